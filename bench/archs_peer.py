"""Per architecture, llminfer's logits against llama.cpp's on the same tiny
random-weight GGUF (tests/support/tiny_models.py): the max abs difference, that
difference over the largest |llama.cpp logit|, and top-1 agreement on the
positions where llama.cpp's top logit leads its second by >= --margin.
A correctness figure, not a speed one.

    PYTHONPATH=tests python bench/archs_peer.py --peer-python /path/to/peer-venv/bin/python

The peer Python (one with llama-cpp-python) is --peer-python, else
$LLMINFER_PEER_PYTHON, else this Python if it has llama_cpp.
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
from archs import NEW_ARCHS, config, run, tokens_for  # noqa: E402
from tiny_models import write_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    peer.add_peer_python_arg(ap)
    ap.add_argument("--archs", default=",".join(["llama", "qwen2", "gemma3"] + NEW_ARCHS))
    ap.add_argument("--types", default="F16,Q8_0,Q4_K")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--margin", type=float, default=0.25)
    args = ap.parse_args()
    peer_python = peer.peer_python(args.peer_python)

    print(f"{'arch':10} {'type':6} {'max|diff|':>10} {'max|logit|':>10} {'relative':>9} {'top-1 (clear)':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for arch in args.archs.split(","):
            for qtype in args.types.split(","):
                path = write_model(tmp / f"{arch}_{qtype}.gguf", config(arch, qtype=qtype, pre="default"))
                diff = big = 0.0
                agree = clear_n = 0
                for k in range(args.prompts):
                    toks = tokens_for(100 + k, n=args.tokens)
                    np.save(tmp / "ids.npy", toks)
                    subprocess.run([peer_python, str(ROOT / "bench" / "peer_logits.py"), str(path),
                                    str(tmp / "ids.npy"), str(tmp / "out.npy")], check=True)
                    ref = np.load(tmp / "out.npy")
                    ours = run(path, toks)
                    diff = max(diff, float(np.abs(ours - ref).max()))
                    big = max(big, float(np.abs(ref).max()))
                    s = np.sort(ref, axis=-1)
                    clear = s[:, -1] - s[:, -2] >= args.margin
                    agree += int((ours.argmax(-1) == ref.argmax(-1))[clear].sum())
                    clear_n += int(clear.sum())
                print(f"{arch:10} {qtype:6} {diff:10.4f} {big:10.2f} {diff / big:9.2e} {agree:>7}/{clear_n:<8}",
                      flush=True)


if __name__ == "__main__":
    main()
