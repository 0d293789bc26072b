"""LFM2-VL vision (clip.projector_type "lfm2"): mtmd's tiling decision, tile
grid and smart resize against cases worked out by hand, the pieces against
a numpy resampling written here, the resized position table and the tower
against the float64 graph of tests/support/reference_lfm2v.py, image
prompts of a tiny lfm2 (a hybrid: its recurrent state after an image) against
the numpy reference model, batch invariance, and bad input."""

import numpy as np
import pytest

pytest.importorskip("PIL")

import llminfer  # noqa: E402
from llminfer.errors import ImageError, InvalidArgumentError, UnsupportedModelError  # noqa: E402
from llminfer.vision import load_mmproj  # noqa: E402
from llminfer.vision.lfm2 import grid_layout, should_tile  # noqa: E402
from images import HOSTILE, data_url, lfm2_text_model, png, synthetic  # noqa: E402
from reference_hybrid import HybridReference  # noqa: E402
from reference_lfm2v import Lfm2VisionReference, resize_table  # noqa: E402
from tiny_models import LFM2_MMPROJ, TinyMmproj, write_mmproj  # noqa: E402

# the tiny tower's cells: 16-pixel patches merged 2 x 2; 64 to 256 cells of 32 x 32
PATCH, CELL, MAX_PX = 16, 32, 256 * 32 * 32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfm2v")
    model = lfm2_text_model(d / "lfm2.gguf", qtype="F32", embd_qtype="F32", tie_output=False)
    mm = {q: write_mmproj(d / f"mmproj-{q}.gguf", TinyMmproj(**LFM2_MMPROJ, qtype=q)) for q in ("F32", "F16", "Q8_0")}
    mm["bare"] = write_mmproj(d / "mmproj-bare.gguf", TinyMmproj(**LFM2_MMPROJ, qtype="F32", input_norm=False))
    return d, model, mm


# ---- preprocessing ----

@pytest.mark.parametrize("w,h,tiled", [
    (512, 512, False),    # 256 cells: within the most
    (1024, 512, False),   # 512 cells: exactly twice the most, not more
    (1056, 512, True),    # 33 x 16 cells
    (720, 720, False),    # 22.5 cells a side round half to even, to 22: 484 cells (half up would make 529)
    (752, 720, True),     # 23.5 rounds to 24: 24 x 22 = 528 cells
    (1000, 700, True),
])
def test_tiling_decision_as_worked_out_by_hand(w, h, tiled):
    assert should_tile(w, h, PATCH, CELL, MAX_PX) == tiled


@pytest.mark.parametrize("w,h,grid", [
    (1000, 700, (3, 2)),    # 1.43: 3/2 (0.07 off) nearer than 4/3 (0.10)
    (700, 1000, (2, 3)),
    (1056, 512, (2, 1)),    # 2.06: 2/1 and 4/2 as near; 4/2 only for an image of more than 4 tiles' half
    (2048, 1024, (4, 2)),   # the same ratio with more than half of 4 x 2 tiles' pixels: the larger grid
    (5000, 600, (8, 1)),    # 8.33: 8/1 (0.33 off) nearer than 9/1 (0.67)
    (3000, 3000, (3, 3)),   # 1: 2/2 and 3/3 as near; more than half of 3 x 3 tiles' pixels
    (900, 900, (2, 2)),     # 1: less than half of 3 x 3 tiles' pixels keeps 2 x 2
])
def test_tile_grid_as_worked_out_by_hand(w, h, grid):
    assert grid_layout(w, h) == grid


@pytest.mark.parametrize("w,h,want", [
    (70, 40, (352, 224)),    # 2 x 1 cells are too few: scaled by sqrt(65536 / 2800) = 4.84, up: 11 x 7
    (200, 300, (224, 320)),  # 6 x 9 too few: by 1.045, up: 7 x 10
    (700, 1000, (416, 608)), # 22 x 31 too many: by 1 / 1.634, down: 13 x 19
    (512, 256, (512, 256)),  # 16 x 8 whole cells: kept
])
def test_sizes_as_worked_out_by_hand(files, w, h, want):
    _, _, mm = files
    enc = load_mmproj(mm["F32"])
    try:
        assert enc.size_for(w, h) == want
        pieces = enc.preprocess(png(synthetic(h, w)))
        assert pieces[-1].shape == (3, want[1], want[0])
    finally:
        enc.close()


def resample(a, size):
    """uint8 [h, w, 3] resized to size (w, h) by Pillow's bilinear filter
    (a triangle widened by the shrink factor, half-pixel centres, weights
    normalised per output pixel), in float64: no 8-bit rounding between the
    passes, so within a level or two of Pillow's."""
    def weights(n_in, n_out):
        scale = n_in / n_out
        support = max(scale, 1.0)
        w = np.zeros((n_out, n_in))
        for i in range(n_out):
            c = (i + 0.5) * scale
            j = np.arange(n_in)
            w[i] = np.maximum(0.0, 1.0 - np.abs((j + 0.5 - c) / support))
        return w / w.sum(1, keepdims=True)

    x = np.einsum("Xx,yxc->yXc", weights(a.shape[1], size[0]), a.astype(np.float64))
    return np.einsum("Yy,yxc->Yxc", weights(a.shape[0], size[1]), x)


def test_pieces_are_the_image_resized_as_computed_here(files):
    """A 1000 x 700 image: drawn into 3 x 2 tiles of 512 (scaled by
    1024 / 700, rounded up: 1463 x 1024, centred: 36 black columns on the
    left, 37 on the right), cut row-major; then the whole image at
    608 x 416, the thumbnail; each normalised with the file's mean and std
    (0.5)."""
    _, _, mm = files
    img = synthetic(700, 1000, seed=3)
    enc = load_mmproj(mm["F32"])
    try:
        pieces = enc.preprocess(png(img))
    finally:
        enc.close()
    assert pieces.grid == (3, 2) and len(pieces) == 7
    canvas = np.zeros((1024, 1536, 3))
    canvas[:, 36:36 + 1463] = resample(img, (1463, 1024))
    want_tiles = [canvas[y * 512:(y + 1) * 512, x * 512:(x + 1) * 512] for y in range(2) for x in range(3)]
    thumb = resample(img, (608, 416))
    tol = 2.5 / 255 / 0.5
    for got, want in zip(pieces, want_tiles + [thumb]):
        want = (want / 255 - 0.5) / 0.5
        np.testing.assert_allclose(got, want.transpose(2, 0, 1), atol=tol)


def test_the_position_table_is_resized_as_the_formula_says(files):
    """Grown, shrunk (antialiased), both at once, and kept: against the
    reference's sum over the source cells."""
    _, _, mm = files
    enc = load_mmproj(mm["F32"])
    try:
        table = enc.vit.pos.astype(np.float64)
        for gx, gy in ((20, 4), (6, 16), (3, 5), (8, 8), (32, 32), (1, 40)):
            got = enc.positions(gx, gy)
            want = resize_table(table, gx, gy)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    finally:
        enc.close()


# ---- the tower ----

@pytest.mark.parametrize("which,tol", [("F32", 1e-3), ("F16", 1e-3), ("Q8_0", 2e-2), ("bare", 1e-3)])
def test_encoder_matches_numpy(files, which, tol):
    """An image of its own size (11 x 7 cells), and of a tiled one the first
    tile and the thumbnail, against the float64 graph (weights through
    gguf's dequantizer); "bare": a file without the projector's input norm."""
    _, _, mm = files
    ref = Lfm2VisionReference(mm[which])
    enc = load_mmproj(mm[which])
    try:
        for h, w in ((40, 70), (700, 1000)):
            pieces = enc.preprocess(png(synthetic(h, w, seed=7)))
            rows = enc.encode_pixels(pieces, n_threads=2)
            at = np.cumsum((0,) + rows.counts)
            for k in sorted({0, len(pieces) - 1}):
                want = ref.encode_piece(pieces[k])
                got = rows[at[k]:at[k + 1]]
                assert got.shape == want.shape
                err = np.abs(got - want).max() / np.abs(want).max()
                assert err < tol, (which, h, w, k, err)
    finally:
        enc.close()


def test_rows_are_the_same_at_one_and_two_threads(files):
    _, _, mm = files
    enc = load_mmproj(mm["F16"])
    try:
        pieces = enc.preprocess(png(synthetic(300, 200, seed=2)))
        np.testing.assert_array_equal(enc.encode_pixels(pieces, 1), enc.encode_pixels(pieces, 2))
    finally:
        enc.close()


def test_bad_mmproj_files_are_refused(tmp_path):
    """No MLP, an MLP of the wrong width, or patches whose cells do not
    divide a tile: UnsupportedModelError naming the problem."""
    cfg = TinyMmproj(**LFM2_MMPROJ, qtype="F32")
    no_mlp = write_mmproj(tmp_path / "a.gguf", cfg, tensor_hook=lambda n, d, t: None if n == "mm.1.weight" else (d, t))
    with pytest.raises(UnsupportedModelError, match="mm.1.weight"):
        load_mmproj(no_mlp)
    wide = write_mmproj(tmp_path / "b.gguf", cfg, tensor_hook=lambda n, d, t: (
        np.zeros((d.shape[0], d.shape[1] // 2), d.dtype), t) if n == "mm.1.weight" else (d, t))
    with pytest.raises(UnsupportedModelError, match="mm.1.weight"):
        load_mmproj(wide)
    odd = write_mmproj(tmp_path / "c.gguf", TinyMmproj(**{**LFM2_MMPROJ, "patch_size": 14, "image_size": 112}))
    with pytest.raises(UnsupportedModelError, match="tiles of 512"):
        load_mmproj(odd)


def test_bad_pixels_and_thin_images(files):
    """Pixels that are no whole number of cells are refused; a 600 x 3
    strip (1:200) is stretched to at least 64 cells, as mtmd does."""
    _, _, mm = files
    enc = load_mmproj(mm["F16"])
    try:
        with pytest.raises(InvalidArgumentError):
            enc.encode_pixels([np.zeros((3, 48, 64), np.float32)])
        rows = enc.encode(png(synthetic(3, 600)))
        assert rows.shape[0] >= 64 and np.isfinite(rows).all()
    finally:
        enc.close()


# ---- image prompts ----

def image_message(url, text="what is this?"):
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_prompt_layout_and_logits_match_the_reference(files):
    """"<|image_start|>", a placeholder ("<image>") per cell, "<|image_end|>";
    a tiled image's "<|img_row_Y_col_X|>" before each tile and
    "<|img_thumbnail|>" before the thumbnail; the logits after the prompt
    against the numpy lfm2 given the same rows (causal, as text)."""
    _, model, mm = files
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=4096, n_threads=2, kv_type="f32") as m:
        tok = lambda t: m.tokenize(t, add_bos=False, special=True)  # noqa: E731
        ids = m.chat_prompt(image_message(data_url(png(synthetic(40, 70, seed=3)))))
        (span,) = ids.images
        assert len(span.rows) == 77
        assert ids[span.start - 1] == tok("<|image_start|>")[0] and ids[span.end] == tok("<|image_end|>")[0]
        assert set(ids[span.start:span.end]) == set(tok("<image>"))
        m.complete(ids, max_tokens=1, temperature=0)
        got = m.last_logits.copy()
        big = m.chat_prompt(image_message(data_url(png(synthetic(700, 1000, seed=4)))))
        assert [len(s.rows) for s in big.images] == [256] * 6 + [247]
        before = [big[s.start - 1] for s in big.images]
        assert before == [tok(f"<|img_row_{k // 3 + 1}_col_{k % 3 + 1}|>")[0] for k in range(6)] + \
            tok("<|img_thumbnail|>")
        assert big[big.images[0].start - 2] == tok("<|image_start|>")[0]
        assert big[big.images[-1].end] == tok("<|image_end|>")[0]
    rows = {span.start + i: r for i, r in enumerate(span.rows)}
    want = HybridReference(model).logits(list(ids), rows=rows)[-1]
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()


def test_a_tiled_image_prompt_matches_the_reference_and_is_reused(files):
    """A 1000 x 700 image: 6 tiles and the thumbnail, seven blocks of rows
    between their markers, decoded one after another into the hybrid; the
    logits after the prompt are the numpy lfm2's given the same rows, and
    the same prompt again reuses the context past the last block (from the
    checkpoint after it), bitwise the same."""
    _, model, mm = files
    msgs = image_message(data_url(png(synthetic(700, 1000, seed=4))))
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=4096, n_threads=2, kv_type="f32") as m:
        ids = m.chat_prompt(msgs)
        assert len(ids.images) == 7
        m.chat_completion(msgs, max_tokens=1, temperature=0)
        got = m.last_logits.copy()
        r = m.chat_completion(msgs, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens > ids.images[-1].end
        np.testing.assert_array_equal(m.last_logits, got)
    rows = {s.start + i: row for s in ids.images for i, row in enumerate(s.rows)}
    want = HybridReference(model).logits(list(ids), rows=rows)[-1]
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()


def test_an_image_prompt_is_batch_invariant(files):
    """The logits after an image prompt are bitwise the same at 1 and 2
    threads, with the rows in one pass or in passes of 32 (n_batch 32) and
    the text in pieces of 3, and with another sequence's tokens in the
    batch beside the text after the image."""
    _, model, mm = files
    msgs = image_message(data_url(png(synthetic(40, 70, seed=5))), text="tell me, what is this picture of?")
    outs = []
    for nt, nb in ((1, 512), (2, 512), (2, 32), (1, 32)):
        with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=nt, n_batch=nb) as m:
            ids = m.chat_prompt(msgs)
            (span,) = ids.images
            eng = m.engine
            seq, other = eng.new_sequence(), eng.new_sequence()
            try:
                step = 3 if nb == 32 else len(ids)
                for a in range(0, span.start, step):
                    eng.decode([(seq, np.asarray(ids[a:min(a + step, span.start)], np.int32), None)])
                eng.decode_rows(seq, np.asarray(ids[span.start:span.end], np.int32), span.rows, None)
                tail = np.asarray(ids[span.end:], np.int32)
                work = [(seq, tail)] + ([(other, np.asarray(ids[:20], np.int32), None)] if nb == 32 else [])
                outs.append(eng.decode(work)[0].copy())
            finally:
                eng.free(seq)
                eng.free(other)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_the_recurrent_state_after_an_image_is_kept_and_brought_back(files):
    """The same image again reuses the context past it (a checkpoint after
    its rows) with the same logits; another image at its place is run again;
    a follow-up after the first goes on from the image's end; and the
    engine never runs an image's placeholder ids to bring a state back."""
    _, model, mm = files
    a = image_message(data_url(png(synthetic(40, 70, seed=1))))
    b = image_message(data_url(png(synthetic(40, 70, seed=2))))
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=1024, n_threads=1) as m:
        span = m.chat_prompt(a).images[0]
        m.chat_completion(a, max_tokens=3, temperature=0)
        m.chat_completion(a, max_tokens=1, temperature=0)
        la = m.last_logits.copy()
        r = m.chat_completion(a, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens > span.end
        np.testing.assert_array_equal(m.last_logits, la)
        r = m.chat_completion(b, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens <= span.start
        assert np.abs(m.last_logits - la).max() > 1e-3
        follow = a[:1] + [{"role": "assistant", "content": "a picture"}, {"role": "user", "content": "and?"}]
        m.chat_completion(a, max_tokens=1, temperature=0)
        r = m.chat_completion(follow, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens >= span.end
        lf = m.last_logits.copy()
        eng, seq = m.engine, m.engine.new_sequence()
        try:
            ids = m.chat_prompt(a)
            eng.decode([(seq, np.asarray(ids[:span.start], np.int32), None)])
            eng.decode_rows(seq, np.asarray(ids[span.start:span.end], np.int32), span.rows, None)
            eng.decode([(seq, np.asarray(ids[span.end:], np.int32), None)])
            assert eng.keepable(seq, span.start + 5) == span.start
            assert eng.keepable(seq, span.end + 2) == span.end + 2
            eng.truncate(seq, span.start + 5)  # into the rows: refused at the next pass, not run as tokens
            with pytest.raises(InvalidArgumentError, match="embedding rows"):
                eng.decode([(seq, np.asarray(ids[span.start + 5:span.start + 6], np.int32))])
        finally:
            eng.free(seq)
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=1024, n_threads=1) as fresh:
        fresh.chat_completion(follow, max_tokens=1, temperature=0)
        np.testing.assert_array_equal(fresh.last_logits, lf)


def test_a_saved_state_keeps_the_image_rows(files):
    """A state saved after an image prompt records where the image's rows
    lie: loaded into another LLM, the same prompt goes on past the image,
    and a truncate into the rows is refused rather than run as the
    placeholder ids (the recurrent state could only come back that way)."""
    _, model, mm = files
    a = image_message(data_url(png(synthetic(40, 70, seed=1))))
    follow = a[:1] + [{"role": "assistant", "content": "a picture"}, {"role": "user", "content": "and?"}]
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=1024, n_threads=1) as m:
        span = m.chat_prompt(a).images[0]
        m.chat_completion(a, max_tokens=1, temperature=0)
        blob = m.save_state()
        m.chat_completion(follow, max_tokens=1, temperature=0)
        want = m.last_logits.copy()
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=1024, n_threads=1) as b:
        b.load_state(blob)
        assert b.sequence.rows == [(span.start, span.end)]
        assert b.engine.keepable(b.sequence, span.start + 5) == span.start
        r = b.chat_completion(follow, max_tokens=1, temperature=0)
        assert r.timings.cached_tokens >= span.end
        np.testing.assert_array_equal(b.last_logits, want)


@pytest.mark.parametrize("name", ["truncated png", "bomb 30000x30000", "svg", "empty", "not an image"])
def test_hostile_images_are_clear_errors(files, name):
    _, model, mm = files
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=256, n_threads=1) as m:
        with pytest.raises(ImageError):
            m.chat_completion(image_message(data_url(HOSTILE[name]())), max_tokens=1)


def test_llama_takes_the_generic_mtmd_chat_handler(files):
    """llama-cpp-python names no LFM2-VL handler: its MTMDChatHandler loads the mmproj."""
    from llminfer.compat.llama import Llama
    from llminfer.compat.llama_chat_format import MTMDChatHandler

    _, model, mm = files
    llm = Llama(model_path=model, chat_handler=MTMDChatHandler(clip_model_path=mm["F16"]), n_ctx=512,
                verbose=False)
    try:
        r = llm.create_chat_completion(image_message(data_url(png(synthetic(40, 70)))), max_tokens=2,
                                       temperature=0)
        assert r["usage"]["prompt_tokens"] > 77
    finally:
        llm.close()
