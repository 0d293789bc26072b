"""Decode (tg) and prefill (pp) speed of llminfer and llama.cpp's llama-bench
on the same files, one per quant type: each type is made from one F16 model
by llama.cpp's own llama-quantize (--pure, so every matrix has the type;
IQ1_*/IQ2_XXS/IQ2_XS get a generated importance matrix, which they need),
then `llminfer bench` and `llama-bench` run pp512 / tg128 on it in turn.

    python bench/make_model.py -o llama1b-f16.gguf      # a random Llama-3.2-1B-shaped F16
    python bench/quant_types.py --f16 llama1b-f16.gguf \\
        --llama-cpp /path/to/llama.cpp/build/bin -t IQ4_XS -t Q4_K_M --threads 1,2 -r 3

llama-quantize and llama-bench are found in --llama-cpp BIN_DIR (--bin, its
older name), else in $LLMINFER_LLAMA_CPP, else on the PATH.

Prints one row per (type, threads, test): tokens/s of each and the ratio
llminfer / llama.cpp (above 1: llminfer faster). The quantized files are kept
in --workdir (default: beside the F16 model) and reused when present.
Run it on a quiet machine: nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import peer  # noqa: E402
from before_after import llama_bench, llminfer_bench  # noqa: E402

NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M"}


def quantized(f16: Path, workdir: Path, ftype: str, quantize: str) -> Path:
    out = workdir / f"{f16.stem.replace('-f16', '')}-{ftype.lower()}.gguf"
    if out.exists():
        return out
    cmd = [quantize]
    if ftype in NEEDS_IMATRIX:
        from peer_checks import write_imatrix
        cmd += ["--imatrix", write_imatrix(str(f16), workdir / f"{f16.stem}-imatrix.gguf")]
    if ftype not in ("Q4_K_M", "Q5_K_M", "Q3_K_M"):
        cmd.append("--pure")
    cmd += [str(f16), str(out), ftype]
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--f16", required=True, help="the F16 GGUF every type is made from")
    peer.add_llama_cpp_arg(ap, "--bin")
    ap.add_argument("-t", "--type", action="append", help="llama-quantize file type (default: IQ4_XS)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="the Python with llminfer installed")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    f16 = Path(a.f16)
    quantize = peer.llama_cpp_tool("llama-quantize", a.llama_cpp)
    bench = peer.llama_cpp_tool("llama-bench", a.llama_cpp)
    workdir = Path(a.workdir) if a.workdir else f16.parent
    print(f"{'type':<9} {'thr':>3} {'test':>6} {'llminfer':>9} {'llama.cpp':>9} {'ratio':>6}")
    for ftype in a.type or ["IQ4_XS"]:
        model = str(quantized(f16, workdir, ftype, quantize))
        for t in [int(x) for x in a.threads.split(",")]:
            ours, theirs = [], []
            for _ in range(a.rounds):
                ours.append(llminfer_bench(a.python, model, t))
                theirs.append(llama_bench(bench, model, t))
            for test in ("pp512", "tg128"):
                o = statistics.median(r[test] for r in ours)
                l = statistics.median(r[test] for r in theirs)
                print(f"{ftype:<9} {t:>3} {test:>6} {o:>9.2f} {l:>9.2f} {o / l:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
