"""The `bert` and `nomic-bert` encoder architectures (all-MiniLM, bge,
nomic-embed-text), for embeddings. Post-norm blocks with LayerNorm (weight
and bias) around attention over the whole input (no causal mask) and a
feed-forward; bert adds learned absolute position embeddings and has a GELU
feed-forward with biases, nomic-bert rotates q and k (RoPE, NeoX pairs), has
a fused attn_qkv and a SiLU-gated feed-forward without biases. Token type
embeddings (token_types.weight) add row 0, as llama.cpp does. The encoder
runs in csrc/encoder.c (llminfer._core.EncoderDesc).

pooling_type (`{arch}.pooling_type`, llama.cpp's numbers): 0 none, 1 mean,
2 CLS (the first token), 3 last, 4 rank (a cross-encoder reranker: the first
token through the classifier head cls.*, read by llminfer.generation.rerank)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import ROPE_NEOX, Hparams, Matrix, Weights

ARCHS = ("bert", "nomic-bert")
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}
RANK = 4  # pooling_type of a reranker


@dataclass
class EncoderLayer:
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    attn_out_norm: np.ndarray
    attn_out_norm_b: np.ndarray
    w_up: Matrix
    w_down: Matrix
    out_norm: np.ndarray
    out_norm_b: np.ndarray
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    b_up: np.ndarray | None = None
    w_gate: Matrix | None = None
    b_down: np.ndarray | None = None


@dataclass
class EncoderSpec:
    arch: str
    n_vocab: int
    n_embd: int
    n_head: int
    head_dim: int
    n_ff: int
    n_rot: int            # 0: no RoPE (bert)
    rope_mode: int
    rope_base: float
    norm_eps: float
    context_length: int   # the longest input
    pooling: str          # "none", "mean", "cls", "last" or "rank"
    tok_embd: Matrix
    embd_norm: np.ndarray
    embd_norm_b: np.ndarray
    pos_embd: Matrix | None = None
    type_embd: Matrix | None = None
    layers: list = field(default_factory=list)

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def n_params(self) -> int:
        mats = [self.tok_embd] + [m for m in (self.pos_embd, self.type_embd) if m is not None]
        for L in self.layers:
            mats += [m for m in (L.wq, L.wk, L.wv, L.wo, L.w_up, L.w_gate, L.w_down) if m is not None]
        return sum(m.rows * m.k for m in mats)


def _rows(m: Matrix, start: int, count: int) -> Matrix:
    """Rows [start, start+count) of a matrix, sharing its bytes."""
    per = m.data.nbytes // m.rows
    return Matrix(m.data[start * per:(start + count) * per], m.qtype, count, m.k)


def build(gguf: GGUFFile) -> EncoderSpec:
    arch = gguf.architecture
    if arch not in ARCHS:
        raise UnsupportedModelError(f"{gguf.path}: {arch!r} is not an encoder architecture ({', '.join(ARCHS)})")
    hp = Hparams(gguf, arch)
    E = hp.int("embedding_length")
    n_head = hp.int("attention.head_count")
    if E % n_head:
        raise UnsupportedModelError(f"{gguf.path}: embedding_length {E} is not a multiple of head_count {n_head}")
    n_layer = hp.int("block_count")
    F = hp.int("feed_forward_length")
    ctx = hp.int("context_length", 512)
    if hp.meta.get(f"{arch}.attention.causal") is True:
        raise UnsupportedModelError(f"{gguf.path}: a causal {arch} model is not supported")
    pooling_id = hp.int("pooling_type", 1)
    if pooling_id not in POOLING and pooling_id != RANK:
        raise UnsupportedModelError(f"{gguf.path}: pooling_type {pooling_id} is not supported "
                                    f"(0 none, 1 mean, 2 cls, 3 last, 4 rank)")
    tokens = gguf.metadata.get("tokenizer.ggml.tokens") or []
    n_vocab = hp.int("vocab_size", len(tokens))
    w = Weights(gguf)
    nomic = arch == "nomic-bert"
    n_types = int(gguf.metadata.get("tokenizer.ggml.token_type_count", 2 if w.has("token_types.weight") else 0))
    spec = EncoderSpec(
        arch=arch, n_vocab=n_vocab, n_embd=E, n_head=n_head, head_dim=E // n_head, n_ff=F,
        n_rot=hp.int("rope.dimension_count", E // n_head) if nomic else 0,
        rope_mode=ROPE_NEOX, rope_base=hp.float("rope.freq_base", 10000.0) if nomic else 10000.0,
        norm_eps=hp.float("attention.layer_norm_epsilon", 1e-12),
        context_length=ctx, pooling=POOLING.get(pooling_id, "rank"),
        tok_embd=w.matrix("token_embd.weight", n_vocab, E),
        embd_norm=w.vector("token_embd_norm.weight", E), embd_norm_b=w.vector("token_embd_norm.bias", E),
        pos_embd=None if nomic else w.matrix("position_embd.weight", ctx, E),
        type_embd=w.matrix("token_types.weight", n_types, E) if w.has("token_types.weight") else None,
    )
    for i in range(n_layer):
        p = f"blk.{i}."
        if w.has(p + "attn_qkv.weight"):
            qkv = w.matrix(p + "attn_qkv.weight", 3 * E, E)
            wq, wk, wv = _rows(qkv, 0, E), _rows(qkv, E, E), _rows(qkv, 2 * E, E)
            b = w.vector(p + "attn_qkv.bias", 3 * E, optional=True)
            bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        else:
            wq, wk, wv = (w.matrix(p + f"attn_{x}.weight", E, E) for x in "qkv")
            bq, bk, bv = (w.vector(p + f"attn_{x}.bias", E, optional=True) for x in "qkv")
        spec.layers.append(EncoderLayer(
            wq=wq, wk=wk, wv=wv, bq=bq, bk=bk, bv=bv,
            wo=w.matrix(p + "attn_output.weight", E, E), bo=w.vector(p + "attn_output.bias", E, optional=True),
            attn_out_norm=w.vector(p + "attn_output_norm.weight", E),
            attn_out_norm_b=w.vector(p + "attn_output_norm.bias", E),
            w_up=w.matrix(p + "ffn_up.weight", F, E), b_up=w.vector(p + "ffn_up.bias", F, optional=True),
            w_gate=w.matrix(p + "ffn_gate.weight", F, E) if nomic else None,
            w_down=w.matrix(p + "ffn_down.weight", E, F), b_down=w.vector(p + "ffn_down.bias", E, optional=True),
            out_norm=w.vector(p + "layer_output_norm.weight", E),
            out_norm_b=w.vector(p + "layer_output_norm.bias", E),
        ))
    # a classifier head (cls.*) is not part of the embedding; a reranker's is read by llminfer.generation.rerank
    for name in list(gguf.tensors):
        if name.startswith("cls."):
            w.used.add(name)
    w.check_all_used(n_layer, arch)
    return spec
