"""The GPU kernels' block arithmetic (csrc/cuda/quant_units.h), checked on the
host so that a machine without a GPU still tests it: unpacking every weight
type the GPU runs into units of 32 against gguf's numpy dequantizers, the
8-bit activation quantization against a numpy statement of the same rule,
and the integer unit dot product against the float product of the two.

tests/cuda_host/unit_check.c drives the header; it is built here with the C
compiler (where the header's functions are plain static inline) and, when
nvcc is installed, with nvcc as CUDA C++ (where they are __host__ __device__,
as the kernels include them)."""

import shutil
import subprocess
import sysconfig
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kernel_cases import random_blocks, type_id

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "tests" / "cuda_host" / "unit_check.c"
GPU_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]

pytestmark = pytest.mark.skipif(not SRC.exists() or not (ROOT / "csrc" / "cuda").exists(),
                                reason="run from a source checkout (csrc/ is not installed)")


def _c_compiler():
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="session", params=["cc", "nvcc"])
def unit_check(request, tmp_path_factory):
    """The path of unit_check built by the C compiler or by nvcc."""
    out = tmp_path_factory.mktemp(f"unit_check_{request.param}") / "unit_check"
    if request.param == "cc":
        cc = _c_compiler()
        if cc is None:
            pytest.skip("no C compiler")
        cmd = [cc, "-O2", "-std=c11", "-Wall", "-Werror", f"-I{ROOT / 'csrc'}", str(SRC), "-o", str(out), "-lm"]
    else:
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            pytest.skip("nvcc is not installed (the CUDA toolkit checks the __host__ __device__ build)")
        cmd = [nvcc, "-x", "cu", "-O2", f"-I{ROOT / 'csrc'}", str(SRC), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def run(tool, *args):
    r = subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def q8_1_reference(x):
    """act_q8_1 of blocks.h per 32 values, in numpy: d = amax/127 and s =
    d*sum(q) at f16 precision, q = x*127/amax rounded half to even."""
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv[:, None]).astype(np.int8)
    s = (d * q.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return d.astype(np.float16).astype(np.float32), s, q


@pytest.mark.parametrize("t", GPU_TYPES, ids=type_id)
def test_unpacked_units_match_gguf(unit_check, tmp_path, t):
    rng = np.random.default_rng(100 + int(t))
    k = 1024
    w = random_blocks(rng, t, 3, k)
    (tmp_path / "w").write_bytes(w.tobytes())
    run(unit_check, "unpack", int(t), tmp_path / "w", tmp_path / "out")
    got = np.fromfile(tmp_path / "out", dtype=np.float32).reshape(3, k)
    want = gguf.quants.dequantize(w, t).reshape(3, k).astype(np.float32)
    # the same products, perhaps grouped differently (d*sc*q as (d*sc)*q): a few ulps
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_activation_quantization_matches_rule(unit_check, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(32 * 40).astype(np.float32) * rng.choice([1e-3, 1.0, 50.0], 32 * 40).astype(np.float32)
    x[:32] = 0.0                  # an all-zero unit: d = 0, q = 0
    x[32:64] = np.arange(32) - 16  # exact ties of x*127/amax are rounded to even
    (tmp_path / "x").write_bytes(x.tobytes())
    run(unit_check, "quant", tmp_path / "x", tmp_path / "q")
    raw = np.fromfile(tmp_path / "q", dtype=np.uint8).reshape(-1, 40)
    d = raw[:, 0:4].copy().view(np.float32).ravel()
    s = raw[:, 4:8].copy().view(np.float32).ravel()
    q = raw[:, 8:40].copy().view(np.int8)
    d_ref, s_ref, q_ref = q8_1_reference(x)
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(d, d_ref)
    np.testing.assert_array_equal(s, s_ref)
    # and it is a quantization: every value within half a step (f16 rounding of d aside)
    err = np.abs(q.astype(np.float32) * d[:, None] - x.reshape(-1, 32))
    assert np.all(err <= 0.5 * d[:, None] * 1.002 + np.abs(x.reshape(-1, 32)) * 1e-3)


@pytest.mark.parametrize("t", GPU_TYPES, ids=type_id)
def test_unit_dot_matches_float_product(unit_check, tmp_path, t):
    """A row's integer dot product equals the float product of the dequantized
    weights and the activations. The activations are integers with 127 in
    every unit, so their quantization is exact (d = 1, q = x, s = sum(q)
    below 2048, exact in f16) and only the order of the sums differs."""
    rng = np.random.default_rng(200 + int(t))
    rows, k = 7, 512
    w = random_blocks(rng, t, rows, k)
    x = rng.integers(-60, 61, size=k).astype(np.float32)
    x[::32] = 127.0
    (tmp_path / "w").write_bytes(w.tobytes())
    (tmp_path / "x").write_bytes(x.tobytes())
    run(unit_check, "dot", int(t), k, tmp_path / "w", tmp_path / "x", tmp_path / "y")
    got = np.fromfile(tmp_path / "y", dtype=np.float32)
    wf = gguf.quants.dequantize(w, t).reshape(rows, k).astype(np.float64)
    want = wf @ x.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (np.abs(wf) @ np.abs(x)).max())


@pytest.mark.parametrize("compiler", ["nvcc", "hipcc"])
def test_gpu_backend_compiles(compiler, tmp_path):
    """csrc/cuda/backend.cu compiles with nvcc and, through gpu_compat.h, with
    hipcc (for an AMD target), without warnings from hipcc's clang."""
    exe = shutil.which(compiler)
    if exe is None:
        pytest.skip(f"{compiler} is not installed")
    src = ROOT / "csrc" / "cuda" / "backend.cu"
    env = None
    if compiler == "nvcc":
        cmd = [exe, "-std=c++17", "-O1", "-arch=sm_75", "-Xcompiler", "-fPIC", f"-I{ROOT / 'csrc'}", "-c", str(src),
               "-o", str(tmp_path / "b.o")]
    else:
        import os

        env = dict(os.environ, HIP_PLATFORM="amd")
        cmd = [exe, "-x", "hip", "-fPIC", "-DLLMINFER_HIP", "--offload-arch=gfx90a", "-O1", "-std=c++17",
               "-Werror", f"-I{ROOT / 'csrc'}", "-c", str(src), "-o", str(tmp_path / "b.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (tmp_path / "b.o").stat().st_size > 0
