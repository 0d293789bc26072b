"""Share of generation time spent outside the native forward pass (sampling,
detokenizing, stop-string checks, the Python loop), per model and sampler.

    PYTHONPATH=. python bench/python_share.py [-n 128] [-t 2] [MODEL ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import llminfer

PROMPT = "Once upon a time, a lighthouse keeper found a message in a bottle. It said"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    p.add_argument("-n", type=int, default=128, help="tokens generated per run")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-r", "--runs", type=int, default=3)
    a = p.parse_args()
    print(f"{'model':<36} {'sampler':<32} {'tokens/s':>9} {'outside native':>15}")
    for m in a.models:
        with llminfer.LLM(m, n_ctx=1024, n_threads=a.threads) as llm:
            for name, kw in (("greedy", {"temperature": 0}),
                             ("default (top-k 40, top-p, min-p)", {"seed": 1}),
                             ("+ repeat penalty 1.1", {"seed": 1, "repeat_penalty": 1.1}),
                             ("top-k off, top-p 0.95", {"seed": 1, "top_k": 0, "top_p": 0.95, "min_p": 0.0}),
                             ("top-k off, top-p 0.9, min-p", {"seed": 1, "top_k": 0, "top_p": 0.9})):
                shares, speeds = [], []
                for _ in range(a.runs):
                    llm.reset()
                    out = llm.complete(PROMPT, max_tokens=a.n, stop=None, **kw)
                    shares.append(out.timings.python_share)
                    speeds.append(out.timings.generation_tokens_per_second)
                print(f"{str(llm.model_path.name)[:36]:<36} {name:<32} {statistics.median(speeds):>9.1f} "
                      f"{100 * statistics.median(shares):>14.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
