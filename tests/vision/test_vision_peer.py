"""Gemma 3 image embeddings and prompt layout against llama.cpp's libmtmd, on
the same tiny random files: tests/c/mtmd_embed.c, compiled here against a
llama.cpp build (its include folders and build/bin with libmtmd.so), runs
mtmd_tokenize and mtmd_encode_chunk on one raw RGB image. Skipped without
a build ($LLAMA_CPP_DIR, or /work/peer/*/vendor/llama.cpp) or a C compiler.

Tolerance, max |ours - mtmd| over max |mtmd|: 2e-3 with F32 and F16
weights (ggml's f16 GELU table and summation order on both sides), 2e-2
with Q8_0 (both quantize the activations to Q8_0, in blocks that differ)."""

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
from images import GEMMA_TEMPLATE, IMAGE_TOKENS, png, synthetic  # noqa: E402
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
    want = []
    for c in chunks:
        want += [int(t) for t in c[1:]] if c[0] == "text" else ["img"] * int(c[1])
    assert [c for c in chunks if c[0] == "image"] == [["image", "4", "1"]]  # 1: non-causal
    with llminfer.LLM(model, mmproj=mm["F16"], n_ctx=128, n_threads=1) as llm:
        vis = llm._vision
        ids = lay_out(prompt, [png(img)], vis, lambda t, bos: llm.tokenize(t, add_bos=bos, special=True),
                      llm._image_rows, True)
    (span,) = ids.images
    got = [t if not span.start <= i < span.end else "img" for i, t in enumerate(ids)]
    assert got == want


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
        ids = lay_out(prompt, [png(img)], llm._vision, lambda t, bos: llm.tokenize(t, add_bos=bos, special=True),
                      llm._image_rows, True)
        llm.complete(ids, max_tokens=1, temperature=0)
        ours = llm.last_logits
    scale = np.abs(out["noncausal"]).max()
    err = {mode: np.abs(ours - v).max() / scale for mode, v in out.items()}
    assert err["noncausal"] < 1.5e-3, err
    assert err["noncausal"] < 0.6 * err["causal"], err
    assert np.argmax(ours) == np.argmax(out["noncausal"])
