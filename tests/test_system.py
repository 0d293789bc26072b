"""llminfer.system's limits: the thread cap and the memory check the engine
applies when a model is loaded."""

import warnings

import numpy as np
import pytest

import llminfer
from llminfer import _core
from llminfer.errors import InvalidArgumentError, LLMInferError, OutOfMemoryError
from llminfer.gguf_file import GGUFFile
from llminfer.models import build_spec
from llminfer.system import (ThreadCountWarning, available_memory, check_memory, check_threads, cpu_count,
                             default_threads)

from tiny_models import TinyConfig, write_model


def test_thread_counts_kept_or_defaulted():
    assert check_threads(None) == default_threads()
    assert check_threads(1) == 1
    assert check_threads(np.int64(1)) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_threads(cpu_count() if _core.openmp_enabled() else 1) >= 1


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.5, "4", [2]])
def test_thread_counts_refused(bad):
    with pytest.raises(InvalidArgumentError, match=r"n_threads must be a positive integer or None"):
        check_threads(bad)


def test_huge_thread_count_is_capped():
    """n_threads=100000 crashed inside the OpenMP runtime."""
    if not _core.openmp_enabled():
        assert check_threads(100000) == 1
        return
    with pytest.warns(ThreadCountWarning, match=rf"n_threads=100000 is more than the {cpu_count()} CPUs"):
        assert check_threads(100000) == cpu_count()


def test_memory_check():
    avail = available_memory()
    assert avail is None or avail > 0
    check_memory(1 << 20, "a small buffer", available=1 << 30)
    with pytest.raises(OutOfMemoryError, match=r"a KV cache of n_ctx=10000000 needs 2.00 GiB, but only 1.00 GiB"):
        check_memory(2 << 30, "a KV cache of n_ctx=10000000", available=1 << 30)
    assert issubclass(OutOfMemoryError, LLMInferError) and issubclass(OutOfMemoryError, MemoryError)
    with pytest.raises(OutOfMemoryError):  # more than any machine has
        check_memory(1 << 62, "an absurd buffer")


@pytest.mark.parametrize("cfg", [TinyConfig(), TinyConfig(arch="gemma3", sliding_window=32)], ids=["llama", "gemma3"])
@pytest.mark.parametrize("kv_type, kv_bytes", [("f16", 2), ("f32", 4)])
def test_kv_cache_estimate_matches_the_allocation(tmp_path, cfg, kv_type, kv_bytes):
    """What the engine will check against available memory before allocating."""
    p = write_model(tmp_path / "m.gguf", cfg)
    with GGUFFile(p) as g:
        spec = build_spec(g)
    with llminfer.LLM(p, n_ctx=256, n_batch=64, kv_type=kv_type) as llm:
        eng = llm.engine
        assert eng.kv_pool_bytes == sum(llm.kv_cache_bytes())
        per_position = spec.n_head_kv * (spec.head_dim + spec.head_dim_v) * kv_bytes
        assert eng.kv_pool_bytes == sum(eng.n_blocks[_core.layer_kv_group(eng.desc, i)] * eng.block_size * per_position
                                        for i in range(spec.n_layer))


def test_kernels_cap_a_huge_team():
    """ops.* took n_threads as given; 100000 crashed inside OpenMP."""
    from llminfer import ops
    x = np.ones((2, 64), dtype=np.float32)
    w = ops.quantize(np.ones((4, 64), dtype=np.float32), "Q8_0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThreadCountWarning)
        got = ops.matmul(w, "Q8_0", (4, 64), x, n_threads=100000)
    np.testing.assert_allclose(got, np.full((2, 4), 64.0), rtol=1e-2)
    with pytest.raises(InvalidArgumentError):
        ops.matmul(w, "Q8_0", (4, 64), x, n_threads=True)
