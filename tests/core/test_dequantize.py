"""Dequantization equals gguf's numpy code bit for bit, for every type and
every kernel level: on random bytes (every bit pattern of the quantized
fields, finite f16 scales) and on data our quantizer made."""

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kernel_cases import (ALL_TYPES, FLOAT_TYPES, QUANT_TYPES, at_level, isa, random_blocks,
                          type_id)
from llminfer.core import ops, system
from llminfer.errors import InvalidArgumentError, ShapeError, UnsupportedTypeError

__all__ = ["isa"]


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def k_cases(t):
    bs = ops.block_sizes(t)[0]
    return (bs, 3 * bs, 4096) if bs > 1 else (1, 7, 100)


@pytest.mark.parametrize("t", QUANT_TYPES, ids=type_id)
def test_random_blocks_match_gguf(isa, t):
    rng = np.random.default_rng(int(t))
    for rows in (1, 5):
        for k in k_cases(t):
            w = random_blocks(rng, t, rows, k)
            got = ops.dequantize(w, t, (rows, k))
            want = gguf.quants.dequantize(w, t)
            assert same_bits(got, want), f"{t.name} rows={rows} k={k} at {isa}"


@pytest.mark.parametrize("t", ALL_TYPES, ids=type_id)
def test_quantized_data_matches_gguf(isa, t):
    rng = np.random.default_rng(100 + int(t))
    bs = ops.block_sizes(t)[0]
    x = rng.standard_normal((3, 8 * max(bs, 32))).astype(np.float32)
    if t not in ops.QUANTIZABLE_TYPES:  # no quantizer of ours: random blocks stand in
        w = random_blocks(rng, t, 3, x.shape[1])
    else:
        w = ops.quantize(x, t)
    got = ops.dequantize(w, t, x.shape)
    want = gguf.quants.dequantize(w, t).reshape(x.shape).astype(np.float32)
    assert same_bits(got, want), f"{t.name} at {isa}"


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=type_id)
def test_float_types_exact(isa, t):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 37)) * 100).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1e-30, 65504.0]
    got = ops.dequantize(ops.quantize(x, t), t, x.shape)
    if t == Q.F32:
        want = x
    elif t == Q.F16:
        want = x.astype(np.float16).astype(np.float32)
    else:
        want = gguf.quants.dequantize(gguf.quants.quantize(x, t), t).astype(np.float32)
    assert same_bits(got, want)


@pytest.mark.parametrize("t", QUANT_TYPES + FLOAT_TYPES[1:], ids=type_id)
def test_levels_agree_on_dequantize(t):
    rng = np.random.default_rng(3)
    k = 4 * ops.block_sizes(t)[0] if t not in FLOAT_TYPES else 203
    w = random_blocks(rng, t, 6, k) if t in QUANT_TYPES else \
        ops.quantize(rng.standard_normal((6, k)).astype(np.float32), t)
    ref = at_level("scalar", ops.dequantize, w, t, (6, k))
    for level in system.available_isas():
        assert same_bits(at_level(level, ops.dequantize, w, t, (6, k)), ref), level


def test_shape_keeps_leading_dims():
    rng = np.random.default_rng(0)
    w = random_blocks(rng, Q.Q4_K, 6, 256)
    got = ops.dequantize(w, "Q4_K", (2, 3, 256))
    assert got.shape == (2, 3, 256)
    assert same_bits(got.reshape(6, 256), gguf.quants.dequantize(w, Q.Q4_K))


def test_wrong_byte_length():
    w = np.zeros(18 * 4 + 1, dtype=np.uint8)
    with pytest.raises(ShapeError, match="takes 72 bytes, got 73"):
        ops.dequantize(w, "Q4_0", (1, 128))


def test_k_not_a_block_multiple():
    with pytest.raises(ShapeError, match="not a multiple of the Q4_K block size 256"):
        ops.dequantize(np.zeros(144, dtype=np.uint8), "Q4_K", (1, 200))


def test_unsupported_and_unknown_types():
    with pytest.raises(UnsupportedTypeError, match="NVFP4"):
        ops.dequantize(np.zeros(36, dtype=np.uint8), Q.NVFP4, (1, 64))
    with pytest.raises(UnsupportedTypeError, match="unknown tensor type"):
        ops.dequantize(np.zeros(18, dtype=np.uint8), "Q4_9", (1, 32))


def test_wrong_dtype_and_layout():
    with pytest.raises(InvalidArgumentError, match="dtype uint8"):
        ops.dequantize(np.zeros(9, dtype=np.int16), "Q4_0", (1, 32))
    w = np.zeros((2, 36), dtype=np.uint8)[:, ::2]
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        ops.dequantize(w, "Q4_0", (2, 32))
    with pytest.raises(InvalidArgumentError, match="numpy array"):
        ops.dequantize(b"\0" * 18, "Q4_0", (1, 32))


@pytest.mark.filterwarnings("ignore:overflow encountered")  # e = 255 times 12 is inf, in gguf as here
def test_mxfp4_every_exponent_matches_gguf():
    """E8M0 scales over their whole range: subnormal (e < 2), normal, 2^127."""
    rng = np.random.default_rng(11)
    b = rng.integers(0, 256, size=(256, 17), dtype=np.uint8)
    b[:, 0] = np.arange(256)
    for level in system.available_isas():
        got = at_level(level, ops.dequantize, b.reshape(-1), Q.MXFP4, (256, 32))
        want = gguf.quants.dequantize(b, Q.MXFP4).reshape(256, 32)
        assert same_bits(got, want), level
