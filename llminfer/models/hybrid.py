"""What the hybrid architectures (lfm2, qwen35, qwen35moe, and the Mamba2
family: mamba2, granitehybrid, nemotron_h) share: per-layer
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
from llminfer.models.base import MIX_GDN, MIX_MAMBA2, MIX_SHORTCONV, Hparams, LayerSpec, Matrix, Weights

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
              ffn_norm, ffn: dict, beta_alpha=None) -> LayerSpec:
    """A Gated DeltaNet layer as qwen35 stores it: attn_qkv [2 * n_group *
    d_state + d_inner, n_embd] (q, k, v channels), attn_gate [d_inner,
    n_embd] (z), ssm_beta / ssm_alpha [n_head, n_embd], ssm_conv1d over
    all the qkv channels, ssm_dt.bias and ssm_a (-exp(A_log)) [n_head],
    ssm_norm [d_state] (each head's output), ssm_out [n_embd, d_inner].
    beta_alpha: ssm_beta and ssm_alpha read otherwise (qwen3next's ssm_ba)."""
    d_inner = n_head * d_state
    channels = 2 * n_group * d_state + d_inner
    return LayerSpec(
        attn_norm=w.vector(p + "attn_norm.weight", n_embd),
        wq=None, wk=None, wv=None, wo=None,
        ffn_norm=ffn_norm, **ffn,
        mixer=MIX_GDN,
        ssm_in=w.matrix(p + "attn_qkv.weight", channels, n_embd),
        ssm_z=w.matrix(p + "attn_gate.weight", d_inner, n_embd),
        **(beta_alpha or dict(ssm_beta=w.matrix(p + "ssm_beta.weight", n_head, n_embd),
                              ssm_alpha=w.matrix(p + "ssm_alpha.weight", n_head, n_embd))),
        ssm_conv=conv_taps(w, p + "ssm_conv1d.weight", channels, d_conv),
        ssm_dt_b=w.vector(p + "ssm_dt.bias", n_head),
        ssm_a=w.vector(p + "ssm_a", n_head),
        ssm_norm=w.vector(p + "ssm_norm.weight", d_state),
        ssm_out=w.matrix(p + "ssm_out.weight", n_embd, d_inner))




def mamba2_sizes(hp: Hparams) -> dict:
    """ssm.* of a model with Mamba2 layers: d_conv taps; n_head heads
    (time_step_rank) of d_inner / n_head channels; n_group groups of B and
    C, each d_state wide, head h using group h / (n_head / n_group)."""
    s = dict(d_conv=ssm_size(hp, "ssm.conv_kernel", 2, MAX_CONV), d_inner=ssm_size(hp, "ssm.inner_size", 1, 1 << 20),
             d_state=ssm_size(hp, "ssm.state_size"), n_group=ssm_size(hp, "ssm.group_count"),
             n_head=ssm_size(hp, "ssm.time_step_rank"))
    if s["d_inner"] % s["n_head"] or s["n_head"] % s["n_group"]:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}'s ssm sizes do not fit Mamba2: inner_size {s['d_inner']} "
                                    f"must be a multiple of time_step_rank {s['n_head']} (the heads), and that "
                                    f"of group_count {s['n_group']}")
    return s


def mamba2_layer(w: Weights, p: str, n_embd: int, s: dict, ffn_norm=None, ffn=None,
                 conv_bias_required: bool = True) -> LayerSpec:
    """A Mamba2 layer as llama.cpp's converter stores it: ssm_in [2 * d_inner
    + 2 * n_group * d_state + n_head, n_embd] (z, x, B, C, dt), ssm_conv1d
    (and its bias) over the x, B and C channels, ssm_dt.bias, ssm_a
    (-exp(A_log)) and ssm_d [n_head], ssm_norm [d_inner] (RMSNorm per
    group), ssm_out [n_embd, d_inner]."""
    di, ng, ds, nh = s["d_inner"], s["n_group"], s["d_state"], s["n_head"]
    channels = di + 2 * ng * ds
    ffn = ffn or dict(w_gate=None, w_up=None, w_down=None)
    return LayerSpec(
        attn_norm=w.vector(p + "attn_norm.weight", n_embd),
        wq=None, wk=None, wv=None, wo=None,
        ffn_norm=ffn_norm, **ffn,
        mixer=MIX_MAMBA2,
        ssm_in=w.matrix(p + "ssm_in.weight", 2 * di + 2 * ng * ds + nh, n_embd),
        ssm_conv=conv_taps(w, p + "ssm_conv1d.weight", channels, s["d_conv"]),
        ssm_conv_b=w.vector(p + "ssm_conv1d.bias", channels, optional=not conv_bias_required),
        ssm_dt_b=w.vector(p + "ssm_dt.bias", nh),
        ssm_a=w.vector(p + "ssm_a", nh),
        ssm_d=w.vector(p + "ssm_d", nh),
        ssm_norm=w.vector(p + "ssm_norm.weight", di),
        ssm_out=w.matrix(p + "ssm_out.weight", n_embd, di))


def set_ssm_sizes(spec, s: dict):
    spec.ssm_d_conv, spec.ssm_d_inner, spec.ssm_d_state = s["d_conv"], s["d_inner"], s["d_state"]
    spec.ssm_n_group, spec.ssm_n_head = s["n_group"], s["n_head"]


def refuse_biases(w: Weights, p: str, names, arch: str):
    """Optional bias tensors llama.cpp reads for the layer but LayerSpec has
    no place for: refuse by name rather than run without them."""
    for name in names:
        if w.has(p + name):
            raise UnsupportedModelError(f"{w.gguf.path}: {p}{name} ({arch}) is not supported: llminfer's layer has "
                                        f"no such bias")


def gather_rows(m: Matrix, rows: list) -> Matrix:
    """A matrix of the given rows of m, copied (quantized rows are whole
    blocks, so any row order is another valid matrix of the same type)."""
    row = m.data.nbytes // m.rows
    data = np.concatenate([m.data[r * row:(r + 1) * row] for r in rows])
    return Matrix(data, m.qtype, len(rows), m.k)
