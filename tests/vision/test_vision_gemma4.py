"""Gemma 4 vision (clip.projector_type "gemma4v"): mtmd's dynamic image size
against sizes worked out by hand, the tower against a float64 numpy graph
written here, image prompts of a tiny gemma4 against the numpy reference
model (the image's rows both ways in the sliding-window layers only), and
bad input."""

import math

import numpy as np
import pytest

pytest.importorskip("PIL")

import llminfer  # noqa: E402
from llminfer.errors import ImageError, InvalidArgumentError, UnsupportedModelError  # noqa: E402
from llminfer.vision import load_mmproj  # noqa: E402
from llminfer.vision.gemma4 import fit_box, target_size  # noqa: E402
from images import HOSTILE, data_url, gemma4_text_model, png, reference_file, synthetic  # noqa: E402
from reference_gemma4 import Gemma4Reference  # noqa: E402
from tiny_models import TinyGemma4v, write_gemma4v_mmproj  # noqa: E402

# the tiny tower's cells: 4-pixel patches pooled 2 x 2, 70 to 1120 cells of 8 x 8
ALIGN, MIN_PX, MAX_PX = 8, 70 * 64, 1120 * 64

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4v")
    model = gemma4_text_model(d / "gemma4.gguf")
    mm = {q: write_gemma4v_mmproj(d / f"mmproj-{q}.gguf", TinyGemma4v(qtype=q)) for q in ("F32", "F16", "Q8_0")}
    mm["clamp"] = write_gemma4v_mmproj(d / "mmproj-clamp.gguf", TinyGemma4v(qtype="F32", clamp=True))
    return d, model, mm


# ---- preprocessing ----

@pytest.mark.parametrize("w,h,want", [
    (96, 56, (96, 56)),      # already whole cells, 84 of them: kept
    (100, 100, (104, 104)),  # 12.5 cells rounds half away from zero, to 13 (numpy's round would say 12)
    (70, 40, (96, 56)),      # 9 x 5 cells are too few: scaled by sqrt(4480 / 2800), rounded up: 12 x 7
    (56, 56, (72, 72)),      # 7 x 7 too few: 56 * 1.1952 / 8 = 8.37, up to 9
    (9, 13, (56, 88)),       # tiny: 9 * 6.188 / 8 = 6.96 -> 7, 13 * 6.188 / 8 = 10.06 -> 11
    (1000, 1000, (264, 264)),  # too many: 1000 / sqrt(1e6 / 71680) / 8 = 33.47, down to 33
    (2000, 500, (528, 128)),   # too many: beta = sqrt(1e6 / 71680) = 3.735; 2000 / 3.735 / 8 = 66.9, 500 -> 16.7
])
def test_target_size_as_worked_out_by_hand(w, h, want):
    assert target_size(w, h, ALIGN, MIN_PX, MAX_PX) == want


@pytest.mark.parametrize("seed", range(40))
def test_target_size_is_whole_cells_within_the_bounds(seed):
    rng = np.random.default_rng(seed)
    w, h = (int(v) for v in rng.integers(1, 3000, 2))
    tw, th = target_size(w, h, ALIGN, MIN_PX, MAX_PX)
    assert tw % ALIGN == 0 and th % ALIGN == 0 and tw >= ALIGN and th >= ALIGN
    assert tw * th <= MAX_PX
    if max(w, h) <= 20 * min(w, h):  # not so thin that one side stops at one cell
        assert tw * th >= MIN_PX
        assert abs(math.log((tw / th) / (w / h))) < math.log(1 + 2 * ALIGN / min(tw, th))


def test_preprocess_pads_and_normalises_as_computed_here(files):
    """A constant 9 x 13 image becomes 56 x 88; drawn inside it at scale
    min(56/9, 88/13) = 6.22 it is 56 x ceil(80.9) = 81 rows, 3 rows below the
    top: the colour there, black above and below, each normalised with the
    file's mean and std."""
    _, _, mm = files
    enc = load_mmproj(mm["F32"])
    try:
        assert fit_box(9, 13, 56, 88) == (56, 81)
        colour = np.array([200, 40, 90], np.uint8)
        got = enc.preprocess(png(np.broadcast_to(colour, (13, 9, 3))))
        assert got.shape == (3, 88, 56) and got.dtype == np.float32
        mean, std = np.array([0.1, 0.2, 0.3], np.float32), np.array([0.9, 0.8, 0.7], np.float32)
        inside = (colour / np.float32(255) - mean) / std
        black = (0 - mean) / std
        for y, want in ((0, black), (2, black), (3, inside), (83, inside), (84, black), (87, black)):
            np.testing.assert_allclose(got[:, y, :], np.broadcast_to(want[:, None], (3, 56)), atol=1.5 / 255 / 0.7,
                                       err_msg=f"row {y}")
    finally:
        enc.close()


# ---- the tower against numpy ----

def reference_encode(path, pixels):
    """The gemma4v graph in float64, from the file alone: [cells, n_embd_text]."""
    md, t = reference_file(path)
    ps, m = md["clip.vision.patch_size"], md["clip.vision.projector.scale_factor"]
    E, H = md["clip.vision.embedding_length"], md["clip.vision.attention.head_count"]
    eps = md["clip.vision.attention.layer_norm_epsilon"]
    D = E // H
    gy, gx = pixels.shape[1] // ps, pixels.shape[2] // ps
    x = np.zeros((gy * gx, E))
    W = t["v.patch_embd.weight"]
    inp = pixels.astype(np.float64) * 2 - 1
    for py in range(gy):
        for px in range(gx):
            patch = inp[:, py * ps:(py + 1) * ps, px * ps:(px + 1) * ps]
            x[py * gx + px] = np.einsum("ecij,cij->e", W, patch) + t["v.position_embd.weight"][0, px] \
                + t["v.position_embd.weight"][1, py]

    def rms(v, w=1.0):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def clamp(name, v, which):
        lo, hi = t.get(f"{name}.{which}_min", [-np.inf])[0], t.get(f"{name}.{which}_max", [np.inf])[0]
        return np.clip(v, lo, hi)

    def linear(name, v):
        return clamp(name, clamp(name, v, "input") @ t[f"{name}.weight"].T, "output")

    def rotate(v, p):  # one half-head [n, D/2]: pairs (i, i + D/4) by angle p * 100^(-i / (D/4))
        q = v.shape[1] // 2
        ang = p[:, None] * 100.0 ** (-np.arange(q) / q)[None, :]
        a, b = v[:, :q], v[:, q:]
        return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], 1)

    col = np.array([i % gx for i in range(gx * gy)], np.float64)
    row = np.array([i // gx for i in range(gx * gy)], np.float64)
    for i in range(md["clip.vision.block_count"]):
        b = f"v.blk.{i}."
        h = rms(x, t[b + "ln1.weight"])
        q, k, v = (linear(b + f"attn_{n}", h) for n in "qkv")
        out = np.zeros_like(h)
        for hh in range(H):
            sl = slice(hh * D, (hh + 1) * D)
            qh, kh, vh = rms(q[:, sl], t[b + "attn_q_norm.weight"]), rms(k[:, sl], t[b + "attn_k_norm.weight"]), \
                rms(v[:, sl])
            qh = np.concatenate([rotate(qh[:, :D // 2], col), rotate(qh[:, D // 2:], row)], 1)
            kh = np.concatenate([rotate(kh[:, :D // 2], col), rotate(kh[:, D // 2:], row)], 1)
            s = qh @ kh.T
            s = np.exp(s - s.max(1, keepdims=True))
            out[:, sl] = (s / s.sum(1, keepdims=True)) @ vh
        x = x + rms(linear(b + "attn_out", out), t[b + "attn_post_norm.weight"])
        h = rms(x, t[b + "ln2.weight"])
        g = linear(b + "ffn_gate", h)
        g = g / (1 + np.exp(-1.702 * g))  # gelu_quick: no clip.use_gelu in the file
        x = x + rms(linear(b + "ffn_down", g * linear(b + "ffn_up", h)), t[b + "ffn_post_norm.weight"])
        x = x * t[b + "out_scale.weight"][0]
    pooled = np.zeros(((gy // m) * (gx // m), E))
    for oy in range(gy // m):
        for ox in range(gx // m):
            pooled[oy * (gx // m) + ox] = np.mean([x[(oy * m + a) * gx + ox * m + c] for a in range(m)
                                                   for c in range(m)], 0)
    pooled = (pooled * math.sqrt(E) - t["v.std_bias"]) * t["v.std_scale"]
    return linear("mm.input_projection", rms(pooled))


@pytest.mark.parametrize("which,tol", [("F32", 1e-3), ("F16", 1e-3), ("Q8_0", 2e-2), ("clamp", 1e-3)])
def test_encoder_matches_numpy(files, which, tol):
    _, _, mm = files
    enc = load_mmproj(mm[which], n_threads=2)
    try:
        for h, w in ((40, 70), (90, 31)):
            pixels = enc.preprocess(png(synthetic(h, w, seed=h)))
            got = enc.encode_pixels(pixels)
            want = reference_encode(mm[which], pixels)
            assert got.shape == want.shape and got.shape[1] == 256 and 70 <= got.shape[0] <= 1120
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < tol, f"{which} {h}x{w}: max error {err:.2e} of the largest value"
            if which == "clamp":  # the clamps bite: the projection's output stops at 2.5
                assert np.abs(want).max() == pytest.approx(2.5) and (np.abs(want) == 2.5).sum() > 3
    finally:
        enc.close()


# ---- files and images refused ----

def test_bad_mmproj_files_are_refused(tmp_path):
    def flat_positions(name, data, t):
        return (data.reshape(-1, data.shape[-1]), t) if name == "v.position_embd.weight" else (data, t)

    path = write_gemma4v_mmproj(tmp_path / "flat.gguf", tensor_hook=flat_positions)
    with pytest.raises(UnsupportedModelError, match="position_embd"):
        load_mmproj(path)
    path = write_gemma4v_mmproj(tmp_path / "heads.gguf", TinyGemma4v(n_head=8, n_embd=48, n_ff=64))  # heads of 6
    with pytest.raises(UnsupportedModelError, match="multiple of 4"):
        load_mmproj(path)

    def no_ln2(name, data, t):
        return None if name == "v.blk.1.ln2.weight" else (data, t)

    with pytest.raises(UnsupportedModelError, match="ln2"):
        load_mmproj(write_gemma4v_mmproj(tmp_path / "noln.gguf", tensor_hook=no_ln2))

    def vector_clamp(name, data, t):
        return (np.zeros(2, np.float32), t) if name == "mm.input_projection.input_max" else (data, t)

    with pytest.raises(UnsupportedModelError, match="input_max"):
        load_mmproj(write_gemma4v_mmproj(tmp_path / "clamp.gguf", TinyGemma4v(clamp=True), tensor_hook=vector_clamp))


def test_bad_pixels_and_thin_images(files):
    _, _, mm = files
    enc = load_mmproj(mm["F32"])
    try:
        for shape in ((3, 60, 56), (3, 0, 56), (1, 56, 56), (56, 56)):
            with pytest.raises(InvalidArgumentError):
                enc.encode_pixels(np.zeros(shape, np.float32))
        with pytest.raises(InvalidArgumentError, match="positions"):
            enc.encode_pixels(np.zeros((3, 8, 8 * 65), np.float32))  # 130 patches a side: the table has 128
        # a 1 x 3000 strip: 8 x 8960 after resizing, more patches on a side than the table has
        with pytest.raises(ImageError, match="positions"):
            enc.preprocess(png(synthetic(1, 3000)))
    finally:
        enc.close()


def test_causal_for_the_e2b_and_e4b_widths(tmp_path):
    """mtmd decodes the image rows of Gemma 4 E2B and E4B (1536 and 2560
    wide) causally, the others' both ways."""
    for width, both_ways in ((1536, False), (2560, False), (256, True), (5376, True)):
        enc = load_mmproj(write_gemma4v_mmproj(tmp_path / f"w{width}.gguf", TinyGemma4v(n_embd_text=width)))
        try:
            assert enc.n_embd_out == width and enc.non_causal is both_ways
        finally:
            enc.close()


# ---- image prompts of a tiny gemma4 ----

def image_message(url, text="what is this?"):
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def f32_model(files):
    d, _, _ = files
    return gemma4_text_model(d / "gemma4-f32.gguf", qtype="F32")


def test_image_prompt_matches_the_reference_sliding_layers_both_ways(files, f32_model):
    """The prompt's layout ("<|image>", a row per cell, "<image|>"), and the
    logits after it against the numpy reference given the same rows: nearer
    the graph where the image's rows see each other in the sliding-window
    layers only (llama.cpp's Gemma 4) than the causal one or the one where
    every layer sees both ways (Gemma 3's)."""
    _, _, mm = files
    msgs = image_message(data_url(png(synthetic(40, 70, seed=3))))
    with llminfer.LLM(f32_model, mmproj=mm["F32"], n_ctx=512, n_threads=2, kv_type="f32") as m:
        ids = m.chat_prompt(msgs)
        (span,) = ids.images
        begin, end, soft = (m.tokenize(t, add_bos=False, special=True) for t in ("<|image>", "<image|>", "<|image|>"))
        assert len(begin) == len(end) == len(soft) == 1
        assert ids[span.start - 1] == begin[0] and ids[span.end] == end[0] and len(span.rows) == 84  # 12 x 7
        assert set(ids[span.start:span.end]) == {soft[0]}
        m.chat_completion(msgs, max_tokens=1, temperature=0)
        got = m.last_logits.copy()
    ref = Gemma4Reference(f32_model)
    rows = {span.start + i: r for i, r in enumerate(span.rows)}
    want = ref.logits(list(ids), rows=rows, both_ways=[(span.start, span.end)])[-1]
    every = ref.logits(list(ids), rows=rows, both_ways=[(span.start, span.end)], both_ways_layers="all")[-1]
    causal = ref.logits(list(ids), rows=rows)[-1]
    err = np.abs(got - want).max()
    assert err < 1e-3 * np.abs(want).max(), err
    assert err < 0.05 * min(np.abs(want - every).max(), np.abs(want - causal).max())


def test_rows_at_the_image_see_the_window_and_the_whole_image(files, f32_model):
    """decode_rows' logits at every row of the image (the rows decoded
    before it, a sliding window of 8 much shorter than the image): each row
    is the reference's with the rows after it visible in the sliding layers."""
    _, _, mm = files
    with llminfer.LLM(f32_model, mmproj=mm["F32"], n_ctx=512, n_threads=1, kv_type="f32") as m:
        ids = m.chat_prompt(image_message(data_url(png(synthetic(56, 56, seed=4)))))
        (span,) = ids.images
        eng = m.engine
        seq = eng.new_sequence()
        try:
            eng.decode([(seq, np.asarray(ids[:span.start], np.int32), None)])
            out = np.empty(eng.spec.n_vocab, np.float32)
            eng.decode_rows(seq, np.asarray(ids[span.start:span.end], np.int32), span.rows, out, causal=False)
        finally:
            eng.free(seq)
    rows = {span.start + i: r for i, r in enumerate(span.rows)}
    want = Gemma4Reference(f32_model).logits(list(ids[:span.end]), rows=rows, both_ways=[(span.start, span.end)])
    np.testing.assert_allclose(out, want[-1], rtol=0, atol=1e-3 * np.abs(want[-1]).max())


def test_an_image_prompt_is_batch_invariant(files):
    """The logits after an image prompt are bitwise the same at 1 and 2
    threads, with the text around the image in one pass or in pieces of 3
    tokens (n_batch 96: the image's 84 rows in one pass), and with another
    sequence's tokens in the batch beside the text after the image."""
    _, model, mm = files
    msgs = image_message(data_url(png(synthetic(40, 70, seed=5))), text="tell me, what is this picture of?")
    outs = []
    for nt, nb in ((1, 512), (2, 512), (2, 96), (1, 96)):
        with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=nt, n_batch=nb) as m:
            ids = m.chat_prompt(msgs)
            (span,) = ids.images
            eng = m.engine
            seq, other = eng.new_sequence(), eng.new_sequence()
            try:
                step = 3 if nb == 96 else len(ids)
                for a in range(0, span.start, step):
                    eng.decode([(seq, np.asarray(ids[a:min(a + step, span.start)], np.int32), None)])
                eng.decode_rows(seq, np.asarray(ids[span.start:span.end], np.int32), span.rows, None, causal=False)
                tail = np.asarray(ids[span.end:], np.int32)
                work = [(seq, tail)] + ([(other, np.asarray(ids[:40], np.int32), None)] if nb == 96 else [])
                outs.append(eng.decode(work)[0].copy())
            finally:
                eng.free(seq)
                eng.free(other)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_greedy_generation_and_the_image_matter(files):
    """A chat with an image runs; another image changes the logits; the same
    image again reuses the cached prefix and gives the same logits."""
    _, model, mm = files
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as m:
        a = image_message(data_url(png(synthetic(40, 70, seed=1))))
        b = image_message(data_url(png(synthetic(40, 70, seed=2))))
        span = m.chat_prompt(a).images[0]
        ra = m.chat_completion(a, max_tokens=1, temperature=0)
        la = m.last_logits.copy()
        ra2 = m.chat_completion(a, max_tokens=1, temperature=0)
        assert ra2.text == ra.text and ra2.timings.cached_tokens > span.end  # the same image: its positions reused
        np.testing.assert_array_equal(m.last_logits, la)
        rb = m.chat_completion(b, max_tokens=1, temperature=0)
        assert rb.timings.cached_tokens <= span.start  # another image at the same place is recomputed
        assert np.abs(m.last_logits - la).max() > 1e-3
        assert len(m.chat_completion(a, max_tokens=4, temperature=0).text) > 0


@pytest.mark.parametrize("name", ["truncated png", "bomb 30000x30000", "svg", "empty"])
def test_hostile_images_are_clear_errors(files, name):
    _, model, mm = files
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=256, n_threads=1) as m:
        with pytest.raises(ImageError):
            m.chat_completion(image_message(data_url(HOSTILE[name]())), max_tokens=1)


def test_an_image_larger_than_a_pass_is_refused(files):
    """Rows seen both ways run in one pass: with n_batch 64 an image of 84
    cells is refused clearly, not decoded causally."""
    _, model, mm = files
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=256, n_threads=1, n_batch=64) as m:
        with pytest.raises(InvalidArgumentError, match="one pass"):
            m.chat_completion(image_message(data_url(png(synthetic(40, 70)))), max_tokens=1)


def test_llama_takes_gemma4_chat_handler(files):
    from llminfer import Llama
    from llminfer.compat.llama_chat_format import Gemma4ChatHandler

    _, model, mm = files
    msgs = image_message(data_url(png(synthetic(40, 70, seed=6))))
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=256, n_threads=1) as m:
        want = m.chat_completion(msgs, max_tokens=3, temperature=0).text
    llm = Llama(model_path=model, chat_handler=Gemma4ChatHandler(clip_model_path=mm["F16"]), n_ctx=256,
                n_threads=1, verbose=False)
    try:
        out = llm.create_chat_completion(messages=msgs, max_tokens=3, temperature=0)
        assert out["choices"][0]["message"]["content"] == want
    finally:
        llm.close()


@pytest.mark.parametrize("n_rows,start", [(3, 5), (4, 20), (12, 30)])
def test_few_rows_both_ways_in_the_sliding_layers(f32_model, n_rows, start):
    """A handful of rows (few enough for the attention's split path, or one
    tile more than the window of 8) after `start` tokens, decoded
    non-causally at 1 and 2 threads: the same logits, the reference's with
    the rows both ways in the sliding layers only."""
    import llminfer.runtime.engine as engine_mod

    rng = np.random.default_rng(n_rows)
    ids = [int(t) for t in rng.integers(5, 200, start)]
    rows = (rng.standard_normal((n_rows, 256)) * 2).astype(np.float32)
    outs = []
    for nt in (1, 2):
        eng = engine_mod.Engine(f32_model, n_ctx=256, kv_type="f32", n_threads=nt)
        try:
            seq = eng.new_sequence()
            eng.decode([(seq, np.asarray(ids, np.int32), None)])
            out = np.empty(eng.spec.n_vocab, np.float32)
            eng.decode_rows(seq, np.zeros(n_rows, np.int32), rows, out, causal=False)
            outs.append(out)
        finally:
            eng.close()
    np.testing.assert_array_equal(outs[0], outs[1])
    ref = Gemma4Reference(f32_model)
    all_ids = ids + [0] * n_rows
    given = {start + i: r for i, r in enumerate(rows)}
    want = ref.logits(all_ids, rows=given, both_ways=[(start, start + n_rows)])[-1]
    causal = ref.logits(all_ids, rows=given)[-1]
    err = np.abs(outs[0] - want).max()
    assert err < 1e-3 * np.abs(want).max() and err < 0.05 * np.abs(want - causal).max(), err


def test_an_unknown_attention_mode_is_refused(f32_model):
    from llminfer import _core
    from llminfer.runtime.engine import Engine

    eng = Engine(f32_model, n_ctx=64)
    try:
        for mode in (-1, 3, 99):
            with pytest.raises(InvalidArgumentError, match="attention mode"):
                _core.set_causal(eng.ctx, mode)
        _core.set_causal(eng.ctx, _core.ATTN_CAUSAL)
    finally:
        eng.close()
