"""llminfer.core.ops: the native kernels on numpy arrays.

    w = ops.quantize(weights, "Q4_K")                    # uint8, gguf layout
    y = ops.matmul(w, "Q4_K", weights.shape, x)          # x @ W.T, float32
    ops.dequantize(w, "Q4_K", weights.shape)             # back to float32

Weight shapes are numpy's: (rows, k), k contiguous, the shape that
``gguf.quants.dequantize`` gives the same bytes. ``qtype`` is a
``gguf.GGMLQuantizationType``, its integer value, or its name ("Q4_K").
Arrays must already be C-contiguous and of the stated dtype; nothing is
copied or converted behind the caller's back, and a mismatch raises a
ValueError (an llminfer.errors class) that names the argument.
"""

from __future__ import annotations

import numpy as np
from llminfer.core.ggml import GGMLQuantizationType

from llminfer import _core
from llminfer.errors import InvalidArgumentError, ShapeError, UnsupportedTypeError
from llminfer.core.system import check_threads, cpu_count, current_isa

__all__ = [
    "qtype_of", "block_sizes", "quantize", "dequantize", "matmul", "rms_norm", "rope",
    "silu", "gelu", "silu_mul", "gelu_mul", "swiglu_oai", "softmax", "add", "mul",
    "GemmWeight", "gemm", "attention", "attention_scratch", "attention_scratch_bytes",
    "layer_norm",
]

SUPPORTED_TYPES = tuple(t for t in GGMLQuantizationType if _core.type_sizes(int(t)) is not None)
QUANTIZABLE_TYPES = tuple(GGMLQuantizationType[n] for n in (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS", "MXFP4"))

_ACT = {"silu": 0, "gelu": 1, "swiglu_oai": 3}
_ROPE_MODES = {"norm": 0, "neox": 2}


def qtype_of(qtype) -> GGMLQuantizationType:
    """The GGMLQuantizationType named by `qtype`, if llminfer supports it."""
    try:
        if isinstance(qtype, str):
            t = GGMLQuantizationType[qtype.strip().upper()]
        else:
            t = GGMLQuantizationType(int(qtype))
    except (KeyError, ValueError, TypeError):
        raise UnsupportedTypeError(f"unknown tensor type {qtype!r}") from None
    if t not in SUPPORTED_TYPES:
        names = ", ".join(s.name for s in SUPPORTED_TYPES)
        raise UnsupportedTypeError(f"tensor type {t.name} is not supported; supported: {names}")
    return t


def block_sizes(qtype) -> tuple[int, int]:
    """(elements per block, bytes per block) of a supported type."""
    return _core.type_sizes(int(qtype_of(qtype)))


def _threads(n_threads):
    # A few more threads than CPUs are allowed here, so tests can split rows
    # any way on a small machine; a huge OpenMP team crashes the runtime.
    return check_threads(n_threads, limit=max(16, 4 * cpu_count()))


def _require(a, name, dtype, ndim=None):
    if not isinstance(a, np.ndarray):
        raise InvalidArgumentError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise InvalidArgumentError(f"{name} must have dtype {np.dtype(dtype).name}, got {a.dtype}")
    if ndim is not None and a.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ShapeError(f"{name} must have {ndim} dimension(s), got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return a


def _weight_shape(shape, t):
    try:
        rows, k = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise ShapeError(f"weight shape must be (rows, k), got {shape!r}") from None
    if rows <= 0 or k <= 0:
        raise ShapeError(f"weight shape must be positive, got {shape!r}")
    bs, ts = _core.type_sizes(int(t))
    if k % bs:
        raise ShapeError(f"k={k} is not a multiple of the {t.name} block size {bs}")
    return rows, k, k // bs * ts


def _weight_bytes(data, name):
    """A weight buffer as flat uint8: uint8 arrays of any shape, or the raw
    float32/float16 arrays gguf gives for F32/F16 tensors."""
    if not isinstance(data, np.ndarray):
        raise InvalidArgumentError(f"{name} must be a numpy array, got {type(data).__name__}")
    if data.dtype not in (np.uint8, np.float32, np.float16):
        raise InvalidArgumentError(f"{name} must have dtype uint8, got {data.dtype}")
    if not data.flags.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return data.reshape(-1).view(np.uint8)


def quantize(x: np.ndarray, qtype, n_threads=None) -> np.ndarray:
    """Rows of float32 `x` (..., k) in `qtype`'s blocks: uint8 (..., bytes per row)."""
    t = qtype_of(qtype)
    if t not in QUANTIZABLE_TYPES:
        names = ", ".join(s.name for s in QUANTIZABLE_TYPES)
        raise UnsupportedTypeError(f"cannot quantize to {t.name}; quantizable types: {names}")
    _require(x, "x", np.float32, ndim=None)
    if x.ndim == 0:
        raise ShapeError("x must have at least one dimension")
    k = x.shape[-1]
    bs, ts = _core.type_sizes(int(t))
    if k == 0 or k % bs:
        raise ShapeError(f"row length {k} is not a multiple of the {t.name} block size {bs}")
    rows = x.size // k
    out_shape = (*x.shape[:-1], k // bs * ts)
    if rows == 0:
        return np.empty(out_shape, dtype=np.uint8)
    return _core.quantize(int(t), x.reshape(rows, k), _threads(n_threads)).reshape(out_shape)


def dequantize(data: np.ndarray, qtype, shape, n_threads=None) -> np.ndarray:
    """float32 array of `shape` (..., k) from its stored bytes `data`."""
    t = qtype_of(qtype)
    raw = _weight_bytes(data, "data")
    shape = tuple(int(v) for v in np.atleast_1d(shape))
    if not shape or any(v < 0 for v in shape) or shape[-1] == 0:
        raise ShapeError(f"invalid shape {shape}")
    k = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    bs, ts = _core.type_sizes(int(t))
    if k % bs:
        raise ShapeError(f"k={k} is not a multiple of the {t.name} block size {bs}")
    if raw.size != rows * (k // bs) * ts:
        raise ShapeError(f"{t.name} data of shape {shape} takes {rows * (k // bs) * ts} bytes, "
                         f"got {raw.size}")
    if rows == 0:
        return np.empty(shape, dtype=np.float32)
    return _core.dequantize(int(t), raw, rows, k, _threads(n_threads)).reshape(shape)


def matmul(w_data: np.ndarray, qtype, w_shape, x: np.ndarray, n_threads=None, repacked: bool = False) -> np.ndarray:
    """x @ W.T for W (rows, k) stored in `qtype`: x (n, k) gives (n, rows); x (k,) gives (rows,).
    Activations are quantized on the fly to the type's activation format.
    repacked: go through the weights' repacked form (csrc/repack.h), as a
    loaded model does; UnsupportedTypeError where this CPU's kernel level has
    no repacked kernel for the type (see repacked_types())."""
    t = qtype_of(qtype)
    rows, k, row_bytes = _weight_shape(w_shape, t)
    raw = _weight_bytes(w_data, "w_data")
    if raw.size != rows * row_bytes:
        raise ShapeError(f"{t.name} weight of shape ({rows}, {k}) takes {rows * row_bytes} bytes, "
                         f"got {raw.size}")
    _require(x, "x", np.float32, ndim=(1, 2))
    if x.shape[-1] != k:
        raise ShapeError(f"x has {x.shape[-1]} columns, the weight has k={k}")
    x2 = x.reshape(-1, k)
    if not isinstance(repacked, bool):
        raise InvalidArgumentError(f"repacked must be True or False, got {repacked!r}")
    if repacked and t.name not in repacked_types():
        raise UnsupportedTypeError(f"the {current_isa()} kernel level has no repacked kernel for {t.name} "
                                   f"(it has: {', '.join(repacked_types()) or 'none'})")
    y = _core.matmul(int(t), raw, rows, k, x2, _threads(n_threads), repacked)
    return y.reshape(rows) if x.ndim == 1 else y


class GemmWeight:
    """A weight W (rows, k) in `qtype` packed once into the float GEMM's
    panels (csrc/sgemm.h), for gemm(): F16 weights stay F16 (widened as the
    kernel reads them) unless f32_panels; every other type is dequantized to
    float32 panels (4 bytes a value). nbytes: what the panels take."""

    def __init__(self, w_data: np.ndarray, qtype, w_shape, f32_panels: bool = False, n_threads=None):
        t = qtype_of(qtype)
        rows, k, row_bytes = _weight_shape(w_shape, t)
        raw = _weight_bytes(w_data, "w_data")
        if raw.size != rows * row_bytes:
            raise ShapeError(f"{t.name} weight of shape ({rows}, {k}) takes {rows * row_bytes} bytes, "
                             f"got {raw.size}")
        self.qtype, self.shape = t, (rows, k)
        self._w = _core.GemmWeight(int(t), raw, rows, k, bool(f32_panels), _threads(n_threads))

    @property
    def nbytes(self) -> int:
        return self._w.nbytes


def gemm(w: GemmWeight, x: np.ndarray, bias: np.ndarray | None = None, residual: np.ndarray | None = None,
         n_threads=None, out: np.ndarray | None = None) -> np.ndarray:
    """x @ W.T (+ bias) (+ residual) in float32 for x (m, k) and a GemmWeight
    W: float products, no quantized activations. Each element's bits are the
    same at any thread count and kernel level. out: where the result goes
    (float32 (m, rows)); it may be the residual itself (each element is read
    before it is written), never x."""
    if not isinstance(w, GemmWeight):
        raise InvalidArgumentError(f"w must be an ops.GemmWeight, got {type(w).__name__}")
    rows, k = w.shape
    _require(x, "x", np.float32, ndim=2)
    if x.shape[1] != k:
        raise ShapeError(f"x has {x.shape[1]} columns, the weight has k={k}")
    if bias is not None:
        _require(bias, "bias", np.float32, ndim=1)
        if bias.shape[0] != rows:
            raise ShapeError(f"bias has {bias.shape[0]} elements, the weight has {rows} rows")
    if residual is not None:
        _require(residual, "residual", np.float32, ndim=2)
        if residual.shape != (x.shape[0], rows):
            raise ShapeError(f"residual has shape {residual.shape}, the product {(x.shape[0], rows)}")
    if out is not None:
        _require(out, "out", np.float32, ndim=2)
        if out.shape != (x.shape[0], rows):
            raise ShapeError(f"out has shape {out.shape}, the product {(x.shape[0], rows)}")
        if np.shares_memory(out, x):
            raise InvalidArgumentError("out must not overlap x")
        if residual is not None and np.shares_memory(out, residual) and not (
                out.ctypes.data == residual.ctypes.data):
            raise InvalidArgumentError("out may be the residual itself, not a part of it")
    return w._w.gemm(x, bias, residual, _threads(n_threads), out)


def _out(out, shape, *inputs):
    """out checked: float32 of `shape`, overlapping none of the inputs."""
    _require(out, "out", np.float32, ndim=len(shape))
    if out.shape != tuple(shape):
        raise ShapeError(f"out has shape {out.shape}, the result {tuple(shape)}")
    if any(a is not None and np.shares_memory(out, a) for a in inputs):
        raise InvalidArgumentError("out must not overlap the inputs")
    return out


def attention_scratch_bytes(n: int, n_head: int, d: int, n_threads=None) -> int:
    """Bytes of the scratch buffer attention() takes for these sizes at up to n_threads."""
    return int(_core.attention_full_scratch(int(n), int(n_head), int(d), _threads(n_threads)))


def attention_scratch(n: int, n_head: int, d: int, n_threads=None) -> np.ndarray:
    """A scratch buffer for attention() of these sizes at up to n_threads
    (uint8): kept by a caller that attends again and again, it saves the
    page faults of fresh memory on every call."""
    return np.empty(attention_scratch_bytes(n, n_head, d, n_threads), np.uint8)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head: int, scale: float | None = None,
              n_threads=None, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """Non-causal multi-head attention of one sequence: q, k, v (n, n_head *
    d) float32; each head's rows get softmax(scale q K^T) V over all n keys
    (scale 1/sqrt(d) by default). (n, n_head * d), into out when given;
    scratch: from attention_scratch (else allocated for the call). q, k, v
    are C-contiguous, or column slices of one wider array (a fused qkv
    product): rows of contiguous floats, the same distance apart in all three."""
    if not all(isinstance(a, np.ndarray) and a.ndim == 2 and a.strides[1] == a.itemsize and
               a.strides[0] == q.strides[0] for a in (q, k, v)):
        _require(q, "q", np.float32, ndim=2)
        _require(k, "k", np.float32, ndim=2)
        _require(v, "v", np.float32, ndim=2)
    for a, name in ((q, "q"), (k, "k"), (v, "v")):
        if a.dtype != np.float32:
            raise InvalidArgumentError(f"{name} must have dtype float32, got {a.dtype}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ShapeError(f"q, k, v must have one shape, got {q.shape}, {k.shape}, {v.shape}")
    if q.strides[0] % q.itemsize or q.strides[0] < q.shape[1] * q.itemsize:
        raise InvalidArgumentError("q, k, v rows must lie apart by a whole number of floats, no fewer than a row")
    n_head = int(n_head)
    if n_head <= 0 or q.shape[1] % n_head or q.shape[0] == 0:
        raise ShapeError(f"{n_head} heads do not divide rows of {q.shape[1]}, or there are no rows")
    d = q.shape[1] // n_head
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if out is not None:
        _out(out, q.shape, q, k, v)
    if scratch is not None:
        _require(scratch, "scratch", np.uint8, ndim=1)
    return _core.attention_full(q, k, v, n_head, scale, _threads(n_threads), out, scratch)


def layer_norm(x: np.ndarray, weight: np.ndarray | None = None, bias: np.ndarray | None = None, eps: float = 1e-6,
               n_threads=None, out: np.ndarray | None = None) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis of x
    (rows, k), into out when given (not overlapping x)."""
    _require(x, "x", np.float32, ndim=2)
    k = x.shape[1]
    for a, name in ((weight, "weight"), (bias, "bias")):
        if a is not None:
            _require(a, name, np.float32, ndim=1)
            if a.shape[0] != k:
                raise ShapeError(f"{name} has {a.shape[0]} elements, x rows have {k}")
    if not (float(eps) >= 0):
        raise InvalidArgumentError(f"eps must be >= 0, got {eps!r}")
    if out is not None:
        _out(out, x.shape, x)
    if x.size == 0:
        return np.empty_like(x) if out is None else out
    return _core.layer_norm(x, weight, bias, float(eps), _threads(n_threads), out)


def repacked_types() -> tuple[str, ...]:
    """Names of the weight types the active kernel level multiplies in a
    repacked layout (csrc/repack.h): a model's matrices of these types are
    repacked at load."""
    return tuple(_core.repacked_types())


def rms_norm(x: np.ndarray, weight: np.ndarray | None = None, eps: float = 1e-6,
             n_threads=None, out: np.ndarray | None = None) -> np.ndarray:
    """x / sqrt(mean(x**2, axis=-1) + eps) * weight, over the last axis,
    into out when given (not overlapping x)."""
    _require(x, "x", np.float32, ndim=(1, 2))
    k = x.shape[-1]
    if weight is not None:
        _require(weight, "weight", np.float32, ndim=1)
        if weight.shape[0] != k:
            raise ShapeError(f"weight has {weight.shape[0]} elements, x rows have {k}")
    if not (float(eps) >= 0):
        raise InvalidArgumentError(f"eps must be >= 0, got {eps!r}")
    if out is not None:
        _out(out, x.shape, x)
    if x.size == 0:
        return np.empty_like(x) if out is None else out
    y = _core.rms_norm(x.reshape(-1, k), weight, float(eps), _threads(n_threads),
                       None if out is None else out.reshape(-1, k))
    return y.reshape(x.shape) if out is None else out


def _unary(name, x, u=None, n_threads=1, out=None):
    _require(x, "x", np.float32)
    if u is not None:
        _require(u, "up", np.float32)
        if u.shape != x.shape:
            raise ShapeError(f"up has shape {u.shape}, gate has {x.shape}")
    if out is not None:
        _require(out, "out", np.float32)
        if out.shape != x.shape or (np.shares_memory(out, x) and out.ctypes.data != x.ctypes.data):
            raise InvalidArgumentError("out must have x's shape, and be x itself or not overlap it")
        if u is not None and np.shares_memory(out, u):
            raise InvalidArgumentError("out must not overlap up")
    if x.size == 0:
        return np.empty_like(x) if out is None else out
    if out is None and n_threads == 1:
        y = _core.activation(_ACT[name], x.reshape(-1), None if u is None else u.reshape(-1))
        return y.reshape(x.shape)
    flat = None if out is None else out.reshape(-1)
    if u is None:
        y = _core.activation_mt(_ACT[name], x.reshape(-1), _threads(n_threads), flat)
    else:
        y = _core.gated_activation_mt(_ACT[name], x.reshape(-1), u.reshape(-1), _threads(n_threads), flat)
    return y.reshape(x.shape) if out is None else out


def silu(x: np.ndarray, n_threads=1, out=None) -> np.ndarray:
    """x * sigmoid(x), through a table indexed by x rounded to float16
    (the same values at any n_threads); out may be x (in place)."""
    return _unary("silu", x, n_threads=n_threads, out=out)


def gelu(x: np.ndarray, n_threads=1, out=None) -> np.ndarray:
    """GELU in its tanh form, through a table indexed by x rounded to float16
    (the same values at any n_threads); out may be x (in place)."""
    return _unary("gelu", x, n_threads=n_threads, out=out)


def silu_mul(gate: np.ndarray, up: np.ndarray, n_threads=1, out=None) -> np.ndarray:
    """silu(gate) * up: the gated feed-forward of Llama-family models (the
    same values at any n_threads); out may be gate (in place)."""
    return _unary("silu", gate, up, n_threads=n_threads, out=out)


def gelu_mul(gate: np.ndarray, up: np.ndarray, n_threads=1, out=None) -> np.ndarray:
    """gelu(gate) * up: the gated feed-forward of Gemma models (the same
    values at any n_threads); out may be gate (in place)."""
    return _unary("gelu", gate, up, n_threads=n_threads, out=out)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's clamped SwiGLU, as ggml_swiglu_oai: g = min(gate, 7),
    u = clip(up, -7, 7), g * sigmoid(1.702 g) * (u + 1), computed exactly
    (no table)."""
    return _unary("swiglu_oai", gate, up)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, numerically stable."""
    _require(x, "x", np.float32)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ShapeError(f"softmax needs a non-empty last axis, got shape {x.shape}")
    if x.size == 0:
        return np.empty_like(x)
    return _core.softmax(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def _binary(op, a, b):
    _require(a, "a", np.float32)
    _require(b, "b", np.float32)
    if a.shape != b.shape:
        raise ShapeError(f"shapes differ: {a.shape} and {b.shape}")
    if a.size == 0:
        return np.empty_like(a)
    return _core.binary(op, a.reshape(-1), b.reshape(-1)).reshape(a.shape)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _binary("add", a, b)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _binary("mul", a, b)


def rope(x: np.ndarray, positions, n_rot: int | None = None, freq_base: float = 10000.0,
         freq_scale: float = 1.0, mode: str = "norm", n_threads=1, out: np.ndarray | None = None) -> np.ndarray:
    """Rotary position embedding of x (n_tok, n_head, head_dim), into a new
    array, or into out (x itself: in place).

    The first n_rot dims of each head (all by default) are rotated by
    positions[t] * freq_scale * freq_base**(-2i/n_rot). mode "norm" rotates
    adjacent pairs (2i, 2i+1), as GGUF Llama weights expect; "neox" rotates
    (i, i + n_rot/2), as Qwen2 and Gemma do. positions (n_tok, n_pos) turn
    head h of token t by positions[t, h % n_pos]: the 2-D RoPE of vision
    towers, half-heads turned in turn by the patch's row and column.
    x must be C-contiguous, except when out is x: then only each token's
    heads need be (tokens a whole number of floats apart, a column slice of
    a wider row). Each value is the same at any n_threads."""
    in_place = out is not None and out is x
    if in_place:
        if x.dtype != np.float32:
            raise InvalidArgumentError(f"x must have dtype float32, got {x.dtype}")
        if x.ndim != 3:
            raise ShapeError(f"x must have 3 dimension(s), got shape {x.shape}")
        it = x.itemsize
        if not x.flags.writeable or x.strides[2] != it or x.strides[1] != x.shape[2] * it or \
                x.strides[0] % it or x.strides[0] < x.shape[1] * x.shape[2] * it:
            raise InvalidArgumentError("x must have each token's heads contiguous (tokens a whole number of "
                                       "floats apart) to be turned in place")
    else:
        _require(x, "x", np.float32, ndim=3)
    n_tok, n_head, head_dim = x.shape
    pos = np.asarray(positions)
    if pos.ndim == 1:
        pos = pos.reshape(-1, 1)
    if pos.ndim != 2 or pos.shape[0] != n_tok or pos.shape[1] == 0 or not np.issubdtype(pos.dtype, np.integer):
        raise ShapeError(f"positions must be {n_tok} integers or {n_tok} rows of them, got {pos.dtype} "
                         f"{np.asarray(positions).shape}")
    if pos.size and (pos.min() < 0 or pos.max() > np.iinfo(np.int32).max):
        raise InvalidArgumentError("positions must be in [0, 2**31)")
    n_rot = head_dim if n_rot is None else int(n_rot)
    if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
        raise ShapeError(f"n_rot must be even and in [2, head_dim={head_dim}], got {n_rot}")
    if mode not in _ROPE_MODES:
        raise InvalidArgumentError(f"mode must be 'norm' or 'neox', got {mode!r}")
    if not (freq_base > 0 and freq_scale > 0):
        raise InvalidArgumentError("freq_base and freq_scale must be > 0")
    if out is None:
        out = x.copy()
    elif not in_place:
        _out(out, x.shape, x)
        np.copyto(out, x)
    if n_tok:
        _core.rope_mt(out, np.ascontiguousarray(pos, dtype=np.int32), n_rot, float(freq_base),
                      float(freq_scale), _ROPE_MODES[mode], _threads(n_threads))
    return out
