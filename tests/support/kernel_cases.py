"""Shared pieces of the kernel tests: the types, random weights of each type,
and a fixture that runs a test under every kernel level this machine has."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from llminfer.core import ops, system

FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
QUANT_32 = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,       # blocks of 32
            Q.IQ4_NL, Q.MXFP4)
QUANT_K = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,        # super-blocks of 256
           Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
           Q.IQ1_S, Q.IQ1_M)
QUANT_TYPES = QUANT_32 + QUANT_K
# the types whose activations are quantized in blocks of 32 (Q8_0 / Q8_1); the rest take 256 (Q8_K)
ACT_32_TYPES = QUANT_32
# the i-quants, ternary types and MXFP4 (scalar_iq.c)
IQ_TYPES = (Q.IQ4_NL, Q.MXFP4, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S,
            Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M)
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES
GGUF_QUANTIZERS = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)  # ours equal gguf.quants.quantize
OUR_K_QUANTIZERS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
OUR_IQ_QUANTIZERS = (Q.IQ4_NL, Q.IQ4_XS)   # quantize_iq.c, our own scale search

# byte offsets of the f16 scale fields (d, and m / dmin) inside each block
F16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    Q.IQ4_NL: (0,), Q.IQ4_XS: (0,), Q.MXFP4: (), Q.TQ1_0: (52,), Q.TQ2_0: (64,),
    Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,), Q.IQ3_S: (0,), Q.IQ1_S: (0,),
    Q.IQ1_M: (),
}
MXFP4_E_RANGE = (110, 136)  # E8M0 exponents of random MXFP4 blocks: scales 2^-18 .. 2^7


def random_blocks(rng, t, rows, k, scale=0.02):
    """Random bytes in t's layout with finite f16 scales: every bit pattern of
    the quantized fields, including the ones our quantizer never makes."""
    bs, ts = ops.block_sizes(t)
    nb = rows * k // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = (rng.standard_normal(nb) * scale).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    if t == Q.MXFP4:
        b[:, 0] = rng.integers(*MXFP4_E_RANGE, size=nb)
    if t == Q.IQ1_M:  # the f16 d lives in the top nibbles of the four scale words (bytes 48-55)
        d = (rng.standard_normal(nb) * scale).astype(np.float16).view(np.uint16).astype(np.uint16)
        words = b[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        b[:, 48:56] = words.view(np.uint8)
    return b.reshape(rows, k // bs * ts)


def float_weight(rng, t, rows, k):
    """A float matrix stored as t (F32, F16 or BF16), as uint8 bytes."""
    return ops.quantize(rng.standard_normal((rows, k)).astype(np.float32), t)


def random_weight(rng, t, rows, k):
    return float_weight(rng, t, rows, k) if t in FLOAT_TYPES else random_blocks(rng, t, rows, k)


def type_id(t):
    return t.name


@pytest.fixture(params=system.available_isas())
def isa(request):
    """Runs the test under one kernel level, then restores the level in use."""
    before = system.current_isa()
    system.select_isa(request.param)
    yield request.param
    system.select_isa(before)


def at_level(name, fn, *args, **kwargs):
    """fn(*args) computed under kernel level `name`, the current level restored after."""
    before = system.current_isa()
    system.select_isa(name)
    try:
        return fn(*args, **kwargs)
    finally:
        system.select_isa(before)


# ---- how far a quantized product may be from float64 ----

Q8_HALF_STEP = 1 / 254   # largest rounding error of an int8 activation, relative to its block's absmax


SIGMAS = 6.0             # allowed error, in standard deviations of the summed rounding errors


FLOAT_REL = 1e-6         # float32 summation error, relative to sum |w_i x_i|


def act_block(t):
    """Elements per activation block: 32 for Q4_0..Q8_0, IQ4_NL, MXFP4; 256 for the
    K-quants, IQ4_XS and the other i-quants; None for floats."""
    if t in FLOAT_TYPES:
        return None
    return 32 if t in ACT_32_TYPES else 256


def tolerance(t, w, x):
    """Per-output bound on |ours - float64| for weights w (rows, k), activations x (n, k)."""
    w, x = w.astype(np.float64), x.astype(np.float64)
    scale = np.abs(x) @ np.abs(w).T
    bs = act_block(t)
    if bs is None:
        return FLOAT_REL * scale + 1e-30
    n, k = x.shape
    h = np.repeat(np.abs(x).reshape(n, k // bs, bs).max(axis=2), bs, axis=1) * Q8_HALF_STEP
    sigma = np.sqrt((h ** 2) @ (w ** 2).T / 3)
    return SIGMAS * sigma + FLOAT_REL * scale + 1e-30
