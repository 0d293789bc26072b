"""pp512 / tg128 of two llminfer builds and llama.cpp's llama-bench, side by
side: the three are run in turn, round after round, on each model and thread
count, and the medians of the rounds are printed with the ratios.

    python bench/before_after.py --before /path/venv-old/bin/python \\
        --after /path/venv/bin/python --llama-cpp /path/to/llama.cpp/build/bin \\
        -m model1.gguf -m model2.gguf -t 1,2 -r 3

llama-bench is found in --llama-cpp BIN_DIR (--llama-bench, its older name,
also takes the binary itself), else in $LLMINFER_LLAMA_CPP, else on the PATH.

Each llminfer figure is `llminfer bench -p 512 -n 128 -r 3` in a fresh
process (the median of its runs); llama-bench runs `-p 512 -n 128 -r 3`
(its mean).
Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, when this file is imported by path
import peer  # noqa: E402

IN_PROCESS = 3  # runs per llminfer process (its median is taken), as llama-bench's -r


def llminfer_bench(python, model, threads):
    out = subprocess.run([python, "-m", "llminfer", "bench", "-m", model, "-t", str(threads), "-p", "512",
                          "-n", "128", "-r", str(IN_PROCESS), "-c", "700", "--json"], capture_output=True, text=True, check=True,
                         cwd="/")
    rows = json.loads(out.stdout)["results"]
    return {r["test"]: r["tokens_per_second"] for r in rows}


def llama_bench(exe, model, threads):
    """llama-bench's pp512 / tg128 tokens/s, keyed as llminfer_bench's."""
    res, _ = peer.llama_bench(exe, model, threads, 512, 128, reps=IN_PROCESS)
    return {"pp512": res["pp"], "tg128": res["tg"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="Python with the old llminfer")
    ap.add_argument("--after", required=True, help="Python with the new llminfer")
    peer.add_llama_cpp_arg(ap, "--llama-bench")
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    a = ap.parse_args()
    exe = peer.llama_cpp_tool("llama-bench", a.llama_cpp)
    print(f"{'model':<34} {'thr':>3} {'test':>6} {'before':>8} {'after':>8} {'llama.cpp':>9} "
          f"{'after/before':>12} {'after/llama':>11}")
    for model in a.model:
        for t in [int(x) for x in a.threads.split(",")]:
            runs = {"before": [], "after": [], "llama": []}
            for _ in range(a.rounds):
                runs["before"].append(llminfer_bench(a.before, model, t))
                runs["after"].append(llminfer_bench(a.after, model, t))
                runs["llama"].append(llama_bench(exe, model, t))
            for test in ("pp512", "tg128"):
                med = {k: statistics.median(r[test] for r in v) for k, v in runs.items()}
                name = model.rsplit("/", 1)[-1][:34]
                print(f"{name:<34} {t:>3} {test:>6} {med['before']:>8.1f} {med['after']:>8.1f} "
                      f"{med['llama']:>9.1f} {med['after'] / med['before']:>12.3f} "
                      f"{med['after'] / med['llama']:>11.3f}", flush=True)


if __name__ == "__main__":
    main()
