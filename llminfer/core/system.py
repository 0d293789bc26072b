"""What the machine offers and what llminfer chose: CPU features, the kernel
level (instruction set) in use, OpenMP, threads, memory.

check_threads() and check_memory() are the limits the engine applies when a
model is loaded: a thread team larger than the CPUs (n_threads=100000 used to
crash inside the OpenMP runtime) is capped with a warning, and a KV cache
larger than the memory available (n_ctx=10**7 reserves hundreds of GB, and
the OS kills the process only when the pages are touched) is refused.

The level is chosen at import from what the CPU reports. LLMINFER_ISA
(scalar, avx2, avx512, neon, neon_dot) forces a level no better than the best one
available, so tests can run every kernel path on one machine.

Decode's kernels hint the weights they stream into a cache a few KiB ahead
of their loads: into L1 as the first line to go on AMD's cores ("l1_nta"),
into L2 elsewhere ("l2"). LLMINFER_PREFETCH forces one of the two; a hint
never changes a result, only the pace.

Those choices are a context's (Tuning): an Engine takes the process's
prefetch kind when it is created (select_prefetch sets the kind for engines
created afterwards), and Engine(tuning=Tuning(...)) or engine.tuning = ...
overrides it and the placement of a 2-thread decode team for that engine
alone.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass

import numpy as np

from llminfer import _core
from llminfer.errors import InvalidArgumentError, OutOfMemoryError, UnsupportedISAError


class ThreadCountWarning(UserWarning):
    """More threads were asked for than this process has CPUs; capped."""

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


STREAM_HINTS = tuple(_core.stream_hint_name(i) for i in range(_core.stream_hint_count()))


# where a 2-thread decode team runs (llminfer.h's enum li_placement): "probe"
# times the team's barrier every few passes to tell one core's two
# hyperthreads ("near") from two cores ("apart"); the other two fix it
PLACEMENTS = ("probe", "near", "apart")
assert len(PLACEMENTS) == _core.placement_count()


def _prefetch_index(name) -> int:
    key = str(name).strip().lower()
    if key not in STREAM_HINTS:
        raise InvalidArgumentError(f"unknown prefetch kind {name!r}; known kinds: {', '.join(STREAM_HINTS)}")
    return STREAM_HINTS.index(key)


def select_prefetch(name):
    """Hint decode's weight stream `name` ("l1_nta" or "l2") in the engines
    created from now on (Tuning overrides it per engine); the results are the
    same either way."""
    _core.stream_hint_select(_prefetch_index(name))


@dataclass(frozen=True)
class Tuning:
    """An engine's host tuning, choices that change no result: `prefetch`,
    where decode's kernels hint the weights ("l1_nta" or "l2"; None: the
    process's kind, current_prefetch()); `placement` of a 2-thread decode
    team ("probe", "near" or "apart")."""
    prefetch: str | None = None
    placement: str = "probe"

    def indices(self) -> tuple[int, int]:
        """(stream hint, placement) as the C core numbers them; raises
        InvalidArgumentError naming a kind that is not one."""
        hint = _core.stream_hint_current() if self.prefetch is None else _prefetch_index(self.prefetch)
        key = str(self.placement).strip().lower()
        if key not in PLACEMENTS:
            raise InvalidArgumentError(f"unknown placement {self.placement!r}; known: {', '.join(PLACEMENTS)}")
        return hint, PLACEMENTS.index(key)

    @classmethod
    def of(cls, value) -> "Tuning":
        """A Tuning from None, a Tuning or a dict of its fields."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"prefetch", "placement"}
            if unknown:
                raise InvalidArgumentError(f"unknown tuning fields {sorted(unknown)}; known: prefetch, placement")
            return cls(**value)
        raise InvalidArgumentError(f"tuning must be a Tuning, a dict or None, not {type(value).__name__}")


def current_prefetch():
    return STREAM_HINTS[_core.stream_hint_current()]


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


def cpu_count() -> int:
    """Logical CPUs this process may run on (its affinity mask where the OS
    has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def check_threads(n_threads, name: str = "n_threads", limit: int | None = None) -> int:
    """The thread count to use for a requested `n_threads`: None gives
    default_threads(); a positive integer is kept, capped at `limit` (default
    cpu_count()) with a ThreadCountWarning (more threads than CPUs only slows
    the kernels, and a huge OpenMP team crashes the runtime). Anything else,
    bool included, raises InvalidArgumentError."""
    if n_threads is None:
        return default_threads()
    if not isinstance(n_threads, (int, np.integer)) or isinstance(n_threads, (bool, np.bool_)) or n_threads <= 0:
        raise InvalidArgumentError(f"{name} must be a positive integer or None, got {n_threads!r}")
    n = int(n_threads)
    if not _core.openmp_enabled():
        return 1
    cap = cpu_count() if limit is None else max(1, int(limit))
    if n > cap:
        warnings.warn(f"{name}={n} is more than the {cap} {'CPUs this process can use' if limit is None else 'allowed'}"
                      f"; using {cap}", ThreadCountWarning, stacklevel=2)
        return cap
    return n


def available_memory():
    """Bytes of memory a new allocation can have without swapping, or None
    when the OS does not say: MemAvailable on Linux (and the cgroup's
    limit when lower), the physical memory elsewhere."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    try:  # a container's own limit (cgroup v2)
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            room = max(0, int(limit) - used)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    if avail is None and sys.platform == "win32":
        avail = _windows_available()
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            pass
    return avail


def _windows_available():
    import ctypes

    class MemoryStatus(ctypes.Structure):
        _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                    ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                    ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                    ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                    ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

    st = MemoryStatus()
    st.dwLength = ctypes.sizeof(st)
    if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st)):
        return int(st.ullAvailPhys)
    return None


def check_memory(nbytes: int, what: str, available=None) -> None:
    """Raise OutOfMemoryError if `nbytes` is more than the memory available
    (available_memory(), or `available` when given). `what` names the
    allocation and how to make it smaller ("a KV cache of n_ctx=... ")."""
    avail = available_memory() if available is None else available
    if avail is not None and nbytes > avail:
        raise OutOfMemoryError(f"{what} needs {nbytes / 2**30:.2f} GiB, but only {avail / 2**30:.2f} GiB "
                               f"of memory is available")


def system_info():
    """A dict describing the CPU features seen, the kernel level chosen (and
    the others available), whether OpenMP is compiled in, and the default
    thread count; "gpu": the GPU backend built in, if any, and its devices
    (llminfer.core.gpu.info())."""
    from llminfer.core import gpu

    return {
        "gpu": gpu.info(),
        "cpu_features": _core.cpu_features(),
        "isa": current_isa(),
        "isa_best": ISA_NAMES[_core.isa_best()],
        "isa_available": available_isas(),
        "prefetch": current_prefetch(),
        "prefetch_default": STREAM_HINTS[_core.stream_hint_default()],
        "openmp": _core.openmp_enabled(),
        "n_threads": default_threads(),
    }


def _apply_environment():
    forced = os.environ.get("LLMINFER_ISA", "").strip()
    if forced:
        select_isa(forced)
    hint = os.environ.get("LLMINFER_PREFETCH", "").strip()
    if hint:
        select_prefetch(hint)


_apply_environment()
