"""The `phi3` architecture (Phi-3, Phi-3.5, Phi-4 mini and Phi-4), as
llama.cpp's converter stores it.

- q, k and v in one tensor, attn_qkv [n_embd + 2 * n_embd_kv, n_embd]
  (separate attn_q/k/v are read too); gate and up in one tensor, ffn_up
  [2 * n_ff, n_embd], gate first. Both are cut into row blocks, views of the
  same bytes, so the C core sees the Llama block.
- RoPE in the NeoX layout. LongRoPE (the 128k models): per-frequency
  divisors rope_factors_short / rope_factors_long, the long ones when the
  context asked for is longer than rope.scaling.original_context_length, as
  llama.cpp chooses; and rope.scaling.attn_factor, which RoPE multiplies
  into both q and k, so it enters the scores squared.
- attention.sliding_window > 0 makes every layer attend to that window, as
  the model was trained (Phi-3 mini: 2047). llama.cpp turns it off for phi3,
  so the two agree only on texts shorter than the window.
"""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, LayerSpec, ModelSpec, rope_scale

ARCH = "phi3"


def _layers(w, hp, sh):
    E, F = sh.n_embd, sh.n_ff
    nq, nk, nv = sh.n_head * sh.head_dim, sh.n_head_kv * sh.head_dim, sh.n_head_kv * sh.head_dim_v
    base, scale = hp.float("rope.freq_base", 10000.0), rope_scale(hp, yarn_ok=True)
    window = hp.int("attention.sliding_window", 0)
    layers = []
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        if w.has(p + "attn_qkv.weight"):
            wq, wk, wv = w.split_rows(p + "attn_qkv.weight", [nq, nk, nv], E)
        else:
            wq, wk, wv = (w.matrix(p + f"attn_{x}.weight", r, E) for x, r in (("q", nq), ("k", nk), ("v", nv)))
        gate, up = w.split_rows(p + "ffn_up.weight", [F, F], E)
        layers.append(LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", E),
            wq=wq, wk=wk, wv=wv,
            wo=w.matrix(p + "attn_output.weight", E, sh.n_head * sh.head_dim_v),
            ffn_norm=w.vector(p + "ffn_norm.weight", E),
            w_gate=gate, w_up=up,
            w_down=w.matrix(p + "ffn_down.weight", E, F),
            rope_base=base, rope_scale=scale, sliding_window=window))
    return layers


def build(gguf: GGUFFile, n_ctx: int | None = None) -> ModelSpec:
    def long_rope(spec, w, hp, sh):
        half = spec.n_rot // 2
        short = w.vector("rope_factors_short.weight", half, optional=True)
        long = w.vector("rope_factors_long.weight", half, optional=True)
        if short is None and long is None:
            return
        orig = hp.int("rope.scaling.original_context_length", spec.context_length)
        use_long = n_ctx is not None and n_ctx > orig
        chosen = long if use_long else short
        spec.rope_factors = chosen if chosen is not None else (short if long is None else long)
        factor = hp.float("rope.scaling.attn_factor", 1.0)
        spec.attn_scale *= factor * factor

    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, customize=long_rope, make_layers=_layers)
