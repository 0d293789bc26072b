"""The `qwen3` architecture (Qwen3 dense): the Llama block without q/k/v
biases, an RMSNorm over each query and key head (attn_q_norm, attn_k_norm,
[head_dim]) before RoPE, RoPE on (i, i + n_rot/2) pairs (NeoX layout), and a
head size given by attention.key_length (128), not n_embd / n_head.

A Qwen3-Reranker file (pooling_type 4) holds cls.output.weight, the
output head's "yes" and "no" rows, read by llminfer.generation.rerank, not here."""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, ModelSpec

ARCH = "qwen3"


def head_norms(spec, w, hp, sh):
    if w.has("cls.output.weight"):  # a reranker's head (llminfer.generation.rerank), as llama.cpp loads it
        w.used.add("cls.output.weight")
    for i, L in enumerate(spec.layers):
        L.q_norm = w.vector(f"blk.{i}.attn_q_norm.weight", sh.head_dim)
        L.k_norm = w.vector(f"blk.{i}.attn_k_norm.weight", sh.head_dim)


def build(gguf: GGUFFile) -> ModelSpec:
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, customize=head_norms, default_eps=1e-6)
