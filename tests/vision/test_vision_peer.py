"""Gemma 3, Idefics3, Gemma 4, LFM2-VL, Qwen2.5-VL and Qwen3-VL image embeddings and prompt layout against
llama.cpp's libmtmd, on the same tiny random files: tests/c/mtmd_embed.c, compiled here against a
llama.cpp build (its include folders and build/bin with libmtmd.so), runs
mtmd_tokenize and mtmd_encode_chunk on one raw RGB image. Skipped without
a build ($LLAMA_CPP_DIR, or /work/peer/*/vendor/llama.cpp) or a C compiler.

Tolerance, max |ours - mtmd| over max |mtmd|: 2e-3 with F32 and F16
weights (ggml's f16 GELU table and summation order on both sides), 2e-2
with Q8_0 (both quantize the activations to Q8_0, in blocks that differ);
the same for Gemma 4's and LFM2-VL's rows."""

import glob
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from llminfer.vision import load_mmproj  # noqa: E402
from llminfer.vision.prompt import lay_out  # noqa: E402
from images import GEMMA_TEMPLATE, IDEFICS3_TOKENS, IMAGE_TOKENS, png, synthetic  # noqa: E402
from tiny_models import TinyConfig, TinyMmproj, write_mmproj, write_model  # noqa: E402

pytestmark = pytest.mark.peer_tools
TOL = {"F32": 2e-3, "F16": 2e-3, "Q8_0": 2e-2}
SIZES = [(40, 70), (37, 100), (56, 56), (200, 300), (13, 9)]  # (height, width)


def find_llama_cpp():
    d = os.environ.get("LLAMA_CPP_DIR")
    if d:
        return Path(d)
    found = sorted(glob.glob("/work/peer/*/vendor/llama.cpp/build/bin/libmtmd.so"))
    return Path(found[0]).parents[2] if found else None


@pytest.fixture(scope="module")
def mtmd(tmp_path_factory):
    root = find_llama_cpp()
    cc = shutil.which("cc") or shutil.which("gcc")
    if root is None or not (root / "build/bin/libmtmd.so").exists() or cc is None:
        pytest.skip("no llama.cpp build with libmtmd (set LLAMA_CPP_DIR) or no C compiler")
    exe = tmp_path_factory.mktemp("mtmd") / "mtmd_embed"
    src = Path(__file__).parents[1] / "c" / "mtmd_embed.c"
    lib = root / "build/bin"
    r = subprocess.run([cc, "-O1", "-o", str(exe), str(src), f"-I{root / 'include'}", f"-I{root / 'ggml/include'}",
                        f"-I{root / 'tools/mtmd'}", f"-L{lib}", "-lmtmd", "-lllama", "-lggml", "-lggml-base",
                        f"-Wl,-rpath,{lib}"], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"mtmd_embed.c does not build against {root}: {r.stderr[-400:]}")
    return exe


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision_peer")
    # "default": the pre-tokenizer name llama.cpp still knows
    model = write_model(d / "gemma3.gguf", TinyConfig(arch="gemma3", pre="default"),
                        extra_strings={"tokenizer.chat_template": GEMMA_TEMPLATE}, extra_tokens=IMAGE_TOKENS)
    return d, model, {q: write_mmproj(d / f"mmproj-{q}.gguf", TinyMmproj(qtype=q)) for q in TOL}


def mtmd_layout(chunks) -> list:
    """mtmd's prompt as token ids with "img" for each of an image's rows."""
    want = []
    for c in chunks:
        want += [int(t) for t in c[1:]] if c[0] == "text" else ["img"] * int(c[1])
    return want


def our_layout(llm, prompt, images):
    """(lay_out's ids for the prompt and images, those ids with "img" for each image row)."""
    ids = lay_out(prompt, images, llm._vision, lambda t, bos: llm.tokenize(t, add_bos=bos, special=True),
                  llm._image_rows, True)
    inside = {p for s in ids.images for p in range(s.start, s.end)}
    return ids, [t if p not in inside else "img" for p, t in enumerate(ids)]


def run_mtmd(exe, model, mm, img, prompt, out):
    raw = out.with_suffix(".rgb")
    np.ascontiguousarray(img, np.uint8).tofile(raw)
    r = subprocess.run([str(exe), model, mm, str(raw), str(img.shape[1]), str(img.shape[0]), prompt, str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    chunks = [line.split() for line in Path(f"{out}.tokens").read_text().splitlines()]
    return chunks, np.fromfile(f"{out}.embd", np.float32)


@pytest.mark.parametrize("qtype", sorted(TOL))
def test_image_embeddings_match_mtmd(mtmd, files, qtype):
    d, model, mm = files
    enc = load_mmproj(mm[qtype])
    try:
        for i, (h, w) in enumerate(SIZES):
            img = synthetic(h, w, seed=10 + i)
            _, peer = run_mtmd(mtmd, model, mm[qtype], img, "<__media__>", d / f"out-{qtype}-{i}")
            peer = peer.reshape(-1, enc.n_embd_out)
            ours = enc.encode(png(img))
            assert ours.shape == peer.shape
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        enc.close()


def test_prompt_layout_matches_mtmd(mtmd, files):
    """The tokens around the image and the image's count are mtmd's, and
    mtmd asks for non-causal attention over a Gemma 3 image (which we do
    not do: docs/python.md)."""
    import llminfer

    d, model, mm = files
    img = synthetic(30, 30)
    prompt = "<start_of_turn>user\nwhat is<__media__>this<end_of_turn>\n"
    chunks, _ = run_mtmd(mtmd, model, mm["F16"], img, prompt, d / "layout")
    want = mtmd_layout(chunks)
    assert [c for c in chunks if c[0] == "image"] == [["image", "4", "1"]]  # 1: non-causal
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=128, n_threads=1) as llm:
        ids, masked = our_layout(llm, prompt, [png(img)])
    (span,) = ids.images
    assert masked == want


@pytest.mark.parametrize("seed,h,w", [(5, 40, 70), (6, 56, 56), (7, 30, 90)])
def test_logits_after_an_image_prompt_match_llama_cpp(mtmd, files, seed, h, w):
    """The whole path (layout, rows, decode) against llama.cpp decoding the
    same chunks with the image's rows as input embeddings, attention over
    them non-causal as mtmd asks for Gemma 3: closer to that run than to a
    causal one (the tiny model's logits move little either way)."""
    import llminfer

    d, model, mm = files
    img = synthetic(h, w, seed=seed)
    prompt = "<start_of_turn>user\nwhat is<__media__>this<end_of_turn>\n<start_of_turn>model\n"
    out = {}
    np.ascontiguousarray(img).tofile(d / "lg.rgb")
    for mode in ("causal", "noncausal"):
        argv = [str(mtmd), model, mm["F16"], str(d / "lg.rgb"), str(w), str(h), prompt, str(d / mode), mode]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        out[mode] = np.fromfile(f"{d / mode}.logits", np.float32)
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=256, n_threads=1) as llm:
        ids, _ = our_layout(llm, prompt, [png(img)])
        llm.complete(ids, max_tokens=1, temperature=0)
        ours = llm.last_logits
    scale = np.abs(out["noncausal"]).max()
    err = {mode: np.abs(ours - v).max() / scale for mode, v in out.items()}
    assert err["noncausal"] < 1.5e-3, err
    assert err["noncausal"] < 0.6 * err["causal"], err
    assert np.argmax(ours) == np.argmax(out["noncausal"])


# ---- Idefics3 (SmolVLM): tiles, pixel shuffle, one projection ----

IDEFICS3_SIZES = [(40, 70), (100, 30), (56, 56), (13, 9), (120, 200)]  # (height, width): 2x2, 1x2, 2x2 ... tiles


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    d = tmp_path_factory.mktemp("idefics3_peer")
    model = write_model(d / "smolvlm.gguf", TinyConfig(pre="default"), extra_tokens=IDEFICS3_TOKENS)
    return d, model, {q: write_mmproj(d / f"mmproj-idefics3-{q}.gguf", TinyMmproj(projector="idefics3", qtype=q))
                      for q in ("F32", "Q8_0")}


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_idefics3_layout_and_rows_match_mtmd(mtmd, idefics3, qtype):
    """Each image's tiles (a grid of 1 x 2 to 2 x 2 and the overview) in
    mtmd's order and text around them, token for token, and every tile's
    rows within TOL of mtmd's, for images of several aspect ratios."""
    import llminfer

    d, model, mm = idefics3
    prompt = "what is<__media__>this"
    with llminfer.LLM(model, mmproj=mm[qtype], n_ctx=512, n_threads=1) as llm:
        for i, (h, w) in enumerate(IDEFICS3_SIZES):
            img = synthetic(h, w, seed=20 + i)
            chunks, peer = run_mtmd(mtmd, model, mm[qtype], img, prompt, d / f"idf-{qtype}-{i}")
            want = mtmd_layout(chunks)
            assert all(c[2] == "0" for c in chunks if c[0] == "image")  # causal, as text
            ids, masked = our_layout(llm, prompt, [png(img)])
            assert masked == want, (h, w)
            ours = np.concatenate([s.rows for s in ids.images])
            peer = peer.reshape(-1, llm._vision.n_embd_out)
            assert ours.shape == peer.shape
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"


@pytest.mark.parametrize("seed,h,w", [(8, 40, 70), (9, 100, 30)])
def test_idefics3_logits_after_an_image_prompt_match_llama_cpp(mtmd, idefics3, seed, h, w):
    """The whole path (tiles, layout, rows, causal decode) against llama.cpp
    decoding mtmd's chunks with the tiles' rows as input embeddings. The
    tiny random llama model magnifies small differences: its logits move
    ~2.5e-3 of their largest between our rows and mtmd's (6e-4 apart) under
    our decode, and as much between our decode and llama.cpp's on mtmd's
    rows; another image moves them ~20 times that."""
    import llminfer
    from llminfer.vision.prompt import ImageSpan, PromptIds

    d, model, mm = idefics3
    img = synthetic(h, w, seed=seed)
    prompt = "what is<__media__>this picture"
    np.ascontiguousarray(img).tofile(d / "idf-lg.rgb")
    argv = [str(mtmd), model, mm["F32"], str(d / "idf-lg.rgb"), str(w), str(h), prompt, str(d / "idf-lg"), "causal"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    peer = np.fromfile(f"{d / 'idf-lg'}.logits", np.float32)
    peer_rows = np.fromfile(f"{d / 'idf-lg'}.embd", np.float32)
    scale = np.abs(peer).max()
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=256, n_threads=1) as llm:
        def logits(image, rows=None):
            ids, _ = our_layout(llm, prompt, [png(image)])
            if rows is not None:  # the same prompt with mtmd's rows in the image's positions
                rows = rows.reshape(-1, llm._vision.n_embd_out)
                ids2, at = PromptIds(ids), np.cumsum([0] + [len(s.rows) for s in ids.images])
                ids2.images = tuple(ImageSpan(s.start, f"mtmd/{k}", rows[at[k]:at[k + 1]])
                                    for k, s in enumerate(ids.images))
                ids = ids2
            llm.complete(ids, max_tokens=1, temperature=0)
            return llm.last_logits.copy()

        ours, with_mtmd_rows = logits(img), logits(img, peer_rows)
        other = logits(synthetic(h, w, seed=seed + 50))
    assert np.abs(ours - with_mtmd_rows).max() / scale < 5e-3
    err = np.abs(ours - peer).max() / scale
    assert err < 5e-3 and np.abs(other - peer).max() / scale > 8 * err
    assert np.argmax(ours) == np.argmax(peer)


def test_idefics3_generation_runs_through_the_library(idefics3):
    """LLM(mmproj=) with an idefics3 projector: a chat with an image runs,
    its prompt holds every tile's rows, and another image moves the logits."""
    import llminfer
    from images import data_url

    d, model, mm = idefics3
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=512, n_threads=1) as llm:
        logits = []
        for seed in (1, 2):
            msgs = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {
                "url": data_url(png(synthetic(40, 70, seed=seed)))}}]}]
            ids = llm.chat_prompt(msgs)
            assert sum(len(s.rows) for s in ids.images) == 5 * llm._vision.n_tokens  # 2 x 2 tiles + overview
            r = llm.chat_completion(msgs, max_tokens=2, temperature=0)
            assert r.prompt_tokens == len(ids)
            llm.complete(ids, max_tokens=1, temperature=0)
            logits.append(llm.last_logits.copy())
        assert np.abs(logits[0] - logits[1]).max() > 1e-4


# ---- Gemma 4 (gemma4v): dynamic size, 2-D RoPE tower, rows both ways in the sliding layers ----

G4_SIZES = [(40, 70), (90, 31), (56, 56), (300, 200), (13, 9)]  # (height, width): 77 to 950 cells


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    from images import gemma4_text_model
    from tiny_models import TinyGemma4v, write_gemma4v_mmproj

    d = tmp_path_factory.mktemp("gemma4v_peer")
    model = gemma4_text_model(d / "gemma4.gguf", qtype="F32")
    return d, model, {q: write_gemma4v_mmproj(d / f"mmproj-g4-{q}.gguf", TinyGemma4v(qtype=q)) for q in TOL}


@pytest.mark.parametrize("qtype", sorted(TOL))
def test_gemma4_rows_match_mtmd(mtmd, gemma4, qtype):
    """Each image's cell count (mtmd's smart resize: 77 to 950 cells) and
    rows within TOL of mtmd's, for images of several sizes and aspect
    ratios."""
    d, model, mm = gemma4
    enc = load_mmproj(mm[qtype])
    try:
        for i, (h, w) in enumerate(G4_SIZES):
            img = synthetic(h, w, seed=30 + i)
            _, peer = run_mtmd(mtmd, model, mm[qtype], img, "<__media__>", d / f"g4-{qtype}-{i}")
            peer = peer.reshape(-1, enc.n_embd_out)
            ours = enc.encode(png(img))
            assert ours.shape == peer.shape, (h, w)
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        enc.close()


def test_gemma4_layout_matches_mtmd(mtmd, gemma4):
    """The tokens around the image ("<|image>", "<image|>") and its row
    count are mtmd's, and mtmd asks for non-causal attention over it (the
    tiny model is 256 wide: not E2B or E4B)."""
    import llminfer

    d, model, mm = gemma4
    img = synthetic(40, 70)
    prompt = "<start_of_turn>user\nwhat is<__media__>this<end_of_turn>\n"
    chunks, _ = run_mtmd(mtmd, model, mm["F16"], img, prompt, d / "g4-layout")
    want = mtmd_layout(chunks)
    assert [c for c in chunks if c[0] == "image"] == [["image", "84", "1"]]
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as llm:
        assert llm._vision.non_causal
        ids, masked = our_layout(llm, prompt, [png(img)])
    (span,) = ids.images
    assert masked == want


@pytest.mark.parametrize("seed,h,w", [(5, 40, 70), (6, 56, 56), (7, 30, 90)])
def test_gemma4_logits_and_greedy_tokens_match_llama_cpp(mtmd, gemma4, seed, h, w):
    """The whole path (preprocessing, rows, layout, decode with the rows
    both ways in the sliding-window layers) against llama.cpp decoding
    mtmd's chunks: the logits after the prompt nearer its non-causal run
    than its causal one, and the greedy tokens the same while llama.cpp's
    margin between its two best is at least 0.25."""
    import llminfer

    d, model, mm = gemma4
    img = synthetic(h, w, seed=seed)
    prompt = "<start_of_turn>user\nwhat is<__media__>this<end_of_turn>\n<start_of_turn>model\n"
    np.ascontiguousarray(img).tofile(d / "g4lg.rgb")
    out, gen = {}, None
    for mode in ("causal", "noncausal"):
        argv = [str(mtmd), model, mm["F32"], str(d / "g4lg.rgb"), str(w), str(h), prompt, str(d / f"g4-{mode}"), mode,
                "8"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out[mode] = np.fromfile(f"{d / f'g4-{mode}'}.logits", np.float32)
        if mode == "noncausal":
            gen = [(int(a), float(b)) for a, b in (line.split() for line in
                                                    Path(f"{d / 'g4-noncausal'}.gen").read_text().splitlines())]
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=512, n_threads=1) as llm:
        ids, _ = our_layout(llm, prompt, [png(img)])
        llm.complete(ids, max_tokens=1, temperature=0)
        ours = llm.last_logits.copy()
        tokens = llm.complete(ids, max_tokens=len(gen), temperature=0).tokens
        eog = set(llm.tokenizer.eog_ids)
    scale = np.abs(out["noncausal"]).max()
    err = {mode: np.abs(ours - v).max() / scale for mode, v in out.items()}
    assert err["noncausal"] < 3e-3 and err["noncausal"] < 0.1 * err["causal"], err
    for k, (tok, margin) in enumerate(gen):
        if margin < 0.25:
            break
        if k == len(tokens):  # ours ended at an end-of-generation token: llama.cpp drew one there too
            assert tok in eog, (k, tokens, gen)
            break
        assert tokens[k] == tok, (k, tokens, gen)


# ---- LFM2-VL (lfm2): smart resize or tiles and a thumbnail, resized positions, unshuffle and MLP ----

# (height, width): 11 x 7 cells, 7 x 10, 3 x 2 tiles and a thumbnail, 64-cell minimum, a 1:200 strip
LFM2_SIZES = [(40, 70), (300, 200), (700, 1000), (13, 9), (3, 600)]


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    from images import lfm2_text_model
    from tiny_models import LFM2_MMPROJ

    d = tmp_path_factory.mktemp("lfm2_peer")
    model = lfm2_text_model(d / "lfm2.gguf", qtype="F32", embd_qtype="F32", tie_output=False)
    return d, model, {q: write_mmproj(d / f"mmproj-lfm2-{q}.gguf", TinyMmproj(**LFM2_MMPROJ, qtype=q)) for q in TOL}


@pytest.mark.parametrize("qtype", sorted(TOL))
def test_lfm2_layout_and_rows_match_mtmd(mtmd, lfm2, qtype):
    """Each image's pieces (one, or 3 x 2 tiles and the thumbnail) in mtmd's
    order and the text around them, token for token, causal as text, and
    every piece's rows within TOL of mtmd's."""
    import llminfer

    d, model, mm = lfm2
    prompt = "what is<__media__>this"
    with llminfer.LLM(model, mmproj=mm[qtype], n_ctx=4096, n_threads=1) as llm:
        for i, (h, w) in enumerate(LFM2_SIZES):
            img = synthetic(h, w, seed=40 + i)
            chunks, peer = run_mtmd(mtmd, model, mm[qtype], img, prompt, d / f"lfm2-{qtype}-{i}")
            want = mtmd_layout(chunks)
            assert all(c[2] == "0" for c in chunks if c[0] == "image")  # causal, as text
            ids, masked = our_layout(llm, prompt, [png(img)])
            assert masked == want, (h, w)
            ours = np.concatenate([s.rows for s in ids.images])
            peer = peer.reshape(-1, llm._vision.n_embd_out)
            assert ours.shape == peer.shape
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"


@pytest.mark.parametrize("seed,h,w", [(5, 40, 70), (6, 56, 56), (7, 30, 90)])
def test_lfm2_logits_and_greedy_tokens_match_llama_cpp(mtmd, lfm2, seed, h, w):
    """The whole path (preprocessing, rows, layout, the hybrid's decode of
    the rows and the text after them) against llama.cpp decoding mtmd's
    chunks: the logits after the prompt within 2e-3 of its largest (another
    image moves them 50 times that), and the greedy tokens the same at every
    step up to the first where they differ, which must be one where
    llama.cpp's margin between its two best is under 0.25."""
    import llminfer

    d, model, mm = lfm2
    img = synthetic(h, w, seed=seed)
    prompt = "<|im_start|>user\nwhat is<__media__>this<|im_end|>\n<|im_start|>assistant\n"
    np.ascontiguousarray(img).tofile(d / "lfm2lg.rgb")
    argv = [str(mtmd), model, mm["F32"], str(d / "lfm2lg.rgb"), str(w), str(h), prompt, str(d / "lfm2lg"), "causal",
            "8"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    peer = np.fromfile(f"{d / 'lfm2lg'}.logits", np.float32)
    gen = [(int(a), float(b)) for a, b in
           (line.split() for line in Path(f"{d / 'lfm2lg'}.gen").read_text().splitlines())]
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=512, n_threads=1) as llm:
        def prompt_ids(image):
            return our_layout(llm, prompt, [png(image)])[0]

        ids = prompt_ids(img)
        llm.complete(ids, max_tokens=1, temperature=0)
        ours = llm.last_logits.copy()
        tokens = llm.complete(ids, max_tokens=len(gen), temperature=0).tokens
        eog = set(llm.tokenizer.eog_ids)
        llm.complete(prompt_ids(synthetic(h, w, seed=seed + 50)), max_tokens=1, temperature=0)
        other = llm.last_logits.copy()
    scale = np.abs(peer).max()
    err = np.abs(ours - peer).max() / scale
    assert err < 2e-3 and np.abs(other - peer).max() / scale > 50 * err, err
    for k, (tok, margin) in enumerate(gen):
        if k == len(tokens):  # ours ended at an end-of-generation token: llama.cpp drew one there too
            assert tok in eog, (k, tokens, gen)
            break
        if tokens[k] != tok:
            assert margin < 0.25, (k, tokens, gen)
            break


# (height, width): grids of 8 x 1, 4 x 2 and 3 x 3 (ties between ratios broken by area), 2 x 2,
# no tiles (22.5 cells a side round half to even), 2 x 2 (23.5 rounds up), 1 x 7
LFM2_GRIDS = [(600, 5000), (1024, 2048), (3000, 3000), (900, 900), (720, 720), (720, 752), (2000, 300)]


def test_lfm2_tile_grids_match_mtmd(mtmd, lfm2):
    """Whether an image is tiled and into which grid, as the markers
    around each tile's rows say, token for token (images passed as decoded
    pictures: a noise PNG of 3000 x 3000 is more bytes than an image may be)."""
    import llminfer
    from PIL import Image

    d, model, mm = lfm2
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=4096, n_threads=1) as llm:
        for i, (h, w) in enumerate(LFM2_GRIDS):
            img = synthetic(h, w, seed=60 + i)
            chunks, _ = run_mtmd(mtmd, model, mm["F32"], img, "<__media__>", d / f"lfm2-grid-{i}")
            want = mtmd_layout(chunks)
            ids, masked = our_layout(llm, "<__media__>", [Image.fromarray(img)])
            assert masked == want, (h, w)


# ---- Qwen2.5-VL (qwen2.5vl_merger): dynamic size, window attention, M-RoPE positions in the text model ----

# ggml's conv turns the pixels into F16 (im2col beside F16 kernels), and its
# flash attention the keys and values, which we do not: up to 3.2e-3 of the
# rows' largest after the tiny tower (whose q and k are twice the usual
# scale), where we are within 4e-4 of the float64 graph
# (test_vision_qwen25vl); with Q8_0 weights mtmd quantizes each product's
# activations to Q8_0 too (our products are float): up to 5e-2
QWEN_TOL = {"F32": 4e-3, "F16": 4e-3, "Q8_0": 6e-2}
QWEN_SIZES = [(200, 300), (56, 56), (40, 70), (300, 130), (13, 9)]  # (height, width): 9 to 77 cells


@pytest.fixture(scope="module")
def qwen25vl(tmp_path_factory):
    from images import qwen2vl_text_model
    from tiny_models import TinyQwen25vl, write_qwen25vl_mmproj

    d = tmp_path_factory.mktemp("qwen25vl_peer")
    model = qwen2vl_text_model(d / "qwen2vl.gguf", qtype="F32", embd_qtype="F32")
    return d, model, {q: write_qwen25vl_mmproj(d / f"mmproj-qwen-{q}.gguf", TinyQwen25vl(qtype=q))
                      for q in QWEN_TOL}


@pytest.mark.parametrize("qtype", sorted(QWEN_TOL))
def test_qwen25vl_rows_match_mtmd(mtmd, qwen25vl, qtype):
    """Each image's cell count (mtmd's smart resize, 8 to 4096 cells) and
    rows within QWEN_TOL of mtmd's, for images of several sizes and aspect
    ratios (one window of 4 x 4 cells, or several, some cut short)."""
    d, model, mm = qwen25vl
    enc = load_mmproj(mm[qtype])
    try:
        for i, (h, w) in enumerate(QWEN_SIZES):
            img = synthetic(h, w, seed=40 + i)
            _, peer = run_mtmd(mtmd, model, mm[qtype], img, "<__media__>", d / f"qw-{qtype}-{i}")
            peer = peer.reshape(-1, enc.n_embd_out)
            ours = enc.encode(png(img))
            assert ours.shape == peer.shape, (h, w)
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < QWEN_TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        enc.close()


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_qwen2vl_rows_match_mtmd(mtmd, qwen25vl, qtype):
    """Qwen2-VL's tower (qwen2vl_merger: LayerNorms, gelu_quick, no
    windows): rows within QWEN_TOL of mtmd's (observed 1.5e-3 and 2.8e-2)."""
    from tiny_models import TinyQwen25vl, write_qwen25vl_mmproj

    d, model, _ = qwen25vl
    mm = write_qwen25vl_mmproj(d / f"mmproj-qwen2-{qtype}.gguf", TinyQwen25vl(qtype=qtype, projector="qwen2vl_merger"))
    enc = load_mmproj(mm)
    try:
        for i, (h, w) in enumerate(QWEN_SIZES):
            img = synthetic(h, w, seed=50 + i)
            _, peer = run_mtmd(mtmd, model, mm, img, "<__media__>", d / f"q2-{qtype}-{i}")
            peer = peer.reshape(-1, enc.n_embd_out)
            ours = enc.encode(png(img))
            assert ours.shape == peer.shape, (h, w)
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < QWEN_TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        enc.close()


def test_qwen25vl_layout_matches_mtmd(mtmd, qwen25vl):
    """The tokens around the image ("<|vision_start|>", "<|vision_end|>")
    and its row count are mtmd's, decoded causally."""
    import llminfer

    d, model, mm = qwen25vl
    img = synthetic(40, 70)
    prompt = "<|im_start|>user\nwhat is<__media__>this<|im_end|>\n"
    chunks, _ = run_mtmd(mtmd, model, mm["F16"], img, prompt, d / "qw-layout")
    want = mtmd_layout(chunks)
    assert [c for c in chunks if c[0] == "image"] == [["image", "12", "0"]]
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=512, n_threads=1) as llm:
        assert not llm._vision.non_causal
        ids, masked = our_layout(llm, prompt, [png(img)])
    (span,) = ids.images
    assert span.grid == (4, 3)
    assert masked == want


@pytest.mark.parametrize("seed,h,w", [(5, 200, 300), (6, 56, 56), (7, 90, 40)])
def test_qwen25vl_logits_and_greedy_tokens_match_llama_cpp(mtmd, qwen25vl, seed, h, w):
    """The whole path (preprocessing, rows, layout, decode with the image's
    M-RoPE positions and the text after it moved on by max(nx, ny)) against
    llama.cpp decoding mtmd's chunks through mtmd's helper: the logits
    after the prompt within 3e-3 of its largest, under a tenth of how far
    the same rows at plain positions land, and the greedy tokens the same
    while llama.cpp's margin between its two best is at least 0.25."""
    import llminfer
    from llminfer.vision.prompt import ImageSpan, PromptIds

    d, model, mm = qwen25vl
    img = synthetic(h, w, seed=seed)
    prompt = "<|im_start|>user\nwhat is<__media__>this<|im_end|>\n<|im_start|>assistant\n"
    np.ascontiguousarray(img).tofile(d / "qwlg.rgb")
    argv = [str(mtmd), model, mm["F32"], str(d / "qwlg.rgb"), str(w), str(h), prompt, str(d / "qw-helper"), "helper",
            "8"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    peer = np.fromfile(f"{d / 'qw-helper'}.logits", np.float32)
    gen = [(int(a), float(b)) for a, b in (line.split() for line in
                                            Path(f"{d / 'qw-helper'}.gen").read_text().splitlines())]
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=512, n_threads=1) as llm:
        ids, _ = our_layout(llm, prompt, [png(img)])
        llm.complete(ids, max_tokens=1, temperature=0)
        ours = llm.last_logits.copy()
        tokens = llm.complete(ids, max_tokens=len(gen), temperature=0).tokens
        eog = set(llm.tokenizer.eog_ids)
        (span,) = ids.images
        flat = PromptIds(ids)  # the same rows without their grid: plain positions
        flat.images = (ImageSpan(span.start, "flat", np.asarray(span.rows)),)
        llm.complete(flat, max_tokens=1, temperature=0)
        plain = llm.last_logits.copy()
    scale = np.abs(peer).max()
    err, far = np.abs(ours - peer).max() / scale, np.abs(plain - peer).max() / scale
    assert err < 3e-3 and err < 0.1 * far, (err, far)
    for k, (tok, margin) in enumerate(gen):
        if margin < 0.25:
            break
        if k == len(tokens):
            assert tok in eog, (k, tokens, gen)
            break
        assert tokens[k] == tok, (k, tokens, gen)


# ---- Qwen3-VL (qwen3vl_merger): learned positions resized, DeepStack slices, interleaved M-RoPE ----

# As Qwen2.5-VL's (F16 pixels and flash attention in mtmd): up to 1.4e-3 of
# the rows' largest with float weights, 2.1e-2 with Q8_0. (300, 130) is
# resized the width first, then the height, as mtmd does, where Pillow's one
# call runs the height first: 3e-2 apart before resize_two_pass)
QWEN3_TOL = {"F32": 2.5e-3, "F16": 2.5e-3, "Q8_0": 4e-2}
QWEN3_SIZES = [(200, 300), (64, 64), (192, 192), (290, 150), (300, 130), (13, 9)]


@pytest.fixture(scope="module")
def qwen3vl(tmp_path_factory):
    from images import QWEN_IMAGE_TOKENS, QWEN_TEMPLATE
    from tiny_models import TinyQwen3vl, write_qwen3vl_mmproj

    d = tmp_path_factory.mktemp("qwen3vl_peer")
    # 4 layers: DeepStack after layers 0 and 1, not the last (llama.cpp's graph adds it before the output rows)
    model = write_model(d / "qwen3vl.gguf", TinyConfig(arch="qwen3vl", pre="default", qtype="F32", embd_qtype="F32",
                                                       n_layer=4),
                        extra_strings={"tokenizer.chat_template": QWEN_TEMPLATE}, extra_tokens=QWEN_IMAGE_TOKENS)
    return d, model, {q: write_qwen3vl_mmproj(d / f"mmproj-qwen3-{q}.gguf", TinyQwen3vl(qtype=q))
                      for q in QWEN3_TOL}


@pytest.mark.parametrize("qtype", sorted(QWEN3_TOL))
def test_qwen3vl_rows_match_mtmd(mtmd, qwen3vl, qtype):
    """Each image's cell count and rows (the projection's and the DeepStack
    slices, 3 x 256 wide) within QWEN3_TOL of mtmd's."""
    d, model, mm = qwen3vl
    enc = load_mmproj(mm[qtype])
    try:
        for i, (h, w) in enumerate(QWEN3_SIZES):
            img = synthetic(h, w, seed=i)
            _, peer = run_mtmd(mtmd, model, mm[qtype], img, "<__media__>", d / f"q3-{qtype}-{i}")
            peer = peer.reshape(-1, enc.n_embd_out)
            ours = enc.encode(png(img))
            assert ours.shape == peer.shape, (h, w)
            err = np.abs(ours - peer).max() / np.abs(peer).max()
            assert err < QWEN3_TOL[qtype], f"{qtype} {h}x{w}: {err:.2e}"
    finally:
        enc.close()


@pytest.fixture(scope="module")
def qwen3vlmoe(qwen3vl):
    """A qwen3vlmoe text model (Qwen3-VL-30B-A3B's) beside the same mmprojs."""
    from images import QWEN_IMAGE_TOKENS, QWEN_TEMPLATE

    d, _, mm = qwen3vl
    model = write_model(d / "qwen3vlmoe.gguf", TinyConfig(arch="qwen3vlmoe", pre="default", qtype="F32",
                                                          embd_qtype="F32", n_layer=4),
                        extra_strings={"tokenizer.chat_template": QWEN_TEMPLATE}, extra_tokens=QWEN_IMAGE_TOKENS)
    return d, model, mm


@pytest.mark.parametrize("text", ["qwen3vl", "qwen3vlmoe"])
@pytest.mark.parametrize("seed,h,w", [(5, 200, 300), (6, 56, 56)])
def test_qwen3vl_logits_match_llama_cpp(mtmd, request, text, seed, h, w):
    """The whole path (rows, layout, DeepStack slices after the first
    layers, interleaved M-RoPE positions) into the dense or the MoE text
    model against llama.cpp through mtmd's helper: within 1e-3 of its
    largest logit, under a tenth of how far the same rows land without
    their DeepStack slices."""
    import llminfer
    from llminfer.vision.prompt import ImageSpan, PromptIds
    from llminfer.vision.qwen25vl import grid_rows

    d, model, mm = request.getfixturevalue(text)
    img = synthetic(h, w, seed=seed)
    prompt = "<|im_start|>user\nwhat is<__media__>this<|im_end|>\n<|im_start|>assistant\n"
    np.ascontiguousarray(img).tofile(d / "q3lg.rgb")
    argv = [str(mtmd), model, mm["F32"], str(d / "q3lg.rgb"), str(w), str(h), prompt, str(d / f"q3-{text}"), "helper"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    peer = np.fromfile(f"{d / f'q3-{text}'}.logits", np.float32)
    with llminfer.LLM(model, mmproj=mm["F32"], n_ctx=512, n_threads=1) as llm:
        ids, _ = our_layout(llm, prompt, [png(img)])
        llm.complete(ids, max_tokens=1, temperature=0)
        ours = llm.last_logits.copy()
        (span,) = ids.images
        rows = np.array(span.rows)
        rows[:, 256:] = 0  # the slices gone
        shallow = PromptIds(ids)
        shallow.images = (ImageSpan(span.start, "shallow", grid_rows(rows, *span.grid)),)
        llm.complete(shallow, max_tokens=1, temperature=0)
        other = llm.last_logits.copy()
    scale = np.abs(peer).max()
    err, far = np.abs(ours - peer).max() / scale, np.abs(other - peer).max() / scale
    assert err < 1e-3 and err < 0.1 * far, (err, far)
