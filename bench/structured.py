"""Cost of structured output: generation tokens/s with a JSON-schema grammar
against the same model unconstrained.

    PYTHONPATH=. python bench/structured.py -m ~/.cache/llminfer/models/SmolLM2-135M-Instruct.Q4_1.gguf -t 4 --new 256

Every mode generates exactly --new tokens after the same chat prompt:
end-of-generation tokens are banned, and the schema (an array of at least
1000 small objects) cannot close before then. Modes:

  free         no grammar
  schema       the grammar's mask for step t+1 computed on a worker thread
               while the forward pass of step t runs (the default)
  serial       the same grammar, each mask computed after the forward pass
               (llminfer.text.structured.OVERLAP_MASK = False)

Printed: median decode tokens/s over --runs runs (runs interleave the modes),
the cost against free, and the mean time of one mask computed alone (the
generated tokens replayed through a matcher) for scale. The claim to check:
schema costs < 10% of free tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from llminfer import LLM

from llminfer.text import structured

SCHEMA = {
    "type": "array", "minItems": 1000,
    "items": {"type": "object", "additionalProperties": False,
              "required": ["name", "price", "tags"],
              "properties": {"name": {"type": "string", "maxLength": 40},
                             "price": {"type": "number"},
                             "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}},
}
MESSAGES = [{"role": "user", "content": "List products of a hardware shop as JSON: name, price, tags."}]


def one(llm, mode, new, ban):
    structured.OVERLAP_MASK = mode != "serial"
    llm.reset()
    ids = llm._chat_prompt(MESSAGES)
    kw = {} if mode == "free" else {"json_schema": SCHEMA}
    c = llm.complete(ids, max_tokens=new, temperature=0.8, seed=7, logit_bias=ban, **kw)
    assert len(c.tokens) == new, (mode, len(c.tokens), c.finish_reason)
    return c.timings.generation_tokens_per_second, c.tokens


def mask_alone(llm, tokens):
    g = structured.Grammar.from_json_schema(SCHEMA)
    structured.OVERLAP_MASK = False
    c = structured.Constraint(g, llm.tokenizer, llm.n_vocab)
    t = time.perf_counter()
    for tok in tokens:
        c.advance(tok)  # consumes, then computes the next mask on this thread
    return (time.perf_counter() - t) / max(1, len(tokens))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--new", type=int, default=256, help="tokens generated per run (default 256)")
    ap.add_argument("-r", "--runs", type=int, default=5, help="runs per mode (default 5)")
    a = ap.parse_args()
    llm = LLM(a.model, n_ctx=a.new + 256, n_threads=a.threads)
    ban = {int(t): float("-inf") for t in llm.tokenizer.eog_ids}
    modes = ["free", "schema", "serial"]
    one(llm, "schema", 8, ban)  # warm-up: builds the tokenizer bridge, touches the weights
    speeds = {m: [] for m in modes}
    tokens = None
    for _ in range(a.runs):
        for m in modes:
            tps, toks = one(llm, m, a.new, ban)
            speeds[m].append(tps)
            if m == "schema":
                tokens = toks
    base = statistics.median(speeds["free"])
    print(f"model {llm.model_path.name}, {llm.n_threads} threads, {a.new} tokens, median of {a.runs} runs")
    print(f"{'mode':<8} {'tok/s':>9} {'vs free':>9}")
    for m in modes:
        v = statistics.median(speeds[m])
        print(f"{m:<8} {v:9.1f} {100 * (v / base - 1):+8.1f}%")
    print(f"one mask alone: {1e3 * mask_alone(llm, tokens):.3f} ms "
          f"(a forward pass: {1e3 / base:.3f} ms)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
