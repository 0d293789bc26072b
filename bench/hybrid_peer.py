"""Per hybrid architecture (issue 51) and weight type, llama.cpp's logits on a
tiny random-weight file (tests/support/tiny_models.py, write_hybrid) against the
numpy reference (tests/support/reference_hybrid.py) and, with --ours, llminfer's:
the max abs difference, that over the largest |llama.cpp logit|, and top-1
agreement where llama.cpp's top logit leads its second by >= --margin. A
correctness figure, not a speed one.

    PYTHONPATH=tests python bench/hybrid_peer.py --peer-python /path/to/peer-venv/bin/python [--ours]

The peer Python (one with llama-cpp-python) is --peer-python, else
$LLMINFER_PEER_PYTHON, else this Python if it has llama_cpp. Heads are
untied (--tied to tie them), so the top token is not simply the input.
MoE rows are over every token, near ties of the expert choice included.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

import peer  # noqa: E402
from reference_hybrid import HybridReference  # noqa: E402
from tiny_models import HYBRID_ARCHS, HybridConfig, write_hybrid  # noqa: E402


def tokens_for(seed, n):
    return np.random.default_rng(seed).integers(0, 268, n).astype(np.int32)


def row(name, ours, ref, margin):
    s = np.sort(ref, axis=-1)
    clear = s[:, -1] - s[:, -2] >= margin
    agree = int((ours.argmax(-1) == ref.argmax(-1))[clear].sum())
    diff, big = float(np.abs(ours - ref).max()), float(np.abs(ref).max())
    return f"{name:9} {diff:10.4f} {big:10.2f} {diff / big:9.2e} {agree:>7}/{int(clear.sum()):<8}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    peer.add_peer_python_arg(ap)
    ap.add_argument("--archs", default=",".join(HYBRID_ARCHS))
    ap.add_argument("--types", default="F32,F16,Q8_0,Q4_K")
    ap.add_argument("--tokens", type=int, default=70)
    ap.add_argument("--margin", type=float, default=0.25)
    ap.add_argument("--tied", action="store_true", help="tie the output head to the embedding")
    ap.add_argument("--ours", action="store_true", help="llminfer's logits too (needs the C core's recurrent layers)")
    args = ap.parse_args()
    peer_python = peer.peer_python(args.peer_python)
    if args.ours:
        from archs import run

    print(f"{'arch':14} {'type':5} {'vs':9} {'max|diff|':>10} {'max|logit|':>10} {'relative':>9} {'top-1 (clear)':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        toks = tokens_for(7, args.tokens)
        np.save(tmp / "ids.npy", toks)
        for arch in args.archs.split(","):
            for qtype in args.types.split(","):
                cfg = HybridConfig(arch=arch, qtype=qtype, embd_qtype=qtype if qtype in ("F32", "F16") else "Q8_0",
                                   tie_output=args.tied)
                path = write_hybrid(tmp / f"{arch}_{qtype}.gguf", cfg)
                r = subprocess.run([peer_python, str(ROOT / "bench" / "peer_logits.py"), str(path),
                                    str(tmp / "ids.npy"), str(tmp / "out.npy")], capture_output=True, text=True)
                if r.returncode:
                    sys.exit(f"llama.cpp failed on {arch}/{qtype}: {r.stderr[-2000:]}")
                theirs = np.load(tmp / "out.npy")
                print(f"{arch:14} {qtype:5} " + row("reference", HybridReference(path).logits(toks), theirs,
                                                     args.margin), flush=True)
                if args.ours:
                    try:
                        ours = run(str(path), toks)
                    except Exception as e:  # an architecture llminfer refuses, or a core without it
                        print(f"{arch:14} {qtype:5} {'llminfer':9} {type(e).__name__}: {str(e)[-80:]}")
                        continue
                    print(f"{arch:14} {qtype:5} " + row("llminfer", ours, theirs, args.margin), flush=True)


if __name__ == "__main__":
    main()
