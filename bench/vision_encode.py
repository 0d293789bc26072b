"""Time to encode one image: llminfer's vision encoder beside llama.cpp's
(`llama-mtmd-cli`), on the same random-weight mmproj file.

The file is a SigLIP-400M-shaped Gemma 3 tower (27 layers, width 1152,
feed-forward 4304, 16 heads, 14-pixel patches at 896 x 896: 4,096 patches
pooled to 256 tokens), written here with random weights in each weight type
asked for, beside a tiny Gemma 3 text model that mtmd-cli needs to start.
Each run is a fresh process that loads the file and encodes one 896 x 896
image once; llminfer's time is `encode()`, llama.cpp's the "image slice
encoding done in N ms" line mtmd-cli prints (the encoder graph alone, its
preprocessing done before; llminfer's includes its own). Runs alternate
between the two, medians of -r each. The BLAS that numpy's attention
products use gets the same thread count as the rest (OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS), so a 1-thread row is one core on both sides.

    python bench/vision_encode.py --llama-cpp /path/to/llama.cpp/build/bin -t 1,2 -r 3
    python bench/vision_encode.py --no-peer -q F16 -t 2 -r 1          # llminfer alone
    python bench/vision_encode.py --dir /tmp/venc ...                 # keep (and reuse) the files

--qwen25vl: a Qwen2.5-VL-7B-shaped tower instead (projector
qwen2.5vl_merger: 32 layers, width 1280, feed-forward 3420, 16 heads,
14-pixel patches, windows of 112 pixels (8 x 8 patches) with full attention
on layers 7, 15, 23 and 31, the merger's MLP into 3584), beside a one-layer
qwen2vl text model 3584 wide; the 896 x 896 image is 4,096 patches merged
to 1,024 tokens.

    python bench/vision_encode.py --qwen25vl --llama-cpp /path/to/llama.cpp/build/bin -t 1,2 -r 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))                              # peer.py
sys.path.insert(0, str(HERE.parent / "tests" / "support"))  # the tiny-model writers
import peer  # noqa: E402

SIGLIP_400M = dict(image_size=896, patch_size=14, n_embd=1152, n_ff=4304, n_layer=27, n_head=16, n_merge=4)
TEXT_WIDTH = 256  # the tiny text model's width: the projection's output
# Qwen2.5-VL-7B's vision tower (its mmproj's clip.vision.*) and its text model's width
QWEN25VL_7B = dict(patch_size=14, n_embd=1280, n_ff=3420, n_layer=32, n_head=16, wa_pattern=8, n_embd_text=3584)

CHILD = r"""
import sys, time
from llminfer.vision import load_mmproj
path, image, nt = sys.argv[1], sys.argv[2], int(sys.argv[3])
enc = load_mmproj(path, n_threads=nt)
data = open(image, 'rb').read()
t0 = time.perf_counter()
rows = enc.encode(data)
dt = time.perf_counter() - t0
enc.close()
print(f"ENCODE_MS {dt * 1000:.1f} {rows.shape[0]}")
"""


def write_qwen_files(d: Path, qtypes, layers):
    """A Qwen2.5-VL-7B-shaped mmproj per weight type, a one-layer qwen2vl
    text model of its output width (what mtmd-cli needs to start) and the
    image."""
    from images import png, qwen2vl_text_model, synthetic
    from tiny_models import TinyQwen25vl, write_qwen25vl_mmproj

    d.mkdir(parents=True, exist_ok=True)
    width = QWEN25VL_7B["n_embd_text"]
    text = d / "qwen2vl-text.gguf"
    if not text.exists():
        qwen2vl_text_model(text, n_embd=width, n_layer=1, n_head=width // 64, n_head_kv=4, head_dim=64)
    image = d / "image-896.png"
    if not image.exists():
        image.write_bytes(png(synthetic(896, 896, seed=3)))
    mm = {}
    for q in qtypes:
        p = d / f"mmproj-qwen25vl7b-{layers}l-{q}.gguf"
        if not p.exists():
            print(f"writing {p.name} ...", file=sys.stderr, flush=True)
            write_qwen25vl_mmproj(p.with_suffix(".tmp"), TinyQwen25vl(qtype=q, **{**QWEN25VL_7B, "n_layer": layers}))
            os.replace(p.with_suffix(".tmp"), p)
        mm[q] = p
    return text, image, mm


def write_files(d: Path, qtypes, layers):
    from images import GEMMA_TEMPLATE, IMAGE_TOKENS, png, synthetic
    from tiny_models import TinyConfig, TinyMmproj, write_mmproj, write_model

    d.mkdir(parents=True, exist_ok=True)
    text = d / "gemma3-text.gguf"
    if not text.exists():
        write_model(text, TinyConfig(arch="gemma3", pre="default", n_embd=TEXT_WIDTH),
                    extra_strings={"tokenizer.chat_template": GEMMA_TEMPLATE}, extra_tokens=IMAGE_TOKENS)
    image = d / "image-896.png"
    if not image.exists():
        image.write_bytes(png(synthetic(896, 896, seed=3)))
    mm = {}
    for q in qtypes:
        p = d / f"mmproj-siglip400m-{layers}l-{q}.gguf"
        if not p.exists():
            print(f"writing {p.name} ...", file=sys.stderr, flush=True)
            cfg = TinyMmproj(qtype=q, n_embd_text=TEXT_WIDTH, **{**SIGLIP_400M, "n_layer": layers})
            write_mmproj(p.with_suffix(".tmp"), cfg)
            os.replace(p.with_suffix(".tmp"), p)
        mm[q] = p
    return text, image, mm


def thread_env(nt: int) -> dict:
    env = dict(os.environ)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(nt)
    return env


def ours(python, mm, image, nt) -> float:
    r = subprocess.run([python, "-c", CHILD, str(mm), str(image), str(nt)], capture_output=True, text=True,
                       env=thread_env(nt), timeout=3600)
    if r.returncode:
        raise RuntimeError(f"llminfer encode failed: {r.stderr.strip()[-800:]}")
    m = re.search(r"ENCODE_MS ([0-9.]+)", r.stdout)
    return float(m.group(1))


def theirs(exe, text, mm, image, nt) -> float:
    cmd = [exe, "-m", str(text), "--mmproj", str(mm), "--image", str(image), "-p", "describe", "-n", "1",
           "-t", str(nt), "--temp", "0", "-c", "512"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    m = re.search(r"(?:mtmd batch encoding done|slice encoded) in (\d+) ms", out)
    if m is None:
        raise RuntimeError(f"{' '.join(cmd)}: no encoding time in its log (status {r.returncode}): {out[-800:]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    peer.add_llama_cpp_arg(ap)
    ap.add_argument("--no-peer", action="store_true", help="llminfer alone")
    ap.add_argument("-q", "--qtypes", default="F16,Q8_0", help="the tower's weight types (F32, F16, BF16, Q8_0)")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--qwen25vl", action="store_true", help="a Qwen2.5-VL-7B-shaped tower (see above)")
    ap.add_argument("--layers", type=int, default=None, help="cut the tower (for a quick look)")
    ap.add_argument("--dir", help="where the files go (kept, and reused when there); default a temporary folder")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    qtypes = [q.strip() for q in a.qtypes.split(",") if q.strip()]
    threads = [int(t) for t in a.threads.split(",")]
    exe = None if a.no_peer else peer.llama_cpp_tool("llama-mtmd-cli", a.llama_cpp)
    tmp = None if a.dir else tempfile.TemporaryDirectory(prefix="llminfer-venc-")
    d = Path(a.dir or tmp.name)
    shape = QWEN25VL_7B if a.qwen25vl else SIGLIP_400M
    a.layers = a.layers or shape["n_layer"]
    text, image, mm = (write_qwen_files if a.qwen25vl else write_files)(d, qtypes, a.layers)
    name = "Qwen2.5-VL-7B-shaped" if a.qwen25vl else "SigLIP-400M-shaped"
    rows = []
    for q in qtypes:
        for nt in threads:
            us, them = [], []
            for _ in range(a.reps):
                us.append(ours(sys.executable, mm[q], image, nt))
                if exe:
                    them.append(theirs(exe, text, mm[q], image, nt))
                print(f"{q} t={nt}: llminfer {us[-1]:.0f} ms" + (f", llama.cpp {them[-1]:.0f} ms" if them else ""),
                      file=sys.stderr, flush=True)
            row = {"qtype": q, "threads": nt, "llminfer_ms": statistics.median(us), "runs": us}
            if them:
                row.update(llama_cpp_ms=statistics.median(them), llama_cpp_runs=them,
                           speedup=statistics.median(them) / statistics.median(us))
            rows.append(row)
    if a.json:
        print(json.dumps({"tower": name, "layers": a.layers, "image": "896x896", "rows": rows}, indent=1))
        return
    print(f"{name} tower ({a.layers} layers), one 896 x 896 image, medians of {a.reps}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"{'weights':8} {'threads':>7} {'llminfer ms':>12} {'llama.cpp ms':>13} {'speedup':>8}")
    for r in rows:
        peer_ms = f"{r['llama_cpp_ms']:13.0f}" if "llama_cpp_ms" in r else f"{'-':>13}"
        sp = f"{r['speedup']:7.2f}x" if "speedup" in r else f"{'-':>8}"
        print(f"{r['qtype']:8} {r['threads']:7d} {r['llminfer_ms']:12.0f} {peer_ms} {sp}")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
