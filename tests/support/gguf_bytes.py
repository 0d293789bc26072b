"""GGUF files written byte by byte, for tests that need what gguf.GGUFWriter
will not write: duplicate keys, tensors out of order, odd alignments, nested
arrays. Also the seed files of the fuzzers (tests/fuzz).

    kv("general.architecture", "llama")           # str -> STRING
    kv("llama.block_count", 2)                     # int -> UINT32
    kv("x", 1.5)                                   # float -> FLOAT32
    kv("x", 7, GGUFValueType.UINT64)               # explicit type
    Tensor("blk.0.attn_norm.weight", (32,), F32, data)   # dims slowest-first, as numpy
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_FMT = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


def _string(s) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(raw)) + raw


def _infer(value):
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        return GGUFValueType.UINT32
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, (str, bytes)):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return GGUFValueType.ARRAY
    raise TypeError(f"no GGUF type for {value!r}")


def value_bytes(vtype, value, etype=None) -> bytes:
    vtype = GGUFValueType(vtype)
    if vtype in _FMT:
        return struct.pack(_FMT[vtype], value)
    if vtype == GGUFValueType.STRING:
        return _string(value)
    items = list(value)
    if etype is None:
        etype = _infer(items[0]) if items else GGUFValueType.UINT32
    out = struct.pack("<IQ", etype, len(items))
    return out + b"".join(value_bytes(etype, v) for v in items)


def kv(key, value, vtype=None, etype=None) -> bytes:
    vtype = _infer(value) if vtype is None else vtype
    return _string(key) + struct.pack("<I", vtype) + value_bytes(vtype, value, etype)


@dataclass
class Tensor:
    name: str
    shape: tuple              # numpy order, slowest first
    qtype: int
    data: bytes
    offset: int | None = None  # data offset as written; None: where it belongs


def tensor_nbytes(shape, qtype) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    return int(np.prod(shape)) // block * size


def gguf_bytes(kvs: list, tensors: list = (), alignment: int = 32, version: int = 3) -> bytes:
    """A whole file. kvs: bytes from kv(). Tensor data is laid out in order,
    each padded to `alignment`, unless a tensor gives its own offset."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos, placed, cursor = b"", [], 0
    for t in tensors:
        offset = cursor if t.offset is None else t.offset
        placed.append((offset, t.data))
        cursor = max(cursor, offset + len(t.data))
        cursor = (cursor + alignment - 1) // alignment * alignment
        dims = tuple(reversed(t.shape))
        infos += _string(t.name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", t.qtype, offset)
    out = bytearray(head + infos)
    out += b"\0" * ((-len(out)) % alignment)
    start = len(out)
    out += b"\0" * cursor
    for offset, data in placed:
        out[start + offset:start + offset + len(data)] = data
    return bytes(out)


def _key_of(kv_bytes) -> str:
    n = struct.unpack_from("<Q", kv_bytes)[0]
    return kv_bytes[8:8 + n].decode("utf-8")


# ---- a tiny llama, F32 throughout: the fuzzers' seed and the loader tests' base ----

TINY_VOCAB = ["<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("a") + 30)]


def tiny_llama(n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=64, replace=None, drop=(),
               extra_tensors=(), alignment=32, seed=0, arch="llama", tensor_layers=None) -> bytes:
    """A loadable llama (SentencePiece-style vocabulary of single letters):
    a few kilobytes, every tensor F32 so any width works. replace: {key:
    kv(...) bytes, or None to drop the key} (a new key is appended); drop:
    tensor names left out; tensor_layers: blocks written (default n_layer)."""
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_vocab = len(TINY_VOCAB)
    a = arch
    kvs = [kv("general.architecture", a), kv(f"{a}.block_count", n_layer),
           kv(f"{a}.context_length", 256), kv(f"{a}.embedding_length", n_embd),
           kv(f"{a}.feed_forward_length", n_ff), kv(f"{a}.attention.head_count", n_head),
           kv(f"{a}.attention.head_count_kv", n_head_kv),
           kv(f"{a}.attention.layer_norm_rms_epsilon", 1e-5), kv(f"{a}.rope.freq_base", 10000.0),
           kv("tokenizer.ggml.model", "llama"), kv("tokenizer.ggml.tokens", TINY_VOCAB),
           kv("tokenizer.ggml.scores", [0.0] * n_vocab, etype=GGUFValueType.FLOAT32),
           kv("tokenizer.ggml.token_type", [3, 3] + [1] * (n_vocab - 2), etype=GGUFValueType.INT32),
           kv("tokenizer.ggml.bos_token_id", 0), kv("tokenizer.ggml.eos_token_id", 1)]
    replace = dict(replace or {})
    kvs = [replace.pop(_key_of(b), b) for b in kvs]
    kvs = [b for b in kvs if b is not None] + [b for b in replace.values() if b is not None]
    F32 = GGMLQuantizationType.F32

    def t(name, *shape, around=0.0, spread=None):
        spread = (1.0 / np.sqrt(shape[-1])) if spread is None else spread
        data = (around + rng.standard_normal(shape) * spread).astype(np.float32)
        return Tensor(name, shape, F32, data.tobytes())

    ts = [t("token_embd.weight", n_vocab, n_embd, spread=1.0),
          t("output_norm.weight", n_embd, around=1.0, spread=0.1)]
    for i in range(n_layer if tensor_layers is None else tensor_layers):
        p = f"blk.{i}."
        ts += [t(p + "attn_norm.weight", n_embd, around=1.0, spread=0.1),
               t(p + "attn_q.weight", n_head * head_dim, n_embd),
               t(p + "attn_k.weight", n_head_kv * head_dim, n_embd),
               t(p + "attn_v.weight", n_head_kv * head_dim, n_embd),
               t(p + "attn_output.weight", n_embd, n_head * head_dim),
               t(p + "ffn_norm.weight", n_embd, around=1.0, spread=0.1),
               t(p + "ffn_gate.weight", n_ff, n_embd),
               t(p + "ffn_up.weight", n_ff, n_embd),
               t(p + "ffn_down.weight", n_embd, n_ff)]
    ts = [x for x in ts if x.name not in drop] + list(extra_tensors)
    return gguf_bytes(kvs, ts, alignment=alignment)
