"""Embedding agreement with llama.cpp: our Embedder against llama-cpp-python
(Llama(embedding=True).embed) on the same GGUF and texts.

    PYTHONPATH=. python bench/embedding_peer.py -m all-MiniLM-L6-v2.Q8_0.gguf [-m nomic-embed-text-v1.5.Q8_0.gguf ...]
    PYTHONPATH=. python bench/embedding_peer.py --tiny      # the tiny random bert / nomic-bert files of the tests

llama-cpp-python runs in its own interpreter: --peer-python (--peer, its
older name), else $LLMINFER_PEER_PYTHON, else this Python if it has
llama_cpp. Printed per
model: whether the token ids agree, and the worst cosine similarity and
largest absolute difference of the L2-normalized embeddings over the texts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import peer
from llminfer import Embedder

TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors.",
         "What is the capital of France? Paris, of course!", "naïve café déjà vu", "a"]

PEER = r"""
import json, sys
from llama_cpp import Llama
path, texts = sys.argv[1], json.loads(sys.argv[2])
llm = Llama(model_path=path, embedding=True, verbose=False, n_ctx=512, n_threads=4)
out = [{"tokens": llm.tokenize(t.encode(), add_bos=True, special=False), "embedding": llm.embed(t, normalize=True)}
       for t in texts]
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", default=[])
    ap.add_argument("--tiny", action="store_true", help="also the tiny random encoders of tests/support/tiny_models.py")
    peer.add_peer_python_arg(ap, "--peer")
    a = ap.parse_args()
    models = list(a.model)
    if a.tiny:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
        from tiny_models import write_encoder
        d = tempfile.mkdtemp()
        models += [write_encoder(os.path.join(d, f"{arch}.gguf"), arch=arch) for arch in ("bert", "nomic-bert")]
    if not models:
        ap.error("give -m MODEL.gguf or --tiny")
    peer_python = peer.peer_python(a.peer_python)
    print(f"{'model':<40} {'tokens':>7} {'min cos':>10} {'max |diff|':>11}")
    for path in models:
        run = subprocess.run([peer_python, "-c", PEER, path, json.dumps(TEXTS)], capture_output=True, text=True)
        if run.returncode:
            print(f"{os.path.basename(path):<40} peer failed: {run.stderr.strip().splitlines()[-1:]}")
            continue
        ref = json.loads(run.stdout)
        with Embedder(path) as e:
            same = all(e.tokenizer.encode(t) == p["tokens"] for t, p in zip(TEXTS, ref))
            ours = [np.array(e.embed(t)) for t in TEXTS]
        theirs = [np.array(p["embedding"]) for p in ref]
        cos = min(float(o @ t) for o, t in zip(ours, theirs))
        diff = max(float(np.abs(o - t).max()) for o, t in zip(ours, theirs))
        print(f"{os.path.basename(path):<40} {'same' if same else 'DIFFER':>7} {cos:10.6f} {diff:11.2e}")


if __name__ == "__main__":
    main()
