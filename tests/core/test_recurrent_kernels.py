"""The recurrent mixers' kernels of the kernel table (csrc/kernels/*_recurrent.c:
the causal convolution, the Gated DeltaNet delta rule, the Mamba2 scan),
reached through _core.conv_kernel / gdn_kernel / mamba2_kernel, at every SIMD
level this machine has against the scalar level (their specification) and
against a float64 numpy reference. NEON is held to the scalar kernels under
qemu by tests/c/test_kernels_neon.c (test_neon_qemu.py)."""

import platform

import numpy as np
import pytest

from kernel_cases import at_level
from llminfer import _core
from llminfer.core import system
from llminfer.errors import ShapeError
from reference_hybrid import HybridReference, sigmoid, silu, softplus

# A SIMD level's delta rule and scan against the scalar order: fused
# multiply-adds and lane-wise partial sums round differently, and the state
# carries the difference from token to token (the decay shrinks it). A state
# is held to its largest value; a token's outputs, sums that may cancel, to
# the largest sum of their terms' magnitudes over the head's rows (from the
# float64 reference). Seen at AVX2 over the cases below: outputs 2.1e-7
# (delta rule) and 1.9e-7 (scan), states 1.8e-7 and 1.3e-7; either level
# against numpy: outputs 3.5e-7 and 3.0e-7, states 2.4e-7 and 2.6e-7.
SIMD_REL = 1e-5
# Either level against float64 numpy from the same float32 inputs, alike.
NUMPY_REL = 1e-5

# the SIMD levels of this machine's family (the other family's are not built)
SIMD_LEVELS = ("neon", "neon_dot") if platform.machine().lower() in ("aarch64", "arm64") else ("avx2", "avx512")


@pytest.fixture(params=SIMD_LEVELS)
def simd(request):
    """A SIMD level, skipped with the reason where this CPU or build lacks it."""
    if request.param not in system.available_isas():
        pytest.skip(f"kernel level {request.param} is not available here (this CPU or build has "
                    f"{', '.join(system.available_isas())})")
    return request.param


def seq_rows(n):
    """One sequence's rows in a batch of 2n + 1: every other row."""
    return np.arange(1, 2 * n + 1, 2, dtype=np.int32)


def normwise(got, want):
    """max |got - want| over max |want|."""
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def per_token(got, want, mag):
    """max over tokens t of max |got[t] - want[t]| over mag[t]."""
    return float((np.abs(got.astype(np.float64) - want).max(axis=1) / np.maximum(mag, 1e-30)).max())


def unit_rows(rng, T, n, ld, scale):
    x = np.zeros((T, ld), np.float32)
    r = rng.standard_normal((T, n))
    x[:, :n] = r / np.linalg.norm(r, axis=1, keepdims=True) * scale
    return x


# ---- the causal convolution ----

def conv_case(seed, C, K, n):
    rng = np.random.default_rng(seed)
    T = 2 * n + 1
    return dict(x=rng.standard_normal((T, C)).astype(np.float32),
                w=rng.standard_normal((C, K)).astype(np.float32),
                bias=rng.standard_normal(C).astype(np.float32),
                state=rng.standard_normal(C * (K - 1)).astype(np.float32))


def run_conv(case, c0, act, with_bias):
    C = case["x"].shape[1]
    y = np.zeros_like(case["x"])
    state = case["state"].copy()
    rows = seq_rows((case["x"].shape[0] - 1) // 2)
    _core.conv_kernel(case["x"], y, rows, case["w"], case["bias"] if with_bias else None, state, c0, C, act)
    return y, state


@pytest.mark.parametrize("C", [1, 5, 8, 17, 64, 67])
@pytest.mark.parametrize("K", [1, 2, 4, 5])
@pytest.mark.parametrize("n", [1, 3, 20])
def test_conv_gives_the_scalar_bits_and_numpy(simd, C, K, n):
    """Channels vectorised, each channel's sum in the scalar order: the same
    bits as the specification, and numpy's values, from channel c0 on (the
    tail channels past the last full vector included)."""
    case = conv_case(C * 100 + K * 10 + n, C, K, n)
    c0 = 1 if C > 4 else 0
    for act in (False, True):
        for with_bias in (False, True):
            want_y, want_s = at_level("scalar", run_conv, case, c0, act, with_bias)
            got_y, got_s = at_level(simd, run_conv, case, c0, act, with_bias)
            assert np.array_equal(got_y.view(np.uint32), want_y.view(np.uint32))
            assert np.array_equal(got_s.view(np.uint32), want_s.view(np.uint32))

            window = case["state"].reshape(C, K - 1).astype(np.float64)
            rows = seq_rows(n)
            w = case["w"].astype(np.float64)
            ref = np.zeros((len(rows), C))
            for i, t in enumerate(rows):
                out, window = HybridReference._conv_step(window, case["x"][t].astype(np.float64), w)
                ref[i] = (out + (case["bias"] if with_bias else 0.0))
            ref = silu(ref) if act else ref
            assert normwise(got_y[rows, c0:], ref[:, c0:]) <= NUMPY_REL
            assert np.all(got_y[:, :c0] == 0) and np.all(np.delete(got_y, rows, axis=0) == 0)
            untouched = case["state"].reshape(C, K - 1)[:c0]
            assert np.array_equal(got_s.reshape(C, K - 1)[:c0], untouched)


# ---- Gated DeltaNet ----

def gdn_case(seed, dk, dv, n):
    rng = np.random.default_rng(seed)
    T, ld = 2 * n + 1, dk + 3
    return dict(S=rng.standard_normal((dv, dk)).astype(np.float32),
                q=unit_rows(rng, T, dk, ld, 1 / np.sqrt(dk)), k=unit_rows(rng, T, dk, ld, 1.0),
                v=rng.standard_normal((T, dv)).astype(np.float32),
                alpha=rng.standard_normal(T).astype(np.float32), beta=rng.standard_normal(T).astype(np.float32),
                dt_b=float(rng.standard_normal()), a=float(-np.exp(rng.standard_normal())))


def run_gdn(case, rows):
    S = case["S"].copy()
    o = np.zeros_like(case["v"])
    _core.gdn_kernel(S, rows, case["q"], case["k"], case["v"], case["alpha"], case["beta"], case["dt_b"],
                     case["a"], o)
    return o, S


def gdn_numpy(case, rows):
    dk = case["S"].shape[1]
    S = case["S"].astype(np.float64)
    a, dt_b = np.float32(case["a"]), np.float32(case["dt_b"])
    out, mag = [], []
    for t in rows:
        q, k = case["q"][t, :dk].astype(np.float64), case["k"][t, :dk].astype(np.float64)
        S = S * np.exp(softplus(np.float64(case["alpha"][t] + dt_b)) * a)
        d = (case["v"][t] - S @ k) * sigmoid(np.float64(case["beta"][t]))
        S = S + np.outer(d, k)
        out.append(S @ q)
        mag.append((np.abs(S) @ np.abs(q)).max())
    return np.array(out), S, np.array(mag)


@pytest.mark.parametrize("dk", [1, 7, 8, 16, 17, 33, 128])
@pytest.mark.parametrize("dv", [1, 5, 16])
@pytest.mark.parametrize("n", [1, 2, 17, 40])
def test_gdn_head_against_the_scalar_kernel_and_numpy(simd, dk, dv, n):
    case = gdn_case(dk * 1000 + dv * 10 + n, dk, dv, n)
    rows = seq_rows(n)
    want_o, want_S = at_level("scalar", run_gdn, case, rows)
    got_o, got_S = at_level(simd, run_gdn, case, rows)
    ref_o, ref_S, mag = gdn_numpy(case, rows)
    assert per_token(got_o[rows], want_o[rows].astype(np.float64), mag) <= SIMD_REL
    assert normwise(got_S, want_S.astype(np.float64)) <= SIMD_REL
    for o, S in ((got_o, got_S), (want_o, want_S)):
        assert per_token(o[rows], ref_o, mag) <= NUMPY_REL
        assert normwise(S, ref_S) <= NUMPY_REL
    assert np.all(np.delete(got_o, rows, axis=0) == 0)  # only the sequence's rows are written


# ---- Mamba2 ----

def mamba2_case(seed, hd, ds, n):
    rng = np.random.default_rng(seed)
    T, ld = 2 * n + 1, max(hd, ds) + 5
    return dict(S=rng.standard_normal((hd, ds)).astype(np.float32),
                x=rng.standard_normal((T, ld)).astype(np.float32), B=rng.standard_normal((T, ld)).astype(np.float32),
                C=rng.standard_normal((T, ld)).astype(np.float32), dt=rng.standard_normal(T).astype(np.float32),
                z=rng.standard_normal((T, hd)).astype(np.float32), dt_b=float(rng.standard_normal()),
                a=float(-np.exp(rng.standard_normal())), d=float(rng.standard_normal()))


def run_mamba2(case, rows):
    S = case["S"].copy()
    y = np.zeros_like(case["z"])
    _core.mamba2_kernel(S, rows, case["x"], case["B"], case["C"], case["dt"], case["dt_b"], case["a"], case["d"],
                        case["z"], y)
    return y, S


def mamba2_numpy(case, rows):
    hd, ds = case["S"].shape
    S = case["S"].astype(np.float64)
    a, dt_b, d = np.float32(case["a"]), np.float32(case["dt_b"]), np.float32(case["d"])
    out, mag = [], []
    for t in rows:
        x, B, C = (case[n][t].astype(np.float64) for n in "xBC")
        dt = softplus(np.float64(case["dt"][t] + dt_b))
        S = S * np.exp(dt * a) + np.outer(x[:hd] * dt, B[:ds])
        gate = silu(case["z"][t].astype(np.float64))
        out.append((S @ C[:ds] + x[:hd] * d) * gate)
        mag.append(((np.abs(S) @ np.abs(C[:ds]) + np.abs(x[:hd] * d)) * np.abs(gate)).max())
    return np.array(out), S, np.array(mag)


@pytest.mark.parametrize("ds", [1, 7, 8, 16, 17, 33, 128])
@pytest.mark.parametrize("hd", [1, 3, 8])
@pytest.mark.parametrize("n", [1, 2, 17, 40])
def test_mamba2_head_against_the_scalar_kernel_and_numpy(simd, hd, ds, n):
    case = mamba2_case(ds * 1000 + hd * 10 + n, hd, ds, n)
    rows = seq_rows(n)
    want_y, want_S = at_level("scalar", run_mamba2, case, rows)
    got_y, got_S = at_level(simd, run_mamba2, case, rows)
    ref_y, ref_S, mag = mamba2_numpy(case, rows)
    assert per_token(got_y[rows], want_y[rows].astype(np.float64), mag) <= SIMD_REL
    assert normwise(got_S, want_S.astype(np.float64)) <= SIMD_REL
    for y, S in ((got_y, got_S), (want_y, want_S)):
        assert per_token(y[rows], ref_y, mag) <= NUMPY_REL
        assert normwise(S, ref_S) <= NUMPY_REL
    assert np.all(np.delete(got_y, rows, axis=0) == 0)


# ---- one order per level, however the rows come ----

@pytest.mark.parametrize("split", [1, 15, 16, 17, 33])
def test_rows_in_pieces_give_the_bits_of_one_call(isa, split):
    """A sequence's 40 rows in one call, or in two (a prompt in chunks, or
    prefill then decode), give the same outputs and state to the bit at
    every level: the SIMD levels' chunks of tokens do not change any
    value's operations."""
    rows = seq_rows(40)
    g = gdn_case(split, 33, 5, 40)
    whole_o, whole_S = run_gdn(g, rows)
    first_o, S = run_gdn(g, rows[:split])
    g2 = dict(g, S=S)
    second_o, S = run_gdn(g2, rows[split:])
    assert np.array_equal((first_o + second_o).view(np.uint32), whole_o.view(np.uint32))
    assert np.array_equal(S.view(np.uint32), whole_S.view(np.uint32))

    m = mamba2_case(split, 3, 17, 40)
    whole_y, whole_S = run_mamba2(m, rows)
    first_y, S = run_mamba2(m, rows[:split])
    second_y, S = run_mamba2(dict(m, S=S), rows[split:])
    assert np.array_equal((first_y + second_y).view(np.uint32), whole_y.view(np.uint32))
    assert np.array_equal(S.view(np.uint32), whole_S.view(np.uint32))

    c = conv_case(split, 67, 4, 40)
    whole = run_conv(c, 0, True, True)
    y = np.zeros_like(c["x"])
    state = c["state"].copy()
    _core.conv_kernel(c["x"], y, rows[:split], c["w"], c["bias"], state, 0, 67, True)
    _core.conv_kernel(c["x"], y, rows[split:], c["w"], c["bias"], state, 0, 67, True)
    assert np.array_equal(y.view(np.uint32), whole[0].view(np.uint32))
    assert np.array_equal(state.view(np.uint32), whole[1].view(np.uint32))


def test_kernel_arguments_are_checked():
    case = gdn_case(0, 8, 2, 3)
    with pytest.raises(ShapeError, match="not one of"):
        _core.gdn_kernel(case["S"], np.array([99], np.int32), case["q"], case["k"], case["v"], case["alpha"],
                         case["beta"], 0.0, -1.0, np.zeros_like(case["v"]))
    with pytest.raises(ShapeError, match="do not agree"):
        _core.gdn_kernel(case["S"], seq_rows(3), case["q"], case["k"][:, :4].copy(), case["v"], case["alpha"],
                         case["beta"], 0.0, -1.0, np.zeros_like(case["v"]))
    m = mamba2_case(0, 3, 8, 3)
    with pytest.raises(ShapeError, match="do not agree"):
        _core.mamba2_kernel(m["S"], seq_rows(3), m["x"], m["B"][:, :3].copy(), m["C"], m["dt"], 0.0, -1.0, 1.0,
                            m["z"], np.zeros_like(m["z"]))
    c = conv_case(0, 8, 4, 3)
    with pytest.raises(ShapeError, match="do not agree"):
        _core.conv_kernel(c["x"], np.zeros_like(c["x"]), seq_rows(3), c["w"], None, c["state"][:5].copy(), 0, 8,
                          True)
