"""The `llama` architecture: Llama 2/3/3.x, SmolLM/SmolLM2, TinyLlama, Mistral.
Pre-norm blocks of grouped-query attention and a SiLU-gated feed-forward;
RoPE on adjacent pairs (the GGUF converter permutes q/k for it); the output
head tied to the embedding when output.weight is absent; Llama 3.1's
per-frequency RoPE factors from rope_freqs.weight; YaRN scaling (Qwen's
long-context files) as per-frequency factors too (base.apply_yarn).

When the file sets attention.sliding_window (Mistral 7B v0.1 and files made
by tools that keep it), every layer attends to the last W positions, as the
model was trained. llama.cpp ignores the key for `llama` files, so the two
agree only on texts shorter than the window.

Other architectures of the same shape build through build() with their own
RoPE layout, their own `make_layers(w, hp, sh)` where the blocks' tensors
differ, and a `customize(spec, w, hp, sh)` step that reads their extra
tensors and settings before the check that every tensor was used."""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_SILU, ROPE_NORM, Hparams, ModelSpec, Weights,
                                  apply_yarn, attn_scale_default, output_head, read_shape, rope_dims, rope_scale,
                                  standard_layers, vocab_size)

ARCH = "llama"


def build(gguf: GGUFFile, arch: str = ARCH, rope_mode: int = ROPE_NORM, biases: bool = False,
          customize=None, make_layers=None, default_eps: float = 1e-5, yarn=None) -> ModelSpec:
    """yarn: (beta_fast, beta_slow, log_mul) for YaRN scaling where the
    architecture reads them from the file (mistral3); llama.cpp's defaults
    (32, 1, 0) otherwise."""
    hp = Hparams(gguf, arch)
    sh = read_shape(hp)
    n_embd = sh.n_embd
    n_rot = rope_dims(hp, sh.head_dim)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)
    spec = ModelSpec(
        arch=arch,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=sh.n_head,
        n_head_kv=sh.n_head_kv,
        head_dim=sh.head_dim,
        head_dim_v=sh.head_dim_v,
        n_ff=sh.n_ff,
        n_rot=n_rot,
        rope_mode=rope_mode,
        gate_fn=ACT_SILU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon", default_eps),
        embd_scale=1.0,
        attn_scale=attn_scale_default(sh.head_dim),
        context_length=hp.int("context_length", 2048),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=(make_layers(w, hp, sh) if make_layers is not None else
                standard_layers(w, sh, hp.float("rope.freq_base", 10000.0), rope_scale(hp, yarn_ok=True),
                                biases=biases)),
        rope_factors=w.vector("rope_freqs.weight", n_rot // 2, optional=True),
    )
    if make_layers is None:
        window = hp.int("attention.sliding_window", 0)
        for L in spec.layers:
            L.sliding_window = window
    if customize is not None:
        customize(spec, w, hp, sh)
    if hp.str("rope.scaling.type", "none").lower() == "yarn":
        apply_yarn(spec, hp, *(yarn or ()))
    w.check_all_used(sh.n_layer, arch)
    return spec
