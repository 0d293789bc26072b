"""Reading GGUF files: metadata and tensor directory from the header, tensor
data as read-only views of a numpy memory map. Nothing is copied or
dequantized: the operating system pages weights in as they are touched.

gguf's own GGUFReader builds an object per metadata item and takes seconds
on a 262k-token vocabulary; this reader walks the header once with bounds
checks at every step, so a truncated or corrupt file raises GGUFError naming
what is wrong and where, never reads past the end, and a model opens in
milliseconds. Constants (value types, tensor types) come from the gguf package.

Format (little-endian): magic "GGUF", uint32 version (2 or 3), uint64 tensor
count, uint64 metadata count; metadata key/value pairs; tensor infos (name,
n_dims, dims fastest-first, type, offset); padding to general.alignment; data.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from llminfer.errors import GGUFError

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

# sanity bounds: far above any real model, low enough to refuse garbage early
_MAX_TENSORS = 1 << 20
_MAX_KV = 1 << 20
_MAX_DIMS = 4


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
            return [self.array(f"{key}[{i}]") for i in range(count)]
        raise GGUFError(f"{self.path}: array {key!r} has unsupported element type {etype.name}")

    def strings(self, count, key):
        from llminfer import _core

        out, pos, done = _core.read_strings(self.buf, self.pos, count)
        self.pos = pos
        if out is None:
            self.need(self.end - pos + 1, f"string {done} of {key!r}")
        return out


class GGUFFile:
    """An open GGUF file: `metadata` (dict), `tensors` (dict name -> TensorInfo),
    and tensor bytes through `tensor_bytes(name)` (a read-only uint8 view of the
    memory map). Usable as a context manager; close() drops the map."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            from llminfer.errors import ModelNotFoundError
            raise ModelNotFoundError(f"no such file: {self.path}")
        if os.path.isdir(self.path):
            raise GGUFError(f"{self.path} is a directory, not a GGUF file")
        self.file_size = os.path.getsize(self.path)
        if self.file_size < 24:
            raise GGUFError(f"{self.path}: not a GGUF file (only {self.file_size} bytes)")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        try:
            self._parse()
        except Exception:
            self.close()
            raise

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
            key = cur.string(f"metadata key {i}")
            vtype = cur.u32(f"value type of {key!r}")
            etype = None
            if vtype == GGUFValueType.ARRAY and cur.pos + 4 <= cur.end:
                etype = struct.unpack_from("<I", cur.buf, cur.pos)[0]
            self.metadata[key] = cur.value(vtype, key)
            self.metadata_types[key] = (vtype, etype)

        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment {self.alignment} is not a power of two")

        infos = []
        for i in range(n_tensors):
            name = cur.string(f"name of tensor {i}")
            n_dims = cur.u32(f"dimension count of {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = [cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims)]
            qtype = cur.u32(f"type of {name!r}")
            offset = cur.u64(f"offset of {name!r}")
            infos.append((name, dims, qtype, offset))

        start = cur.pos
        self.data_offset = (start + self.alignment - 1) // self.alignment * self.alignment
        self.tensors = {}
        for name, dims, qtype, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} appears twice")
            if any(d <= 0 for d in dims):
                raise GGUFError(f"{self.path}: tensor {name!r} has a zero dimension {dims}")
            nbytes = self._tensor_nbytes(name, dims, qtype)
            absolute = self.data_offset + offset
            if offset % self.alignment:
                raise GGUFError(f"{self.path}: tensor {name!r} offset {offset} is not aligned "
                                f"to {self.alignment}")
            if nbytes is not None and absolute + nbytes > self.file_size:
                raise GGUFError(f"{self.path}: file is truncated: tensor {name!r} ends at byte "
                                f"{absolute + nbytes}, the file has {self.file_size}")
            self.tensors[name] = TensorInfo(name, qtype, tuple(int(d) for d in reversed(dims)),
                                            absolute, -1 if nbytes is None else nbytes)

    def _tensor_nbytes(self, name, dims, qtype):
        """Bytes of the tensor, or None for a type we do not know (checked at use)."""
        try:
            t = GGMLQuantizationType(qtype)
        except ValueError:
            return None
        block, size = GGML_QUANT_SIZES[t]
        if dims[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} row length {dims[0]} is not a multiple "
                            f"of the {t.name} block size {block}")
        rows = 1
        for d in dims[1:]:
            rows *= d
        return rows * (dims[0] // block) * size

    # ---- access ----

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch

    def tensor_bytes(self, name) -> np.ndarray:
        """The stored bytes of tensor `name`: a read-only uint8 view of the map."""
        info = self.tensors[name]
        if info.nbytes < 0:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown type {info.qtype}")
        return self._map[info.offset:info.offset + info.nbytes]

    def close(self):
        m = getattr(self, "_map", None)
        if m is not None:
            mm = getattr(m, "_mmap", None)
            self._map = None
            if mm is not None:
                try:
                    mm.close()
                except (BufferError, ValueError):
                    pass  # views still alive: the map is freed when they go

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"GGUFFile({self.path!r}, version={self.version}, {len(self.tensors)} tensors, "
                f"{len(self.metadata)} metadata keys)")
