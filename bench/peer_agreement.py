"""Teacher-forced agreement with llama.cpp (through llama-cpp-python).

For each prompt, llama.cpp generates its own greedy 48-token continuation,
keeping its logits at every step. The prompt and that continuation are then
fed through llminfer's LLM.eval, and at each of the 48 positions our top-1
token is compared with llama.cpp's. A disagreement counts against us only
where llama.cpp's top logit leads its second by at least --margin (0.25):
nearer ties flip legitimately between correct engines, even between
llama.cpp's own attention paths.

For scale, the table also shows how often llama.cpp's own batched evaluation
of the same sequence disagrees with its step-by-step logits.

Run with a Python that has both packages, e.g.
    PYTHONPATH=. /path/to/peer-venv/bin/python bench/peer_agreement.py MODEL.gguf [...]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three laws of thermodynamics state that",
    "Here is a recipe for a simple tomato soup:\n1.",
    "In 1969, the Apollo 11 mission",
    "Photosynthesis is the process by which",
    "Q: What is the tallest mountain in the world?\nA:",
    "The main differences between Python and C are",
    "Dear hiring manager,\n\nI am writing to apply for",
    "A haiku about autumn leaves:\n",
    "The quick brown fox jumps over the lazy dog. This sentence is famous because",
    "To install the package, first open a terminal and",
    "The French Revolution began in 1789 when",
    "In mathematics, a prime number is",
    "My favourite way to spend a Sunday afternoon is",
    "The stock market fell sharply on Monday after",
    "import numpy as np\n\ndef normalize(x):\n",
    "Water boils at 100 degrees Celsius at sea level, but",
    "The main character of the novel is a young woman who",
    "Here are five tips for better sleep:\n1.",
    "The difference between weather and climate is",
    "Dear Sir or Madam,\nI am writing to complain about",
    "The mitochondria is the powerhouse of the cell because",
    "SELECT name, age FROM users WHERE",
    "A good password should be",
    "The history of the Roman Empire can be divided into",
    "Translate to French: 'Good morning, how are you?'\n",
    "The recipe calls for two cups of flour, one egg and",
    "Electric cars are becoming more popular because",
]


def peer_continuation(peer, ids, n_gen):
    """llama.cpp's greedy continuation and the logits that chose each token."""
    peer.reset()
    peer.eval(ids)
    rows = [np.array(peer.scores[len(ids) - 1], dtype=np.float32)]
    cont = []
    for j in range(n_gen):
        tok = int(np.argmax(rows[-1]))
        cont.append(tok)
        if j < n_gen - 1:
            peer.eval([tok])
            rows.append(np.array(peer.scores[peer.n_tokens - 1], dtype=np.float32))
    return cont, np.stack(rows)


def compare(model_path, n_gen=48, margin=0.25, threads=2, prompts=PROMPTS):
    import llama_cpp

    import llminfer

    peer = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, logits_all=True,
                           n_threads=threads, verbose=False)
    ours = llminfer.LLM(model_path, n_ctx=1024, n_threads=threads)
    total = agree = decisive = decisive_agree = 0
    self_decisive = self_disagree = 0  # llama.cpp batched against its own step-by-step logits
    worst = []
    for prompt in prompts:
        ids = peer.tokenize(prompt.encode(), add_bos=True, special=False)
        cont, ref = peer_continuation(peer, ids, n_gen)
        ours.reset()
        logits = ours.eval(ids + cont)[len(ids) - 1:len(ids) - 1 + n_gen]
        peer.reset()
        peer.eval(ids + cont)
        batched = np.array(peer.scores[len(ids) - 1:len(ids) - 1 + n_gen], dtype=np.float32)
        top_ref, top = ref.argmax(-1), logits.argmax(-1)
        s = np.sort(ref, axis=-1)
        lead = s[:, -1] - s[:, -2]
        same = top == top_ref
        total += len(same)
        agree += int(same.sum())
        d = lead >= margin
        decisive += int(d.sum())
        decisive_agree += int(same[d].sum())
        for j in np.flatnonzero(~same):
            worst.append((float(lead[j]), prompt[:30], int(j)))
        own = batched.argmax(-1) == top_ref
        self_disagree += int((~own).sum())
        self_decisive += int((~own & d).sum())
    ours.close()
    return {
        "model": str(model_path), "positions": total, "top1_agree": agree,
        "decisive_positions": decisive, "decisive_agree": decisive_agree,
        "disagreements": sorted(worst, reverse=True)[:10],
        "peer_self_disagree": self_disagree, "peer_self_decisive_disagree": self_decisive,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("-n", type=int, default=48)
    p.add_argument("--margin", type=float, default=0.25)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=len(PROMPTS),
                   help=f"use the first N of the {len(PROMPTS)} built-in prompts")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    results = [compare(m, a.n, a.margin, a.threads, PROMPTS[:a.prompts]) for m in a.models]
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'model':<34} {'agree':>11} {'decisive (lead>=%.2f)' % a.margin:>22} {'max lead':>9} "
          f"| llama.cpp batched vs itself: {'disagree':>8} {'decisive':>8}")
    for r in results:
        name = r["model"].rsplit("/", 1)[-1][:34]
        lead = f"{r['disagreements'][0][0]:.3f}" if r["disagreements"] else "-"
        print(f"{name:<34} {r['top1_agree']:>5}/{r['positions']:<5} "
              f"{r['decisive_agree']:>13}/{r['decisive_positions']:<8} {lead:>9} "
              f"| {'':>29}{r['peer_self_disagree']:>8} {r['peer_self_decisive_disagree']:>8}")
    ok = all(r["decisive_agree"] == r["decisive_positions"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
