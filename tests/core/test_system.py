"""llminfer.core.system's limits: the thread cap and the memory check the engine
applies when a model is loaded."""

import os
import warnings

import numpy as np
import pytest

import llminfer
from llminfer import _core
from llminfer.errors import InvalidArgumentError, LLMInferError, OutOfMemoryError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec
from llminfer.core.system import (ThreadCountWarning, available_memory, check_memory, check_threads, cpu_count,
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
    from llminfer.core import ops
    x = np.ones((2, 64), dtype=np.float32)
    w = ops.quantize(np.ones((4, 64), dtype=np.float32), "Q8_0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThreadCountWarning)
        got = ops.matmul(w, "Q8_0", (4, 64), x, n_threads=100000)
    np.testing.assert_allclose(got, np.full((2, 4), 64.0), rtol=1e-2)
    with pytest.raises(InvalidArgumentError):
        ops.matmul(w, "Q8_0", (4, 64), x, n_threads=True)


def test_prefetch_kind_selected_and_refused():
    """LLMINFER_PREFETCH's kinds: the default follows the CPU's vendor, each
    kind can be selected and read back, an unknown one is refused naming the
    known ones, and system_info reports the kind in use."""
    from llminfer.core import system
    before = system.current_prefetch()
    assert set(system.STREAM_HINTS) == {"l1_nta", "l2"}
    try:
        for kind in system.STREAM_HINTS:
            system.select_prefetch(f" {kind.upper()} ")
            assert system.current_prefetch() == kind == system.system_info()["prefetch"]
        with pytest.raises(InvalidArgumentError, match="l1_nta, l2"):
            system.select_prefetch("nta")
        assert system.current_prefetch() == system.STREAM_HINTS[-1]  # a refused kind changes nothing
    finally:
        system.select_prefetch(before)
    vendor = ""
    try:
        with open("/proc/cpuinfo") as f:
            vendor = next((line.split(":")[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        pass
    if vendor in ("AuthenticAMD", "GenuineIntel"):
        want = "l1_nta" if vendor == "AuthenticAMD" else "l2"
        assert system.system_info()["prefetch_default"] == want


def test_prefetch_environment_variable(tmp_path):
    """LLMINFER_PREFETCH at import selects the kind; a bad value fails the
    import with the error naming it."""
    import subprocess
    import sys
    code = "from llminfer import system; print(system.current_prefetch())"
    for kind in ("l1_nta", "l2"):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LLMINFER_PREFETCH": kind},
                             capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0 and out.stdout.strip() == kind, out.stderr
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LLMINFER_PREFETCH": "l3"},
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "unknown prefetch kind 'l3'" in bad.stderr
