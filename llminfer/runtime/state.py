"""Saving and restoring an LLM's context: its tokens and their keys and values.

    blob = llm.save_state()          # bytes
    llm.load_state(blob)             # the same context again, bit for bit
    llm.save_session("chat.llmstate")
    llm.load_session("chat.llmstate")

A state holds the tokens, their positions, the logits after the last one
(so generation can go on at once), and the bytes of every KV block the
sequence's tables point at, per group, then a hybrid model's recurrent
state after the tokens (one slot of the state pool). Restored blocks come from the pool's
free list (their ids need not be the old ones); the tables are rewritten to
match, so the logits after a restore are bitwise those before it.

The format (little-endian):

    magic "LLMIKV\\0\\1" | u32 header length | header (JSON) | payload

The header names the format version, the llminfer version, a fingerprint of
the model file, the KV type and block size, the group block sizes and the
payload layout. Loading checks each of them against the LLM and raises
InvalidArgumentError naming what differs: a state from another model, another
KV type or block size, or another format version is refused, never loaded
into the wrong cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np

from llminfer.text import jsonlimits
from llminfer.errors import InvalidArgumentError
from llminfer.runtime.kv_cache import FULL, SWA

MAGIC = b"LLMIKV\x00\x01"
FORMAT_VERSION = 1
_SAMPLES = 64            # fingerprint: chunks read across the tensor data
_SAMPLE_BYTES = 1 << 16


def model_fingerprint(gguf) -> str:
    """A hash of a model file: its header (metadata and tensor table) whole,
    and 64 chunks of 64 KiB spread over the tensor data, and its size. Two
    files that agree on all of that are the same model for all practical
    purposes; reading it all would take seconds on a large file."""
    cached = getattr(gguf, "_state_fingerprint", None)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    m = gguf._map
    h.update(str(gguf.file_size).encode())
    h.update(bytes(m[:gguf.data_offset]))
    span = gguf.file_size - gguf.data_offset
    for i in range(_SAMPLES):
        at = gguf.data_offset + span * i // _SAMPLES
        h.update(bytes(m[at:at + _SAMPLE_BYTES]))
    gguf._state_fingerprint = h.hexdigest()
    return gguf._state_fingerprint


def _layout(llm):
    """What a state holds ahead of its KV blocks (magic, header, logits), and
    the (group, block) pairs whose bytes follow, in order."""
    from llminfer import __version__

    eng = llm.engine
    seq = llm.sequence
    groups = {}
    blocks = []
    for g in eng.kv.groups:
        table = list(seq.tables[g])
        groups[str(g)] = {"table": table, "block_bytes": eng.ctx.block_bytes(g)}
        blocks += [(g, b) for b in table if b >= 0]
    header = {
        "format": FORMAT_VERSION, "llminfer": __version__, "model": model_fingerprint(eng.gguf),
        "model_name": os.path.basename(str(llm.model_path)), "kv_type": eng.kv_type,
        "block_size": eng.block_size, "n_vocab": llm.n_vocab, "tokens": list(seq.tokens),
        "positions": list(seq.positions), "next_pos": seq.next_pos, "swa_floor": seq.swa_floor,
        "groups": groups, "state_bytes": eng.state_slot_bytes,
    }
    if seq.rope_marks:  # an M-RoPE model's images (Sequence.rope_marks)
        header["rope_marks"] = [[int(a), int(b)] for a, b in seq.rope_marks]
    if seq.rows:  # the places that came from embedding rows (an image's): their ids are placeholders
        header["rows"] = [[int(a), int(b)] for a, b in seq.rows]
        header["images"] = [[int(s.start), int(s.end), str(s.key)] for s in llm.held_images()]
    head = json.dumps(header, separators=(",", ":")).encode()
    logits = np.ascontiguousarray(llm.last_logits, dtype="<f4").tobytes()
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, logits]), blocks


def _recurrent(llm) -> bytes:
    """A hybrid model's recurrent state after the context's tokens (b"" for other models)."""
    eng = llm.engine
    if not eng.state_slot_bytes:
        return b""
    seq = llm.sequence
    eng.bring_state(seq)  # after a truncate, the state is brought back to the tokens first
    return eng.ctx.read_state(seq.slot)


def save(llm) -> bytes:
    """The state of llm's context as bytes, made in place: the process holds
    one copy of the cache's blocks beside the cache, not two."""
    head, blocks = _layout(llm)
    return llm.engine.ctx.read_blocks(head, blocks) + _recurrent(llm)


def write(llm, f) -> None:
    """save()'s bytes written to the binary file f a block at a time, so a
    session file costs no copy of the whole cache in memory."""
    head, blocks = _layout(llm)
    f.write(head)
    for g, b in blocks:
        f.write(llm.engine.ctx.read_block(g, b))
    f.write(_recurrent(llm))


def _parse(blob):
    if not isinstance(blob, (bytes, bytearray)):
        try:  # any other buffer (a memoryview, an mmap, a numpy array) as its bytes
            blob = bytes(memoryview(blob))
        except TypeError:
            raise InvalidArgumentError(f"a state must be bytes (from save_state()), got "
                                       f"{type(blob).__name__}") from None
    blob = memoryview(blob)
    if len(blob) < len(MAGIC) + 4 or bytes(blob[:len(MAGIC) - 1]) != MAGIC[:-1]:
        raise InvalidArgumentError("not an llminfer state (bad magic): use bytes from save_state() or a file "
                                   "from save_session()")
    if blob[len(MAGIC) - 1] != MAGIC[-1]:
        raise InvalidArgumentError(f"an llminfer state of format {blob[len(MAGIC) - 1]}, this version reads "
                                   f"format {MAGIC[-1]}")
    (n,) = struct.unpack_from("<I", blob, len(MAGIC))
    start = len(MAGIC) + 4
    if start + n > len(blob):
        raise InvalidArgumentError("the state is truncated (its header runs past its end)")
    header = jsonlimits.loads(bytes(blob[start:start + n]), "the state's header (corrupt)")
    if not isinstance(header, dict):
        raise InvalidArgumentError(f"the state's header is corrupt: a JSON {type(header).__name__}, not an object")
    return header, blob[start + n:]


_MAX_INT = 1 << 62  # positions, block ids and sizes: room to add without leaving int64


def _ints(value, field, lo=-_MAX_INT, hi=_MAX_INT) -> list:
    """value as a list of ints in [lo, hi), or InvalidArgumentError naming the field."""
    if not isinstance(value, list):
        raise InvalidArgumentError(f"the state's header is corrupt: {field} is not a list")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < hi:
            raise InvalidArgumentError(f"the state's header is corrupt: {field} holds {str(v)[:40]!r}, not an "
                                       f"integer in [{lo}, {hi})")
    return value


def _int(value, field, lo=-_MAX_INT, hi=_MAX_INT) -> int:
    return _ints([value], field, lo, hi)[0]


def _fields(header, n_vocab):
    """(tokens, positions, next_pos, swa_floor, groups) of a header, each
    checked for its type and range, so that nothing sized from them is
    allocated before the sizes are known to agree with the payload."""
    for key in ("tokens", "positions", "groups", "next_pos", "swa_floor"):
        if key not in header:
            raise InvalidArgumentError(f"the state's header is corrupt: it has no {key}")
    tokens = _ints(header["tokens"], "tokens", 0, n_vocab)
    positions = _ints(header["positions"], "positions", 0)
    next_pos, swa_floor = _int(header["next_pos"], "next_pos", 0), _int(header["swa_floor"], "swa_floor", 0)
    if not isinstance(header["groups"], dict):
        raise InvalidArgumentError("the state's header is corrupt: groups is not an object")
    groups = {}
    for g, v in header["groups"].items():
        if g not in (str(FULL), str(SWA)) or not isinstance(v, dict):
            raise InvalidArgumentError(f"the state's header is corrupt: groups holds {g[:40]!r}")
        groups[g] = {"table": _ints(v.get("table"), f"group {g}'s table", -1),
                     "block_bytes": _int(v.get("block_bytes"), f"group {g}'s block_bytes", 0)}
    return tokens, positions, next_pos, swa_floor, groups


def load(llm, blob):
    """Restore llm's context from save()'s bytes."""
    header, payload = _parse(blob)
    eng = llm.engine
    checks = [("format", FORMAT_VERSION, "format version"),
              ("model", model_fingerprint(eng.gguf), "model (another model file)"),
              ("kv_type", eng.kv_type, "KV cache type"), ("block_size", eng.block_size, "KV block size"),
              ("n_vocab", llm.n_vocab, "vocabulary size")]
    for key, ours, what in checks:
        if header.get(key) != ours:
            theirs = header.get("model_name") if key == "model" else header.get(key)
            raise InvalidArgumentError(f"this state was saved with a different {what}: {theirs!r}, while this "
                                       f"LLM has {os.path.basename(str(llm.model_path)) if key == 'model' else ours!r}")
    tokens, positions, next_pos, swa_floor, groups = _fields(header, llm.n_vocab)
    if len(positions) != len(tokens):
        raise InvalidArgumentError("the state's header is corrupt: its tokens and positions disagree")
    if len(tokens) > llm.n_ctx:
        raise InvalidArgumentError(f"the state holds {len(tokens)} tokens, more than n_ctx={llm.n_ctx}")
    if sorted(int(g) for g in groups) != sorted(eng.kv.groups):
        raise InvalidArgumentError("the state's KV groups do not match this model's")
    for g, info in groups.items():
        size = eng.ctx.block_bytes(int(g))
        if info["block_bytes"] != size:
            raise InvalidArgumentError(f"the state's KV blocks take {info['block_bytes']} bytes, this model's "
                                       f"{size}")
    why = _layout_fault(positions, next_pos, swa_floor, groups, eng.block_size)
    if why:
        raise InvalidArgumentError(f"the state's header is corrupt: {why}")
    marks = header.get("rope_marks", [])
    if not isinstance(marks, list) or not all(
            isinstance(m, list) and len(m) == 2 and all(type(v) is int for v in m) and 0 < m[0] <= next_pos
            and -m[0] <= m[1] <= 0 for m in marks) or [m[0] for m in marks] != sorted({m[0] for m in marks}):
        raise InvalidArgumentError("the state's header is corrupt: its rope marks are not places in the sequence")
    rows, images = _row_spans(header, len(tokens))
    recurrent = header.get("state_bytes", 0)
    if recurrent != eng.state_slot_bytes:
        raise InvalidArgumentError(f"the state holds {str(recurrent)[:40]} bytes of recurrent state per sequence, "
                                   f"this model {eng.state_slot_bytes}")
    n_logits = llm.n_vocab * 4
    need = n_logits + sum(g["block_bytes"] * sum(1 for b in g["table"] if b >= 0) for g in groups.values())
    need += recurrent
    if len(payload) != need:
        raise InvalidArgumentError(f"the state's payload has {len(payload)} bytes, its header describes {need}")
    llm.reset()
    seq = llm.sequence
    try:
        _restore_blocks(eng, seq, groups, payload, n_logits)
    except BaseException:
        for g in eng.kv.groups:  # give back what was taken; the context stays empty
            for b in seq.tables[g]:
                if b >= 0:
                    eng.kv.pools[g].release(b)
            seq.tables[g] = []
        raise
    seq.tokens = list(tokens)
    seq.positions = positions
    seq.next_pos = next_pos
    seq.swa_floor = swa_floor
    seq.rope_marks = [(a, b) for a, b in marks]
    seq.rows = rows
    if recurrent:
        eng.ctx.write_state(seq.slot, np.frombuffer(payload[len(payload) - recurrent:], dtype=np.uint8))
        seq.state_len = len(tokens)
    llm.context_replaced(np.frombuffer(payload[:n_logits], dtype="<f4"))
    return images


def _row_spans(header, n_tokens):
    """The header's spans of places that came from embedding rows, and its
    images ([start, end, content key], each one of the spans or inside one),
    checked: a state that loses them would let a truncate replay an image's
    placeholder ids as text (a hybrid model) or a text prompt reuse an
    image's keys and values."""
    rows, images = header.get("rows", []), header.get("images", [])
    bad = InvalidArgumentError("the state's header is corrupt: its embedding rows are not spans of its tokens")
    if not isinstance(rows, list) or not isinstance(images, list):
        raise bad
    end = 0
    for span in rows:
        if not (isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span)
                and end <= span[0] < span[1] <= n_tokens):
            raise bad
        end = span[1]
    for im in images:
        if not (isinstance(im, list) and len(im) == 3 and all(type(v) is int for v in im[:2])
                and isinstance(im[2], str) and 0 < len(im[2]) <= 256
                and any(a <= im[0] < im[1] <= b for a, b in rows)):
            raise InvalidArgumentError("the state's header is corrupt: its images are not among its embedding rows")
    return [(a, b) for a, b in rows], [(a, b, key) for a, b, key in images]


def _layout_fault(positions, next_pos, swa_floor, groups, bs):
    """What makes a header's tokens and block tables a layout the cache
    never holds (None when nothing does). The attention reads every row of a
    present block below the token's position, so a table that claims a
    block for positions no token was written at would feed it whatever the
    pool held there.

    What the cache holds: positions rising from 0 to next_pos - 1, less the
    whole blocks a context shift dropped; a block is present in the table
    exactly when the sequence holds its positions, except that the
    sliding-window group gives back the blocks below swa_floor (a multiple
    of the block size)."""
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size and (pos[0] < 0 or np.any(np.diff(pos) <= 0)):
        return "its positions do not rise from 0"
    if next_pos != (int(pos[-1]) + 1 if pos.size else 0):
        return f"next_pos {next_pos} does not follow its last position"
    if not 0 <= swa_floor <= next_pos or swa_floor % bs:
        return f"swa_floor {swa_floor} is not a block boundary at or before next_pos {next_pos}"
    n_blocks = -(-next_pos // bs)
    for g, info in groups.items():  # before anything n_blocks long is made: the tables bound it
        if len(info["table"]) < n_blocks:
            return f"group {g}'s table of {len(info['table'])} blocks does not reach next_pos {next_pos}"
    held = np.bincount(pos // bs, minlength=n_blocks)
    whole = np.minimum(bs, next_pos - np.arange(n_blocks) * bs)  # positions of each block below next_pos
    if np.any((held != 0) & (held != whole)):
        return "a block holds only some of its positions"
    for g, info in groups.items():
        table = np.asarray(info["table"], dtype=np.int64)
        want = held > 0
        if int(g) == SWA:
            want[:swa_floor // bs] = False
        if np.any((table[:n_blocks] >= 0) != want):
            return f"group {g}'s table disagrees with the positions it holds"
    return None


def _restore_blocks(eng, seq, groups, payload, at):
    for g in (FULL, SWA):
        if g not in eng.kv.groups:
            continue
        info = groups[str(g)]
        size = info["block_bytes"]  # load() checked it is this model's
        pool = eng.kv.pools[g]
        table = []
        for b in info["table"]:
            if b < 0:
                table.append(-1)
                continue
            nb = pool.alloc()
            table.append(nb)  # recorded first, so a failure below gives it back with the rest
            seq.tables[g] = table
            eng.ctx.write_block(g, nb, payload[at:at + size])
            at += size
        seq.tables[g] = table
