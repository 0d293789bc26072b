"""GPU offload: whether this install has a GPU backend (llminfer._cuda or
llminfer._hip, built with LLMINFER_CUDA=1 or LLMINFER_HIP=1, or installed as
the llminfer-cu12 wheel), which devices it sees, and which layers
n_gpu_layers puts on it.

n_gpu_layers, as llama-cpp-python users know it: 0 (the default) runs
everything on the CPU, exactly as a CPU-only build does; N > 0 runs the first
N layers on the GPU and the rest on the CPU; -1 (or any N >= the model's
layer count) runs every layer and the output head on the GPU. Asking for a
GPU that cannot be used raises GPUUnavailableError naming why: no GPU backend
built, no driver, or no device. LLMINFER_NO_GPU=1 hides the backend (as if
it were not built), for tests and for comparing against the CPU.
"""

from __future__ import annotations

import importlib
import os

from llminfer.errors import GPUUnavailableError, InvalidArgumentError

MODULES = ("_cuda", "_hip")
_NOT_BUILT = ("llminfer was built without a GPU backend: install llminfer-cu12 (NVIDIA), or rebuild from "
              "source with LLMINFER_CUDA=1 pip install . (or LLMINFER_HIP=1 for AMD ROCm)")
_module = None
_why = None


def _load():
    """(the GPU module, None) or (None, why it is not there)."""
    global _module, _why
    if _module is not None or _why is not None:
        return _module, _why
    if os.environ.get("LLMINFER_NO_GPU", "") not in ("", "0"):
        return None, "the GPU backend is disabled by LLMINFER_NO_GPU"
    reasons = []
    for name in MODULES:
        try:
            _module = importlib.import_module(f"llminfer.{name}")
            return _module, None
        except ModuleNotFoundError:
            continue
        except ImportError as e:  # built, but its runtime library is missing (libamdhip64 for HIP)
            reasons.append(f"llminfer.{name} cannot be loaded: {e}")
    _why = "; ".join(reasons) or _NOT_BUILT
    return None, _why


def info() -> dict:
    """What system_info() reports: the backend built in ("cuda", "hip" or
    None), whether it can run, why not, and the devices it sees."""
    mod, why = _load()
    if mod is None:
        return {"backend": None, "available": False, "reason": why, "devices": []}
    code, message, count = mod.probe()
    devices = [{"index": i, "name": name, "memory_bytes": mem, "compute_capability": f"{cc[0]}.{cc[1]}"}
               for i, (name, mem, cc) in enumerate(mod.devices())] if code == 0 else []
    return {"backend": mod.NAME, "available": code == 0 and count > 0, "reason": None if code == 0 else message,
            "runtime_version": mod.runtime_version(), "devices": devices}


def plan(n_gpu_layers, n_layer: int) -> tuple[int, bool]:
    """(layers on the GPU, whether the output head is too) for n_gpu_layers."""
    if isinstance(n_gpu_layers, bool) or not hasattr(n_gpu_layers, "__index__"):
        raise InvalidArgumentError(f"n_gpu_layers must be an integer (-1 for all), got {n_gpu_layers!r}")
    n = int(n_gpu_layers.__index__())
    if n < -1:
        raise InvalidArgumentError(f"n_gpu_layers must be -1 (all layers) or at least 0, got {n}")
    if n == 0:
        return 0, False
    if n == -1 or n >= n_layer:
        return n_layer, True
    return n, False


def backend(device: int = 0):
    """The backend's function table (a capsule for llminfer._core.Context), or
    GPUUnavailableError saying why there is none."""
    mod, why = _load()
    if mod is None:
        raise GPUUnavailableError(f"n_gpu_layers > 0 needs a GPU: {why}")
    code, message, count = mod.probe()
    if code != 0:
        raise GPUUnavailableError(f"n_gpu_layers > 0 needs a GPU: {message}")
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
        raise InvalidArgumentError(f"main_gpu must be a device index in [0, {count}), got {device!r}")
    return mod.backend()
