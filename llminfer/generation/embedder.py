"""Embedder: an embedding model, encoder or decoder, behind one front.

    emb = llminfer.Embedder("all-MiniLM-L6-v2.Q8_0.gguf")
    vecs = emb.embed(["a sentence", "another"])          # list of lists of floats
    emb.create_embedding("a sentence")                   # {"object": "list", "data": [...], ...}
    rr = llminfer.Embedder("ms-marco-MiniLM-L6-v2-Q8_0.gguf")   # a reranker (pooling_type 4)
    rr.rank("a query", ["doc one", "doc two"])          # a relevance score per document

Encoder GGUFs (bert, nomic-bert) run in csrc/encoder.c; any decoder model
llminfer loads gives its pooled hidden states through an LLM
(llminfer.generation.embeddings). It sits above both, so neither imports it.
"""

from __future__ import annotations

import threading

import numpy as np

from llminfer import _core, hub

from llminfer.generation import rerank
from llminfer.generation.embeddings import POOLINGS, EmbeddingBase, declared_pooling, decoder_hidden
from llminfer.errors import InvalidArgumentError, UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.generation.llm import LLM
from llminfer.models import bert
from llminfer.core.system import check_threads
from llminfer.text.tokenizer import Tokenizer


class Embedder(EmbeddingBase, rerank.Ranking):
    """An embedding model: an encoder GGUF (bert, nomic-bert), or any decoder
    model we load (its hidden states pooled). pooling overrides the one the
    GGUF declares; n_threads: threads of the native kernels."""

    def __init__(self, model, n_threads: int | None = None, pooling: str | None = None, n_ctx: int | None = None,
                 mmap: bool = True):
        if pooling is not None and pooling not in POOLINGS:
            raise InvalidArgumentError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        path = hub.resolve(model)
        self.model_path = path
        self.model_name = str(path)
        self._lock = threading.Lock()
        self._llm = None
        self.rank_head = None
        self.gguf = GGUFFile(path, mmap=mmap)
        if self.gguf.architecture in bert.ARCHS:
            try:
                self.spec = bert.build(self.gguf)
                self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
                self.gguf.check_finite()  # a NaN block scale would give finite, wrong embeddings
                if self.spec.pooling == "rank":
                    self.rank_head = rerank.read_head(self.gguf, self.spec.n_embd)
                self.desc = _core.EncoderDesc(self.spec)
                self.desc.watch_faults(self.gguf.fault_token, self.gguf.path)
            except Exception:
                self.gguf.close()
                raise
            self.n_threads = check_threads(n_threads)
            self.n_ctx = min(self.spec.context_length, n_ctx or self.spec.context_length)
            self.n_embd = self.spec.n_embd
            # a reranker's embeddings: its first token's state (the head reads that one)
            self.pooling = pooling or ("cls" if self.spec.pooling == "rank" else self.spec.pooling)
        else:
            arch = self.gguf.architecture
            declared = declared_pooling(self.gguf.metadata, arch)
            trained = self.gguf.metadata.get(f"{arch}.context_length")
            try:
                if rerank.declares_rank(self.gguf.metadata, arch):  # a decoder reranker (Qwen3-Reranker)
                    declared = "last"
                    n_embd = self.gguf.metadata.get(f"{arch}.embedding_length")
                    if not isinstance(n_embd, (int, np.integer)) or n_embd <= 0:
                        raise UnsupportedModelError(f"{path}: {arch}.embedding_length is missing")
                    self.rank_head = rerank.read_head(self.gguf, int(n_embd), decoder=True)
            finally:
                self.gguf.close()
            default = min(2048, int(trained)) if isinstance(trained, (int, np.integer)) and trained > 0 else 2048
            self._llm = LLM(path, n_ctx=n_ctx or default, n_threads=n_threads, mmap=mmap)
            self.tokenizer = self._llm.tokenizer
            self.n_threads = self._llm.n_threads
            self.n_ctx = self._llm.n_ctx
            self.n_embd = self._llm.spec.n_embd
            self.pooling = pooling or declared

    def _token_vectors(self, ids):
        if self._llm is not None:
            return decoder_hidden(self._llm, ids)
        with self._lock:
            return self.desc.encode(np.asarray(ids, dtype=np.int32), None, self.n_threads)

    @property
    def _metadata(self):
        return self._llm.metadata if self._llm is not None else self.gguf.metadata

    def _rank_vectors(self, ids):
        return self._token_vectors(ids)

    def close(self):
        if self._llm is not None:
            self._llm.close()
        else:
            self.desc = None
            self.gguf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        arch = self.spec.arch if self._llm is None else self._llm.architecture
        return f"Embedder({self.model_name!r}, arch={arch}, pooling={self.pooling})"
