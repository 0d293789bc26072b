"""Reading GGUF files: metadata and tensor directory from the header, tensor
data as read-only views of a numpy memory map. Nothing is copied or
dequantized: the operating system pages weights in as they are touched.

gguf's own GGUFReader builds an object per metadata item and takes seconds
on a 262k-token vocabulary; this reader walks the header once with bounds
checks at every step, so a truncated or corrupt file raises GGUFError naming
what is wrong and where, never reads past the end, and a model opens in
milliseconds. Constants (value types, tensor types) are llminfer.core.ggml's.

Format (little-endian): magic "GGUF", uint32 version (2 or 3), uint64 tensor
count, uint64 metadata count; metadata key/value pairs; tensor infos (name,
n_dims, dims fastest-first, type, offset); padding to general.alignment; data.

A file is untrusted input. Everything ggml's own reader (gguf.cpp) refuses is
refused here too, with the key or tensor and the byte offset: duplicate keys
and tensor names, nested arrays, an alignment that is not a power of two of at
least 8, unknown tensor types, element counts past int64, and tensor offsets
that are not exactly where the previous tensor ended (padded to the
alignment), which is what rules out overlapping tensors.

The data stays on disk behind a memory map unless mmap=False. A mapped file
that is truncated while in use makes the next read of a lost page fail with
SIGBUS, which no Python code can catch: check_unchanged() is the cheap test
(one fstat) to run before each use of a mapped file, and for a truncation
during a pass the map's range is watched by the C core (csrc/fault.c:
fault_token), which puts zero pages where the lost ones were and lets the
pass's caller raise GGUFError. mmap=False copies the file into memory instead
(what llama.cpp's --no-mmap does), immune to either.
"""

from __future__ import annotations

import mmap as _mmap_module  # `mmap` is GGUFFile's argument
import operator
import os
import struct
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from llminfer.core.ggml import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from llminfer.errors import GGUFError, InvalidArgumentError, OutOfMemoryError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# scalar value types: (struct format, numpy dtype)
_SCALARS = {
    GGUFValueType.UINT8: ("<B", np.uint8),
    GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16),
    GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32),
    GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.FLOAT32: ("<f", np.float32),
    GGUFValueType.BOOL: ("<?", np.bool_),
    GGUFValueType.UINT64: ("<Q", np.uint64),
    GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT64: ("<d", np.float64),
}

# tensor types whose every element is a float (check_finite scans values, not block scales)
_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)

# sanity bounds: far above any real model, low enough to refuse garbage early
_MAX_TENSORS = 1 << 20
_MAX_KV = 1 << 20
_MAX_DIMS = 4         # GGML_MAX_DIMS
_MAX_NAME = 64        # GGML_MAX_NAME, terminating zero included
_MIN_ALIGNMENT = 8    # the GGUF spec: general.alignment is a multiple of 8
_INT64_MAX = (1 << 63) - 1
_INTEGER_TYPES = (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                  GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's directory entry. shape is numpy's (slowest first), so a
    weight matrix is (rows, k); offset is absolute in the file."""

    name: str
    qtype: int
    shape: tuple
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type {self.qtype}"


class _Cursor:
    """Reads little-endian values from a buffer, checking every bound."""

    def __init__(self, buf, path):
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.path = path

    def need(self, n, what):
        if n < 0 or self.pos + n > self.end:
            raise GGUFError(f"{self.path}: file is truncated or corrupt: {what} at offset "
                            f"{self.pos} needs {n} bytes, only {self.end - self.pos} remain")

    def scalar(self, fmt, size, what):
        self.need(size, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def u32(self, what):
        return self.scalar("<I", 4, what)

    def u64(self, what):
        return self.scalar("<Q", 8, what)

    def string(self, what, errors="strict"):
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8", errors=errors)
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8 ({e.reason} at byte "
                            f"{e.start})") from None

    def value(self, vtype, key):
        try:
            vtype = GGUFValueType(vtype)
        except ValueError:
            raise GGUFError(f"{self.path}: metadata {key!r} has unknown value type {vtype}") from None
        if vtype in _SCALARS:
            fmt, dtype = _SCALARS[vtype]
            v = self.scalar(fmt, np.dtype(dtype).itemsize, f"value of {key!r}")
            return bool(v) if vtype == GGUFValueType.BOOL else v
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key!r}")
        if vtype == GGUFValueType.ARRAY:
            return self.array(key)
        raise GGUFError(f"{self.path}: metadata {key!r} has unsupported value type {vtype.name}")

    def array(self, key):
        etype = self.u32(f"element type of {key!r}")
        count = self.u64(f"element count of {key!r}")
        try:
            etype = GGUFValueType(etype)
        except ValueError:
            raise GGUFError(f"{self.path}: array {key!r} has unknown element type {etype}") from None
        if etype in _SCALARS:
            dtype = np.dtype(_SCALARS[etype][1]).newbyteorder("<")
            nbytes = count * dtype.itemsize
            self.need(nbytes, f"array {key!r}")
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += nbytes
            return arr
        if etype == GGUFValueType.STRING:
            # each string is at least its 8-byte length: refuse impossible counts up front
            self.need(count * 8, f"array {key!r}")
            return self.strings(count, key)
        if etype == GGUFValueType.ARRAY:
            # ggml has no arrays of arrays; allowing them would also let a file
            # nest thousands deep and exhaust Python's stack
            raise GGUFError(f"{self.path}: array {key!r} at offset {self.pos - 12} holds arrays, "
                            f"which GGUF readers do not support")
        raise GGUFError(f"{self.path}: array {key!r} has unsupported element type {etype.name}")

    def strings(self, count, key):
        from llminfer import _core

        blob, offsets, pos, done = _core.read_strings(self.buf, self.pos, count)
        self.pos = pos
        if blob is None:
            self.need(self.end - pos + 1, f"string {done} of {key!r}")
        return StringArray(blob, offsets)


class StringArray(Sequence):
    """A metadata array of strings, held as its bytes back to back and the
    offsets where each starts: Gemma 3's 262k vocabulary pieces are 4 MiB this
    way and 22 MiB as a list of str. It reads like a list (len, index, slice,
    iteration, ==); an item decodes when it is read, invalid UTF-8 as U+FFFD
    (vocabularies hold byte pieces), and raw(i) gives its bytes."""

    __slots__ = ("_blob", "_offsets", "_off")

    def __init__(self, blob: bytes, offsets: np.ndarray):
        self._blob = blob
        self._offsets = offsets
        self._off = memoryview(offsets).cast("B").cast("q")  # plain ints on indexing, fast

    @classmethod
    def of(cls, strings) -> "StringArray":
        """A StringArray holding the given str items."""
        raw = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in raw], out=offsets[1:])
        return cls(b"".join(raw), offsets)

    def __len__(self):
        return len(self._off) - 1

    def _index(self, i):
        n = len(self._off) - 1
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string array index out of range ({n} items)")
        return i

    def raw(self, i) -> bytes:
        i = self._index(i)
        return self._blob[self._off[i]:self._off[i + 1]]

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                from llminfer import _core

                return _core.decode_strings(self._blob, self._offsets[start:max(start, stop) + 1])
            return [self[j] for j in range(start, stop, step)]
        return self.raw(i).decode("utf-8", "replace")

    def __iter__(self):
        return iter(self.tolist())  # decoded in one C loop: a pass over 262k items in ~20 ms

    def lengths(self) -> np.ndarray:
        """Bytes of each item."""
        return np.diff(self._offsets)

    def hashes(self) -> np.ndarray:
        """The 64-bit FNV-1a hash of each item's bytes (uint64), as
        _core.hash_bytes gives it for one."""
        from llminfer import _core

        return _core.hash_strings(self._blob, self._offsets)

    def tolist(self) -> list:
        from llminfer import _core

        return _core.decode_strings(self._blob, self._offsets)

    def __eq__(self, other):
        if isinstance(other, StringArray):
            return self._blob == other._blob and np.array_equal(self._offsets, other._offsets)
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        n = len(self)
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if n > 3 else ''}], {n} items)"


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _read_whole(fd, size, path) -> np.ndarray:
    """The file's bytes in anonymous memory (read-only), for mmap=False."""
    buf = np.empty(size, dtype=np.uint8)
    view, done = memoryview(buf), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while done < size:
        n = os.readv(fd, [view[done:]]) if hasattr(os, "readv") else _read_into(fd, view[done:])
        if n == 0:
            raise GGUFError(f"{path}: file is truncated: it ended at byte {done} while being read "
                            f"({size} expected)")
        done += n
    buf.flags.writeable = False
    return buf


def _read_into(fd, view):
    data = os.read(fd, min(len(view), 1 << 26))
    view[:len(data)] = data
    return len(data)


class GGUFFile:
    """An open GGUF file: `metadata` (dict), `tensors` (dict name -> TensorInfo),
    and tensor bytes through `tensor_bytes(name)` (a read-only uint8 view of the
    memory map). Usable as a context manager; close() drops the map.
    mmap=False reads the whole file into memory instead of mapping it: more
    memory and a slower load, but immune to the file changing on disk."""

    def __init__(self, path, mmap: bool = True):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            from llminfer.errors import ModelNotFoundError
            raise ModelNotFoundError(f"no such file: {self.path}")
        if os.path.isdir(self.path):
            raise GGUFError(f"{self.path} is a directory, not a GGUF file")
        if not isinstance(mmap, bool):
            raise InvalidArgumentError(f"mmap must be True or False, got {mmap!r}")
        self.mmap = mmap
        # Held open for check_unchanged(): fstat on it sees this file even
        # after the path is renamed over, and sees it shrink when truncated.
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self._map = None
        self.fault_token = -1  # the C core's watch over the map (_core.fault_watch), -1 if none
        self._unwatch = None
        try:
            from llminfer import _core
            self._stamp_is = _core.file_stamp_is  # check_unchanged's, in C
            self._stamp = _core.file_stamp(self._fd)  # (size, mtime in ns)
            self.file_size = self._stamp[0]
            if self.file_size < 24:
                raise GGUFError(f"{self.path}: not a GGUF file (only {self.file_size} bytes)")
            if mmap:
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
                self._watch(_core)
            else:
                self._map = _read_whole(self._fd, self.file_size, self.path)
            self._parse()
            if mmap:
                self._release_header()
        except BaseException:
            self.close()
            raise

    def _watch(self, core):
        """Have the C core catch a SIGBUS in the map's range (the file
        truncated under it). The watch ends when the map is unmapped: at
        close(), or, while views of it outlive close(), when the last goes."""
        mm = getattr(self._map, "_mmap", None)
        if mm is None or self._map.nbytes == 0:
            return
        self._range = (self._map.__array_interface__["data"][0], self._map.nbytes)
        self.fault_token = self._watch_range(core, mm)

    def _watch_range(self, core, mm):
        """A watch over self._range that ends when mm goes (or at
        self._unwatch()); its token."""
        try:
            token = core.fault_watch(*self._range)
        except OutOfMemoryError:
            return -1  # every slot in use: check_unchanged() still guards each pass
        if token >= 0:
            self._unwatch = weakref.finalize(mm, core.fault_unwatch, token)
        return token

    def check_finite(self, names=None):
        """Raise GGUFError naming the first tensor (of `names`, or all) with a
        NaN or infinite block scale (d, dmin, m; every value of an F32, F16 or
        BF16 tensor): such a block decodes to non-finite weights, and the
        forward pass's activation quantizers turn those into finite garbage
        rather than NaN logits (csrc/finite.c). The check reads each
        tensor's scales once, in C; a mapped file's pages go back as they are
        read. Tensors of types with no known layout are skipped.
        LLMINFER_CHECK_SCALES=0 skips the check (for tests of what a pass
        does with non-finite weights)."""
        from llminfer import _core
        if os.environ.get("LLMINFER_CHECK_SCALES", "1") == "0":
            return
        for name in (self.tensors if names is None else names):
            info = self.tensors[name]
            unit = _core.first_nonfinite(info.qtype, self.tensor_bytes(name), self.mmap)
            if unit is None or unit < 0:
                continue
            block, _ = GGML_QUANT_SIZES[GGMLQuantizationType(info.qtype)]
            k = info.shape[-1]
            what = "value" if info.qtype in _FLOAT_TYPES else "block scale"
            raise GGUFError(f"{self.path}: tensor {name!r} ({info.type_name}) has a NaN or infinite {what} "
                            f"in {'element' if what == 'value' else 'block'} {unit} (row {unit * block // k}): "
                            f"the file is corrupt")

    def _release_header(self):
        """Hand the header's pages back to the page cache: everything in it
        (the vocabulary is megabytes) has been copied out by the parse, and a
        page read again faults back in from the cache."""
        m = getattr(self._map, "_mmap", None)  # numpy.memmap's mmap.mmap
        n = min(self.data_offset, self.file_size) // _mmap_module.PAGESIZE * _mmap_module.PAGESIZE
        if m is not None and n > 0 and hasattr(m, "madvise") and hasattr(_mmap_module, "MADV_DONTNEED"):
            m.madvise(_mmap_module.MADV_DONTNEED, 0, n)

    def _parse(self):
        cur = _Cursor(self._map, self.path)
        magic = bytes(self._map[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0 and self.version != 0:
                raise GGUFError(f"{self.path}: big-endian GGUF files are not supported")
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version} (2 and 3 are)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        if n_tensors > _MAX_TENSORS or n_kv > _MAX_KV:
            raise GGUFError(f"{self.path}: corrupt header ({n_tensors} tensors, {n_kv} metadata keys)")

        self.metadata = {}
        self.metadata_types = {}  # key -> (GGUF value type, element type of an array or None)
        for i in range(n_kv):
            at = cur.pos
            key = cur.string(f"metadata key {i}")
            if key in self.metadata:
                # ggml refuses these; a reader that lets the last one win loads
                # a model other tools see differently
                raise GGUFError(f"{self.path}: metadata key {key!r} appears twice (again at offset {at})")
            vtype = cur.u32(f"value type of {key!r}")
            etype = None
            if vtype == GGUFValueType.ARRAY and cur.pos + 4 <= cur.end:
                etype = struct.unpack_from("<I", cur.buf, cur.pos)[0]
            self.metadata[key] = cur.value(vtype, key)
            self.metadata_types[key] = (vtype, etype)

        self.alignment = self._alignment()

        infos = []
        for i in range(n_tensors):
            at = cur.pos
            name = cur.string(f"name of tensor {i}")
            if len(name.encode("utf-8")) >= _MAX_NAME:
                raise GGUFError(f"{self.path}: tensor {i} at offset {at} has a name of "
                                f"{len(name.encode('utf-8'))} bytes (at most {_MAX_NAME - 1}): {name[:80]!r}")
            n_dims = cur.u32(f"dimension count of {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise GGUFError(f"{self.path}: tensor {name!r} at offset {at} has {n_dims} dimensions "
                                f"(1 to {_MAX_DIMS} are allowed)")
            dims = [cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims)]
            qtype = cur.u32(f"type of {name!r}")
            offset = cur.u64(f"offset of {name!r}")
            infos.append((name, dims, qtype, offset, at))

        start = cur.pos
        self.data_offset = (start + self.alignment - 1) // self.alignment * self.alignment
        self.tensors = {}
        expected = 0  # where the next tensor must start, relative to data_offset
        for name, dims, qtype, offset, at in infos:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} appears twice (again at offset {at})")
            if any(d <= 0 for d in dims):
                raise GGUFError(f"{self.path}: tensor {name!r} has a zero dimension {dims}")
            nbytes = self._tensor_nbytes(name, dims, qtype)
            if offset != expected:
                # As ggml: tensors lie in order, each padded to the alignment, so
                # no two overlap and none starts at a misaligned address.
                raise GGUFError(f"{self.path}: tensor {name!r} has data offset {offset}, expected "
                                f"{expected} (tensors must follow one another in order, each padded "
                                f"to {self.alignment} bytes)")
            absolute = self.data_offset + offset
            if absolute + nbytes > self.file_size:
                raise GGUFError(f"{self.path}: file is truncated: tensor {name!r} ends at byte "
                                f"{absolute + nbytes}, the file has {self.file_size}")
            expected += (nbytes + self.alignment - 1) // self.alignment * self.alignment
            self.tensors[name] = TensorInfo(name, qtype, tuple(int(d) for d in reversed(dims)),
                                            absolute, nbytes)

    def _alignment(self):
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        vtype, _ = self.metadata_types["general.alignment"]
        value = self.metadata["general.alignment"]
        if vtype not in _INTEGER_TYPES:
            raise GGUFError(f"{self.path}: general.alignment must be an integer, got "
                            f"{GGUFValueType(vtype).name} {_short(value)}")
        if value < _MIN_ALIGNMENT or value & (value - 1):
            raise GGUFError(f"{self.path}: general.alignment {value} is not a power of two of at "
                            f"least {_MIN_ALIGNMENT}")
        return int(value)

    def _tensor_nbytes(self, name, dims, qtype):
        """Bytes of the tensor; refuses types ggml does not know, as ggml does."""
        try:
            t = GGMLQuantizationType(qtype)
            block, size = GGML_QUANT_SIZES[t]
        except (ValueError, KeyError):
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown type {qtype}") from None
        if dims[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} row length {dims[0]} is not a multiple "
                            f"of the {t.name} block size {block}")
        n = 1
        for d in dims:
            n *= d
        if n > _INT64_MAX:
            raise GGUFError(f"{self.path}: tensor {name!r} has {n} elements {dims}, more than ggml's "
                            f"int64 element count can hold")
        return n // block * size

    # ---- access ----

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch

    def tensor_bytes(self, name) -> np.ndarray:
        """The stored bytes of tensor `name`: a read-only uint8 view of the map
        (or of the in-memory copy with mmap=False)."""
        info = self.tensors[name]
        if self._map is None:
            raise GGUFError(f"{self.path}: the file is closed")
        return self._map[info.offset:info.offset + info.nbytes]

    def file_offset(self, array):
        """Where a contiguous view of the mapped file starts in the file, or
        None (mmap=False, a closed file, or bytes that are not the map's)."""
        if not self.mmap or self._map is None or self._fd is None:
            return None
        a = np.asarray(array)
        base = self._map.__array_interface__["data"][0]
        at = a.__array_interface__["data"][0] - base
        if not a.flags.c_contiguous or at < 0 or at + a.nbytes > self._map.nbytes:
            return None
        return at

    def descriptor(self):
        """The open file's descriptor (valid until close()), or None."""
        return self._fd

    def check_unchanged(self):
        """Raise GGUFError if the file was truncated or rewritten since it was
        opened. One fstat on the open descriptor (in C: os.fstat's
        stat_result cost a 135M model's token 9 us on caches the pass had
        left cold), so cheap enough to run before every forward pass: a
        mapped file that shrank would otherwise kill the process with SIGBUS
        at the first page it lost. A file replaced by rename is not a change
        (the old one stays mapped). With mmap=False the data is a private
        copy and nothing can change it."""
        if not self.mmap:
            return
        if self._fd is None:
            raise GGUFError(f"{self.path}: the file is closed")
        size, mtime_ns = self._stamp
        if not self._stamp_is(self._fd, size, mtime_ns):
            from llminfer import _core
            now = _core.file_stamp(self._fd)[0]
            raise GGUFError(f"{self.path}: the file changed on disk while loaded (size {now}, "
                            f"was {size}); its mapped data can no longer be read safely. "
                            f"Load it again, or load with mmap=False to keep a private copy")

    def close(self):
        m = getattr(self, "_map", None)
        if m is not None:
            mm = getattr(m, "_mmap", None)
            self._map = None
            if mm is not None:
                unwatch = getattr(self, "_unwatch", None)
                try:
                    if unwatch is not None:
                        unwatch()  # before the range is unmapped; a no-op once done
                    mm.close()
                except BufferError:
                    # views still alive: the map is freed when they go, and
                    # watched till then
                    if unwatch is not None:
                        from llminfer import _core
                        self.fault_token = self._watch_range(_core, mm)
                except ValueError:
                    pass
        fd = getattr(self, "_fd", None)
        if fd is not None:
            self._fd = None
            os.close(fd)

    def __del__(self):
        # a GGUFFile dropped without close() (GGUFFile(p).metadata) must not
        # keep its descriptor; the map goes with its last view
        fd = getattr(self, "_fd", None)
        if fd is not None:
            self._fd = None
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"GGUFFile({self.path!r}, version={self.version}, {len(self.tensors)} tensors, "
                f"{len(self.metadata)} metadata keys)")
