"""Reranking: a relevance score for each (query, document) pair, as
llama.cpp's pooling type RANK gives it.

    emb = llminfer.Embedder("ms-marco-MiniLM-L6-v2-Q8_0.gguf")
    emb.rank("what is a panda?", ["The giant panda is a bear.", "hi"])   # [4.2, -9.8]
    emb.create_rerank("what is a panda?", docs, top_n=1)                 # Jina/Cohere-shaped

A cross-encoder (a `bert` GGUF with `{arch}.pooling_type` 4) reads the
query and the document in one input; its first token's final hidden state
goes through the classifier head: cls.weight/cls.bias then tanh (the
pooler), then cls.output.weight/cls.output.bias (the scores, one per
classifier label); the score is the first. Either half of the head may be
absent (jina-reranker-v1 has no cls.output), as llama.cpp allows.

A decoder reranker (Qwen3-Reranker: a `qwen3` GGUF with pooling_type 4)
reads the pair through its `tokenizer.chat_template.rerank` prompt; its last
token's final normed hidden state goes through cls.output.weight (the output
head's "yes" and "no" rows), and the score is the softmax's first, P(yes),
as llama.cpp computes it.

The pair is put in one input as llama.cpp's server does it: the GGUF's
`tokenizer.chat_template.rerank` with {query} and {document} replaced,
tokenized with special tokens read and none added; without that template,
[BOS] query [EOS] [SEP] document [EOS], each special token where the
vocabulary adds it (a WordPiece vocabulary: [CLS] query [SEP] document).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llminfer.errors import ContextFullError, InvalidArgumentError, UnsupportedModelError

RERANK_TEMPLATE = "tokenizer.chat_template.rerank"
RANK = 4                          # {arch}.pooling_type of a reranker
SOFTMAX_ARCHS = ("qwen3", "qwen3vl")  # llama.cpp takes the softmax of these heads' outputs


def declares_rank(metadata, arch: str) -> bool:
    v = metadata.get(f"{arch}.pooling_type")
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and int(v) == RANK


@dataclass
class RankHead:
    """The classifier head of a reranker, as float32 arrays."""

    dense: np.ndarray | None       # [n_embd, n_embd] (cls.weight)
    dense_b: np.ndarray | None
    out: np.ndarray | None         # [n_labels, n_embd] (cls.output.weight)
    out_b: np.ndarray | None
    softmax: bool = False          # of the outputs (decoder rerankers)
    row: int = 0                   # the token read: 0 the first (encoders), -1 the last (decoders)

    def scores(self, v: np.ndarray) -> np.ndarray:
        """The head's outputs for one hidden state v [n_embd]."""
        x = np.asarray(v, dtype=np.float32)
        if self.dense is not None:
            x = self.dense @ x
            if self.dense_b is not None:
                x = x + self.dense_b
            x = np.tanh(x)
        if self.out is not None:
            x = self.out @ x
            if self.out_b is not None:
                x = x + self.out_b
        if self.softmax:
            e = np.exp(x.astype(np.float64) - np.max(x))
            x = e / e.sum()
        return x.astype(np.float32)

    def score(self, v: np.ndarray) -> float:
        return float(self.scores(v)[0])


def _dense(gguf, name, n_cols) -> np.ndarray | None:
    if name not in gguf.tensors:
        return None
    from llminfer.core import ops

    info = gguf.tensors[name]
    shape = tuple(int(s) for s in info.shape)
    if len(shape) == 1:
        shape = (shape[0],)
    elif len(shape) != 2 or shape[1] != n_cols:
        raise UnsupportedModelError(f"{gguf.path}: tensor {name!r} has shape {shape}, expected (rows, {n_cols})")
    try:
        out = ops.dequantize(np.ascontiguousarray(gguf.tensor_bytes(name)), info.qtype, shape)
    except Exception as e:  # noqa: BLE001 - a type ops cannot read: say which tensor
        raise UnsupportedModelError(f"{gguf.path}: cannot read tensor {name!r}: {e}") from None
    out = np.array(out, dtype=np.float32).reshape(shape)
    if not np.all(np.isfinite(out)):
        raise UnsupportedModelError(f"{gguf.path}: tensor {name!r} holds non-finite values")
    return out


def read_head(gguf, n_embd: int, decoder: bool = False) -> RankHead:
    """The classifier head (cls.*) of a reranker GGUF; decoder: a causal
    model's (its last token read, its outputs' softmax where llama.cpp
    takes it)."""
    dense = _dense(gguf, "cls.weight", n_embd)
    out = _dense(gguf, "cls.output.weight", n_embd)
    if dense is None and out is None:
        raise UnsupportedModelError(f"{gguf.path}: pooling_type is rank (4), but the file has no classifier "
                                    f"head (cls.weight or cls.output.weight)")
    if dense is not None and dense.shape[0] != n_embd:
        raise UnsupportedModelError(f"{gguf.path}: tensor 'cls.weight' has {dense.shape[0]} rows, expected {n_embd}")
    dense_b = _dense(gguf, "cls.bias", 1) if "cls.bias" in gguf.tensors else None
    out_b = _dense(gguf, "cls.output.bias", 1) if "cls.output.bias" in gguf.tensors else None
    if dense_b is not None:
        dense_b = dense_b.reshape(-1)
        if dense is None or dense_b.size != dense.shape[0]:
            raise UnsupportedModelError(f"{gguf.path}: tensor 'cls.bias' does not match 'cls.weight'")
    if out_b is not None:
        out_b = out_b.reshape(-1)
        if out is None or out_b.size != out.shape[0]:
            raise UnsupportedModelError(f"{gguf.path}: tensor 'cls.output.bias' does not match 'cls.output.weight'")
    if decoder:
        if out is None or dense is not None:
            raise UnsupportedModelError(f"{gguf.path}: a decoder reranker needs cls.output.weight (and no cls.weight)")
        return RankHead(None, None, out, out_b, softmax=gguf.architecture in SOFTMAX_ARCHS, row=-1)
    return RankHead(dense, dense_b, out, out_b)


def pair_ids(tokenizer, metadata, query: str, document: str) -> list:
    """The token ids of one (query, document) input, as llama.cpp's server
    builds it (module docstring)."""
    if not isinstance(query, str):
        raise InvalidArgumentError(f"the query must be a string, not {type(query).__name__}")
    if not isinstance(document, str):
        raise InvalidArgumentError(f"a document must be a string, not {type(document).__name__}")
    template = metadata.get(RERANK_TEMPLATE)
    if isinstance(template, str):
        text = template.replace("{query}", query).replace("{document}", document)
        return tokenizer.encode(text, add_bos=False, special=True)
    wordpiece = tokenizer.kind == "bert"
    # our WordPiece tokenizer's add_eos is llama.cpp's add_sep, its eos [SEP]
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) if wordpiece else tokenizer.add_eos
    add_sep = bool(metadata.get("tokenizer.ggml.add_sep_token", wordpiece))
    sep = metadata.get("tokenizer.ggml.seperator_token_id", 102 if wordpiece else None)
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else sep
    ids = []
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        ids.append(tokenizer.bos_id)
    ids += tokenizer.encode(query, add_bos=False, special=False)
    if add_eos and eos is not None:
        ids.append(int(eos))
    if add_sep and sep is not None:
        ids.append(int(sep))
    ids += tokenizer.encode(document, add_bos=False, special=False)
    if add_eos and eos is not None:
        ids.append(int(eos))
    return ids


def documents_texts(documents) -> list:
    """Documents as texts: each a string or {"text": string}."""
    if isinstance(documents, (str, bytes)) or not isinstance(documents, (list, tuple)):
        raise InvalidArgumentError("documents must be a list of strings")
    out = []
    for d in documents:
        if isinstance(d, dict) and isinstance(d.get("text"), str):
            d = d["text"]
        if not isinstance(d, str):
            raise InvalidArgumentError("each document must be a string or {\"text\": string}")
        out.append(d)
    return out


def check_length(ids, n_ctx, index) -> None:
    if len(ids) > n_ctx:
        raise ContextFullError(f"the query with document {index} has {len(ids)} tokens; the model takes {n_ctx}")


def ranked(scores, texts, top_n=None, return_documents=False) -> list:
    """The results, best first: {index, relevance_score[, document]}."""
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InvalidArgumentError(f"top_n must be a positive integer, got {top_n!r}")
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    out = []
    for i in order[:top_n]:
        r = {"index": i, "relevance_score": float(scores[i])}
        if return_documents:
            r["document"] = {"text": texts[i]}
        out.append(r)
    return out


class Ranking:
    """rank and create_rerank over a model's token vectors. The class that
    takes it has rank_head (a RankHead, or None for a model that is not a
    reranker), tokenizer, n_ctx, model_name, _metadata and
    _rank_vectors(ids) -> [n, n_embd]."""

    rank_head = None

    @property
    def is_reranker(self) -> bool:
        return self.rank_head is not None

    def rank_ids(self, query: str, documents) -> list:
        """The token ids of each (query, document) input; ContextFullError for
        one longer than n_ctx (a cut would drop part of the document)."""
        if not self.is_reranker:
            raise UnsupportedModelError(f"{self.model_name} is not a reranker (its GGUF's pooling_type is not "
                                        f"rank, 4, with a classifier head)")
        texts = documents_texts(documents)
        if not texts:
            raise InvalidArgumentError("documents must not be empty")
        out = []
        for i, d in enumerate(texts):
            ids = pair_ids(self.tokenizer, self._metadata, query, d)
            check_length(ids, self.n_ctx, i)
            out.append(ids)
        return out

    def rank_scores(self, items) -> list:
        """The score of each input of rank_ids."""
        return [self.rank_head.score(self._rank_vectors(ids)[self.rank_head.row]) for ids in items]

    def rank(self, query: str, documents) -> list:
        """The relevance score of each document (a string or {"text": ...})
        to query, in the documents' order: the reranker's raw score (a
        logit; higher is more relevant), as llama.cpp gives it."""
        return self.rank_scores(self.rank_ids(query, documents))

    def create_rerank(self, query: str, documents, top_n: int | None = None, return_documents: bool = False,
                      model: str | None = None) -> dict:
        """The response of /v1/rerank (Jina's and Cohere's shape): results
        best first, top_n of them, each {index, relevance_score} and with
        return_documents {document: {text}}; usage counts the tokens read."""
        texts = documents_texts(documents)
        items = self.rank_ids(query, texts)
        results = ranked(self.rank_scores(items), texts, top_n, return_documents)
        n = sum(len(ids) for ids in items)
        return {"model": model or self.model_name, "object": "list", "results": results,
                "usage": {"prompt_tokens": n, "total_tokens": n}}



class DecoderRanking(Ranking):
    """LLM.rank / LLM.create_rerank: a decoder reranker's scores, each pair
    in a sequence of its own (the LLM's context is untouched)."""

    def __init__(self, llm):
        from llminfer.generation.embeddings import decoder_hidden

        self._llm = llm
        self._hidden = decoder_hidden
        self.tokenizer = llm.tokenizer
        self.model_name = str(llm.model_path)
        self._metadata = llm.metadata
        head = getattr(llm, "_rank_head", None)
        if head is None and declares_rank(llm.metadata, llm.architecture):
            with llm._lock:
                llm._check_open()
                head = llm._rank_head = read_head(llm.engine.gguf, llm.spec.n_embd, decoder=True)
        self.rank_head = head

    @property
    def n_ctx(self):
        return self._llm.n_ctx

    def _rank_vectors(self, ids):
        return self._hidden(self._llm, ids)
