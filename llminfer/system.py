"""What the machine offers and what llminfer chose: CPU features, the kernel
level (instruction set) in use, OpenMP, threads.

The level is chosen at import from what the CPU reports. LLMINFER_ISA
(scalar, avx2, avx512, neon, neon_dot) forces a level no better than the best one
available, so tests can run every kernel path on one machine.
"""

import os

from llminfer import _core
from llminfer.errors import UnsupportedISAError

ISA_NAMES = tuple(_core.isa_name(i) for i in range(_core.isa_count()))


def available_isas():
    """Names of the kernel levels this CPU and this build can run, best last."""
    return [ISA_NAMES[i] for i in range(len(ISA_NAMES)) if _core.isa_available(i)]


def select_isa(name):
    """Use kernel level `name` for every later call (not while others compute)."""
    key = str(name).strip().lower()
    if key not in ISA_NAMES:
        raise UnsupportedISAError(
            f"unknown kernel level {name!r}; known levels: {', '.join(ISA_NAMES)}")
    isa = ISA_NAMES.index(key)
    if not _core.isa_available(isa):
        raise UnsupportedISAError(
            f"kernel level {key!r} is not available on this CPU or build; "
            f"available: {', '.join(available_isas())}")
    _core.isa_select(isa)


def current_isa():
    return ISA_NAMES[_core.isa_current()]


def _physical_cores():
    """Physical cores this process may run on (hyperthread siblings counted once)."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # macOS, Windows: no affinity API, no sysfs
        return os.cpu_count() or 1
    cores = set()
    for cpu in allowed:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            return max(1, len(allowed))
    return max(1, len(cores))


def default_threads():
    """The thread count used when none is given: the physical cores, capped by
    OMP_NUM_THREADS when that is set; 1 without OpenMP."""
    if not _core.openmp_enabled():
        return 1
    n = _physical_cores()
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        n = min(n, int(env))
    return n


def system_info():
    """A dict describing the CPU features seen, the kernel level chosen (and
    the others available), whether OpenMP is compiled in, and the default
    thread count."""
    return {
        "cpu_features": _core.cpu_features(),
        "isa": current_isa(),
        "isa_best": ISA_NAMES[_core.isa_best()],
        "isa_available": available_isas(),
        "openmp": _core.openmp_enabled(),
        "n_threads": default_threads(),
    }


def _apply_environment():
    forced = os.environ.get("LLMINFER_ISA", "").strip()
    if forced:
        select_isa(forced)


_apply_environment()
