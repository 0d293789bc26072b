"""The vision encoder's float kernels (csrc/sgemm.c, ops.c): ops.gemm over
weights packed once (ops.GemmWeight), ops.attention (full, non-causal) and
ops.layer_norm, against float64 numpy from the same float32 inputs (weights
through gguf's own dequantizer), at every kernel level this machine has; the
GEMM's levels bit for bit against the scalar tile (its specification), and
every result bit for bit at 1, 2 and 3 threads."""

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kernel_cases import at_level, float_weight, isa, random_blocks  # noqa: F401 (isa: a fixture)
from llminfer.core import ops, system
from llminfer.errors import InvalidArgumentError, ShapeError

GEMM_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0)
# (m, n, k): one row, tiles cut at every edge (m not a multiple of the
# tile's 6 rows, n of the panel's 16, k of 8 or 32), k past one block of
# 256 values, m past one unit's 72 rows, n past one unit's 1152 columns
# (75 panels: blocks of 38 and 37, the last panel 6 rows)
SHAPES = ((1, 1, 32), (1, 17, 64), (7, 16, 32), (13, 33, 96), (150, 200, 320), (6, 48, 544), (8, 1190, 64))
FLOAT_SHAPES = ((1, 1, 1), (5, 3, 7), (13, 33, 70), (145, 193, 257))
# float32 accumulation, one rounding per fused multiply-add, in value order:
# the error of a sum of k products stays below k * 2^-24 of the sum of their
# magnitudes (a far bound; seen: under 2e-7 of it)
GEMM_REL = 2.0 ** -24
# attention's output is a convex mix of value rows: its error, relative to
# the largest |v|, stays near float32's rounding (exp approximated to a few
# ulp by the SIMD levels; seen: under 5e-7)
ATTN_ABS = 1e-5


def weight(rng, t, rows, k):
    """(bytes in t's layout, the same matrix as float64 through gguf's dequantizer)."""
    w = random_blocks(rng, t, rows, k) if t == Q.Q8_0 else float_weight(rng, t, rows, k)
    return w, gguf.quants.dequantize(w, t).reshape(rows, k).astype(np.float64)


def gemm_bound(x, w64, k):
    return k * GEMM_REL * (np.abs(x.astype(np.float64)) @ np.abs(w64).T) + 1e-30


@pytest.mark.parametrize("t", GEMM_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gemm_matches_float64(isa, t, shape):  # noqa: F811
    m, n, k = shape
    rng = np.random.default_rng(m * 1000 + n + k)
    w, w64 = weight(rng, t, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    y = ops.gemm(ops.GemmWeight(w, t, (n, k)), x, bias)
    want = x.astype(np.float64) @ w64.T + bias
    assert y.dtype == np.float32 and y.shape == (m, n)
    assert np.all(np.abs(y - want) <= gemm_bound(x, w64, k) + 2.0 ** -24 * np.abs(want))


@pytest.mark.parametrize("shape", FLOAT_SHAPES, ids=str)
def test_gemm_float_odd_k(shape):
    """k of any length (F32 weights have no blocks)."""
    m, n, k = shape
    rng = np.random.default_rng(k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = ops.gemm(ops.GemmWeight(w, "F32", (n, k)), x)
    w64 = w.astype(np.float64)
    assert np.all(np.abs(y - x.astype(np.float64) @ w64.T) <= gemm_bound(x, w64, k))


@pytest.mark.parametrize("t", GEMM_TYPES, ids=lambda t: t.name)
def test_gemm_levels_agree_to_the_bit(t):
    """Every SIMD tile does the scalar tile's fused multiply-adds in its order."""
    rng = np.random.default_rng(5)
    m, n, k = 150, 200, 320
    w, _ = weight(rng, t, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)

    def run():
        return ops.gemm(ops.GemmWeight(w, t, (n, k)), x, bias, res)

    want = at_level("scalar", run)
    for level in system.available_isas():
        np.testing.assert_array_equal(at_level(level, run), want, err_msg=level)


@pytest.mark.parametrize("t", GEMM_TYPES, ids=lambda t: t.name)
def test_gemm_thread_count_changes_no_bit(t):
    rng = np.random.default_rng(6)
    m, n, k = 300, 1190, 544  # units of 72 rows by 38 or 37 panels
    w, _ = weight(rng, t, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    one = ops.gemm(ops.GemmWeight(w, t, (n, k), n_threads=1), x, n_threads=1)
    for nt in (2, 3):
        np.testing.assert_array_equal(ops.gemm(ops.GemmWeight(w, t, (n, k), n_threads=nt), x, n_threads=nt), one)


def test_gemm_f16_panels_and_f32_panels_agree():
    """F16 widened in the tile or before it: the same values in the same order."""
    rng = np.random.default_rng(7)
    w, _ = weight(rng, Q.F16, 40, 96)
    x = rng.standard_normal((20, 96)).astype(np.float32)
    a, b = ops.GemmWeight(w, Q.F16, (40, 96)), ops.GemmWeight(w, Q.F16, (40, 96), f32_panels=True)
    assert a.nbytes == 3 * 16 * 96 * 2 and b.nbytes == 3 * 16 * 96 * 4  # rows padded to panels of 16
    np.testing.assert_array_equal(ops.gemm(a, x), ops.gemm(b, x))


def test_gemm_bias_and_residual():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((21, 40)).astype(np.float32)
    x = rng.standard_normal((9, 40)).astype(np.float32)
    bias = rng.standard_normal(21).astype(np.float32)
    res = rng.standard_normal((9, 21)).astype(np.float32)
    W = ops.GemmWeight(w, "F32", w.shape)
    plain = ops.gemm(W, x)
    np.testing.assert_array_equal(ops.gemm(W, x, bias), plain + bias)
    np.testing.assert_array_equal(ops.gemm(W, x, bias, res), (plain + bias) + res)
    assert ops.gemm(W, np.empty((0, 40), np.float32)).shape == (0, 21)
    into = res.copy()  # summed into the residual's own rows, as the vision tower does
    assert ops.gemm(W, x, bias, into, out=into) is into
    np.testing.assert_array_equal(into, (plain + bias) + res)
    with pytest.raises(InvalidArgumentError):
        ops.gemm(ops.GemmWeight(np.zeros((40, 40), np.float32), "F32", (40, 40)), x, out=x)


def test_gemm_refuses_bad_arguments():
    w = np.zeros((4, 32), np.float32)
    W = ops.GemmWeight(w, "F32", w.shape)
    with pytest.raises(ShapeError):
        ops.gemm(W, np.zeros((2, 31), np.float32))
    with pytest.raises(ShapeError):
        ops.gemm(W, np.zeros((2, 32), np.float32), bias=np.zeros(3, np.float32))
    with pytest.raises(ShapeError):
        ops.gemm(W, np.zeros((2, 32), np.float32), residual=np.zeros((2, 5), np.float32))
    with pytest.raises(InvalidArgumentError):
        ops.gemm(W, np.zeros((2, 32), np.float64))
    with pytest.raises(InvalidArgumentError):
        ops.gemm(w, np.zeros((2, 32), np.float32))
    with pytest.raises(ShapeError):
        ops.GemmWeight(np.zeros(10, np.uint8), "Q8_0", (1, 32))


def attention_reference(q, k, v, n_head, scale):
    n, width = q.shape
    d = width // n_head
    out = np.empty((n, width))
    for h in range(n_head):
        s = slice(h * d, (h + 1) * d)
        z = scale * (q[:, s].astype(np.float64) @ k[:, s].astype(np.float64).T)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        out[:, s] = (p / p.sum(axis=1, keepdims=True)) @ v[:, s]
    return out


# (n, heads, d): one row, rows not a multiple of the unit's 16 queries or the
# tile's 6 keys, keys past one block of 256, d not a multiple of 6 or 8
ATTN_SHAPES = ((1, 1, 4), (7, 2, 8), (40, 3, 20), (300, 2, 72), (97, 4, 33))


@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=str)
def test_attention_matches_float64(isa, shape):  # noqa: F811
    n, H, d = shape
    rng = np.random.default_rng(n + H + d)
    q, k, v = (rng.standard_normal((n, H * d)).astype(np.float32) for _ in range(3))
    q *= 2  # scores spread wide enough that the softmax is not near uniform
    scale = 1 / np.sqrt(d)
    got = ops.attention(q, k, v, H)
    assert got.dtype == np.float32 and got.shape == q.shape
    np.testing.assert_allclose(got, attention_reference(q, k, v, H, scale), rtol=0, atol=ATTN_ABS * np.abs(v).max())


def test_attention_thread_count_changes_no_bit():
    rng = np.random.default_rng(9)
    n, H, d = 300, 3, 40
    q, k, v = (rng.standard_normal((n, H * d)).astype(np.float32) for _ in range(3))
    one = ops.attention(q, k, v, H, n_threads=1)
    for nt in (2, 3):
        np.testing.assert_array_equal(ops.attention(q, k, v, H, n_threads=nt), one)
    # into a given array, through a kept scratch buffer
    out, scratch = np.full_like(q, np.nan), ops.attention_scratch(n, H, d, n_threads=2)
    for _ in range(2):
        assert ops.attention(q, k, v, H, n_threads=2, out=out, scratch=scratch) is out
        np.testing.assert_array_equal(out, one)
    with pytest.raises(ShapeError):
        ops.attention(q, k, v, H, scratch=scratch[:100])
    with pytest.raises(InvalidArgumentError):
        ops.attention(q, k, v, H, out=q)


def test_attention_on_column_slices_of_one_product():
    """q, k, v as column slices of one fused (n, 3E) product read the same
    values as their contiguous copies: the same bits at 1 and 2 threads."""
    rng = np.random.default_rng(10)
    n, H, d = 97, 4, 20
    qkv = rng.standard_normal((n, 3 * H * d)).astype(np.float32)
    q, k, v = (qkv[:, i * H * d:(i + 1) * H * d] for i in range(3))
    want = ops.attention(*(np.ascontiguousarray(a) for a in (q, k, v)), H)
    for nt in (1, 2):
        np.testing.assert_array_equal(ops.attention(q, k, v, H, n_threads=nt), want)
    with pytest.raises(InvalidArgumentError):  # rows of k not as far apart as those of q
        ops.attention(q, np.ascontiguousarray(k), v, H)
    with pytest.raises(InvalidArgumentError):
        ops.attention(q[::-1], k[::-1], v[::-1], H)


def test_attention_refuses_bad_shapes():
    a = np.zeros((4, 12), np.float32)
    with pytest.raises(ShapeError):
        ops.attention(a, a, np.zeros((4, 8), np.float32), 2)
    with pytest.raises(ShapeError):
        ops.attention(a, a, a, 5)


@pytest.mark.parametrize("k", (1, 7, 1152))
def test_layer_norm_matches_float64(isa, k):  # noqa: F811
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((33, k)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(k).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(ops.layer_norm(x, w, b, 1e-6), want * w + b, rtol=0, atol=2e-6 * (np.abs(w).max() + 1))
    np.testing.assert_allclose(ops.layer_norm(x, eps=1e-6), want, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(ops.layer_norm(x, w, b, 1e-6, n_threads=2), ops.layer_norm(x, w, b, 1e-6))
    out = np.empty_like(x)
    assert ops.layer_norm(x, w, b, 1e-6, out=out) is out
    np.testing.assert_array_equal(out, ops.layer_norm(x, w, b, 1e-6))


@pytest.mark.parametrize("fn", (ops.gelu, ops.silu))
def test_threaded_activation_is_the_single_thread_one(fn):
    x = (np.random.default_rng(2).standard_normal(70001) * 4).astype(np.float32)
    one = fn(x)
    for nt in (2, 3):
        np.testing.assert_array_equal(fn(x, n_threads=nt), one)
    assert fn(x, n_threads=2, out=x) is x  # in place
    np.testing.assert_array_equal(x, one)
