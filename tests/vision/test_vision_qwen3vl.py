"""Qwen3-VL images (projector qwen3vl_merger beside a qwen3vl text model, or
Qwen3-VL-30B-A3B's qwen3vlmoe: the same M-RoPE and DeepStack on routed experts):
the position table's bilinear resize against the align-corners formula in
float64, the tower (F32, F16, Q8_0; its DeepStack slices) against a
float64 numpy graph (tests/support/reference_qwen25vl.py), image rows in
the text model (interleaved M-RoPE positions, DeepStack slices added after
the first layers) against the numpy reference model, batch invariance with
such an image, a tower's rows in the MoE text model against the reference,
and LLM(mmproj=)."""

import numpy as np
import pytest

pytest.importorskip("PIL")

import llminfer  # noqa: E402
from llminfer.vision import load_mmproj  # noqa: E402
from llminfer.vision.qwen3vl import resize_bilinear  # noqa: E402
from images import QWEN_IMAGE_TOKENS, QWEN_TEMPLATE, data_url, png, reference_file, synthetic  # noqa: E402
from reference import ReferenceModel  # noqa: E402
import reference_qwen25vl  # noqa: E402
from tiny_models import TinyConfig, TinyQwen3vl, write_model, write_qwen3vl_mmproj  # noqa: E402

# (height, width): 9 x 6 cells, 3 x 3, 6 x 6, 5 x 9 and a tiny one scaled up to 3 x 4 (the
# 6 x 6 position table resized to each patch grid)
SIZES = [(200, 300), (64, 64), (192, 192), (290, 150), (13, 9)]


TEXT_ARCHS = ["qwen3vl", "qwen3vlmoe"]


@pytest.fixture(scope="module")
def mmprojs(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vl_mmproj")
    return {q: write_qwen3vl_mmproj(d / f"mmproj3-{q}.gguf", TinyQwen3vl(qtype=q)) for q in ("F32", "F16", "Q8_0")}


@pytest.fixture(scope="module", params=TEXT_ARCHS)
def files(request, tmp_path_factory, mmprojs):
    """(folder, text model of the parameter's architecture, mmprojs by type);
    4 layers: DeepStack after layers 0 and 1, not the last."""
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    model = write_model(d / f"{arch}.gguf", TinyConfig(arch=arch, pre="default", qtype="F32", embd_qtype="F32",
                                                       n_layer=4),
                        extra_strings={"tokenizer.chat_template": QWEN_TEMPLATE}, extra_tokens=QWEN_IMAGE_TOKENS)
    return d, model, mmprojs


@pytest.mark.parametrize("n,gx,gy", [(6, 12, 18), (6, 6, 6), (4, 1, 7), (5, 9, 2), (3, 3, 1)])
def test_position_resize_is_align_corners_bilinear(n, gx, gy):
    """Output (y, x) reads the table at (y (n - 1) / (gy - 1), x (n - 1) /
    (gx - 1)) (0 on a side of 1 when the table's is too), blending its four
    neighbours, worked out in float64."""
    t = np.random.default_rng(n + gx).standard_normal((n, n, 5)).astype(np.float32)
    got = resize_bilinear(t, gx, gy)

    def src(out):
        return np.arange(out) * ((n - 1) / (out - 1)) if out > 1 else np.zeros(1)

    want = np.empty((gy, gx, 5))
    for i, sy in enumerate(src(gy)):
        for j, sx in enumerate(src(gx)):
            y0, x0 = int(np.floor(sy)), int(np.floor(sx))
            y1, x1 = min(y0 + 1, n - 1), min(x0 + 1, n - 1)
            fy, fx = sy - y0, sx - x0
            want[i, j] = (t[y0, x0] * (1 - fy) * (1 - fx) + t[y0, x1] * (1 - fy) * fx
                          + t[y1, x0] * fy * (1 - fx) + t[y1, x1] * fy * fx)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0"])
def test_tower_matches_the_float64_graph(mmprojs, qtype):
    """The rows (the projection's and the two DeepStack slices, side by
    side) within 1e-3 of the largest |reference|, for several sizes."""
    mm = mmprojs[qtype]
    md, t = reference_file(mm)
    e = load_mmproj(mm)
    try:
        assert e.n_deepstack == 2 and e.n_embd_out == 3 * 256
        for i, (h, w) in enumerate(SIZES):
            px = e.preprocess(png(synthetic(h, w, seed=i)))
            want = reference_qwen25vl.encode_qwen3vl(md, t, px.astype(np.float64))
            got = e.encode_pixels(px)
            assert got.shape == want.shape and got.grid == (px.shape[2] // 32, px.shape[1] // 32)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < 1e-3, f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        e.close()


def run_image(model, before, rows, grid, after, n_threads=1, chunk=None):
    from llminfer.runtime.engine import Engine

    eng = Engine(model, n_ctx=512, kv_type="f32", n_threads=n_threads)
    try:
        seq = eng.new_sequence()
        eng.decode([(seq, np.asarray(before, np.int32), None)])
        n = len(rows)
        chunk = chunk or n
        for s in range(0, n, chunk):
            eng.decode_rows(seq, np.zeros(min(chunk, n - s), np.int32), rows[s:s + chunk], grid=grid, first=s)
        return eng.decode([(seq, np.asarray(after, np.int32), "all")])[0]
    finally:
        eng.close()


def image_positions(n0, nx, ny, n_after):
    """mtmd's M-RoPE layout: text before the image at (p, p, p, 0), the
    image's cells at (n0, n0 + y, n0 + x, 0), the text after it from
    n0 + max(nx, ny)."""
    n = nx * ny
    i = np.arange(n)
    img = np.stack([np.full(n, n0), n0 + i // nx, n0 + i % nx, 0 * i], axis=1)
    text = lambda a, b: np.stack([np.arange(a, b)] * 3 + [np.zeros(b - a, int)], axis=1)  # noqa: E731
    return np.concatenate([text(0, n0), img, text(n0 + max(nx, ny), n0 + max(nx, ny) + n_after)])


def test_deepstack_rows_at_interleaved_positions(files):
    """Text, an image of 4 x 3 cells whose rows are 3 x 256 wide, and text:
    the logits after it are the numpy reference's with the slices added
    after layers 0 and 1 and the interleaved M-RoPE positions of mtmd's
    layout; without the slices (or at plain positions) they are far off."""
    _, model, _ = files
    rng = np.random.default_rng(8)
    before, after = rng.integers(0, 260, 5), rng.integers(0, 260, 4)
    nx, ny = 4, 3
    rows = (rng.standard_normal((nx * ny, 3 * 256)) * 0.5).astype(np.float32)
    ours = run_image(model, before, rows, (nx, ny), after)
    n0, n = len(before), nx * ny
    pos = image_positions(n0, nx, ny, len(after))
    toks = np.concatenate([before, np.zeros(n, np.int64), after])
    ref = ReferenceModel(model)
    want = ref.logits(toks, rows={n0 + k: r for k, r in enumerate(rows)}, rope_pos=pos)[-len(after):]
    flat = ref.logits(toks, rows={n0 + k: r[:256] for k, r in enumerate(rows)}, rope_pos=pos)[-len(after):]
    plain = ref.logits(toks, rows={n0 + k: r for k, r in enumerate(rows)})[-len(after):]
    err = np.abs(ours - want).max()
    assert err < 1e-3 * np.abs(want).max(), err
    assert err < 0.05 * np.abs(want - flat).max() and err < 0.05 * np.abs(want - plain).max()


def test_tower_rows_into_the_moe_text_model(mmprojs, tmp_path_factory):
    """An image through the qwen3vl_merger tower (F16), its rows (3 x 256
    wide) and grid into a qwen3vlmoe text model: the logits after it are the
    numpy reference's on the same rows (F32 weights and activations: no
    8-bit rounding to flip a near-tied expert choice), and bitwise the same
    in chunks of 5 rows at 2 threads."""
    d = tmp_path_factory.mktemp("qwen3vlmoe_tower")
    model = write_model(d / "qwen3vlmoe.gguf", TinyConfig(arch="qwen3vlmoe", pre="default", qtype="F32",
                                                          embd_qtype="F32", n_layer=4, seed=3))
    e = load_mmproj(mmprojs["F16"])
    try:
        rows = e.encode_pixels(e.preprocess(png(synthetic(130, 200, seed=4))))
    finally:
        e.close()
    nx, ny = rows.grid
    rows = np.asarray(rows, np.float32)
    assert rows.shape == (nx * ny, 3 * 256)
    rng = np.random.default_rng(10)
    before, after = rng.integers(0, 260, 4), rng.integers(0, 260, 6)
    ours = run_image(model, before, rows, (nx, ny), after)
    assert np.array_equal(run_image(model, before, rows, (nx, ny), after, n_threads=2, chunk=5), ours)
    n0 = len(before)
    toks = np.concatenate([before, np.zeros(nx * ny, np.int64), after])
    ref = ReferenceModel(model)
    want = ref.logits(toks, rows={n0 + k: r for k, r in enumerate(rows)},
                      rope_pos=image_positions(n0, nx, ny, len(after)))[-len(after):]
    err = np.abs(ours - want).max()
    assert err < 1e-3 * np.abs(want).max(), err


def test_a_deepstack_image_is_bitwise_invariant(files):
    """Whole or in chunks, 1 or 2 threads: the same bits after the image."""
    _, model, _ = files
    rng = np.random.default_rng(9)
    before, after = rng.integers(0, 260, 6), rng.integers(0, 260, 5)
    rows = rng.standard_normal((12, 3 * 256)).astype(np.float32)
    whole = run_image(model, before, rows, (4, 3), after)
    assert np.array_equal(run_image(model, before, rows, (4, 3), after, n_threads=2, chunk=5), whole)
    assert np.array_equal(run_image(model, before, rows, (4, 3), after, chunk=1), whole)


def test_llm_chat_with_a_qwen3vl_image(files):
    """LLM(mmproj=) with a qwen3vl_merger tower: the rows are as wide as the
    text model's input (3 x 256), another image moves the logits."""
    _, model, mm = files

    def msgs(seed):
        return [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {
            "url": data_url(png(synthetic(200, 300, seed=seed)))}}]}]

    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as llm:
        out = []
        for seed in (1, 2):
            ids = llm.chat_prompt(msgs(seed))
            (span,) = ids.images
            assert span.grid == (9, 6) and span.rows.shape == (54, 768)
            llm.complete(ids, max_tokens=1, temperature=0)
            out.append(llm.last_logits.copy())
        assert np.abs(out[0] - out[1]).max() > 1e-4
