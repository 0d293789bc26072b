"""Shared pieces of the kernel tests: the types, random weights of each type,
and a fixture that runs a test under every kernel level this machine has."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from llminfer import ops, system

FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
QUANT_32 = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)       # blocks of 32
QUANT_K = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)        # super-blocks of 256
QUANT_TYPES = QUANT_32 + QUANT_K
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES
OUR_K_QUANTIZERS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)

# byte offsets of the f16 scale fields (d, and m / dmin) inside each block
F16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
}


def random_blocks(rng, t, rows, k, scale=0.02):
    """Random bytes in t's layout with finite f16 scales: every bit pattern of
    the quantized fields, including the ones our quantizer never makes."""
    bs, ts = ops.block_sizes(t)
    nb = rows * k // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = (rng.standard_normal(nb) * scale).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
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
