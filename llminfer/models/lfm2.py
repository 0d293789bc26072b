"""The `lfm2` architecture (Liquid AI's LFM2 and LFM2.5 dense models), as
llama.cpp's converter stores it (src/models/lfm2.cpp there).

- Pre-norm blocks; each layer is either a gated short convolution or
  attention, told apart by attention.head_count_kv, an array with 0 for the
  convolution layers.
- A convolution layer: shortconv.in_proj [3 * n_embd, n_embd] gives b, c and
  x; b * x is convolved over time per channel with shortconv.l_cache taps
  (F32 shortconv.conv, the oldest input's tap first; the layer keeps the
  last l_cache - 1 inputs per sequence); the result times c goes through
  shortconv.out_proj.
- An attention layer: grouped-query attention with a per-head RMSNorm of
  queries and keys, RoPE in the NeoX layout; attention.sliding_window, when
  the file sets it, windows every attention layer (as llama.cpp reads it).
- Every layer has the SiLU-gated feed-forward after its ffn_norm.
- The final norm is named token_embd_norm; the head is tied to the
  embedding unless output.weight is present.

lfm2moe (LFM2-8B-A1B, LFM2-24B-A2B) is the same with experts in the layers
after leading_dense_block_count: a sigmoid router whose top expert_used_count
are chosen after adding exp_probs_b.bias, weighted by their (unbiased)
sigmoids normalized to sum 1 (the C core's LI_GATING_SIGMOID, with the
bias as the layer's router_sel_b).
The bidirectional LFM2 encoders (attention.causal false) and the ColBERT
head (dense_2) are not read."""

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_SILU, GATING_SIGMOID, ROPE_NEOX, Hparams, LayerSpec, ModelSpec, MoESpec, Weights,
                                  attn_scale_default, output_head, rope_dims, rope_scale, vocab_size)
from llminfer.models.hybrid import MAX_CONV, dense_ffn, layer_array, shortconv_layer, ssm_size

ARCH = "lfm2"
MOE_ARCH = "lfm2moe"
SIGMOID = 2  # expert_gating_func: gguf's ExpertGatingFuncType.SIGMOID


def _experts(hp: Hparams, n_layer: int):
    """lfm2moe: (experts, used, width, leading dense layers)."""
    from llminfer.models.qwen3moe import MAX_EXPERTS
    n_expert, n_used = hp.int("expert_count", 0), hp.int("expert_used_count", 0)
    n_ff_exp = hp.int("expert_feed_forward_length", 0)
    lead = hp.int("leading_dense_block_count", 0)
    if not (0 < n_used <= n_expert <= MAX_EXPERTS) or not 0 < n_ff_exp <= 1 << 20 or not 0 <= lead <= n_layer:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.expert_count {n_expert}, expert_used_count {n_used}, "
                                    f"expert_feed_forward_length {n_ff_exp} and leading_dense_block_count {lead} "
                                    f"do not fit")
    return n_expert, n_used, n_ff_exp, lead


def build(gguf: GGUFFile, arch: str = ARCH) -> ModelSpec:
    hp = Hparams(gguf, arch)
    causal = gguf.metadata.get(f"{arch}.attention.causal", True)
    if causal is False or (isinstance(causal, (bool, np.bool_)) and not causal):
        raise UnsupportedModelError(f"{gguf.path}: a bidirectional LFM2 encoder ({arch}.attention.causal is "
                                    f"false) does not generate text")
    n_layer = hp.int("block_count")
    n_embd = hp.int("embedding_length")
    n_head = hp.int("attention.head_count")
    n_ff = hp.int("feed_forward_length")
    l_cache = ssm_size(hp, "shortconv.l_cache", 2, MAX_CONV)
    kv = layer_array(hp, "attention.head_count_kv", n_layer)
    if kv is None:
        raise UnsupportedModelError(f"{gguf.path}: metadata '{arch}.attention.head_count_kv' is missing; "
                                    f"lfm2 tells its convolution layers (0) from attention layers by it")
    kv_heads = sorted({k for k in kv if k != 0})
    if len(kv_heads) > 1:
        raise UnsupportedModelError(f"{gguf.path}: {arch}.attention.head_count_kv gives attention layers "
                                    f"different KV head counts {kv_heads}; llminfer runs one per model")
    if any(k < 0 for k in kv) or (kv_heads and (kv_heads[0] > 1 << 12 or n_head % kv_heads[0])):
        raise UnsupportedModelError(f"{gguf.path}: {arch}.attention.head_count_kv {kv} does not divide "
                                    f"attention.head_count {n_head}")
    n_head_kv = kv_heads[0] if kv_heads else n_head
    if f"{arch}.attention.key_length" not in hp.meta and n_embd % n_head:
        raise UnsupportedModelError(f"{gguf.path}: {arch}.embedding_length {n_embd} is not a multiple of "
                                    f"attention.head_count {n_head}")
    head_dim = hp.int("attention.key_length", n_embd // n_head)
    if hp.int("attention.value_length", head_dim) != head_dim or head_dim * n_head != n_embd:
        raise UnsupportedModelError(f"{gguf.path}: lfm2 attention needs key and value heads of "
                                    f"n_embd / n_head = {n_embd // n_head}")
    n_rot = rope_dims(hp, head_dim)
    base, scale = hp.float("rope.freq_base", 1000000.0), rope_scale(hp)
    window = hp.int("attention.sliding_window", 0)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)

    moe = _experts(hp, n_layer) if arch == MOE_ARCH else None
    layers = []
    for i in range(n_layer):
        p = f"blk.{i}."
        ffn_norm = w.vector(p + "ffn_norm.weight", n_embd)
        if moe is not None and i >= moe[3]:
            ne, _, fe, _ = moe
            ffn = dict(w_gate=None, w_up=None, w_down=None, moe=MoESpec(
                router=w.matrix(p + "ffn_gate_inp.weight", ne, n_embd),
                gate_exps=w.expert_matrix(p + "ffn_gate_exps.weight", ne, fe, n_embd),
                up_exps=w.expert_matrix(p + "ffn_up_exps.weight", ne, fe, n_embd),
                down_exps=w.expert_matrix(p + "ffn_down_exps.weight", ne, n_embd, fe)),
                router_sel_b=w.vector(p + "exp_probs_b.bias", ne))  # added to the sigmoids to choose
        else:
            ffn = dense_ffn(w, p, n_embd, n_ff)
        if kv[i] == 0:
            layers.append(shortconv_layer(w, p, n_embd, l_cache, ffn_norm, ffn))
            continue
        layers.append(LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", n_embd),
            wq=w.matrix(p + "attn_q.weight", n_head * head_dim, n_embd),
            wk=w.matrix(p + "attn_k.weight", n_head_kv * head_dim, n_embd),
            wv=w.matrix(p + "attn_v.weight", n_head_kv * head_dim, n_embd),
            wo=w.matrix(p + "attn_output.weight", n_embd, n_head * head_dim),
            ffn_norm=ffn_norm, **ffn,
            q_norm=w.vector(p + "attn_q_norm.weight", head_dim),
            k_norm=w.vector(p + "attn_k_norm.weight", head_dim),
            rope_base=base, rope_scale=scale, sliding_window=window))

    spec = ModelSpec(
        arch=arch,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim,
        n_ff=n_ff,
        n_rot=n_rot,
        rope_mode=ROPE_NEOX,
        gate_fn=ACT_SILU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon"),
        embd_scale=1.0,
        attn_scale=attn_scale_default(head_dim),
        context_length=hp.int("context_length", 128000),
        tok_embd=tok_embd,
        # llama.cpp's name for LFM2's final norm (LLM_TENSOR_OUTPUT_NORM_LFM2)
        output_norm=w.vector("token_embd_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
        ssm_d_conv=l_cache,
        ssm_d_inner=n_embd,  # the convolution's channels
    )
    if moe is not None:
        spec.n_expert, spec.n_expert_used, spec.n_ff_exp = moe[:3]
        gating = hp.int("expert_gating_func", SIGMOID)
        if gating != SIGMOID:
            raise UnsupportedModelError(f"{gguf.path}: {arch}'s expert_gating_func {gating} is not sigmoid (2), "
                                        f"the only gating llminfer reads for it")
        scale = hp.float("expert_weights_scale", 1.0)
        if scale not in (0.0, 1.0):
            raise UnsupportedModelError(f"{gguf.path}: {arch}.expert_weights_scale {scale} is not supported "
                                        f"(released files have none)")
        spec.expert_gating = GATING_SIGMOID
    w.check_all_used(n_layer, arch)
    return spec


def build_moe(gguf: GGUFFile) -> ModelSpec:
    return build(gguf, arch=MOE_ARCH)
