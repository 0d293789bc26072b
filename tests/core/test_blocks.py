"""Block layouts: our C block sizes are gguf's, for every supported type."""

import gguf
import pytest
from gguf import GGMLQuantizationType as Q

from kernel_cases import ALL_TYPES, type_id
from llminfer.core import ops
from llminfer.errors import UnsupportedTypeError


@pytest.mark.parametrize("t", ALL_TYPES, ids=type_id)
def test_block_sizes_match_gguf(t):
    assert ops.block_sizes(t) == gguf.GGML_QUANT_SIZES[t]
    assert ops.block_sizes(t.name) == ops.block_sizes(int(t))


def test_supported_types_are_exactly_these():
    assert set(ops.SUPPORTED_TYPES) == set(ALL_TYPES)


@pytest.mark.parametrize("t", [Q.Q8_1, Q.NVFP4, Q.I8])
def test_unsupported_type_names_itself(t):
    with pytest.raises(UnsupportedTypeError, match=t.name):
        ops.block_sizes(t)


@pytest.mark.parametrize("bad", ["Q9_9", 99, -1, None])
def test_unknown_type(bad):
    with pytest.raises(UnsupportedTypeError, match="unknown tensor type"):
        ops.block_sizes(bad)
