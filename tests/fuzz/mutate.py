"""A small mutational fuzzer in pure Python, for machines without atheris
and for the bounded run in the test suite: seeded, so a run is repeatable.

Mutations suit both inputs: GGUF files (integers of interesting values
written over little-endian fields, bytes flipped, runs cut, copied or
spliced from another seed) and templates (jinja tokens inserted)."""

from __future__ import annotations

import random
import re
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


# ---- JSON request bodies ("PATH\nBODY", the http target) ----

_VALUE = re.compile(rb':\s*("(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+-]*|true|false|null)')
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_HUGE_NUMBERS = [b"1" + b"0" * 400, b"-1" + b"0" * 400, b"9" * 4400, b"1e400", b"-1e400", b"1e-400", b"NaN",
                 b"Infinity", b"-Infinity", b"-0", b"2e308", b"18446744073709551616", b"9223372036854775808",
                 b"-9223372036854775809", b"4294967296", b"1.0000000000000002", b"0.0", b"-1"]
_VALUES = [b"null", b"true", b"false", b'"x"', b'""', b"[]", b"{}", b"[1]", b'{"a": 1}', b"1.5", b"-1", b"0",
           b'[[1, 2], [3]]', b'["a", 1]', b'{"type": "text", "text": "a"}', b'[{"role": "user"}]']
_BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x00",
             b"\\ud800", b"\\udfff\\ud800", b"\\u0000"]


class JSONMutator(Mutator):
    """Mutations of a JSON request body after its "PATH\\n" line: values
    nested deep, numbers no float holds, values of the wrong type, bytes
    that are not UTF-8 and long strings (the request-level hostile inputs),
    with a few of the byte-level ones."""

    def _split(self, data):
        i = data.find(b"\n")
        return (data[:i + 1], data[i + 1:]) if i >= 0 else (b"", data)

    def _sub(self, data, regex, make):
        head, body = self._split(data)
        spots = list(regex.finditer(body))
        if not spots:
            return data
        m = self.rng.choice(spots)
        return bytearray(head + body[:m.start()] + make(m) + body[m.end():])

    def _deep(self, data):
        k = self.rng.choice([2, 64, 127, 128, 129, 200, 1000, 3000, 20000])
        if self.rng.random() < 0.5:
            v = b"[" * k + self.rng.choice([b"", b"1", b'"a"']) + b"]" * k
        else:
            v = b'{"a": ' * k + b"1" + b"}" * k
        if self.rng.random() < 0.2:  # left open: the parser recurses all the same
            v = v[:len(v) // 2]
        return self._sub(data, _VALUE, lambda m: b": " + v)

    def _huge(self, data):
        return self._sub(data, _NUMBER, lambda m: self.rng.choice(_HUGE_NUMBERS))

    def _wrong_type(self, data):
        return self._sub(data, _VALUE, lambda m: b": " + self.rng.choice(_VALUES))

    def _bad_utf8(self, data):
        def inside(m):
            s = m.group(0)
            at = self.rng.randrange(1, max(2, len(s)))
            return s[:at] + self.rng.choice(_BAD_UTF8) + s[at:]
        return self._sub(data, _STRING, inside)

    def _long_string(self, data):
        n = self.rng.choice([1000, 5000, 40000, 120000])
        piece = self.rng.choice([b"a", b"ab ", b"\\n", b"\\u00e9", b"<tool_call>", b"["])
        return self._sub(data, _STRING, lambda m: b'"' + piece * (n // len(piece)) + b'"')

    def _new_key(self, data):
        head, body = self._split(data)
        if not body.startswith(b"{"):
            return data
        key = self.rng.choice([b"n", b"max_tokens", b"temperature", b"seed", b"logit_bias", b"stream", b"tools",
                               b"response_format", b"json_schema", b"grammar", b"suffix", b"echo", b"messages",
                               b"prompt", b"input", b"tokens", b"top_logprobs", b"logprobs", b"stop"])
        value = self.rng.choice(_VALUES + _HUGE_NUMBERS[:4])
        return bytearray(head + b'{"' + key + b'": ' + value + b", " + body[1:])

    def _path(self, data):
        head, body = self._split(data)
        paths = [b"/v1/completions\n", b"/v1/chat/completions\n", b"/v1/embeddings\n", b"/tokenize\n",
                 b"/detokenize\n"]
        return bytearray(self.rng.choice(paths) + body)

    _OPS = [_deep, _deep, _huge, _huge, _wrong_type, _wrong_type, _bad_utf8, _long_string, _new_key, _new_key,
            _path, Mutator._flip, Mutator._delete, Mutator._duplicate, Mutator._splice, Mutator._truncate]
