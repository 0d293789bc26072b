"""The `gpt-oss` architecture (OpenAI's gpt-oss-20b and -120b), read as
llama.cpp reads it (src/models/openai-moe.cpp there):

- pre-norm blocks; the feed-forward's pre-norm is stored as
  post_attention_norm;
- attention with q/k/v biases, a bias on the output projection, NeoX RoPE
  (YaRN-scaled in the released files) and per-head attention sinks
  (attn_sinks [n_head]: a logit each head's softmax counts in its
  denominator and that weighs no value), scores scaled by 1/sqrt(n_rot);
- layers alternating between a sliding window (attention.sliding_window,
  128) and the whole context: of every attention.sliding_window_pattern
  layers (2 by default) the last attends globally, or per layer when the
  key is an array;
- a mixture of experts with biases everywhere: the router's logits (plus
  ffn_gate_inp.bias) pick the expert_used_count largest, weighted by a
  softmax over those alone; each expert computes gate and up (plus their
  per-expert biases), the clamped SwiGLU min(g, 7) sigmoid(1.702 min(g, 7))
  (clip(u, -7, 7) + 1), then down (plus its bias). The released files keep
  the experts in MXFP4.
"""

from __future__ import annotations

import math

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import (ACT_SWIGLU_OAI, GATING_SOFTMAX_WEIGHT, ROPE_NEOX, LayerSpec, ModelSpec, MoESpec,
                                  is_swa_layer, rope_dims, rope_scale)

ARCH = "gpt-oss"
MAX_EXPERTS = 4096  # LI_MAX_EXPERTS in csrc/context.h


def _experts(hp):
    n_expert = hp.int("expert_count", 0)
    n_used = hp.int("expert_used_count", 0)
    if not (0 < n_expert <= MAX_EXPERTS) or not (0 < n_used <= n_expert):
        raise UnsupportedModelError(f"{hp.path}: {ARCH}.expert_count {n_expert} and expert_used_count {n_used} "
                                    f"must satisfy 0 < used <= count <= {MAX_EXPERTS}")
    n_ff_exp = hp.int("expert_feed_forward_length")
    if not (0 < n_ff_exp <= 1 << 20):
        raise UnsupportedModelError(f"{hp.path}: {ARCH}.expert_feed_forward_length {n_ff_exp} is out of range")
    return n_expert, n_used, n_ff_exp


def _windowed(hp, n_layer) -> list:
    """Whether each layer attends through the sliding window."""
    key = f"{ARCH}.attention.sliding_window_pattern"
    raw = hp.meta.get(key)
    if isinstance(raw, (list, tuple, np.ndarray)):
        flags = [bool(v) for v in np.asarray(raw).reshape(-1)]
        if len(flags) < n_layer:
            raise UnsupportedModelError(f"{hp.path}: {key} has {len(flags)} entries for {n_layer} layers")
        return flags[:n_layer]
    pattern = hp.int("attention.sliding_window_pattern", 2)
    return [is_swa_layer(i, pattern) for i in range(n_layer)]


def _layers(w, hp, sh):
    E, H = sh.n_embd, sh.n_head
    nq, nk, nv = H * sh.head_dim, sh.n_head_kv * sh.head_dim, sh.n_head_kv * sh.head_dim_v
    n_expert, _, Fe = _experts(hp)
    base, scale = hp.float("rope.freq_base", 10000.0), rope_scale(hp, yarn_ok=True)
    base_swa = hp.float("rope.freq_base_swa", base)
    window = hp.int("attention.sliding_window")
    if window <= 0:
        raise UnsupportedModelError(f"{hp.path}: {ARCH}.attention.sliding_window is {window}; gpt-oss's local "
                                    f"layers need a window")
    local = _windowed(hp, sh.n_layer)
    layers = []
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        layers.append(LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", E),
            wq=w.matrix(p + "attn_q.weight", nq, E),
            wk=w.matrix(p + "attn_k.weight", nk, E),
            wv=w.matrix(p + "attn_v.weight", nv, E),
            wo=w.matrix(p + "attn_output.weight", E, H * sh.head_dim_v),
            ffn_norm=w.vector(p + "post_attention_norm.weight", E),  # the feed-forward's pre-norm
            w_gate=None, w_up=None, w_down=None,
            bq=w.vector(p + "attn_q.bias", nq, optional=True),
            bk=w.vector(p + "attn_k.bias", nk, optional=True),
            bv=w.vector(p + "attn_v.bias", nv, optional=True),
            bo=w.vector(p + "attn_output.bias", E),
            attn_sinks=w.vector(p + "attn_sinks.weight", H),
            rope_base=base_swa if local[i] else base, rope_scale=scale,
            sliding_window=window if local[i] else 0,
            moe=MoESpec(
                router=w.matrix(p + "ffn_gate_inp.weight", n_expert, E),
                gate_exps=w.expert_matrix(p + "ffn_gate_exps.weight", n_expert, Fe, E),
                up_exps=w.expert_matrix(p + "ffn_up_exps.weight", n_expert, Fe, E),
                down_exps=w.expert_matrix(p + "ffn_down_exps.weight", n_expert, E, Fe)),
            router_b=w.vector(p + "ffn_gate_inp.bias", n_expert),
            gate_exps_b=w.vector(p + "ffn_gate_exps.bias", n_expert * Fe),
            up_exps_b=w.vector(p + "ffn_up_exps.bias", n_expert * Fe),
            down_exps_b=w.vector(p + "ffn_down_exps.bias", n_expert * E)))
    return layers


def _customize(spec, w, hp, sh):
    spec.n_expert, spec.n_expert_used, spec.n_ff_exp = _experts(hp)
    spec.gate_fn = ACT_SWIGLU_OAI
    spec.expert_gating = GATING_SOFTMAX_WEIGHT
    spec.attn_scale = 1.0 / math.sqrt(rope_dims(hp, sh.head_dim))  # llama.cpp: 1/sqrt(n_rot); YaRN scales it after


def build(gguf: GGUFFile) -> ModelSpec:
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, customize=_customize, make_layers=_layers,
                       default_eps=1e-5)
