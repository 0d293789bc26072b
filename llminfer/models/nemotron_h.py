"""The `nemotron_h` architecture (NVIDIA Nemotron-H, Nemotron Nano 2 dense),
as llama.cpp's converter stores it (src/models/nemotron-h.cpp there).

Each layer is RMSNorm (attn_norm), one of three blocks, and the residual
add, told apart by two per-layer arrays:

- attention.head_count_kv 0 and feed_forward_length 0: a Mamba2 layer
  (hybrid.mamba2_layer, see mamba2.py);
- attention.head_count_kv > 0: attention without RoPE (and no
  feed-forward);
- feed_forward_length > 0: a feed-forward alone, ffn_down(relu(ffn_up x)^2),
  squared ReLU without a gate.

llminfer's feed-forward is gated, by SiLU or GELU: the squared-ReLU layers
are read into LayerSpecs (mixer MIX_NONE, the file's attn_norm as their
ffn_norm, w_gate None) and the file is then refused by name until the C
core computes them. nemotron_h_moe (Nemotron 3)
is another architecture."""

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import (ACT_RELU_SQR, ACT_SILU, MIX_NONE, ROPE_NEOX, Hparams, LayerSpec, ModelSpec, Weights,
                                  attn_scale_default, output_head, vocab_size)
from llminfer.models.hybrid import layer_array, mamba2_layer, mamba2_sizes, refuse_biases, set_ssm_sizes

ARCH = "nemotron_h"


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    n_layer_all = hp.int("block_count")
    n_nextn = hp.int("nextn_predict_layers", 0)
    if n_nextn:
        raise UnsupportedModelError(f"{gguf.path}: {ARCH} with a multi-token-prediction head is not supported")
    n_layer = n_layer_all
    n_embd = hp.int("embedding_length")
    n_head = hp.int("attention.head_count")
    kv = layer_array(hp, "attention.head_count_kv", n_layer)
    ff = layer_array(hp, "feed_forward_length", n_layer)
    if kv is None or ff is None:
        raise UnsupportedModelError(f"{gguf.path}: {ARCH} needs the per-layer arrays attention.head_count_kv and "
                                    f"feed_forward_length to tell its Mamba2, attention and feed-forward layers")
    if any(k < 0 or f < 0 or (k and f) for k, f in zip(kv, ff)):
        raise UnsupportedModelError(f"{gguf.path}: a {ARCH} layer is attention (head_count_kv > 0) or a "
                                    f"feed-forward (feed_forward_length > 0), not both")
    kv_heads = sorted({k for k in kv if k})
    if len(kv_heads) > 1 or (kv_heads and n_head % kv_heads[0]):
        raise UnsupportedModelError(f"{gguf.path}: {ARCH}.attention.head_count_kv {kv} must be 0 or one KV head "
                                    f"count dividing attention.head_count {n_head}")
    n_head_kv = kv_heads[0] if kv_heads else n_head
    head_dim = hp.int("attention.key_length", n_embd // n_head)
    if hp.int("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{gguf.path}: {ARCH} attention needs keys and values of one head size")
    eps = hp.float("attention.layer_norm_rms_epsilon", 0.0) or hp.float("attention.layer_norm_epsilon")
    s = mamba2_sizes(hp)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)
    nq, nkv = n_head * head_dim, n_head_kv * head_dim
    no_ffn = dict(w_gate=None, w_up=None, w_down=None)

    layers, relu2 = [], []
    for i in range(n_layer):
        p = f"blk.{i}."
        refuse_biases(w, p, ("ffn_up.bias", "ffn_down.bias", "attn_output.bias"), ARCH)
        if kv[i] == 0 and ff[i] == 0:
            layers.append(mamba2_layer(w, p, n_embd, s, conv_bias_required=False))
        elif kv[i]:
            L = LayerSpec(
                attn_norm=w.vector(p + "attn_norm.weight", n_embd),
                wq=w.matrix(p + "attn_q.weight", nq, n_embd),
                wk=w.matrix(p + "attn_k.weight", nkv, n_embd),
                wv=w.matrix(p + "attn_v.weight", nkv, n_embd),
                wo=w.matrix(p + "attn_output.weight", n_embd, nq),
                ffn_norm=None, **no_ffn, no_rope=True)
            L.bq = w.vector(p + "attn_q.bias", nq, optional=True)
            L.bk = w.vector(p + "attn_k.bias", nkv, optional=True)
            L.bv = w.vector(p + "attn_v.bias", nkv, optional=True)
            layers.append(L)
        else:
            # no mixer: the file's attn_norm is the feed-forward's pre-norm
            layers.append(LayerSpec(
                attn_norm=None,
                wq=None, wk=None, wv=None, wo=None, ffn_norm=w.vector(p + "attn_norm.weight", n_embd),
                w_gate=None, w_up=w.matrix(p + "ffn_up.weight", ff[i], n_embd),
                w_down=w.matrix(p + "ffn_down.weight", n_embd, ff[i]),
                mixer=MIX_NONE))
            relu2.append(i)

    spec = ModelSpec(
        arch=ARCH,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim,
        n_ff=max(ff) or 1,
        n_rot=head_dim - head_dim % 2,  # unused: no layer turns its queries
        rope_mode=ROPE_NEOX,
        gate_fn=ACT_SILU,
        norm_eps=eps,
        embd_scale=1.0,
        attn_scale=attn_scale_default(head_dim),
        context_length=hp.int("context_length", 8192),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
    )
    set_ssm_sizes(spec, s)
    w.check_all_used(n_layer, ARCH)
    if relu2:  # ffn_down(relu(ffn_up x)^2): ungated, squared ReLU
        spec.gate_fn = ACT_RELU_SQR
    return spec
