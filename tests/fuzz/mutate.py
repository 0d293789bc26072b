"""A small mutational fuzzer in pure Python, for machines without atheris
and for the bounded run in the test suite: seeded, so a run is repeatable.

Mutations suit both inputs: GGUF files (integers of interesting values
written over little-endian fields, bytes flipped, runs cut, copied or
spliced from another seed) and templates (jinja tokens inserted)."""

from __future__ import annotations

import random
import struct

_INTERESTING = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 255, 256, 1023, 4096, 65535, 65536,
                2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
_FLOATS = [0.0, -0.0, 1e-45, 1e300, -1.0, float("inf"), float("-inf"), float("nan"), 1e38, 0.5]
_FLOATS32 = [f for f in _FLOATS if not abs(f) > 3e38]
_JINJA = ["{{", "}}", "{%", "%}", "{#", "#}", " for x in messages ", " endfor ", " if ", " endif ",
          " else ", " set ns = namespace(a=1) ", " set ns.a = ns.a ~ ns.a ", " macro f(n) ", " endmacro ",
          "f(1)", "range(", "100000", ")", "(", "*", "**", "~", "+", "%", "|", "tojson", "join", "center(",
          "replace('', 'xx')", "format(", "'%s'", "'{:>9}'", "[", "]", ",", ".", "message", "messages",
          "['content']", ".content", "loop.index", "raise_exception('x')", "bos_token", "__class__",
          "namespace(", "9" * 12, "-1", "'a'", "\"", "\n", " is defined ", " not ", "trim", "strftime_now('%Y')",
          "{% generation %}", "{% endgeneration %}", "{% break %}", "{% continue %}"]


class Mutator:
    def __init__(self, seeds: list, seed: int = 0, max_size: int = 1 << 20):
        if not seeds:
            raise ValueError("a mutator needs at least one seed input")
        self.seeds = [bytes(s) for s in seeds]
        self.rng = random.Random(seed)
        self.max_size = max_size

    def next(self) -> bytes:
        r = self.rng
        data = bytearray(r.choice(self.seeds))
        for _ in range(1 + int(r.expovariate(0.7))):
            op = r.choice(self._OPS)
            data = op(self, data)
        return bytes(data[:self.max_size])

    def _pos(self, data, width=1):
        return self.rng.randrange(0, max(1, len(data) - width + 1))

    def _int(self, data):
        """An interesting value over a field of 1 to 8 bytes (2**64 - 1 is -1 as int64)."""
        if len(data) < 8:
            return data
        fmt, width = self.rng.choice([("<I", 4), ("<Q", 8), ("<H", 2), ("<B", 1)])
        v = self.rng.choice(_INTERESTING) % 2**(8 * width)
        p = self._pos(data, width)
        data[p:p + width] = struct.pack(fmt, v)
        return data

    def _nudge(self, data):
        """Add a small delta to a 32- or 64-bit field: counts and offsets off by a little."""
        if len(data) < 8:
            return data
        width = self.rng.choice([4, 8])
        p = self._pos(data, width)
        fmt = "<I" if width == 4 else "<Q"
        v = (struct.unpack_from(fmt, data, p)[0] + self.rng.choice([-8, -2, -1, 1, 2, 8, 32])) % 2**(8 * width)
        struct.pack_into(fmt, data, p, v)
        return data

    def _float(self, data):
        if len(data) < 8:
            return data
        if self.rng.random() < 0.5:
            struct.pack_into("<f", data, self._pos(data, 4), self.rng.choice(_FLOATS32))
        else:
            struct.pack_into("<d", data, self._pos(data, 8), self.rng.choice(_FLOATS))
        return data

    def _flip(self, data):
        if data:
            p = self._pos(data)
            data[p] ^= 1 << self.rng.randrange(8)
        return data

    def _byte(self, data):
        if data:
            data[self._pos(data)] = self.rng.randrange(256)
        return data

    def _truncate(self, data):
        return data[:self._pos(data)] if data else data

    def _delete(self, data):
        if len(data) > 2:
            p = self._pos(data)
            del data[p:p + self.rng.randint(1, min(64, len(data) - p))]
        return data

    def _duplicate(self, data):
        if data:
            p = self._pos(data)
            n = self.rng.randint(1, min(256, len(data) - p))
            q = self._pos(data)
            data[q:q] = data[p:p + n] * self.rng.choice([1, 1, 2, 8])
        return data

    def _splice(self, data):
        other = self.rng.choice(self.seeds)
        if not other or not data:
            return data
        p, q = self._pos(data), self.rng.randrange(len(other))
        return data[:p] + other[q:q + self.rng.randint(1, 512)] + data[p:]

    def _token(self, data):
        tok = self.rng.choice(_JINJA).encode()
        p = self.rng.randrange(len(data) + 1)
        data[p:p] = tok
        return data

    _OPS = [_int, _int, _nudge, _float, _flip, _byte, _truncate, _delete, _duplicate, _splice, _token]
