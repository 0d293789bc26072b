"""Perplexity of llama.cpp (through llama-cpp-python) and of llminfer on the
same file and settings, by llama-perplexity's method (llminfer.generation.perplexity
documents it; the same windows and scoring are applied to both engines).

    PYTHONPATH=. /path/to/peer-venv/bin/python bench/perplexity_peer.py MODEL.gguf -f text.txt -c 512
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from llminfer.generation.perplexity import chunks, token_nll


def peer_perplexity(path, text, n_ctx, threads):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                          n_threads=threads, verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "true") == "true"
    bos = llm.token_bos() if add_bos else None
    first = n_ctx // 2
    s = s2 = 0.0
    count = 0
    t0 = time.perf_counter()
    for window in chunks(tokens, n_ctx, bos):
        llm.reset()
        llm.eval(window)
        logits = np.array(llm.scores[:n_ctx], dtype=np.float32)
        nll = token_nll(logits[first:n_ctx - 1], np.asarray(window[first + 1:n_ctx]))
        s += nll.sum()
        s2 += (nll * nll).sum()
        count += len(nll)
    mean = s / count
    ppl = math.exp(mean)
    return ppl, ppl * math.sqrt((s2 / count - mean * mean) / (count - 1)), len(tokens), time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("-f", "--file", required=True)
    p.add_argument("-c", "--ctx", type=int, default=512)
    p.add_argument("-t", "--threads", type=int, default=2)
    a = p.parse_args()
    import llminfer
    from llminfer.generation.perplexity import perplexity

    text = open(a.file, encoding="utf-8").read()
    print(f"{'model':<40} {'llama.cpp':>20} {'llminfer':>20} {'diff':>8}")
    for m in a.models:
        ppl_ref, err_ref, _, _ = peer_perplexity(m, text, a.ctx, a.threads)
        with llminfer.LLM(m, n_ctx=a.ctx, n_threads=a.threads) as llm:
            r = perplexity(llm, text, n_ctx=a.ctx)
        name = str(m).rsplit("/", 1)[-1][:40]
        print(f"{name:<40} {ppl_ref:>11.4f} ± {err_ref:<6.4f} {r.ppl:>11.4f} ± {r.ppl_err:<6.4f} "
              f"{100 * (r.ppl / ppl_ref - 1):>+7.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
