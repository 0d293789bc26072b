"""Aggregate generation throughput: LLM.generate on a list of prompts (one
batch, one forward pass per step for all of them) against the same prompts
run one after another.

    PYTHONPATH=. python bench/batch_throughput.py -m model.gguf -t 2 -n 8,32 --new 64

Each prompt is a different short text; end-of-generation tokens are banned so
every sequence generates exactly --new tokens. Figures: generated tokens per
second of wall time for the whole call (prompts included) and for the decode
steps alone (after the prompts' pass). Sequential runs are timed the same way
and summed. Runs alternate (batched, sequential) and medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

from llminfer import LLM, SamplingParams

TOPICS = ["the sea", "a city at night", "old trains", "mountain weather", "bread", "a violin", "winter birds",
          "the moon", "a library", "rivers", "clocks", "a garden", "storms", "maps", "bridges", "glass"]


def prompts(n):
    return [f"Write a few sentences about {TOPICS[i % len(TOPICS)]} (note {i}):" for i in range(n)]


def run_batched(llm, ps, params, new):
    t = time.perf_counter()
    outs = llm.complete(ps, max_tokens=new, sampling=params)
    total = time.perf_counter() - t
    gen = sum(len(c.tokens) for c in outs)
    decode = outs[0].timings.generation_seconds
    # the decode steps produce all but the first token of each sequence
    return gen / total, (gen - len(ps)) / decode


def run_sequential(llm, ps, params, new):
    total = decode = 0.0
    gen = 0
    for p in ps:
        llm.reset()
        t = time.perf_counter()
        c = llm.complete(p, max_tokens=new, sampling=params)
        total += time.perf_counter() - t
        decode += c.timings.generation_seconds
        gen += len(c.tokens)
    return gen / total, (gen - len(ps)) / decode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-prompts", default="8,32")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("-r", "--runs", type=int, default=3)
    a = ap.parse_args()
    sizes = [int(x) for x in a.n_prompts.split(",")]
    llm = LLM(a.model, n_ctx=512, n_threads=a.threads, kv_pool_tokens=max(sizes) * (a.new + 64) + 512)
    params = SamplingParams(temperature=0, logit_bias={t: float("-inf") for t in llm.tokenizer.eog_ids})
    print(f"model {a.model}, {a.threads} threads, {a.new} new tokens per prompt, medians of {a.runs}")
    print(f"{'prompts':>7} | {'batched tok/s (all / decode)':>29} | {'sequential tok/s (all / decode)':>32} | speed-up")
    for n in sizes:
        ps = prompts(n)
        b, s = [], []
        for _ in range(a.runs):
            b.append(run_batched(llm, ps, params, a.new))
            s.append(run_sequential(llm, ps, params, a.new))
        bt, bd = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
        st, sd = statistics.median(x[0] for x in s), statistics.median(x[1] for x in s)
        print(f"{n:>7} | {bt:>14.1f} / {bd:>12.1f} | {st:>15.1f} / {sd:>14.1f} | {bt / st:>6.2f}x")


if __name__ == "__main__":
    main()
