"""The `gemma3` architecture (text), as llama.cpp's converter stores it.

- Norm weights in the GGUF already include Gemma's "+1" (the converter adds
  it), so every norm is a plain RMSNorm times its weight.
- Token embeddings are scaled by sqrt(n_embd); the output head is tied to them
  unless the file has its own output.weight.
- Each block: RMSNorm -> attention -> RMSNorm (post_attention_norm) -> residual;
  RMSNorm (ffn_norm) -> GELU(tanh)-gated feed-forward -> RMSNorm (post_ffw_norm)
  -> residual. Queries and keys get a per-head RMSNorm before RoPE (NeoX layout).
- Attention scores are scaled by 1/sqrt(key_length) (1/sqrt(n_embd/n_head)
  for the 62-layer 27B model).
- Sliding-window attention on 5 of every 6 layers (layer i is global when
  i % 6 == 5) with window `attention.sliding_window`; local layers use RoPE
  base 10000 without scaling, global layers `rope.freq_base` and any linear
  scaling from the metadata.
"""

import math

from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_GELU, ROPE_NEOX, Hparams, ModelSpec, Weights, output_head,
                                  read_shape, rope_dims, rope_scale, standard_layers, vocab_size)

ARCH = "gemma3"
SWA_PATTERN = 6           # every 6th layer attends globally
LOCAL_ROPE_BASE = 10000.0


def is_global(layer: int, pattern: int = SWA_PATTERN) -> bool:
    return pattern <= 1 or layer % pattern == pattern - 1


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    sh = read_shape(hp)
    n_embd, n_head, head_dim = sh.n_embd, sh.n_head, sh.head_dim
    window = hp.int("attention.sliding_window", 0)
    pattern = hp.int("attention.sliding_window_pattern", SWA_PATTERN)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)

    layers = standard_layers(w, sh, hp.float("rope.freq_base", 1000000.0), rope_scale(hp))
    for i, L in enumerate(layers):
        p = f"blk.{i}."
        L.q_norm = w.vector(p + "attn_q_norm.weight", head_dim)
        L.k_norm = w.vector(p + "attn_k_norm.weight", head_dim)
        L.post_attn_norm = w.vector(p + "post_attention_norm.weight", n_embd)
        L.post_ffn_norm = w.vector(p + "post_ffw_norm.weight", n_embd)
        if window > 0 and not is_global(i, pattern):
            L.sliding_window = window
            L.rope_base = LOCAL_ROPE_BASE
            L.rope_scale = 1.0

    n_rot = rope_dims(hp, head_dim)
    big = sh.n_layer == 62  # Gemma 3 27B scales by the model width per head instead
    spec = ModelSpec(
        arch=ARCH,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=sh.n_head_kv,
        head_dim=head_dim,
        head_dim_v=sh.head_dim_v,
        n_ff=sh.n_ff,
        n_rot=n_rot,
        rope_mode=ROPE_NEOX,
        gate_fn=ACT_GELU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon", 1e-6),
        embd_scale=math.sqrt(n_embd),
        attn_scale=1.0 / math.sqrt(n_embd / n_head if big else head_dim),
        context_length=hp.int("context_length", 32768),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
    )
    w.check_all_used(sh.n_layer, ARCH)
    return spec
