"""JSON with a bound on how deep it nests, for every JSON that comes from
outside: request bodies, response_format schemas, tool-call arguments, a
model's own replies parsed as tool calls, the headers of state files.

Python's json parser recurses once per level, so `[[[[...` a few thousand
deep raises RecursionError (not a ValueError), and a value nested just under
that limit raises it later, in whatever serializes or walks it. Here a text
that nests too deep is refused as the caller's error, and a parsed value is
checked without recursion, so a value that passes is safe to dump and walk.

    value = loads(text, "the request body")       # InvalidArgumentError when too deep
    check_depth(schema, "response_format")         # for values built in Python
    value, end = raw_decode(text, i)               # ValueError when too deep (model output)
"""

from __future__ import annotations

import json

from llminfer.errors import InvalidArgumentError

MAX_DEPTH = 128  # levels of arrays and objects; real schemas and arguments nest a dozen or so

_DECODER = json.JSONDecoder()
_CONTAINERS = (dict, list, tuple)


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether value's dicts, lists and tuples nest more than limit levels
    (a scalar is 0 levels, [] is 1). Iterative; a value that contains itself
    counts as too deep."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, _CONTAINERS):
            continue
        depth += 1
        if depth > limit:
            return True
        for c in (v.values() if isinstance(v, dict) else v):
            if isinstance(c, _CONTAINERS):
                stack.append((c, depth))
    return False


def _deep(what, limit):
    return f"{what} nests deeper than {limit} levels of arrays and objects"


def check_depth(value, what: str, limit: int = MAX_DEPTH, error=InvalidArgumentError):
    """value, or `error` naming `what` when it nests deeper than limit."""
    if too_deep(value, limit):
        raise error(_deep(what, limit))
    return value


_RAISE = object()


def loads(text, what: str, limit: int = MAX_DEPTH, error=InvalidArgumentError, default=_RAISE):
    """json.loads(text), refusing with `error` (naming `what`) text that
    nests deeper than limit, and text that is not JSON (or not UTF-8) unless
    a default is given to return for it."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(_deep(what, limit)) from None
    except ValueError as e:  # UnicodeDecodeError too
        if default is not _RAISE:
            return default
        raise error(f"{what} is not valid JSON: {e}") from None
    return check_depth(value, what, limit, error)


def raw_decode(text: str, i: int = 0, limit: int = MAX_DEPTH):
    """(value, end) of the JSON value that starts at text[i], as
    json.JSONDecoder.raw_decode; ValueError when there is none or it nests
    deeper than limit (as for any other text that is not JSON)."""
    try:
        value, end = _DECODER.raw_decode(text, i)
    except RecursionError:
        raise ValueError(_deep("the JSON", limit)) from None
    if too_deep(value, limit):
        raise ValueError(_deep("the JSON", limit))
    return value, end
