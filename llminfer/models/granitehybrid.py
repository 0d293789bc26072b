"""The `granitehybrid` architecture (IBM Granite 4.0-H, Bamba), as llama.cpp's
converter stores it (src/models/granite-hybrid.cpp there).

- Mamba2 layers (hybrid.mamba2_layer, see mamba2.py) wherever
  attention.head_count_kv, an array, is 0; attention layers elsewhere,
  without RoPE when rope.scaling.finetuned is false (Granite 4.0-H) and
  with RoPE on adjacent pairs otherwise (Bamba).
- Every layer then has a SiLU-gated feed-forward after its ffn_norm.
- Granite's multipliers, each optional: embedding_scale (the embeddings),
  residual_scale (each half's output before its residual add),
  attention.scale (the scores, in place of 1/sqrt(head_dim)) and
  logit_scale (the logits are divided by it).

The mixture-of-experts files (Granite 4.0-H Tiny and Small, expert_count >
0) put routed experts in place of every layer's feed-forward: a softmax
router over expert_count experts, the expert_used_count most probable with
their weights renormalized (qwen3moe's gating), each expert as wide as
feed_forward_length; and, where expert_shared_feed_forward_length is set, a
shared expert (ffn_*_shexp) whose output is added ungated. Biases on the
attention output or the feed-forward are refused (LayerSpec has no place
for them)."""

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_SILU, GATING_SOFTMAX, ROPE_NORM, Hparams, LayerSpec, ModelSpec, MoESpec,
                                  Weights, attn_scale_default, output_head, rope_dims, rope_scale, vocab_size)
from llminfer.models.hybrid import (dense_ffn, layer_array, mamba2_layer, mamba2_sizes, refuse_biases,
                                    set_ssm_sizes)
from llminfer.models.qwen3moe import MAX_EXPERTS

ARCH = "granitehybrid"


def _multiplier(hp, key) -> float:
    """A Granite multiplier: absent or 0 means none (1)."""
    v = hp.float(key, 0.0)
    if v == 0.0:
        return 1.0
    if not 0.0 < v <= 1e6:
        raise UnsupportedModelError(f"{hp.path}: metadata '{ARCH}.{key}' is {v!r}; it must be positive")
    return v


def _expert_sizes(hp, n_ff) -> tuple:
    """(expert_count, expert_used_count, expert_shared_feed_forward_length),
    (0, 0, 0) in a dense file."""
    n_expert = hp.int("expert_count", 0)
    if n_expert == 0:
        return 0, 0, 0
    n_used = hp.int("expert_used_count", 0)
    if not (0 < n_expert <= MAX_EXPERTS) or not (0 < n_used <= n_expert):
        raise UnsupportedModelError(f"{hp.path}: {ARCH}.expert_count {n_expert} and expert_used_count {n_used} "
                                    f"must satisfy 0 < used <= count <= {MAX_EXPERTS}")
    n_ff_shexp = hp.int("expert_shared_feed_forward_length", 0)
    if not (0 < n_ff <= 1 << 20) or not (0 <= n_ff_shexp <= 1 << 20):
        raise UnsupportedModelError(f"{hp.path}: {ARCH}.feed_forward_length {n_ff} (the experts' width) and "
                                    f"expert_shared_feed_forward_length {n_ff_shexp} are out of range")
    return n_expert, n_used, n_ff_shexp


def _experts(w: Weights, p: str, n_embd: int, n_ff: int, n_expert: int, n_ff_shexp: int) -> dict:
    """A MoE layer's routed experts (each n_ff wide, as llama.cpp reads
    them) and its ungated shared expert where n_ff_shexp > 0."""
    out = dict(w_gate=None, w_up=None, w_down=None, moe=MoESpec(
        router=w.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd),
        gate_exps=w.expert_matrix(p + "ffn_gate_exps.weight", n_expert, n_ff, n_embd),
        up_exps=w.expert_matrix(p + "ffn_up_exps.weight", n_expert, n_ff, n_embd),
        down_exps=w.expert_matrix(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff)))
    if n_ff_shexp:
        out.update(gate_shexp=w.matrix(p + "ffn_gate_shexp.weight", n_ff_shexp, n_embd),
                   up_shexp=w.matrix(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd),
                   down_shexp=w.matrix(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp))
    return out


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    n_layer = hp.int("block_count")
    n_embd = hp.int("embedding_length")
    n_head = hp.int("attention.head_count")
    n_ff = hp.int("feed_forward_length")
    n_expert, n_used, n_ff_shexp = _expert_sizes(hp, n_ff)
    kv = layer_array(hp, "attention.head_count_kv", n_layer)
    if kv is None:
        raise UnsupportedModelError(f"{gguf.path}: metadata '{ARCH}.attention.head_count_kv' is missing; it tells "
                                    f"the Mamba2 layers (0) from the attention layers")
    kv_heads = sorted({k for k in kv if k})
    if len(kv_heads) > 1 or any(k < 0 for k in kv) or (kv_heads and n_head % kv_heads[0]):
        raise UnsupportedModelError(f"{gguf.path}: {ARCH}.attention.head_count_kv {kv} must be 0 or one KV head "
                                    f"count dividing attention.head_count {n_head}")
    n_head_kv = kv_heads[0] if kv_heads else n_head
    head_dim = hp.int("attention.key_length", n_embd // n_head)
    if hp.int("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{gguf.path}: {ARCH} attention needs keys and values of one head size")
    n_rot = rope_dims(hp, head_dim)
    finetuned = hp.meta.get(f"{ARCH}.rope.scaling.finetuned", True)
    if not isinstance(finetuned, (bool, np.bool_)):
        raise UnsupportedModelError(f"{gguf.path}: metadata '{ARCH}.rope.scaling.finetuned' must be a bool")
    base, scale = hp.float("rope.freq_base", 10000.0), rope_scale(hp)
    s = mamba2_sizes(hp)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)
    nq, nkv = n_head * head_dim, n_head_kv * head_dim

    layers = []
    for i in range(n_layer):
        p = f"blk.{i}."
        refuse_biases(w, p, ("ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "attn_output.bias"), ARCH)
        ffn_norm = w.vector(p + "ffn_norm.weight", n_embd)
        ffn = _experts(w, p, n_embd, n_ff, n_expert, n_ff_shexp) if n_expert else dense_ffn(w, p, n_embd, n_ff)
        if kv[i] == 0:
            layers.append(mamba2_layer(w, p, n_embd, s, ffn_norm, ffn, conv_bias_required=False))
            continue
        L = LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", n_embd),
            wq=w.matrix(p + "attn_q.weight", nq, n_embd),
            wk=w.matrix(p + "attn_k.weight", nkv, n_embd),
            wv=w.matrix(p + "attn_v.weight", nkv, n_embd),
            wo=w.matrix(p + "attn_output.weight", n_embd, nq),
            ffn_norm=ffn_norm, **ffn,
            rope_base=base, rope_scale=scale, no_rope=not finetuned)
        L.bq = w.vector(p + "attn_q.bias", nq, optional=True)
        L.bk = w.vector(p + "attn_k.bias", nkv, optional=True)
        L.bv = w.vector(p + "attn_v.bias", nkv, optional=True)
        layers.append(L)

    att = hp.float("attention.scale", 0.0)
    spec = ModelSpec(
        arch=ARCH,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim,
        n_ff=n_ff,
        n_rot=n_rot,
        rope_mode=ROPE_NORM,
        gate_fn=ACT_SILU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon"),
        embd_scale=_multiplier(hp, "embedding_scale"),
        attn_scale=_multiplier(hp, "attention.scale") if att else attn_scale_default(head_dim),
        context_length=hp.int("context_length", 1 << 20),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
        residual_scale=_multiplier(hp, "residual_scale"),
        logit_scale=1.0 / _multiplier(hp, "logit_scale"),
    )
    if n_expert:
        spec.n_expert, spec.n_expert_used, spec.n_ff_exp = n_expert, n_used, n_ff
        spec.n_ff_shexp, spec.expert_gating = n_ff_shexp, GATING_SOFTMAX
    set_ssm_sizes(spec, s)
    w.check_all_used(n_layer, ARCH)
    return spec
