"""The `qwen35` architecture (Qwen3.5 and Qwen3.6 dense, text), as llama.cpp's
converter stores it (src/models/qwen35.cpp there).

- Gated DeltaNet layers, with every full_attention_interval-th layer (4 in
  the released models; attention.recurrent_layers, where the file has it,
  says which) a gated attention layer instead.
- A Gated DeltaNet layer (hybrid.gdn_layer): attn_qkv gives q, k (n_group
  heads of ssm.state_size) and v (ssm.time_step_rank heads of
  ssm.inner_size / time_step_rank); a causal convolution over
  ssm.conv_kernel taps and SiLU; q and k L2-normalised; per value head a
  decay exp(softplus(alpha + ssm_dt.bias) * ssm_a) (ssm_a stored as
  -exp(A_log)) and a write strength sigmoid(beta) in the delta rule; value
  head h reads key head h % n_group; each head's output RMSNorm'd with
  ssm_norm times SiLU(attn_gate . x), then ssm_out.
- A gated attention layer: attn_q gives per head head_dim queries then
  head_dim gate values; per-head RMSNorm of queries and keys; RoPE on the
  first rope.dimension_count dims in NeoX pairs; the attention output
  times sigmoid(gate) before attn_output. The rope is llama.cpp's
  interleaved multi-section one (rope.dimension_sections); on text every
  section turns by the token's position except the fourth, which turns by
  0, so a file whose sections leave rotated pairs to the fourth is refused.
- post_attention_norm is the feed-forward's pre-norm (llminfer's ffn_norm).
- The multi-token-prediction block (nextn_predict_layers, the last blocks)
  is a draft head that the main pass does not run: its tensors are left
  unread.

Norm weights already include Qwen's "+1" (the converter adds it, as for
gemma3); ssm_norm has none and needs none."""

from __future__ import annotations

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_SILU, LAYER_TENSOR, ROPE_NEOX, Hparams, LayerSpec, ModelSpec, Weights,
                                  attn_scale_default, output_head, rope_dims, rope_scale, rope_sections, vocab_size)
from llminfer.models.hybrid import MAX_CONV, dense_ffn, gdn_layer, layer_array, ssm_size

ARCH = "qwen35"


def recurrent_layers(hp: Hparams, n_layer_all: int, n_layer: int) -> list:
    """Whether each trunk layer is a Gated DeltaNet layer (llama.cpp's
    load_arch_hparams): attention.recurrent_layers, else every layer but
    each full_attention_interval-th."""
    arr = layer_array(hp, "attention.recurrent_layers", n_layer_all)
    if arr is not None:
        return [bool(arr[i]) for i in range(n_layer)]
    interval = hp.int("full_attention_interval", 4)
    if not 1 <= interval <= 1 << 12:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.full_attention_interval {interval} is out of range")
    return [(i + 1) % interval != 0 for i in range(n_layer)]


def check_rope_sections(hp: Hparams, n_rot: int):
    """Refuse sections under which some rotated pair would turn by the
    fourth (extra) position, 0 on text: llminfer turns every pair by the
    token's position (ggml's ggml_mrope_cache_init, interleaved)."""
    s = rope_sections(hp, n_rot)
    total = sum(s)
    for j in range(n_rot // 2):
        sector = j % total
        if not ((sector % 3 == 0 and sector < 3 * s[0]) or (sector % 3 == 1 and sector < 3 * s[1])
                or (sector % 3 == 2 and sector < 3 * s[2])):
            raise UnsupportedModelError(f"{hp.path}: {hp.arch}.rope.dimension_sections {s} leave rotated pair "
                                        f"{j} to the fourth (non-text) position, which llminfer does not run")


def _attention_layer(w, p, sh, base, scale, ffn_norm, ffn) -> LayerSpec:
    E, hd = sh["n_embd"], sh["head_dim"]
    nq, nkv = sh["n_head"] * hd, sh["n_head_kv"] * hd
    if w.has(p + "attn_qkv.weight"):
        wq, wk, wv = w.split_rows(p + "attn_qkv.weight", [2 * nq, nkv, nkv], E)
    else:
        wq = w.matrix(p + "attn_q.weight", 2 * nq, E)
        wk = w.matrix(p + "attn_k.weight", nkv, E)
        wv = w.matrix(p + "attn_v.weight", nkv, E)
    return LayerSpec(
        attn_norm=w.vector(p + "attn_norm.weight", E),
        wq=wq, wk=wk, wv=wv,
        wo=w.matrix(p + "attn_output.weight", E, nq),
        ffn_norm=ffn_norm, **ffn,
        q_norm=w.vector(p + "attn_q_norm.weight", hd),
        k_norm=w.vector(p + "attn_k_norm.weight", hd),
        rope_base=base, rope_scale=scale,
        attn_out_gate=True)


def build(gguf: GGUFFile, arch: str = ARCH, make_ffn=None, customize=None, sections: bool = True,
          make_gdn=gdn_layer) -> ModelSpec:
    """make_ffn(w, hp, p, n_embd) -> dict of LayerSpec's feed-forward fields
    (qwen35moe's experts); the dense SiLU-gated one by default. sections:
    the rope is the multi-section one (rope.dimension_sections); make_gdn:
    the Gated DeltaNet layers' reader (hybrid.gdn_layer's arguments)."""
    hp = Hparams(gguf, arch)
    n_layer_all = hp.int("block_count")
    n_nextn = hp.int("nextn_predict_layers", 0)
    if not 0 <= n_nextn < n_layer_all:
        raise UnsupportedModelError(f"{gguf.path}: {arch}.nextn_predict_layers {n_nextn} must be below "
                                    f"block_count {n_layer_all}")
    n_layer = n_layer_all - n_nextn
    n_embd = hp.int("embedding_length")
    n_head = hp.int("attention.head_count")
    n_head_kv = hp.int("attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise UnsupportedModelError(f"{gguf.path}: {arch}.attention.head_count {n_head} is not a multiple of "
                                    f"attention.head_count_kv {n_head_kv}")
    head_dim = hp.int("attention.key_length", n_embd // n_head)
    if hp.int("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{gguf.path}: {arch} attention needs keys and values of one head size")
    n_ff = hp.int("feed_forward_length", 0 if make_ffn is not None else None)
    n_rot = rope_dims(hp, head_dim)
    if sections:
        check_rope_sections(hp, n_rot)
    d_conv = ssm_size(hp, "ssm.conv_kernel", 2, MAX_CONV)
    d_state = ssm_size(hp, "ssm.state_size")
    n_group = ssm_size(hp, "ssm.group_count")
    n_v = ssm_size(hp, "ssm.time_step_rank")
    d_inner = ssm_size(hp, "ssm.inner_size", 1, 1 << 20)
    if d_inner != n_v * d_state or n_v % n_group:
        raise UnsupportedModelError(f"{gguf.path}: {arch}'s ssm sizes do not fit Gated DeltaNet: inner_size "
                                    f"{d_inner} must be time_step_rank {n_v} x state_size {d_state} (value "
                                    f"heads as wide as key heads), and time_step_rank a multiple of "
                                    f"group_count {n_group}")
    recurrent = recurrent_layers(hp, n_layer_all, n_layer)
    base, scale = hp.float("rope.freq_base", 10000000.0), rope_scale(hp)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)
    sh = dict(n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim)

    layers = []
    for i in range(n_layer):
        p = f"blk.{i}."
        ffn_norm = w.vector(p + "post_attention_norm.weight", n_embd)
        ffn = make_ffn(w, hp, p, n_embd) if make_ffn is not None else dense_ffn(w, p, n_embd, n_ff)
        if recurrent[i]:
            layers.append(make_gdn(w, p, n_embd, d_conv, d_state, n_group, n_v, ffn_norm, ffn))
        else:
            layers.append(_attention_layer(w, p, sh, base, scale, ffn_norm, ffn))

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
        norm_eps=hp.float("attention.layer_norm_rms_epsilon", 1e-6),
        embd_scale=1.0,
        attn_scale=attn_scale_default(head_dim),
        context_length=hp.int("context_length", 262144),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
        ssm_d_conv=d_conv,
        ssm_d_inner=d_inner,
        ssm_d_state=d_state,
        ssm_n_group=n_group,
        ssm_n_head=n_v,
    )
    if customize is not None:
        customize(spec, w, hp)
    # the multi-token-prediction blocks: a draft head the main pass does not run
    for name in gguf.tensors:
        m = LAYER_TENSOR.match(name)
        if m and int(m.group(1)) >= n_layer:
            w.used.add(name)
    w.check_all_used(n_layer_all, arch)
    return spec
