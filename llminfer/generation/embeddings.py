"""Embeddings: one vector per input text, OpenAI-shaped; pooling and the
decoder models' hidden states (LLM.embed). The front that loads any
embedding model, encoder or decoder, is llminfer.generation.embedder.Embedder.

    llm.embed("text")                                    # pooled from a decoder model

Encoder models (the `bert` and `nomic-bert` architectures: all-MiniLM, bge,
nomic-embed-text) run in csrc/encoder.c, every token attending to every
other. Decoder models (llama, qwen2, gemma3, ...) give their final normed
hidden states, the rows their output head would read. The token vectors are
pooled as the GGUF declares (`{arch}.pooling_type`: mean, CLS = the first
token, last; decoders that declare none are mean-pooled) and, by default,
scaled to unit L2 norm, as llama.cpp does.
"""

from __future__ import annotations

import numpy as np

from llminfer.errors import ContextFullError, InvalidArgumentError
from llminfer.models import bert

POOLINGS = ("mean", "cls", "last", "none")


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """One vector from token vectors [n, n_embd] (or the rows themselves for "none")."""
    if pooling == "mean":
        return hidden.astype(np.float64).mean(axis=0).astype(np.float32)
    if pooling == "cls":
        return hidden[0].copy()
    if pooling == "last":
        return hidden[-1].copy()
    if pooling == "none":
        return hidden
    raise InvalidArgumentError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")


def l2_normalize(v: np.ndarray) -> np.ndarray:
    """v / ||v|| along the last axis (zero vectors stay zero)."""
    v = np.asarray(v, dtype=np.float32)
    n = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)


def _inputs(input) -> tuple[list, bool]:
    """(texts or id lists, whether one input was given)."""
    if isinstance(input, str):
        return [input], True
    if isinstance(input, (list, tuple)) and input and all(isinstance(t, (int, np.integer)) for t in input):
        return [list(input)], True
    if isinstance(input, (list, tuple)) and all(isinstance(t, (str, list, tuple)) for t in input):
        return list(input), False
    raise InvalidArgumentError("input must be a string, a list of strings, a list of token ids, "
                               f"or a list of those; got {type(input).__name__}")


class EmbeddingBase:
    """embed and create_embedding over a token-vectors function."""

    pooling = "mean"
    model_name = ""

    def _ids(self, item, truncate: bool) -> list:
        """item (a text or token ids) as ids, cut to n_ctx where truncate allows."""
        if isinstance(item, str):
            ids = self.tokenizer.encode(item, add_bos=True, special=False)
        else:
            ids = [int(t) for t in item]
            bad = [t for t in ids if not 0 <= t < self.tokenizer.n_vocab]
            if bad:
                raise InvalidArgumentError(f"token id {bad[0]} is outside the vocabulary [0, {self.tokenizer.n_vocab})")
        if not ids:
            raise InvalidArgumentError("an empty input has no embedding")
        if len(ids) > self.n_ctx:
            if not truncate:
                raise ContextFullError(f"the input has {len(ids)} tokens; the model takes {self.n_ctx}")
            keep_last = self.tokenizer.add_eos and ids[-1] == self.tokenizer.eos_id
            ids = ids[:self.n_ctx - 1] + [ids[-1]] if keep_last else ids[:self.n_ctx]
        return ids

    def _token_vectors(self, ids) -> np.ndarray:
        raise NotImplementedError

    def embed(self, input, normalize: bool = True, truncate: bool = True, pooling: str | None = None,
              return_count: bool = False):
        """Vectors for input (a text, or a list of texts): a list of floats for
        one text, a list of lists for several (with pooling "none", a list of
        token vectors per text). normalize scales each to unit L2 norm;
        truncate cuts an input longer than the model takes (else
        ContextFullError). With return_count, (vectors, tokens used)."""
        p = self.pooling if pooling is None else pooling
        if p not in POOLINGS:
            raise InvalidArgumentError(f"pooling must be one of {', '.join(POOLINGS)}, got {p!r}")
        items, single = _inputs(input)
        out, count = [], 0
        for item in items:
            ids = self._ids(item, truncate)
            count += len(ids)
            v = pool(self._token_vectors(ids), p)
            if normalize:
                v = l2_normalize(v)
            out.append(v.tolist())
        out = out[0] if single else out
        return (out, count) if return_count else out

    def create_embedding(self, input, model: str | None = None, **kwargs) -> dict:
        """OpenAI's embeddings response for input (a text or a list of texts)."""
        items, single = _inputs(input)
        vecs, count = self.embed(items, return_count=True, **kwargs)
        return {"object": "list", "model": model or self.model_name,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": count, "total_tokens": count}}


def declared_pooling(metadata, arch: str) -> str:
    """The pooling a decoder model's GGUF declares ({arch}.pooling_type),
    mean when it declares none."""
    declared = metadata.get(f"{arch}.pooling_type")
    return bert.POOLING.get(int(declared) if declared is not None else 1, "mean")


def engine_hidden(eng, ids) -> np.ndarray:
    """The final normed hidden states [len(ids), n_embd] of ids on an Engine,
    in a sequence of their own, given back after."""
    seq = eng.new_sequence()
    try:
        return eng.hidden_states(seq, ids, "all")
    finally:
        eng.free(seq)


def decoder_hidden(llm, ids) -> np.ndarray:
    """The final normed hidden states [len(ids), n_embd] of a decoder model
    for ids, in a sequence of their own (the LLM's context is untouched)."""
    with llm._lock:
        llm._check_open()
        eng = llm.engine
        if len(ids) > eng.n_ctx:
            raise ContextFullError(f"the input has {len(ids)} tokens; n_ctx is {eng.n_ctx}")
        return engine_hidden(eng, ids)


class DecoderEmbedding(EmbeddingBase):
    """LLM.embed / LLM.create_embedding: pooled hidden states of the LLM's model."""

    def __init__(self, llm):
        self._llm = llm
        self.pooling = declared_pooling(llm.metadata, llm.architecture)
        self.model_name = str(llm.model_path)
        self.tokenizer = llm.tokenizer

    @property
    def n_ctx(self):
        return self._llm.n_ctx

    def _token_vectors(self, ids):
        return decoder_hidden(self._llm, ids)
