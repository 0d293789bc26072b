"""What the hybrid architectures (lfm2, qwen35, qwen35moe) share: per-layer
metadata arrays, the recurrent layers' sizes, and the readers of their
layers' tensors into LayerSpecs with a recurrent mixer (base.MIX_*), as
csrc/llminfer.h's li_layer_desc describes them.

A convolution's taps (ssm_conv) are handed over as one float32 vector laid
out [channels, d_conv] row-major: channel c's taps, the oldest input's
first, at c * d_conv (GGUF's [d_conv, channels] in ggml order is that
numpy array)."""

from __future__ import annotations

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.models.base import MIX_GDN, MIX_SHORTCONV, Hparams, LayerSpec, Weights

MAX_CONV = 64          # taps of a recurrent layer's convolution (real models: 3 or 4)
MAX_SSM = 1 << 14      # any one recurrent size (state, heads, groups)


def layer_array(hp: Hparams, key: str, n_layer: int, default=None) -> list | None:
    """A per-layer metadata value, as an integer list of n_layer entries: an
    array of that length, or one number for every layer. None when absent
    and no default."""
    full = f"{hp.arch}.{key}"
    v = hp.meta.get(full)
    if v is None:
        return None if default is None else [default] * n_layer
    if isinstance(v, (bool, np.bool_)):
        raise UnsupportedModelError(f"{hp.path}: metadata {full!r} must be an integer or an array of them")
    if isinstance(v, (int, np.integer)):
        return [int(v)] * n_layer
    arr = np.asarray(v)
    if arr.ndim != 1 or arr.size != n_layer or not (np.issubdtype(arr.dtype, np.integer)
                                                     or np.issubdtype(arr.dtype, np.bool_)):
        raise UnsupportedModelError(f"{hp.path}: metadata {full!r} must be one integer or an array of "
                                    f"{n_layer} (one per layer), got {_describe(v)}")
    return [int(x) for x in arr]


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        return f"an array of {v.size} {v.dtype}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def ssm_size(hp: Hparams, key: str, low: int = 1, high: int = MAX_SSM) -> int:
    v = hp.int(key)
    if not low <= v <= high:
        raise UnsupportedModelError(f"{hp.path}: metadata '{hp.arch}.{key}' is {v}, outside the range "
                                    f"[{low}, {high}] a model can use")
    return v


def conv_taps(w: Weights, name: str, channels: int, taps: int) -> np.ndarray:
    """A convolution weight [channels, taps] (GGUF {taps, channels}), F32
    as llama.cpp's converter keeps it, as one contiguous float32 vector."""
    info = w.gguf.tensors.get(name)
    if info is not None and info.shape != (channels, taps):
        raise UnsupportedModelError(f"{w.gguf.path}: tensor {name!r} has shape {info.shape}, expected "
                                    f"({channels}, {taps}) from the metadata")
    return np.ascontiguousarray(w.vector(name, channels * taps), dtype=np.float32)


def dense_ffn(w: Weights, p: str, n_embd: int, n_ff: int) -> dict:
    return dict(w_gate=w.matrix(p + "ffn_gate.weight", n_ff, n_embd),
                w_up=w.matrix(p + "ffn_up.weight", n_ff, n_embd),
                w_down=w.matrix(p + "ffn_down.weight", n_embd, n_ff))


def shortconv_layer(w: Weights, p: str, n_embd: int, l_cache: int, ffn_norm, ffn: dict) -> LayerSpec:
    """LFM2's gated short convolution: in_proj [3 * n_embd, n_embd] gives
    b, c, x; y = c * conv(b * x) over l_cache taps; out_proj [n_embd, n_embd]."""
    return LayerSpec(
        attn_norm=w.vector(p + "attn_norm.weight", n_embd),
        wq=None, wk=None, wv=None, wo=None,
        ffn_norm=ffn_norm, **ffn,
        mixer=MIX_SHORTCONV,
        ssm_in=w.matrix(p + "shortconv.in_proj.weight", 3 * n_embd, n_embd),
        ssm_conv=conv_taps(w, p + "shortconv.conv.weight", n_embd, l_cache),
        ssm_out=w.matrix(p + "shortconv.out_proj.weight", n_embd, n_embd))


def gdn_layer(w: Weights, p: str, n_embd: int, d_conv: int, d_state: int, n_group: int, n_head: int,
              ffn_norm, ffn: dict) -> LayerSpec:
    """A Gated DeltaNet layer as qwen35 stores it: attn_qkv [2 * n_group *
    d_state + d_inner, n_embd] (q, k, v channels), attn_gate [d_inner,
    n_embd] (z), ssm_beta / ssm_alpha [n_head, n_embd], ssm_conv1d over
    all the qkv channels, ssm_dt.bias and ssm_a (-exp(A_log)) [n_head],
    ssm_norm [d_state] (each head's output), ssm_out [n_embd, d_inner]."""
    d_inner = n_head * d_state
    channels = 2 * n_group * d_state + d_inner
    return LayerSpec(
        attn_norm=w.vector(p + "attn_norm.weight", n_embd),
        wq=None, wk=None, wv=None, wo=None,
        ffn_norm=ffn_norm, **ffn,
        mixer=MIX_GDN,
        ssm_in=w.matrix(p + "attn_qkv.weight", channels, n_embd),
        ssm_z=w.matrix(p + "attn_gate.weight", d_inner, n_embd),
        ssm_beta=w.matrix(p + "ssm_beta.weight", n_head, n_embd),
        ssm_alpha=w.matrix(p + "ssm_alpha.weight", n_head, n_embd),
        ssm_conv=conv_taps(w, p + "ssm_conv1d.weight", channels, d_conv),
        ssm_dt_b=w.vector(p + "ssm_dt.bias", n_head),
        ssm_a=w.vector(p + "ssm_a", n_head),
        ssm_norm=w.vector(p + "ssm_norm.weight", d_state),
        ssm_out=w.matrix(p + "ssm_out.weight", n_embd, d_inner))


__all__ = ["layer_array", "ssm_size", "conv_taps", "dense_ffn", "shortconv_layer", "gdn_layer"]
