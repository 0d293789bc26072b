"""Qwen2.5-VL images (projector qwen2.5vl_merger beside a qwen2vl text
model): mtmd's dynamic size against sizes worked out by hand, the pixels
against PIL and numpy, the window order against its definition, the tower
(F32, F16, Q8_0) against a float64 numpy graph written apart
(tests/support/reference_qwen25vl.py), the image's M-RoPE positions in the
text model against the numpy reference model with the same positions,
batch invariance with an image in the batch, the marks a truncate and a
fork keep, and the library's paths (LLM(mmproj=), Qwen25VLChatHandler)."""

import numpy as np
import pytest

pytest.importorskip("PIL")

import llminfer  # noqa: E402
from llminfer.errors import InvalidArgumentError  # noqa: E402
from llminfer.vision import load_mmproj  # noqa: E402
from llminfer.vision.qwen25vl import grid_rows, window_order, windows  # noqa: E402
from images import data_url, png, qwen2vl_text_model, reference_file, synthetic  # noqa: E402
from reference import ReferenceModel  # noqa: E402
import reference_qwen25vl  # noqa: E402
from tiny_models import TinyQwen25vl, write_qwen25vl_mmproj  # noqa: E402

SIZES = [(200, 300), (56, 56), (300, 130), (13, 9), (40, 70)]  # (height, width)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen25vl")
    model = qwen2vl_text_model(d / "qwen2vl.gguf", qtype="F32", embd_qtype="F32")
    return d, model, {q: write_qwen25vl_mmproj(d / f"mmproj-{q}.gguf", TinyQwen25vl(qtype=q))
                      for q in ("F32", "F16", "Q8_0")}


@pytest.fixture(scope="module")
def enc(files):
    e = load_mmproj(files[2]["F16"])
    yield e
    e.close()


# (width, height) -> (width, height), cells of 28 pixels, 8 to 4096 of them:
# 300 x 200 rounds to 308 x 196 (11 x 7 cells); 56 x 56 is 2 x 2 = 4 cells,
# under 8: scaled by sqrt(6272 / 3136) and rounded up, 3 x 3; 9 x 13 rounds
# to one cell, scaled by sqrt(6272 / 117) = 7.32: 65.9 and 95.2 up to 84 x
# 112; 4000 x 3000 is over 4096 cells: scaled by sqrt(12e6 / 3211264) =
# 1.933 and rounded down, 2069 -> 2044, 1552 -> 1540
HAND_SIZES = {(300, 200): (308, 196), (56, 56): (84, 84), (9, 13): (84, 112), (4000, 3000): (2044, 1540),
              (28, 28 * 8): (28, 224), (70, 40): (112, 84)}


def test_size_follows_mtmds_smart_resize(enc):
    for (w, h), want in HAND_SIZES.items():
        assert enc.size_for(w, h) == want, (w, h)


def test_pixels_are_the_resized_image_normalised(enc):
    """The image resized by PIL's bicubic to its cell grid, the width first,
    then the height, as mtmd does (drawn centred on black where the aspect
    ratio leaves a margin), each channel (x / 255 - mean) / std, worked out
    here with numpy."""
    from PIL import Image

    p = enc.params
    for h, w in ((200, 300), (40, 70), (300, 130)):
        img = synthetic(h, w, seed=3)
        tw, th = enc.size_for(w, h)
        scale = min(tw / w, th / h)
        nw, nh = min(int(np.ceil(w * scale)), tw), min(int(np.ceil(h * scale)), th)
        canvas = np.zeros((th, tw, 3), np.float64)
        wide = Image.fromarray(img).resize((nw, h), Image.BICUBIC)
        small = np.asarray(wide.resize((nw, nh), Image.BICUBIC), np.float64)
        y0, x0 = (th - nh) // 2, (tw - nw) // 2
        canvas[y0:y0 + nh, x0:x0 + nw] = small
        want = ((canvas / 255 - np.array(p.mean)) / np.array(p.std)).transpose(2, 0, 1)
        got = enc.preprocess(png(img))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("cx,cy,w", [(11, 7, 4), (3, 3, 4), (9, 5, 2), (4, 4, 4)])
def test_window_order_groups_each_window(cx, cy, w):
    """Every cell once; each window's cells contiguous, row-major inside,
    windows row-major; the spans are those runs."""
    order = window_order(cx, cy, w)
    assert sorted(order.tolist()) == list(range(cx * cy))
    key = [((c // cx) // w, (c % cx) // w) for c in order]
    assert key == sorted(key)  # windows in row-major order, each in one run
    for c0, n in windows(cx, cy, w):
        run = order[c0:c0 + n]
        assert len({((c // cx) // w, (c % cx) // w) for c in run}) == 1
        assert list(run) == sorted(run)
    assert sum(n for _, n in windows(cx, cy, w)) == cx * cy


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0"])
def test_tower_matches_the_float64_graph(files, qtype):
    """Rows of several sizes (windows cut short, one window, several) within
    1e-3 of the largest |reference| (the f16 tables of SiLU and GELU)."""
    mm = files[2][qtype]
    md, t = reference_file(mm)
    e = load_mmproj(mm)
    try:
        for i, (h, w) in enumerate(SIZES):
            px = e.preprocess(png(synthetic(h, w, seed=i)))
            want = reference_qwen25vl.encode(md, t, px.astype(np.float64))
            got = e.encode_pixels(px)
            cx, cy = px.shape[2] // 28, px.shape[1] // 28
            assert got.shape == want.shape and got.grid == (cx, cy)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < 1e-3, f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        e.close()


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_qwen2vl_tower_matches_the_float64_graph(files, qtype):
    """Qwen2-VL's tower (qwen2vl_merger: LayerNorms, an ungated gelu_quick
    feed-forward, no windows) through the same encoder, within 1e-3."""
    d = files[0]
    mm = write_qwen25vl_mmproj(d / f"mmproj-v2-{qtype}.gguf", TinyQwen25vl(qtype=qtype, projector="qwen2vl_merger"))
    md, t = reference_file(mm)
    e = load_mmproj(mm)
    try:
        assert e.layer_norm and e.wa_pattern == 0
        for i, (h, w) in enumerate(SIZES[:3]):
            px = e.preprocess(png(synthetic(h, w, seed=i)))
            want = reference_qwen25vl.encode(md, t, px.astype(np.float64))
            got = e.encode_pixels(px)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < 1e-3, f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        e.close()


def test_windows_matter(files):
    """The window rule is not a no-op: the same tower with every layer
    attending to the whole image (n_wa_pattern 1) moves the rows far more
    than the tolerance above."""
    d, _, mm = files
    full = write_qwen25vl_mmproj(d / "mmproj-full.gguf", TinyQwen25vl(qtype="F32"),
                                 meta={"clip.vision.n_wa_pattern": 1})
    a, b = load_mmproj(mm["F32"]), load_mmproj(full)
    try:
        px = a.preprocess(png(synthetic(200, 300, seed=1)))
        x, y = a.encode_pixels(px), b.encode_pixels(px)
        assert np.abs(x - y).max() / np.abs(x).max() > 2e-2
    finally:
        a.close()
        b.close()


def image_positions(start, nx, ny):
    """mtmd's M-RoPE positions of an image's rows at rope position start."""
    i = np.arange(nx * ny)
    return np.stack([np.full(nx * ny, start), start + i // nx, start + i % nx, 0 * i], axis=1)


def run_image(model, before, rows, grid, after, n_threads=1, chunk=None, n_batch=512):
    """Logits after `before` tokens, the image rows (in chunks of `chunk`)
    and `after` tokens, every position's of `after`."""
    from llminfer.runtime.engine import Engine

    eng = Engine(model, n_ctx=512, kv_type="f32", n_threads=n_threads, n_batch=n_batch)
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


def test_image_rows_take_mroped_positions(files):
    """Text, an image of 5 x 3 cells and text: the logits of the text after
    it are the numpy reference's with mtmd's positions (the image's rows on
    their grid at the next rope position, the text after it from there +
    max(5, 3)), not those of plain positions."""
    _, model, _ = files
    rng = np.random.default_rng(4)
    before, after = rng.integers(0, 260, 6), rng.integers(0, 260, 5)
    nx, ny = 5, 3
    rows = (rng.standard_normal((nx * ny, 256)) * 1.5).astype(np.float32)
    ours = run_image(model, before, rows, (nx, ny), after)
    n0, n = len(before), nx * ny
    toks = np.concatenate([before, np.zeros(n, np.int64), after])
    text = lambda a, b: np.stack([np.arange(a, b)] * 3 + [np.zeros(b - a, int)], axis=1)  # noqa: E731
    pos = np.concatenate([text(0, n0), image_positions(n0, nx, ny), text(n0 + max(nx, ny), n0 + max(nx, ny) + 5)])
    ref = ReferenceModel(model)
    given = {n0 + i: r for i, r in enumerate(rows)}
    want = ref.logits(toks, rows=given, rope_pos=pos)[-5:]
    plain = ref.logits(toks, rows=given)[-5:]
    err = np.abs(ours - want).max()
    assert err < 2e-3 * np.abs(want).max() and err < 0.05 * np.abs(want - plain).max(), err


def test_an_image_in_a_batch_is_bitwise_invariant(files):
    """The text after an image: the same bits with the image's rows whole or
    in chunks, at 1 or 2 threads, alone or batched with another sequence,
    token by token (Engine.step) or in one pass."""
    from llminfer.runtime.engine import Engine

    _, model, _ = files
    rng = np.random.default_rng(5)
    before, after, other = rng.integers(0, 260, 7), rng.integers(0, 260, 9), rng.integers(0, 260, 11)
    rows = (rng.standard_normal((12, 256))).astype(np.float32)
    whole = run_image(model, before, rows, (4, 3), after)
    assert np.array_equal(run_image(model, before, rows, (4, 3), after, n_threads=2, chunk=5), whole)
    assert np.array_equal(run_image(model, before, rows, (4, 3), after, chunk=1, n_batch=8), whole)
    eng = Engine(model, n_ctx=512, kv_type="f32", n_threads=2)
    try:
        a, b = eng.new_sequence(), eng.new_sequence()
        eng.decode([(a, np.asarray(before, np.int32), None)])
        eng.decode_rows(a, np.zeros(12, np.int32), rows, grid=(4, 3))
        la, lb = eng.decode([(a, np.asarray(after[:4], np.int32), "all"), (b, np.asarray(other, np.int32), "all")])
        assert np.array_equal(la, whole[:4])
        buf = np.empty(eng.n_vocab, np.float32)
        steps = [eng.step(a, int(t), buf).copy() for t in after[4:]]
        assert np.array_equal(np.array(steps), whole[4:])
        # b (no image) as it is alone
        c = eng.new_sequence()
        assert np.array_equal(eng.decode([(c, np.asarray(other, np.int32), "all")])[0], lb)
    finally:
        eng.close()


def test_truncate_and_fork_keep_the_image_mark(files):
    """Going back into an image drops its mark (the text goes on from
    plain positions); going back to after it keeps it; a fork keeps it."""
    from llminfer.runtime.engine import Engine

    _, model, _ = files
    rng = np.random.default_rng(6)
    before, after = rng.integers(0, 260, 4), rng.integers(0, 260, 3)
    rows = rng.standard_normal((6, 256)).astype(np.float32)
    whole = run_image(model, before, rows, (3, 2), after)
    eng = Engine(model, n_ctx=512, kv_type="f32", n_threads=1)
    try:
        s = eng.new_sequence()
        eng.decode([(s, np.asarray(before, np.int32), None)])
        eng.decode_rows(s, np.zeros(6, np.int32), rows, grid=(3, 2))
        eng.decode([(s, np.asarray(after, np.int32), None)])
        assert s.rope_marks == [(10, 3 - 6)]
        f = eng.kv.fork(s)
        assert f.rope_marks == s.rope_marks
        eng.truncate(s, 10)
        assert np.array_equal(eng.decode([(s, np.asarray(after, np.int32), "all")])[0], whole)
        eng.truncate(s, 7)  # into the image
        assert s.rope_marks == []
        eng.kv.free(f)
    finally:
        eng.close()


def test_bad_grids_are_refused(files):
    from llminfer.runtime.engine import Engine

    _, model, _ = files
    eng = Engine(model, n_ctx=64, n_threads=1)
    try:
        s = eng.new_sequence()
        rows = np.zeros((4, 256), np.float32)
        for grid, first in (((3, 1), 0), ((0, 4), 0), ((2, 2), 1)):
            with pytest.raises(InvalidArgumentError):
                eng.decode_rows(s, np.zeros(4, np.int32), rows, grid=grid, first=first)
    finally:
        eng.close()


def test_rope_positions_are_checked(files):
    """The C core refuses rope positions outside [0, 2^24)."""
    from llminfer.errors import LLMInferError
    from llminfer.runtime.engine import Engine

    _, model, _ = files
    eng = Engine(model, n_ctx=64, n_threads=1)
    try:
        s = eng.new_sequence()
        eng.kv.reserve(s, 1)
        views = [eng.kv.table_arrays(s)]
        one = np.zeros(1, np.int32)
        out = np.empty(eng.n_vocab, np.float32)
        for bad in (-1, 1 << 24):
            rp = np.array([[0, bad, 0, 0]], np.int32)
            with pytest.raises(LLMInferError, match="rope position"):
                eng.ctx.decode(one, None, one, one, np.ones(1, np.int8), views, out, 1, rp)
    finally:
        eng.close()


def test_llm_chat_with_an_image_and_the_chat_handler(files):
    """LLM(mmproj=) lays an image out as <|vision_start|>, 77 rows,
    <|vision_end|> with its grid; another image moves the logits; Llama with
    Qwen25VLChatHandler answers as LLM does."""
    from llminfer import Llama
    from llminfer.compat.llama_chat_format import Qwen25VLChatHandler

    _, model, mm = files

    def msgs(seed):
        return [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {
            "url": data_url(png(synthetic(200, 300, seed=seed)))}}]}]

    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as llm:
        ids = llm.chat_prompt(msgs(1))
        (span,) = ids.images
        assert span.grid == (11, 7) and len(span.rows) == 77
        begin, end = (llm.tokenize(t, add_bos=False, special=True) for t in ("<|vision_start|>", "<|vision_end|>"))
        assert ids[span.start - 1:span.start] == begin and ids[span.end:span.end + 1] == end
        r = llm.chat_completion(msgs(1), max_tokens=3, temperature=0)
        want = r.text
        llm.complete(ids, max_tokens=1, temperature=0)
        a = llm.last_logits.copy()
        llm.complete(llm.chat_prompt(msgs(2)), max_tokens=1, temperature=0)
        assert np.abs(a - llm.last_logits).max() > 1e-3
    q = Llama(model_path=model, chat_handler=Qwen25VLChatHandler(clip_model_path=mm["F16"]), n_ctx=512,
              n_threads=1, verbose=False)
    try:
        out = q.create_chat_completion(messages=msgs(1), max_tokens=3, temperature=0)
        assert out["choices"][0]["message"]["content"] == want
    finally:
        q.close()


def test_grid_rows_keep_their_grid():
    r = grid_rows(np.zeros((6, 4), np.float32), 3, 2)
    assert r[2:].grid == (3, 2) and np.asarray(r).shape == (6, 4)


def test_a_saved_state_keeps_the_image_mark(files):
    """save_state after an image prompt, load_state in another LLM: the
    same image prompt goes on from the context (the image not run again)
    and the text after the image at the same rope positions (the same
    logits as in the first LLM); the placeholder ids alone, without the
    image, do not reuse the image's places."""
    from llminfer.vision.prompt import PromptIds

    _, model, mm = files
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": data_url(png(synthetic(90, 150, seed=3)))}}, {"type": "text", "text": "what"}]}]
    extra = [5, 17, 29]
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as a:
        ids = a.chat_prompt(msgs)
        a.complete(ids, max_tokens=1, temperature=0)
        blob = a.save_state()
        longer = PromptIds(list(ids) + extra)
        longer.images = ids.images
        a.complete(longer, max_tokens=1, temperature=0)
        want = a.last_logits.copy()
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as b:
        b.load_state(blob)
        assert b.sequence.rope_marks
        r = b.complete(longer, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens >= ids.images[0].end
        assert np.array_equal(b.last_logits, want)
        b.load_state(blob)
        r = b.complete(list(ids) + extra, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens <= ids.images[0].start
