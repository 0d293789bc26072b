"""The vector operations of llminfer.core.ops against plain numpy, under every
kernel level: rms_norm, rope (both pairings, per-head position columns, in
place on strided rows), silu / gelu and their gated forms (through
float16-indexed tables), softmax, add, mul; the threaded forms against the
1-thread values, bit for bit."""

import numpy as np
import pytest

from kernel_cases import at_level, isa
from llminfer.core import ops, system
from llminfer.errors import InvalidArgumentError, ShapeError

__all__ = ["isa"]

F32_REL = 2e-6        # float32 rounding of a few operations, relative
F16_OUTPUT_REL = 2 ** -11  # float16 rounding of a table value (GELU), relative
SILU_REL = 4e-6       # SiLU's interpolated table: second order in the f16 spacing, plus float32 rounding
SILU_ABS = 5e-8       # ... which near its small negative tail (x < -5) is better bounded absolutely
TAIL_ABS = 1e-10      # GELU(x) for x << 0 is 1 + tanh(..) cancelling: only absolute agreement


def rng_x(seed, *shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("k", [1, 7, 64, 4099])
def test_rms_norm(isa, k):
    x, w = rng_x(1, 3, k, scale=3), rng_x(2, k)
    x64 = x.astype(np.float64)
    inv = 1 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ops.rms_norm(x, w, eps=1e-5), x64 * inv * w, rtol=F32_REL, atol=0)
    one = ops.rms_norm(x, w, eps=1e-5, n_threads=1)
    out = np.empty_like(x)
    assert ops.rms_norm(x, w, eps=1e-5, n_threads=3, out=out) is out and np.array_equal(out, one)
    np.testing.assert_allclose(ops.rms_norm(x[0], eps=1e-5), x64[0] * inv[0], rtol=F32_REL, atol=0)


def rope_angles_exact(pos, n_rot, base, scale):
    half = n_rot // 2
    return (pos[:, None] * scale) * base ** (-2.0 * np.arange(half) / n_rot)  # (n_tok, half)


def rope_angles_ggml(pos, n_rot, base, scale):
    """The angles as ggml (and llminfer) compute them: float32 throughout,
    theta_i = p * theta_scale^i by repeated products."""
    f = np.float32
    # powf(base, -2/n_rot), correctly rounded (numpy's float32 power can be an ulp off)
    theta_scale = f(np.float64(base) ** np.float64(f(-2.0) / f(n_rot)))
    out = np.zeros((len(pos), n_rot // 2))
    for t, p in enumerate(pos):
        theta = f(p)
        for i in range(n_rot // 2):
            out[t, i] = f(scale) * theta
            theta = f(theta * theta_scale)
    return out


def rope_ref(x, pos, n_rot, base, scale, mode, angles=rope_angles_exact):
    y = x.astype(np.float64).copy()
    half = n_rot // 2
    theta = angles(pos, n_rot, base, scale)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if mode == "norm":
        a, b = x[..., 0:n_rot:2].astype(np.float64), x[..., 1:n_rot:2].astype(np.float64)
        y[..., 0:n_rot:2], y[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :half].astype(np.float64), x[..., half:n_rot].astype(np.float64)
        y[..., :half], y[..., half:n_rot] = a * c - b * s, a * s + b * c
    return y


@pytest.mark.parametrize("mode", ["norm", "neox"])
@pytest.mark.parametrize("n_rot", [64, 32])
def test_rope(isa, mode, n_rot):
    x = rng_x(3, 5, 4, 64)
    pos = np.array([0, 1, 7, 300, 4095], dtype=np.int32)
    got = ops.rope(x, pos, n_rot=n_rot, freq_base=10000.0, freq_scale=0.5, mode=mode)
    # the rotation itself, given ggml's float32 angles
    want = rope_ref(x, pos, n_rot, 10000.0, 0.5, mode, angles=rope_angles_ggml)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # and against exact angles: float32 products drift by about an ulp of the
    # angle per step, which grows with the position
    exact = rope_ref(x, pos, n_rot, 10000.0, 0.5, mode)
    drift = (pos[:, None, None] * 0.5 + 1) * (n_rot // 2) * 2.0 ** -23
    assert np.all(np.abs(got - exact) <= 2 * np.abs(x).max() * drift + 1e-5)
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:]), "dims past n_rot stay"


def test_rope_threads_positions_in_place(isa):
    """Tokens shared by threads change no value; positions (n_tok, n_pos)
    turn head h by column h % n_pos, as ropes of each head alone would; and
    a column slice of wider rows turns in place, leaving the rest."""
    x = rng_x(11, 37, 6, 20)
    pos = np.random.default_rng(12).integers(0, 3000, (37, 2)).astype(np.int32)
    one = ops.rope(x, pos, n_rot=16, mode="neox")
    for nt in (2, 3, 5):
        assert np.array_equal(ops.rope(x, pos, n_rot=16, mode="neox", n_threads=nt), one)
    for h in range(6):
        alone = ops.rope(np.ascontiguousarray(x[:, h:h + 1]), pos[:, h % 2], n_rot=16, mode="neox")
        assert np.array_equal(one[:, h:h + 1], alone)
        want = rope_ref(x[:, h:h + 1], pos[:, h % 2], 16, 10000.0, 1.0, "neox", angles=rope_angles_ggml)
        np.testing.assert_allclose(one[:, h:h + 1], want, rtol=0, atol=1e-5)
    wide = rng_x(13, 37, 3 * 120)
    before = wide.copy()
    part = wide[:, 120:240].reshape(37, 6, 20)
    assert ops.rope(part, pos, n_rot=16, mode="neox", n_threads=2, out=part) is part
    want = ops.rope(np.ascontiguousarray(before[:, 120:240]).reshape(37, 6, 20), pos, n_rot=16, mode="neox")
    assert np.array_equal(wide[:, 120:240].reshape(37, 6, 20), want)
    assert np.array_equal(wide[:, :120], before[:, :120]) and np.array_equal(wide[:, 240:], before[:, 240:])
    out = np.empty_like(x)
    assert ops.rope(x, pos, n_rot=16, mode="neox", out=out) is out and np.array_equal(out, one)
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        ops.rope(part, pos, n_rot=16)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        t = np.ones((6, 37, 20), np.float32).transpose(1, 0, 2)
        ops.rope(t, pos, out=t)
    with pytest.raises(InvalidArgumentError, match="overlap"):
        ops.rope(x[:18], pos[:18], out=x[1:19])


def silu64(x):
    return x / (1 + np.exp(-x))


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("name", ["silu", "gelu"])
def test_activations(isa, name):
    f, fn, gated = {"silu": (silu64, ops.silu, ops.silu_mul),
                    "gelu": (gelu64, ops.gelu, ops.gelu_mul)}[name]
    x = rng_x(4, 3, 1001, scale=4)
    x[0, :8] = [0.0, -0.0, 20.0, -20.0, 1e-6, -1e-6, 11.0, -11.0]
    u = rng_x(5, 3, 1001)
    x64 = x.astype(np.float64)
    if name == "silu":
        # table values and slopes at the float16 nearest x, interpolated: the
        # error is second order in the float16 spacing, below float32 rounding
        want = f(x64)
        np.testing.assert_allclose(fn(x), want, rtol=SILU_REL, atol=SILU_ABS)
        np.testing.assert_allclose(gated(x, u), want * u, rtol=2 * SILU_REL, atol=4 * SILU_ABS)
        return
    # ggml's GELU table: the value at the float16 nearest x, itself kept in
    # float16; x above +10 and 0 below -10
    x16 = x.astype(np.float16).astype(np.float64)
    inside = f(x16).astype(np.float32).astype(np.float16).astype(np.float64)
    want = np.where(x64 >= 10, x64, np.where(x64 <= -10, 0.0, inside))
    np.testing.assert_allclose(fn(x), want, rtol=F16_OUTPUT_REL, atol=TAIL_ABS)
    np.testing.assert_allclose(gated(x, u), want * u, rtol=F16_OUTPUT_REL + 2 * F32_REL, atol=TAIL_ABS)
    assert np.all(fn(x)[x >= 10] == x[x >= 10]) and np.all(fn(x)[x <= -10] == 0)


@pytest.mark.parametrize("name", ["silu", "gelu"])
def test_activations_threads(isa, name):
    """The threaded and in-place forms give the 1-thread values bit for bit
    (each element alone, whatever the split), over more than one piece."""
    fn, gated = {"silu": (ops.silu, ops.silu_mul), "gelu": (ops.gelu, ops.gelu_mul)}[name]
    x, u = rng_x(14, 3, 20011, scale=4), rng_x(15, 3, 20011)
    plain, prod = fn(x), gated(x, u)
    np.testing.assert_array_equal(prod, plain * u)
    for nt in (2, 3):
        assert np.array_equal(fn(x, n_threads=nt), plain)
        assert np.array_equal(gated(x, u, n_threads=nt), prod)
        g = x.copy()
        assert gated(g, u, n_threads=nt, out=g) is g and np.array_equal(g, prod)
        out = np.empty_like(x)
        assert gated(x, u, n_threads=nt, out=out) is out and np.array_equal(out, prod)
    with pytest.raises(InvalidArgumentError, match="overlap up"):
        gated(x, u, out=u)


@pytest.mark.parametrize("k", [1, 5, 8, 100, 4099])
def test_softmax(isa, k):
    x = rng_x(6, 4, k, scale=10)
    x[1] += 1000.0  # stable for large inputs
    if k > 2:
        x[2, ::2] = -np.inf  # masked positions give exact zeros
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    got = ops.softmax(x)
    np.testing.assert_allclose(got, want, rtol=4 * F32_REL, atol=1e-37)
    if k > 2:
        assert np.all(got[2, ::2] == 0)


def test_add_mul_exact(isa):
    a, b = rng_x(7, 3, 37), rng_x(8, 3, 37)
    assert np.array_equal(ops.add(a, b), a + b)
    assert np.array_equal(ops.mul(a, b), a * b)


def test_levels_agree_on_ops():
    """RMSNorm and softmax sum in each level's order; GELU is ggml's table at
    every level, so its bits agree; SiLU is the interpolated table at the
    scalar (and NEON) level and computed at the x86 levels, the two within
    the bound test_activations holds each to."""
    x, w = rng_x(9, 4, 515, scale=3), rng_x(10, 515)
    up = w[None].repeat(4, 0)
    fns = (lambda: ops.rms_norm(x, w), lambda: ops.softmax(x), lambda: ops.silu_mul(x, up),
           lambda: ops.gelu_mul(x, up))
    ref = [at_level("scalar", f) for f in fns]
    exact = silu64(x.astype(np.float64)) * up
    for level in system.available_isas():
        got = [at_level(level, f) for f in fns]
        np.testing.assert_allclose(got[0], ref[0], rtol=F32_REL)
        np.testing.assert_allclose(got[1], ref[1], rtol=4 * F32_REL, atol=1e-37)
        np.testing.assert_allclose(got[2], exact, rtol=2 * SILU_REL, atol=4 * SILU_ABS)
        assert np.array_equal(got[3], ref[3]), "the GELU table is indexed the same way"


def test_errors():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ShapeError, match="weight has 4 elements, x rows have 8"):
        ops.rms_norm(x, np.ones(4, np.float32))
    with pytest.raises(InvalidArgumentError, match="eps must be >= 0"):
        ops.rms_norm(x, eps=-1.0)
    with pytest.raises(InvalidArgumentError, match="dtype float32"):
        ops.rms_norm(x.astype(np.float64))
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        ops.softmax(np.ones((8, 2), np.float32).T)
    with pytest.raises(ShapeError, match="non-empty last axis"):
        ops.softmax(np.ones((2, 0), np.float32))
    with pytest.raises(ShapeError, match="shapes differ"):
        ops.add(x, np.ones((2, 7), np.float32))
    with pytest.raises(ShapeError, match="up has shape"):
        ops.silu_mul(x, np.ones((2, 7), np.float32))
    with pytest.raises(ShapeError, match="3 dimension"):
        ops.rope(x, np.zeros(2, np.int32))
    x3 = np.ones((2, 1, 8), np.float32)
    with pytest.raises(ShapeError, match="positions must be 2 integers"):
        ops.rope(x3, np.zeros(3, np.int32))
    with pytest.raises(ShapeError, match="n_rot must be even"):
        ops.rope(x3, np.zeros(2, np.int32), n_rot=3)
    with pytest.raises(InvalidArgumentError, match="mode must be"):
        ops.rope(x3, np.zeros(2, np.int32), mode="glm")
    with pytest.raises(InvalidArgumentError, match="positions must be in"):
        ops.rope(x3, np.array([0, -1]))
