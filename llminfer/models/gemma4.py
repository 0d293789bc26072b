"""The `gemma4` architecture (text), as llama.cpp's converter stores it and
its src/models/gemma4.cpp runs it.

- Norm weights are stored as the model applies them (no "+1" to add); every
  norm is an RMSNorm times its weight. Token embeddings are scaled by
  sqrt(n_embd); the output head is tied to them unless the file has its own.
- Each block: RMSNorm -> attention -> RMSNorm (post_attention_norm) ->
  residual; RMSNorm (ffn_norm) -> GELU(tanh)-gated feed-forward -> RMSNorm
  (post_ffw_norm) -> residual; then, in the small E models, the per-layer
  embedding (below); then the residual stream times the layer's
  layer_output_scale where the file has one.
- Queries and keys get a per-head RMSNorm with weights, values one without
  (weights of ones here), before RoPE (NeoX layout) and the cache. Scores
  are not scaled (the norms set their size): attn_scale 1. Logits are
  soft-capped by final_logit_softcapping (30 when the key is absent, as
  llama.cpp reads it).
- attention.sliding_window_pattern is an array, one flag per layer: sliding
  layers attend through the window with head size key_length_swa, their
  own KV head count (head_count_kv may be an array), rope.dimension_count_swa
  dims rotated with base rope.freq_base_swa (10000 when absent) and no
  scaling; full layers use key_length, rope.freq_base, any linear scaling,
  and rope_freqs.weight as divisors ("proportional" RoPE: 1e30 for the
  dimensions it leaves unrotated).
- A layer without attn_v uses its key projection for the values too.
- attention.shared_kv_layers: the last that many layers compute no keys or
  values; a sliding one attends to those of the last sliding layer before
  them, a full one to those of the last layer before them (llama.cpp's
  n_layer_kv_from_start - 2 and - 1).
- embedding_length_per_layer_input > 0 (the E models): a per-layer input
  for each token and layer from per_layer_token_embd and the projection
  per_layer_model_proj of the embedding, added after each layer's
  feed-forward through inp_gate, proj and post_norm (csrc/llminfer.h).
- feed_forward_length may be an array (wider layers after the shared ones).
- An image's rows decoded non-causally (Engine.decode_rows) see each other
  both ways in the sliding-window layers only; the full layers stay causal
  (llama.cpp's LLAMA_NON_CAUSAL_TYPE_SWA_ONLY, HF's
  use_bidirectional_attention "vision").

- MoE layers (ffn_gate_inp: 26B-A4B): the dense feed-forward becomes a
  shared expert beside the routed ones, each half with its own norms: the
  shared one reads rmsnorm(x) * ffn_norm and its output is normed by
  post_ffw_norm_1; the experts read rmsnorm(x) * pre_ffw_norm_2, their
  weighted sum (softmax over all experts, the top expert_used_count
  renormalized; expert e's output times ffn_down_exps.scale[e]) normed by
  post_ffw_norm_2; the router reads rmsnorm(x) / sqrt(n_embd) *
  ffn_gate_inp.scale. The two sums go through post_ffw_norm. Gate and up
  experts may be one tensor (ffn_gate_up_exps: each expert's gate rows,
  then its up rows).

Not supported: a fused attn_qkv.
"""

import math

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_GELU, GATING_SOFTMAX, HPARAM_RANGES, ROPE_NEOX, Hparams, LayerSpec, ModelSpec,
                                  MoESpec, Weights, output_head, rope_scale, vocab_size)

ARCH = "gemma4"
DEFAULT_FINAL_SOFTCAP = 30.0
DEFAULT_SWA_BASE = 10000.0


def _per_layer(hp: Hparams, key: str, n_layer: int, default=None) -> list:
    """An integer key stored as one value or as one per layer, as a list of
    n_layer integers, each within the key's range."""
    full = f"{hp.arch}.{key}"
    v = hp.meta.get(full)
    if v is None:
        if default is None:
            raise UnsupportedModelError(f"{hp.path}: metadata key {full!r} is missing")
        return [default] * n_layer
    if isinstance(v, np.ndarray) or isinstance(v, (list, tuple)):
        arr = list(np.asarray(v).reshape(-1))
        if len(arr) != n_layer:
            raise UnsupportedModelError(f"{hp.path}: metadata {full!r} has {len(arr)} values for {n_layer} layers")
    else:
        arr = [v] * n_layer
    out = []
    lo, hi, _ = HPARAM_RANGES.get(key, (0, 1 << 30, False))
    for x in arr:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or not lo <= int(x) <= hi:
            raise UnsupportedModelError(f"{hp.path}: metadata {full!r} holds {x!r}, not an integer in "
                                        f"[{lo}, {hi}]")
        out.append(int(x))
    return out


def _swa_flags(hp: Hparams, n_layer: int) -> list:
    full = f"{hp.arch}.attention.sliding_window_pattern"
    v = hp.meta.get(full)
    if v is None:
        raise UnsupportedModelError(f"{hp.path}: metadata key {full!r} is missing")
    arr = np.asarray(v).reshape(-1)
    if arr.size != n_layer or arr.dtype.kind not in "bui":
        raise UnsupportedModelError(f"{hp.path}: metadata {full!r} must be {n_layer} flags, one per layer "
                                    f"(true: sliding window), got {arr.size} of {arr.dtype}")
    return [bool(x) for x in arr]


def kv_sources(swa: list, n_shared: int, path) -> list:
    """kv_reuse per layer: 0 for a layer with its own keys and values; for
    the last n_shared layers the distance back to the layer whose they read
    (the last of the layers before them, n_kv - 1, for a full one; the one
    before it, n_kv - 2, for a sliding one), which must be of its kind."""
    n_layer = len(swa)
    n_kv = n_layer - n_shared
    out = [0] * n_layer
    if n_shared == 0:
        return out
    if n_kv < 2:
        raise UnsupportedModelError(f"{path}: {n_shared} of {n_layer} layers share keys and values; at least two "
                                    f"must have their own")
    for il in range(n_kv, n_layer):
        src = n_kv - (2 if swa[il] else 1)
        if swa[src] != swa[il]:
            raise UnsupportedModelError(f"{path}: layer {il} ({'sliding' if swa[il] else 'full'}) would share the "
                                        f"keys and values of layer {src}, which is of the other kind")
        out[il] = il - src
    return out


def _moe_layer(w: Weights, p: str, L: LayerSpec, dense: tuple, n_embd: int, n_expert: int, n_ff_exp: int):
    """A MoE layer's router, experts and norms into L; its dense
    feed-forward is the shared expert."""
    router = w.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd)
    down = w.expert_matrix(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp)
    if w.has(p + "ffn_gate_up_exps.weight"):
        L.gate_up_exps = w.expert_matrix(p + "ffn_gate_up_exps.weight", n_expert, 2 * n_ff_exp, n_embd)
        L.moe = MoESpec(router, None, None, down)
    else:
        L.moe = MoESpec(router, w.expert_matrix(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd),
                        w.expert_matrix(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd), down)
    L.gate_shexp, L.up_shexp, L.down_shexp = dense
    L.router_in_scale = w.vector(p + "ffn_gate_inp.scale", n_embd)
    L.down_exps_s = w.vector(p + "ffn_down_exps.scale", n_expert, optional=True)
    L.moe_norm = w.vector(p + "pre_ffw_norm_2.weight", n_embd)
    L.moe_post_norm = w.vector(p + "post_ffw_norm_2.weight", n_embd)
    L.shexp_post_norm = w.vector(p + "post_ffw_norm_1.weight", n_embd)


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    n_embd = hp.int("embedding_length")
    n_layer = hp.int("block_count")
    n_head = hp.int("attention.head_count")
    swa = _swa_flags(hp, n_layer)
    n_head_kv = _per_layer(hp, "attention.head_count_kv", n_layer, n_head)
    n_ff = _per_layer(hp, "feed_forward_length", n_layer)
    hd_full = hp.int("attention.key_length", n_embd // n_head)
    hd_swa = hp.int("attention.key_length_swa", hd_full)
    if hp.int("attention.value_length", hd_full) != hd_full or hp.int("attention.value_length_swa", hd_swa) != hd_swa:
        raise UnsupportedModelError(f"{gguf.path}: gemma4 needs value heads the size of key heads")
    rot_full = hp.int("rope.dimension_count", hd_full)
    rot_swa = hp.int("rope.dimension_count_swa", rot_full)
    for rot, hd in ((rot_full, hd_full), (rot_swa, hd_swa)):
        if rot % 2 or rot > hd or rot < 2:
            raise UnsupportedModelError(f"{gguf.path}: {ARCH}: RoPE over {rot} dims of heads of {hd}")
    for il, kv in enumerate(n_head_kv):
        if kv == 0 or n_head % kv:
            raise UnsupportedModelError(f"{gguf.path}: {ARCH}: layer {il}'s {kv} KV heads do not divide "
                                        f"{n_head} heads")
    window = hp.int("attention.sliding_window")
    n_shared = hp.int("attention.shared_kv_layers", 0)
    if n_shared > n_layer:
        raise UnsupportedModelError(f"{gguf.path}: {n_shared} shared-KV layers of {n_layer}")
    reuse = kv_sources(swa, n_shared, gguf.path)
    n_pe = hp.int("embedding_length_per_layer_input", 0)
    if n_pe < 0 or n_pe > (1 << 16):
        raise UnsupportedModelError(f"{gguf.path}: per-layer embedding width {n_pe} out of range")
    base_full = hp.float("rope.freq_base", 10000.0)
    base_swa = hp.float("rope.freq_base_swa", DEFAULT_SWA_BASE)
    if not (math.isfinite(base_swa) and 1.0 < base_swa <= 1e12):
        raise UnsupportedModelError(f"{gguf.path}: rope.freq_base_swa {base_swa} out of range")
    scale_full = rope_scale(hp)
    softcap = hp.float("final_logit_softcapping", DEFAULT_FINAL_SOFTCAP)
    if not 0.0 <= softcap <= 1e6:
        raise UnsupportedModelError(f"{gguf.path}: final_logit_softcapping {softcap} out of range")

    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    moe_layers = [i for i in range(n_layer) if w.has(f"blk.{i}.ffn_gate_inp.weight")]
    n_expert = n_used = n_ff_exp = 0
    if moe_layers:
        n_expert, n_used = hp.int("expert_count"), hp.int("expert_used_count")
        n_ff_exp = hp.int("expert_feed_forward_length")
        if not 0 < n_used <= n_expert:
            raise UnsupportedModelError(f"{gguf.path}: {n_used} of {n_expert} experts used per token")
        if len({n_ff[i] for i in moe_layers}) > 1:
            raise UnsupportedModelError(f"{gguf.path}: MoE layers whose shared feed-forwards differ in width")
    if any(w.has(f"blk.{i}.attn_qkv.weight") for i in range(n_layer)):
        raise UnsupportedModelError(f"{gguf.path}: a fused attn_qkv in gemma4 is not supported")
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)
    full_factors = None
    if not all(swa):
        full_factors = w.vector("rope_freqs.weight", hd_full // 2)[:rot_full // 2]
        if not np.all(full_factors > 0):
            raise UnsupportedModelError(f"{gguf.path}: rope_freqs.weight holds a divisor that is not positive")
        full_factors = np.ascontiguousarray(full_factors, dtype=np.float32)

    # the model's sizes are the first full layer's (else layer 0's); other layers give their own
    ref = swa.index(False) if not all(swa) else 0
    model_hd = hd_swa if swa[ref] else hd_full
    model_rot = rot_swa if swa[ref] else rot_full
    layers = []
    for i in range(n_layer):
        p = f"blk.{i}."
        hd = hd_swa if swa[i] else hd_full
        nkv = n_head_kv[i]
        dense = (w.matrix(p + "ffn_gate.weight", n_ff[i], n_embd), w.matrix(p + "ffn_up.weight", n_ff[i], n_embd),
                 w.matrix(p + "ffn_down.weight", n_embd, n_ff[i]))
        moe = i in moe_layers
        L = LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", n_embd),
            wq=w.matrix(p + "attn_q.weight", n_head * hd, n_embd),
            wk=None, wv=None,
            wo=w.matrix(p + "attn_output.weight", n_embd, n_head * hd),
            ffn_norm=w.vector(p + "ffn_norm.weight", n_embd),
            w_gate=None if moe else dense[0],
            w_up=None if moe else dense[1],
            w_down=None if moe else dense[2],
            q_norm=w.vector(p + "attn_q_norm.weight", hd),
            post_attn_norm=w.vector(p + "post_attention_norm.weight", n_embd),
            post_ffn_norm=w.vector(p + "post_ffw_norm.weight", n_embd),
        )
        if moe:
            _moe_layer(w, p, L, dense, n_embd, n_expert, n_ff_exp)
        if reuse[i] == 0:
            L.wk = w.matrix(p + "attn_k.weight", nkv * hd, n_embd)
            L.wv = w.matrix(p + "attn_v.weight", nkv * hd, n_embd) if w.has(p + "attn_v.weight") else L.wk
            L.k_norm = w.vector(p + "attn_k_norm.weight", hd)
            L.v_norm = np.ones(hd, dtype=np.float32)
        else:
            L.kv_reuse = reuse[i]
            for name in ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight"):
                if w.has(p + name):  # llama.cpp loads and ignores them in a shared layer
                    w._info(p + name)
        if swa[i]:
            L.sliding_window = window
            L.rope_base, L.rope_scale = base_swa, 1.0
        else:
            L.rope_base, L.rope_scale = base_full, scale_full
            L.rope_factors = full_factors
        if hd != model_hd:
            L.head_dim = L.head_dim_v = hd
        rot = rot_swa if swa[i] else rot_full
        if rot != model_rot:
            L.n_rot = rot
        if nkv != n_head_kv[ref]:
            L.n_head_kv = nkv
        if n_ff[i] != n_ff[ref] and not moe:
            L.n_ff = n_ff[i]
        if w.has(p + "layer_output_scale.weight"):
            s = float(w.vector(p + "layer_output_scale.weight", 1)[0])
            if s == 0.0:
                raise UnsupportedModelError(f"{gguf.path}: layer {i}'s layer_output_scale is 0")
            L.out_scale = s
        if n_pe > 0:
            L.pe_gate = w.matrix(p + "inp_gate.weight", n_pe, n_embd)
            L.pe_proj = w.matrix(p + "proj.weight", n_embd, n_pe)
            L.pe_post_norm = w.vector(p + "post_norm.weight", n_embd)
        layers.append(L)

    spec = ModelSpec(
        arch=ARCH,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv[ref],
        head_dim=model_hd,
        head_dim_v=model_hd,
        n_ff=n_ff[ref],
        n_rot=model_rot,
        rope_mode=ROPE_NEOX,
        gate_fn=ACT_GELU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon"),
        embd_scale=math.sqrt(n_embd),
        attn_scale=1.0,
        context_length=hp.int("context_length", 131072),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
        final_softcap=softcap,
        non_causal_swa_only=True,
    )
    if moe_layers:
        spec.n_expert, spec.n_expert_used, spec.n_ff_exp = n_expert, n_used, n_ff_exp
        spec.n_ff_shexp = n_ff[moe_layers[0]]
        spec.expert_gating = GATING_SOFTMAX
    if n_pe > 0:
        spec.n_embd_pe = n_pe
        spec.pe_tok_embd = w.matrix("per_layer_token_embd.weight", n_vocab, n_layer * n_pe)
        spec.pe_model_proj = w.matrix("per_layer_model_proj.weight", n_layer * n_pe, n_embd)
        spec.pe_proj_norm = w.vector("per_layer_proj_norm.weight", n_pe)
    w.check_all_used(n_layer, ARCH)
    return spec
