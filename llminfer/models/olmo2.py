"""The `olmo2` architecture (OLMo 2, and OLMo 3 with its windows).

- No norm before attention or the feed-forward: each half's output is
  normed (post_attention_norm, post_ffw_norm) and added to the residual.
- q and k get one RMSNorm each over the whole projection (attn_q_norm
  [n_head * head_dim], attn_k_norm [n_head_kv * head_dim]), before they are
  split into heads and rotated (NeoX layout).
- The output head is its own tensor (output.weight).
- With attention.sliding_window set (OLMo 3), 3 of every 4 layers
  (attention.sliding_window_pattern) attend through the window, with
  rope.freq_base_swa and no RoPE scaling.
"""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, LayerSpec, ModelSpec, is_swa_layer, rope_scale

ARCH = "olmo2"
SWA_PATTERN = 4


def _layers(w, hp, sh):
    E, F = sh.n_embd, sh.n_ff
    nq, nk, nv = sh.n_head * sh.head_dim, sh.n_head_kv * sh.head_dim, sh.n_head_kv * sh.head_dim_v
    base, scale = hp.float("rope.freq_base", 10000.0), rope_scale(hp, yarn_ok=True)
    window = hp.int("attention.sliding_window", 0)
    pattern = hp.int("attention.sliding_window_pattern", SWA_PATTERN)
    swa_base = hp.float("rope.freq_base_swa", base)
    layers = []
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        L = LayerSpec(
            attn_norm=None,
            wq=w.matrix(p + "attn_q.weight", nq, E),
            wk=w.matrix(p + "attn_k.weight", nk, E),
            wv=w.matrix(p + "attn_v.weight", nv, E),
            wo=w.matrix(p + "attn_output.weight", E, sh.n_head * sh.head_dim_v),
            ffn_norm=None,
            w_gate=w.matrix(p + "ffn_gate.weight", F, E),
            w_up=w.matrix(p + "ffn_up.weight", F, E),
            w_down=w.matrix(p + "ffn_down.weight", E, F),
            q_norm=w.vector(p + "attn_q_norm.weight", nq),
            k_norm=w.vector(p + "attn_k_norm.weight", nk),
            post_attn_norm=w.vector(p + "post_attention_norm.weight", E),
            post_ffn_norm=w.vector(p + "post_ffw_norm.weight", E),
            rope_base=base, rope_scale=scale)
        if window > 0 and is_swa_layer(i, pattern):
            L.sliding_window, L.rope_base, L.rope_scale = window, swa_base, 1.0
        layers.append(L)
    return layers


def _whole_qk_norm(spec, w, hp, sh):
    spec.qk_norm_whole = True


def build(gguf: GGUFFile) -> ModelSpec:
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, customize=_whole_qk_norm, make_layers=_layers,
                       default_eps=1e-6)
