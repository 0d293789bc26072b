"""llminfer.vision: a Gemma 3 mmproj's preprocessing and encoder against
numbers computed here in numpy, images in chat prompts against the numpy
reference model, and hostile images."""

import io
import math

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import llminfer  # noqa: E402
from llminfer.errors import ImageError, InvalidArgumentError, UnsupportedModelError  # noqa: E402
from llminfer.vision import load_image, load_mmproj  # noqa: E402
from reference import ReferenceModel  # noqa: E402
from tiny_models import TinyConfig, TinyMmproj, write_mmproj, write_model  # noqa: E402
from images import GEMMA_TEMPLATE, HOSTILE, IMAGE_TOKENS, data_url, png, reference_file, synthetic  # noqa: E402

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    model = write_model(d / "gemma3.gguf", TinyConfig(arch="gemma3"),
                        extra_strings={"tokenizer.chat_template": GEMMA_TEMPLATE}, extra_tokens=IMAGE_TOKENS)
    mm = {q: write_mmproj(d / f"mmproj-{q}.gguf", TinyMmproj(qtype=q)) for q in ("F32", "F16", "Q8_0")}
    return d, model, mm


@pytest.fixture(scope="module")
def llm(files):
    d, model, mm = files
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=256, n_threads=1) as m:
        yield m


def test_preprocess_pads_and_normalises_as_computed_here(files):
    """A 56 x 28 image needs no resize into 56 x 56 (scale 1): it is centred
    on black (14 rows above), scaled to [0, 1] and normalised per channel."""
    _, _, mm = files
    enc = load_mmproj(mm["F32"])
    try:
        img = synthetic(28, 56)
        got = enc.preprocess(png(img))
        mean, std = np.array([0.5, 0.5, 0.5], np.float32), np.array([0.5, 0.5, 0.5], np.float32)
        want = np.zeros((56, 56, 3), np.float32)
        want[14:42] = img / np.float32(255)
        want = ((want - mean) / std).transpose(2, 0, 1)
        assert got.shape == (3, 56, 56) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    finally:
        enc.close()


def test_preprocess_keeps_aspect_ratio_rounding_up(files):
    """A constant 100 x 37 image: scale 0.56, resized to 56 x ceil(20.72) = 21
    rows, offset (56 - 21) // 2 = 17: the colour exactly there, black elsewhere."""
    _, _, mm = files
    enc = load_mmproj(mm["F32"])
    try:
        colour = np.array([200, 40, 90], np.uint8)
        got = enc.preprocess(png(np.broadcast_to(colour, (37, 100, 3))))
        norm = (colour / np.float32(255) - 0.5) / 0.5
        rows = np.flatnonzero(np.abs(got[0] - (-1.0)).max(axis=1) > 1e-6)
        assert rows.tolist() == list(range(17, 17 + math.ceil(37 * 56 / 100)))
        np.testing.assert_allclose(got[:, 17, 0], norm, atol=1e-6)
        np.testing.assert_allclose(got[:, 0, 0], [-1, -1, -1], atol=1e-6)
    finally:
        enc.close()


# ---- the encoder against numpy ----

def reference_encode(path, pixels):
    """The Gemma 3 graph in float64: the ViT, 2-D average pooling, RMS norm, projection."""
    md, t = reference_file(path)
    x, g, m, eps = reference_vit(md, t, pixels)
    E = x.shape[1]
    n = g // m
    pooled = np.zeros((n * n, E))
    for oy in range(n):
        for ox in range(n):
            pooled[oy * n + ox] = np.mean([x[(oy * m + a) * g + ox * m + b] for a in range(m) for b in range(m)], 0)
    pooled = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
    return pooled @ t["mm.input_projection.weight"]


def reference_idefics3_tile(path, pixels):
    """The Idefics3 graph of one tile in float64: the ViT, each m x m block
    of patches concatenated row-major into one row, the projection."""
    md, t = reference_file(path)
    x, g, m, _ = reference_vit(md, t, pixels)
    n = g // m
    rows = np.zeros((n * n, m * m * x.shape[1]))
    for oy in range(n):
        for ox in range(n):
            rows[oy * n + ox] = np.concatenate([x[(oy * m + a) * g + ox * m + b] for a in range(m) for b in range(m)])
    return rows @ t["mm.model.fc.weight"].T


def reference_vit(md, t, pixels):
    """The SigLIP ViT in float64: ([g*g, E] rows, g, scale factor, eps)."""
    S, ps = md["clip.vision.image_size"], md["clip.vision.patch_size"]
    E, H, eps = md["clip.vision.embedding_length"], md["clip.vision.attention.head_count"], \
        md["clip.vision.attention.layer_norm_epsilon"]
    m = md["clip.vision.projector.scale_factor"]
    g = S // ps
    W = t["v.patch_embd.weight"]  # [E, 3, p, p]
    x = np.zeros((g * g, E))
    for py in range(g):
        for px in range(g):
            patch = pixels[:, py * ps:(py + 1) * ps, px * ps:(px + 1) * ps].astype(np.float64)
            x[py * g + px] = np.einsum("ecij,cij->e", W, patch)
    x += t["v.patch_embd.bias"] + t["v.position_embd.weight"]

    def ln(v, w, b):
        mu = v.mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))

    D = E // H
    for i in range(md["clip.vision.block_count"]):
        T = lambda n: t[f"v.blk.{i}.{n}"]  # noqa: E731
        h = ln(x, T("ln1.weight"), T("ln1.bias"))
        q, k, v = (h @ T(f"attn_{n}.weight").T + T(f"attn_{n}.bias") for n in "qkv")
        out = np.zeros_like(h)
        for hh in range(H):
            sl = slice(hh * D, (hh + 1) * D)
            s = q[:, sl] @ k[:, sl].T / math.sqrt(D)
            s = np.exp(s - s.max(1, keepdims=True))
            out[:, sl] = (s / s.sum(1, keepdims=True)) @ v[:, sl]
        x = x + out @ T("attn_out.weight").T + T("attn_out.bias")
        h = ln(x, T("ln2.weight"), T("ln2.bias"))
        x = x + gelu(h @ T("ffn_up.weight").T + T("ffn_up.bias")) @ T("ffn_down.weight").T + T("ffn_down.bias")
    return ln(x, t["v.post_ln.weight"], t["v.post_ln.bias"]), g, m, eps


@pytest.mark.parametrize("qtype,tol", [("F32", 1e-3), ("F16", 1e-3), ("Q8_0", 2e-2)])
def test_encoder_matches_numpy_siglip(files, qtype, tol):
    _, _, mm = files
    enc = load_mmproj(mm[qtype], n_threads=2)
    try:
        pixels = enc.preprocess(png(synthetic(45, 60, seed=3)))
        got = enc.encode_pixels(pixels)
        want = reference_encode(mm[qtype], pixels)
        assert got.shape == want.shape == (4, 256)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < tol, f"{qtype}: max error {err:.2e} of the largest value"
    finally:
        enc.close()


@pytest.mark.parametrize("qtype,tol", [("F32", 1e-3), ("Q8_0", 2e-2)])
def test_idefics3_encoder_matches_numpy(tmp_path, qtype, tol):
    """Each tile's rows (2 x 2 tiles and the overview) against the float64
    graph, and the tiles are the image cut as mtmd cuts it."""
    mm = write_mmproj(tmp_path / "idefics3.gguf", TinyMmproj(projector="idefics3", qtype=qtype))
    enc = load_mmproj(mm, n_threads=2)
    try:
        img = synthetic(45, 60, seed=3)
        pixels = enc.preprocess(png(img))
        assert pixels.shape == (5, 3, 56, 56) and pixels.grid == (2, 2)  # 60 x 45 -> 112 x 84 -> 112 x 112
        refined = Image.fromarray(img).resize((112, 84), Image.LANCZOS).resize((112, 112), Image.LANCZOS)
        top_right = np.asarray(refined, np.float32)[:56, 56:] / 255
        assert np.allclose(pixels[1], ((top_right - 0.5) / 0.5).transpose(2, 0, 1))
        got = enc.encode_pixels(pixels)
        assert got.shape == (5 * 4, 256)
        for k in range(5):
            want = reference_idefics3_tile(mm, pixels[k])
            err = np.abs(got[4 * k:4 * k + 4] - want).max() / np.abs(want).max()
            assert err < tol, f"{qtype} tile {k}: max error {err:.2e} of the largest value"
    finally:
        enc.close()


@pytest.mark.parametrize("w,h,grid", [(60, 45, (2, 2)), (30, 100, (1, 2)), (200, 40, (2, 1)), (1000, 3, (2, 1))])
def test_idefics3_tiles_follow_the_longest_edge(tmp_path, w, h, grid):
    """112 on the longer side, the other to the aspect ratio (even, at
    least 2: a 1000 x 3 strip is not an empty image), in tiles of 56."""
    mm = write_mmproj(tmp_path / "idefics3.gguf", TinyMmproj(projector="idefics3"))
    enc = load_mmproj(mm)
    try:
        pixels = enc.preprocess(png(synthetic(h, w)))
        assert pixels.grid == grid and pixels.shape[0] == grid[0] * grid[1] + 1
    finally:
        enc.close()


def test_idefics3_without_its_preprocessing_size_is_refused(tmp_path):
    mm = write_mmproj(tmp_path / "old.gguf", TinyMmproj(projector="idefics3"),
                      meta={"clip.vision.preproc_image_size": 0})
    with pytest.raises(UnsupportedModelError, match="preproc_image_size"):
        load_mmproj(mm)


def test_swapped_ffn_names_are_read_as_llama_cpp_reads_them(files, tmp_path):
    """Old conversions stored up and down under each other's names; the
    encoder swaps them back, so both files give the same rows."""
    _, _, mm = files
    swapped = write_mmproj(tmp_path / "swapped.gguf", TinyMmproj(qtype="F32", swap_ffn=True))
    a, b = load_mmproj(mm["F32"]), load_mmproj(swapped)
    try:
        pixels = a.preprocess(png(synthetic(56, 56)))
        np.testing.assert_array_equal(a.encode_pixels(pixels), b.encode_pixels(pixels))
    finally:
        a.close()
        b.close()


def test_other_projector_types_are_refused_by_name(tmp_path):
    p = write_mmproj(tmp_path / "pixtral.gguf", TinyMmproj(), meta={"clip.projector_type": "pixtral"})
    with pytest.raises(UnsupportedModelError, match="pixtral"):
        load_mmproj(p)


def test_a_text_model_is_no_mmproj(files):
    _, model, _ = files
    with pytest.raises(UnsupportedModelError, match="not an mmproj"):
        load_mmproj(model)


def test_mmproj_of_another_width_is_refused(files, tmp_path):
    _, model, _ = files
    p = write_mmproj(tmp_path / "w128.gguf", TinyMmproj(n_embd_text=128))
    with pytest.raises(UnsupportedModelError, match="width 128"):
        llminfer.LLM(model, mmproj=p, n_ctx=64)


# ---- images in chat prompts ----

def image_message(url, text="what is this"):
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_image_prompt_logits_and_greedy_tokens_match_the_reference(files, llm):
    """The prompt's tokens around the image, its rows at the image's
    positions (unscaled), and the reference model given the same rows."""
    _, model, _ = files
    msgs = image_message(data_url(png(synthetic(40, 70))))
    ids = llm.chat_prompt(msgs)
    (span,) = ids.images
    begin = llm.tokenize("<start_of_image>", add_bos=False, special=True)
    end = llm.tokenize("<end_of_image>", add_bos=False, special=True)
    assert len(begin) == len(end) == 1
    assert ids[span.start - 1] == begin[0] and ids[span.end] == end[0] and len(span.rows) == 4
    ref = ReferenceModel(model)
    rows = {span.start + i: r for i, r in enumerate(span.rows)}
    out = llm.chat_completion(msgs, max_tokens=6, temperature=0)
    want = ref.logits(list(ids), rows=rows, both_ways=[(span.start, span.end)])[-1]
    tokens = llm.tokenize(out.text, add_bos=False, special=True)
    # the first token: the reference's argmax where its margin is clear
    top2 = np.sort(want)[-2:]
    if top2[1] - top2[0] > 0.05:
        assert tokens[0] == int(np.argmax(want))
    with llminfer.LLM(model, mmproj=files[2]["F32"], n_ctx=256, n_threads=1) as fresh:
        fresh.chat_completion(msgs, max_tokens=1, temperature=0)
        got = fresh.last_logits
    np.testing.assert_allclose(got, want, rtol=0, atol=0.005 * np.abs(want).max())


def test_the_image_changes_the_answer_and_repeats_reuse_the_context(llm):
    a = image_message(data_url(png(synthetic(40, 70, seed=1))))
    b = image_message(data_url(png(synthetic(40, 70, seed=2))))
    ra = llm.chat_completion(a, max_tokens=1, temperature=0)
    la = llm.last_logits
    span = llm.chat_prompt(a).images[0]
    ra2 = llm.chat_completion(a, max_tokens=1, temperature=0)
    assert ra2.timings.cached_tokens > span.end  # the same image: its positions are reused
    np.testing.assert_allclose(llm.last_logits, la, rtol=0, atol=1e-5)
    rb = llm.chat_completion(b, max_tokens=1, temperature=0)
    assert rb.timings.cached_tokens <= span.start  # another image at the same place is recomputed
    assert np.abs(llm.last_logits - la).max() > 1e-3
    assert ra.prompt_tokens == rb.prompt_tokens


def test_images_without_mmproj_are_refused(files):
    _, model, _ = files
    with llminfer.LLM(model, n_ctx=128) as m:
        with pytest.raises(InvalidArgumentError, match="mmproj"):
            m.chat_completion(image_message(data_url(png(synthetic(8, 8)))), max_tokens=1)


def test_http_urls_are_not_fetched(llm):
    with pytest.raises(ImageError, match="not fetched"):
        llm.chat_completion(image_message("https://example.com/cat.png"), max_tokens=1)


def test_formats_read(llm, tmp_path):
    img = synthetic(30, 30)
    out = {}
    for fmt in ("PNG", "JPEG", "WEBP", "GIF"):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, fmt)
        out[fmt] = llm.encode_image(buf.getvalue())
    assert all(v.shape == (4, 256) for v in out.values())
    # a GIF's first frame
    frames = [Image.fromarray(synthetic(30, 30, seed=s)) for s in (5, 6)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    one = io.BytesIO()
    frames[0].save(one, "GIF")
    np.testing.assert_array_equal(llm.encode_image(buf.getvalue()), llm.encode_image(one.getvalue()))
    path = tmp_path / "x.png"
    path.write_bytes(png(img))
    np.testing.assert_array_equal(llm.encode_image(str(path)), out["PNG"])


# ---- hostile images ----

@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_images_are_clear_errors(llm, name):
    data = HOSTILE[name]()
    with pytest.raises(ImageError):
        load_image(data)
    with pytest.raises(ImageError):
        llm.chat_completion(image_message(data_url(data)), max_tokens=1)


def test_bad_data_urls(llm):
    for url in ("data:image/png,rawbytes", "data:image/png;base64,@@@not base64@@@"):
        with pytest.raises(ImageError):
            llm.chat_completion(image_message(url), max_tokens=1)


# ---- the fronts: llama-cpp-python's Llama, the CLI ----

def test_llama_takes_mmproj_and_gemma3_chat_handler(files, llm):
    from llminfer import Llama
    from llminfer.compat.llama_chat_format import Gemma3ChatHandler

    _, model, mm = files
    msgs = image_message(data_url(png(synthetic(40, 70, seed=9))))
    llm.chat_completion(msgs, max_tokens=1, temperature=0)
    want = llm.last_logits
    for kw in ({"mmproj": mm["F32"]}, {"chat_handler": Gemma3ChatHandler(clip_model_path=mm["F32"])}):
        m = Llama(model_path=model, n_ctx=256, n_threads=1, verbose=False, **kw)
        try:
            out = m.create_chat_completion(msgs, max_tokens=1, temperature=0)
            assert out["usage"]["prompt_tokens"] == len(llm.chat_prompt(msgs))
            np.testing.assert_allclose(m.llm.last_logits, want, rtol=0, atol=1e-5)
        finally:
            m.close()


def test_cli_run_with_an_image(files, tmp_path, capsys):
    from llminfer.cli import commands as cli

    _, model, mm = files
    img = tmp_path / "cat.png"
    img.write_bytes(png(synthetic(20, 20)))
    code = cli.main(["run", "-m", model, "--mmproj", mm["F16"], "--image", str(img), "-p", "what is it",
                     "-n", "3", "--temp", "0", "-c", "256"])
    assert code == 0
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    code = cli.main(["run", "-m", model, "--mmproj", mm["F16"], "--image", str(bad), "-p", "x", "-n", "1",
                     "-c", "256"])
    err = capsys.readouterr().err
    assert code != 0 and "no image" in err
    code = cli.main(["run", "-m", model, "--image", str(img), "-p", "x"])
    assert code != 0 and "--mmproj" in capsys.readouterr().err


def test_decode_rows_logits_at_an_image_position_match_the_reference(files, llm):
    """The logits at an image's last row read that row's own residual: rows
    scaled as token embeddings are (Gemma's sqrt(n_embd)) would show here."""
    _, model, _ = files
    msgs = image_message(data_url(png(synthetic(33, 47, seed=4))))
    ids = llm.chat_prompt(msgs)
    (span,) = ids.images
    eng = llm.engine
    seq = eng.new_sequence()
    try:
        eng.decode([(seq, np.asarray(ids[:span.start], np.int32), None)])
        out = np.empty(eng.spec.n_vocab, np.float32)
        eng.decode_rows(seq, np.asarray(ids[span.start:span.end], np.int32), span.rows, out, causal=False)
    finally:
        eng.free(seq)
    rows = {span.start + i: r for i, r in enumerate(span.rows)}
    want = ReferenceModel(model).logits(list(ids[:span.end]), rows=rows, both_ways=[(span.start, span.end)])[-1]
    np.testing.assert_allclose(out, want, rtol=0, atol=0.03 * np.abs(want).max())  # Q8_0 weights, f16 KV


def test_image_rows_see_each_other_both_ways(tmp_path):
    """F32 weights, so that the engine is much nearer the reference than the
    causal and the non-causal graphs are to each other: the rows' logits
    after the image are the non-causal reference's (llama.cpp's Gemma 3)."""
    model = write_model(tmp_path / "f32.gguf", TinyConfig(arch="gemma3", qtype="F32", embd_qtype="F32"),
                        extra_strings={"tokenizer.chat_template": GEMMA_TEMPLATE}, extra_tokens=IMAGE_TOKENS)
    mm = write_mmproj(tmp_path / "mm.gguf", TinyMmproj(qtype="F32", n_merge=1))  # 16 rows
    with llminfer.LLM(model, mmproj=mm, n_ctx=256, n_threads=2, kv_type="f32") as m:
        msgs = image_message(data_url(png(synthetic(50, 50, seed=8))))
        ids = m.chat_prompt(msgs)
        (span,) = ids.images
        m.chat_completion(msgs, max_tokens=1, temperature=0)
        got = m.last_logits
    ref = ReferenceModel(model)
    rows = {span.start + i: r for i, r in enumerate(span.rows)}
    both = ref.logits(list(ids), rows=rows, both_ways=[(span.start, span.end)])[-1]
    causal = ref.logits(list(ids), rows=rows)[-1]
    err, gap = np.abs(got - both).max(), np.abs(both - causal).max()
    assert err < 0.1 * gap, (err, gap)


def test_chat_repl_image_command(files, tmp_path, capsys):
    """/image PATH puts the image in the next message: the reply is the
    library's to the same messages; a bad file is said at once and dropped."""
    from llminfer.cli.chat_repl import repl
    from cli_runs import Script

    _, model, mm = files
    img = tmp_path / "cat.png"
    img.write_bytes(png(synthetic(30, 40, seed=11)))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"no image")
    msgs = [{"role": "user", "content": [{"type": "image", "image": str(img)}, {"type": "text", "text": "what"}]}]
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=256, n_threads=1) as fresh:
        want = fresh.chat(msgs, max_tokens=4, temperature=0)
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=256, n_threads=1) as m:
        assert repl(m, max_tokens=4, sampling={"temperature": 0},
                    input_fn=Script(f"/image {bad}", f"/image {img}", "what")) == 0
        assert m.tokens[:len(m.chat_prompt(msgs))] == list(m.chat_prompt(msgs))
    out = capsys.readouterr().out
    assert "no image" in out and f"(image {img} goes with your next message)" in out
    assert out.endswith(want + "\n\n")
    with llminfer.LLM(model, n_ctx=256, n_threads=1) as blind:
        assert repl(blind, max_tokens=2, input_fn=Script(f"/image {img}")) == 0
    assert "--mmproj" in capsys.readouterr().out


def test_an_mmproj_with_a_nan_is_a_numerical_error(files, tmp_path):
    from llminfer.errors import NumericalError

    _, model, _ = files

    def poison(name, data, t):
        if name == "mm.input_projection.weight":
            data = data.copy()
            data[0, 0] = np.nan
        return data, t

    mm = write_mmproj(tmp_path / "nan.gguf", TinyMmproj(qtype="F32"), tensor_hook=poison)
    with llminfer.LLM(model, mmproj=mm, n_ctx=256, n_threads=1) as m:
        with pytest.raises(NumericalError):
            m.chat_completion(image_message(data_url(png(synthetic(20, 20)))), max_tokens=1)


def test_decode_rows_checks_its_logits(llm):
    """Rows that end a prompt give its logits: a NaN among them is a
    NumericalError there, not a token drawn from NaNs."""
    from llminfer.errors import NumericalError

    eng = llm.engine
    seq = eng.new_sequence()
    try:
        rows = np.zeros((3, eng.spec.n_embd), np.float32)
        rows[1, 5] = np.nan
        with pytest.raises(NumericalError):
            eng.decode_rows(seq, np.zeros(3, np.int32), rows, np.empty(eng.spec.n_vocab, np.float32), causal=False)
    finally:
        eng.free(seq)


def test_idefics3_of_too_many_tiles_is_refused(tmp_path):
    mm = write_mmproj(tmp_path / "huge.gguf", TinyMmproj(projector="idefics3"),
                      meta={"clip.vision.preproc_image_size": 56 * 9})
    with pytest.raises(UnsupportedModelError, match="tiles"):
        load_mmproj(mm)
