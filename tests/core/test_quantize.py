"""Quantization: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are gguf's bit for bit; our
own Q4_K / Q5_K / Q6_K and IQ4_NL / IQ4_XS quantizers make blocks gguf reads
back to our values, with less error than the simpler type of about the same
size."""

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kernel_cases import GGUF_QUANTIZERS, OUR_IQ_QUANTIZERS, OUR_K_QUANTIZERS, type_id
from llminfer.core import ops
from llminfer.errors import InvalidArgumentError, ShapeError, UnsupportedTypeError


def cases(rng, k):
    """Rows that stress the quantizers: Gaussian, outliers, constant, zero, ties, tiny."""
    g = rng.standard_normal(k).astype(np.float32)
    out = g.copy()
    out[::37] *= 40
    ties = (np.round(rng.standard_normal(k) * 4) / 2).astype(np.float32)
    return np.stack([g, out, np.full(k, 0.5, np.float32), np.zeros(k, np.float32), ties,
                     g * np.float32(1e-6), -np.abs(g), g * 3000]).astype(np.float32)


@pytest.mark.parametrize("t", GGUF_QUANTIZERS, ids=type_id)
def test_matches_gguf_bit_for_bit(t):
    rng = np.random.default_rng(int(t))
    x = cases(rng, 256)
    got = ops.quantize(x, t)
    want = gguf.quants.quantize(x, t)
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("t", [Q.F16, Q.BF16, Q.F32], ids=type_id)
def test_float_types_match_numpy(t):
    rng = np.random.default_rng(1)
    x = cases(rng, 64)
    got = ops.quantize(x, t)
    if t == Q.F32:
        want = x.view(np.uint8)
    elif t == Q.F16:
        want = x.astype(np.float16).view(np.uint8)
    else:
        want = gguf.quants.quantize(x, t).view(np.uint8)
    assert np.array_equal(got.reshape(-1), want.reshape(-1))


def rmse(t, x):
    y = ops.dequantize(ops.quantize(x, t), t, x.shape)
    return float(np.sqrt(np.mean((y.astype(np.float64) - x) ** 2)))


@pytest.mark.parametrize("t", OUR_K_QUANTIZERS + OUR_IQ_QUANTIZERS, ids=type_id)
def test_k_quants_read_back_by_gguf(t):
    rng = np.random.default_rng(int(t))
    x = cases(rng, 512)
    w = ops.quantize(x, t)
    ours = ops.dequantize(w, t, x.shape)
    theirs = gguf.quants.dequantize(w, t).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert np.all(np.isfinite(ours))
    assert np.array_equal(ours[3], np.zeros(512, np.float32)), "a zero row stays zero"


# each K-quant against the smaller-or-equal 32-block type it must beat
RMSE_BASELINE = {Q.Q4_K: Q.Q4_0, Q.Q5_K: Q.Q5_0, Q.Q6_K: Q.Q5_1, Q.IQ4_NL: Q.Q4_0, Q.IQ4_XS: Q.Q4_0}


@pytest.mark.parametrize("t", OUR_K_QUANTIZERS + OUR_IQ_QUANTIZERS, ids=type_id)
def test_k_quant_error_below_baseline(t):
    x = np.random.default_rng(5).standard_normal((64, 1024)).astype(np.float32)
    ours, base = rmse(t, x), rmse(RMSE_BASELINE[t], x)
    msg = f"RMSE on N(0,1): {t.name} {ours:.5f}, {RMSE_BASELINE[t].name} {base:.5f}"
    assert ours < base, msg


def test_shapes():
    x = np.ones((2, 3, 64), np.float32)
    assert ops.quantize(x, "Q8_0").shape == (2, 3, 2 * 34)
    assert ops.quantize(np.ones((0, 64), np.float32), "Q8_0").shape == (0, 68)


def test_errors():
    x = np.ones((2, 64), np.float32)
    with pytest.raises(UnsupportedTypeError, match="cannot quantize to Q2_K"):
        ops.quantize(x, "Q2_K")
    with pytest.raises(UnsupportedTypeError, match="IQ2_XXS"):
        ops.quantize(np.ones((1, 256), np.float32), Q.IQ2_XXS)
    with pytest.raises(ShapeError, match="row length 64 is not a multiple of the Q4_K block size 256"):
        ops.quantize(x, "Q4_K")
    with pytest.raises(InvalidArgumentError, match="dtype float32"):
        ops.quantize(x.astype(np.float64), "Q8_0")
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        ops.quantize(np.ones((64, 2), np.float32).T, "Q8_0")
    with pytest.raises(ShapeError, match="at least one dimension"):
        ops.quantize(np.array(1.0, dtype=np.float32), "Q8_0")


@pytest.mark.parametrize("t", OUR_IQ_QUANTIZERS, ids=type_id)
def test_iq4_scale_search_beats_absmax_scale(t):
    """The searched block scale against the plain one (largest value onto the
    table's end -127, nearest levels): lower error on heavy-tailed rows."""
    x = np.random.default_rng(8).standard_t(4, (32, 1024)).astype(np.float32)
    kv = np.array(gguf.quants.IQ4_NL.kvalues, np.float32)
    b = x.reshape(-1, 32)
    mx = b[np.arange(len(b)), np.abs(b).argmax(axis=1)]
    d = (mx / kv[0]).astype(np.float16).astype(np.float32)[:, None]
    naive = kv[np.abs(b[:, :, None] / d[:, :, None] - kv).argmin(axis=2)] * d
    naive_rmse = float(np.sqrt(np.mean((naive - b) ** 2)))
    assert rmse(t, x) < naive_rmse
