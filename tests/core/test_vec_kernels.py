"""The attention helpers of the kernel table (dot, axpy, scale, f16
conversions), reached through _core.vec_kernel, against numpy under every
kernel level."""

import numpy as np
import pytest

from kernel_cases import at_level, isa
from llminfer import _core
from llminfer.core import system
from llminfer.errors import ShapeError

__all__ = ["isa"]

SUM_REL = 1e-6  # float32 sums in another order, relative to sum |a b|


@pytest.mark.parametrize("n", [0, 1, 7, 8, 33, 1000])
def test_vector_kernels(isa, n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    h = rng.standard_normal(n).astype(np.float16)
    a64, b64, h64 = a.astype(np.float64), b.astype(np.float64), h.astype(np.float64)

    got = _core.vec_kernel("dot_f32", 0.0, a, b)
    assert abs(got - a64 @ b64) <= SUM_REL * (np.abs(a64) @ np.abs(b64)) + 1e-30
    got = _core.vec_kernel("dot_f32_f16", 0.0, a, h)
    assert abs(got - a64 @ h64) <= SUM_REL * (np.abs(a64) @ np.abs(h64)) + 1e-30

    y = b.copy()
    _core.vec_kernel("axpy_f32", 0.75, a, y)
    np.testing.assert_allclose(y, b64 + 0.75 * a64, rtol=1e-6, atol=1e-6)
    y = b.copy()
    _core.vec_kernel("axpy_f16", -1.5, h, y)
    np.testing.assert_allclose(y, b64 - 1.5 * h64, rtol=1e-6, atol=1e-6)
    y = b.copy()
    _core.vec_kernel("scale_f32", 0.3, a, y)
    assert np.array_equal(y, b * np.float32(0.3))

    out16 = np.empty(n, np.float16)
    big = (a * 3e4).astype(np.float32)  # past 65504 some round to inf, as numpy does
    _core.vec_kernel("f32_to_f16", 0.0, big, out16)
    with np.errstate(over="ignore"):
        want16 = big.astype(np.float16)
    assert np.array_equal(out16.view(np.uint16), want16.view(np.uint16))
    out32 = np.empty(n, np.float32)
    _core.vec_kernel("f16_to_f32", 0.0, h, out32)
    assert np.array_equal(out32, h.astype(np.float32))


def test_sizes_must_pair():
    with pytest.raises(ShapeError, match="do not pair up"):
        _core.vec_kernel("dot_f32", 0.0, np.ones(3, np.float32), np.ones(4, np.float32))


@pytest.mark.parametrize("d", [32, 40, 64, 96, 128, 256])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 17])
@pytest.mark.parametrize("nh", [1, 2, 3, 4, 7])
def test_attention_kernels_match_numpy(isa, d, n, nh):
    """Scores of nh query heads against rows of an F16 cache whose rows are
    wider than d (the other heads' columns sit in between), and the weighted
    sums of those rows."""
    rng = np.random.default_rng(d * 1000 + n * 10 + nh)
    stride = d + 24
    cache = rng.standard_normal((n, stride)).astype(np.float16)
    rows = cache[:, :d].astype(np.float64)
    q = rng.standard_normal((nh, d + 3)).astype(np.float32)
    scores = np.full((nh, n + 3), 7.0, dtype=np.float32)
    _core.attn_kernel(False, q, cache.view(np.uint16), d, 0.125, scores)
    want = 0.125 * q[:, :d].astype(np.float64) @ rows.T
    assert np.allclose(scores[:, :n], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.all(scores[:, n:] == 7.0)  # nothing written past each head's n scores

    p = rng.random((nh, n + 2)).astype(np.float32)
    out = rng.standard_normal((nh, d + 5)).astype(np.float32)
    before = out.copy()
    _core.attn_kernel(True, p, cache.view(np.uint16), d, 1.0, out)
    want = before[:, :d] + p[:, :n].astype(np.float64) @ rows
    assert np.allclose(out[:, :d], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.array_equal(out[:, d:], before[:, d:])


@pytest.mark.parametrize("d", [64, 128, 96])
def test_attention_sums_are_the_same_bits_at_every_vector_width(d):
    """The AVX-512 weighted sum holds 4 heads x 64 columns where the AVX2 one
    holds 3 x 32, but each output element is the same fma chain over the
    rows in order: the same bits (d = 96 takes the AVX2 kernel at both)."""
    if not {"avx2", "avx512"} <= set(system.available_isas()):
        pytest.skip("needs the AVX2 and AVX-512 levels")
    rng = np.random.default_rng(d)
    cache = rng.standard_normal((37, d + 16)).astype(np.float16).view(np.uint16)
    for nh in (1, 3, 4, 5, 8):
        p = rng.random((nh, 37)).astype(np.float32)
        start = rng.standard_normal((nh, d)).astype(np.float32)
        outs = []
        for level in ("avx2", "avx512"):
            out = start.copy()
            at_level(level, _core.attn_kernel, True, p, cache, d, 1.0, out)
            outs.append(out)
        assert np.array_equal(outs[0], outs[1]), f"d={d} nh={nh}"


@pytest.mark.parametrize("d", [64, 128, 80])
def test_a_score_does_not_depend_on_what_is_computed_beside_it(isa, d):
    """Batch invariance rests on this: a (head, row) score is the same bits
    whether its call has 1 to 7 heads (the SIMD kernels take them 4 at a
    time), and whether its row is first, in the middle or alone in the call
    (they take rows in pairs, and an odd last row alone)."""
    rng = np.random.default_rng(d + 7)
    n, stride = 37, d + 32
    cache = rng.standard_normal((n, stride)).astype(np.float16)
    q = rng.standard_normal((7, d)).astype(np.float32)
    whole = np.zeros((7, n), np.float32)
    _core.attn_kernel(False, q, cache.view(np.uint16), d, 0.125, whole)
    for h in range(7):  # one head at a time, and three heads from h
        one = np.zeros((1, n), np.float32)
        _core.attn_kernel(False, q[h:h + 1], cache.view(np.uint16), d, 0.125, one)
        assert np.array_equal(one[0], whole[h]), f"head {h} alone"
        three = np.zeros((min(3, 7 - h), n), np.float32)
        _core.attn_kernel(False, q[h:h + 3], cache.view(np.uint16), d, 0.125, three)
        assert np.array_equal(three, whole[h:h + 3]), f"heads {h}.."
    for a, b in ((0, 1), (5, 6), (3, 21), (20, 37), (36, 37)):  # rows [a, b) in a call of their own
        part = np.zeros((7, b - a), np.float32)
        _core.attn_kernel(False, q, np.ascontiguousarray(cache[a:b]).view(np.uint16), d, 0.125, part)
        assert np.array_equal(part, whole[:, a:b]), f"rows {a}:{b}"


SOFTCAP_REL = 1e-6  # a SIMD level's tanh against tanh (csrc/kernels/x86_avx2.c's tanh_ps: 4e-7 at worst)


@pytest.mark.parametrize("cap", [30.0, 1.0])
def test_softcap_is_tanh_within_a_stated_tolerance(isa, cap):
    """The final logit soft-cap cap * tanh(x / cap) (Gemma's logits, 262144 a
    token): the scalar level's tanhf, a SIMD level's own vector tanh, each
    within SOFTCAP_REL of float64 tanh, over the whole range of tanh (tiny
    values, where it is x, up to the values where it rounds to 1), with
    signed zeros, infinities and NaN kept as tanhf keeps them."""
    rng = np.random.default_rng(int(cap))
    x = np.concatenate([rng.standard_normal(5000) * 3 * cap, np.linspace(-10 * cap, 10 * cap, 4001),
                        cap * np.logspace(-9, 1, 2000) * rng.choice([-1, 1], 2000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30]]).astype(np.float32)
    y = x.copy()
    _core.vec_kernel("softcap_f32", cap, np.zeros_like(y), y)
    z = x.astype(np.float64) / np.float32(cap)
    want = cap * np.tanh(z)
    ok = np.isnan(x)
    assert np.array_equal(np.isnan(y), ok)
    err = np.abs(y[~ok] - want[~ok])
    assert np.all(err <= SOFTCAP_REL * np.abs(want[~ok]) + 1e-37), (
        f"{isa}: worst {np.max(err / (np.abs(want[~ok]) + 1e-37)):.3g} relative at x = {x[~ok][np.argmax(err)]}")
    assert np.all(np.abs(y[~ok]) <= cap)
    assert np.signbit(y[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()


def test_softcap_of_an_element_does_not_depend_on_its_place():
    """Batch invariance of the logits: threads split a batch's logits at any
    element, so an element's soft-capped value must not depend on where in a
    call it lies (a vector body or the tail of a call)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(101) * 40).astype(np.float32)
    for level in system.available_isas():
        whole = x.copy()
        at_level(level, _core.vec_kernel, "softcap_f32", 30.0, np.zeros_like(whole), whole)
        for a, b in ((0, 1), (1, 4), (3, 12), (7, 101), (50, 59), (96, 101), (100, 101)):
            part = x[a:b].copy()
            at_level(level, _core.vec_kernel, "softcap_f32", 30.0, np.zeros_like(part), part)
            assert np.array_equal(part, whole[a:b]), f"{level}: elements {a}:{b}"
