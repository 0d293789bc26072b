"""The `gemma2` architecture, as llama.cpp's converter stores it.

- Norm weights already include Gemma's "+1"; token embeddings are scaled by
  sqrt(n_embd); the output head is the token embedding.
- Each block: RMSNorm -> attention -> RMSNorm (post_attention_norm) ->
  residual; RMSNorm -> GELU(tanh)-gated feed-forward -> RMSNorm
  (post_ffw_norm) -> residual. No q/k norms; RoPE in the NeoX layout.
- Attention scores are scaled by 1/sqrt(key_length) (1/sqrt(n_embd/n_head)
  for the 46-layer 27B), then soft-capped: cap * tanh(score / cap), cap from
  attn_logit_softcapping (50). Logits are soft-capped the same way by
  final_logit_softcapping (30).
- Sliding-window attention (attention.sliding_window, 4096) on every other
  layer, starting with layer 0 (attention.sliding_window_pattern, 2); all
  layers share one RoPE base.
"""

import math

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_GELU, ROPE_NEOX, Hparams, ModelSpec, Weights, is_swa_layer,
                                  output_head, read_shape, rope_dims, rope_scale, standard_layers,
                                  vocab_size)

ARCH = "gemma2"
SWA_PATTERN = 2
DEFAULT_WINDOW = 4096


def _cap(hp, key, default):
    v = hp.float(key, default)
    if not (0.0 <= v <= 1e6):
        raise UnsupportedModelError(f"{hp.path}: metadata '{ARCH}.{key}' is {v!r}, outside [0, 1e6]")
    return v


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    sh = read_shape(hp)
    n_embd, n_head, head_dim = sh.n_embd, sh.n_head, sh.head_dim
    window = hp.int("attention.sliding_window", DEFAULT_WINDOW)
    pattern = hp.int("attention.sliding_window_pattern", SWA_PATTERN)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)

    layers = standard_layers(w, sh, hp.float("rope.freq_base", 10000.0), rope_scale(hp))
    for i, L in enumerate(layers):
        p = f"blk.{i}."
        L.post_attn_norm = w.vector(p + "post_attention_norm.weight", n_embd)
        L.post_ffn_norm = w.vector(p + "post_ffw_norm.weight", n_embd)
        if window > 0 and is_swa_layer(i, pattern):
            L.sliding_window = window

    big = sh.n_layer == 46  # Gemma 2 27B scales by the model width per head instead
    spec = ModelSpec(
        arch=ARCH,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=sh.n_head_kv,
        head_dim=head_dim,
        head_dim_v=sh.head_dim_v,
        n_ff=sh.n_ff,
        n_rot=rope_dims(hp, head_dim),
        rope_mode=ROPE_NEOX,
        gate_fn=ACT_GELU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon", 1e-6),
        embd_scale=math.sqrt(n_embd),
        attn_scale=1.0 / math.sqrt(n_embd / n_head if big else head_dim),
        context_length=hp.int("context_length", 8192),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
        attn_softcap=_cap(hp, "attn_logit_softcapping", 50.0),
        final_softcap=_cap(hp, "final_logit_softcapping", 30.0),
    )
    w.check_all_used(sh.n_layer, ARCH)
    return spec
