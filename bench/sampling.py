"""Time of one sample() per token, on real logits: a model's logits at the
last positions of a text, sampled with the chains people send (OpenAI-style
requests leave top-k off). Medians of per-row times; numbers for the notes,
not asserted anywhere.

    PYTHONPATH=. python bench/sampling.py [-r 10] [MODEL ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import llminfer
from llminfer.generation.sampling import Sampler, SamplingParams

TEXT = ("The history of the city begins in the early medieval period, when a small settlement grew up "
        "around a river crossing. Over the following centuries")

CHAINS = (
    ("top-k off, temperature 0.7", dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)),
    ("top-k off, temperature 1 (OpenAI's defaults)", dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
    ("top-k off, top-p 0.95", dict(temperature=0.7, top_k=0, top_p=0.95, min_p=0.0)),
    ("top-k off, top-p 0.9, min-p 0.05", dict(temperature=0.8, top_k=0, top_p=0.9, min_p=0.05)),
    ("default (top-k 40, top-p, min-p)", dict()),
)


def row_logits(llm, n_rows):
    ids = llm.tokenize(TEXT)
    out = np.asarray(llm._forward(np.array(ids, np.int32), logits_all=True)).reshape(len(ids), -1)
    return [np.ascontiguousarray(r, dtype=np.float32) for r in out[-n_rows:]]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    p.add_argument("-r", "--repeats", type=int, default=10, help="passes over the rows")
    p.add_argument("--rows", type=int, default=24, help="positions of the text sampled")
    a = p.parse_args()
    print(f"{'model':<34} {'vocab':>7} {'chain':<46} {'us / sample':>12}")
    for m in a.models:
        with llminfer.LLM(m, n_ctx=512) as llm:
            rows = row_logits(llm, a.rows)
            name = str(llm.model_path.name)[:34]
        for label, kw in CHAINS:
            s = Sampler(SamplingParams(seed=0, **kw), rows[0].size)
            for r in rows:
                s.sample(r)
            times = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                for r in rows:
                    s.sample(r)
                times.append((time.perf_counter() - t) / len(rows))
            print(f"{name:<34} {rows[0].size:>7} {label:<46} {1e6 * statistics.median(times):>12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
