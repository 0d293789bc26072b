"""The sandbox chat templates run in, with bounds on the work they may do.

A chat template comes from a downloaded file (or from whoever passes
chat_template=), so it is untrusted code. jinja2's immutable sandbox stops it
reaching Python internals or mutating the caller's objects, and bounds one
range() to 100,000 items; it does not bound the total work, nor the size of
what is built. Here a render is also stopped, with ChatTemplateError naming
the bound, when it

- runs more than `max_steps` template lines (loop iterations count, empty
  ones too: every line the compiled template executes is a step),
- runs longer than `timeout` seconds of wall-clock time, checked at every
  template step and every few lines of any Python code a filter or method
  runs (textwrap, markupsafe, jinja's own filters),
- would build a value larger than `max_chars` (see "sizes" below), or write
  more than `max_chars` of output.

Sizes are predicted before the value is built, from the arguments: a width,
a count, a repeat factor, the fields of a format string, the items to join.
Every filter, global and method a template can reach is on a list here with
the check it needs (`_FILTER_CHECKS`, `_STR_METHODS`); methods of built-in
types not on the list are refused. Every value a template builds (literals,
results of operators, calls and filters, items of the iterators filters
return) is measured, so no value can hold more than `max_chars`, counted as
the text it would print with shared items counted each time they appear:
`[x, x]` nested sixty times is small in memory but would take years to
compare, hash or print, and is refused when it is built.

Steps are counted with a trace function on the rendering thread (chained
to any debugger or coverage tracer already set), so they need nothing from
the template's cooperation.
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import wraps
from string import Formatter
from types import BuiltinFunctionType

from jinja2 import ext, pass_environment, pass_eval_context
from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.filters import make_attrgetter
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import Namespace, generate_lorem_ipsum

from llminfer.errors import ChatTemplateError


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one render. max_chars grows by four times the size of what
    the caller passes in (messages and extra variables), so a long
    conversation is never refused for its own length."""

    max_steps: int = 5_000_000
    timeout: float = 10.0
    max_chars: int = 1 << 22    # any value built, and the output; about bytes (see _Budget.measure)
    max_int_bits: int = 4096    # integers a template computes
    max_arg: int = 100_000      # widths and counts given to filters and methods


DEFAULT_LIMITS = TemplateLimits()

_TEMPLATE_FILE = "<template>"  # the file name jinja gives compiled template code
_state = threading.local()     # the _Budget of the render running on this thread
_LIBRARY_LINES = 64            # lines of library code between two checks of the deadline

_CONTAINER, _ITEM = 64, 8     # the size of a container, and of each item more: about their bytes
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def _namespace_attrs(ns) -> dict:
    return object.__getattribute__(ns, "_Namespace__attrs")


def _children(x):
    """The items a container prints, or None for a value that is not one."""
    if isinstance(x, (str, bytes)):
        return None
    if isinstance(x, (list, tuple)):
        return x
    if isinstance(x, dict):
        return [v for kv in x.items() for v in kv]
    if isinstance(x, (set, frozenset) + _VIEWS):
        return list(x)
    if isinstance(x, Namespace):
        return [_namespace_attrs(x)]
    return None


def _scalar_size(x) -> int:
    if isinstance(x, (str, bytes)):
        return len(x)
    if isinstance(x, bool) or x is None:
        return 5
    if isinstance(x, int):
        return x.bit_length() // 3 + 2
    return 64  # a float, an object's repr


class _Budget:
    """What one render may still spend; installed on its thread while it runs.

    Sizes are measured in characters of the text a value prints as, with
    each container counted as _CONTAINER plus _ITEM per item more (about
    its bytes in memory), and an item shared by several containers counted
    each time it appears."""

    def __init__(self, limits: TemplateLimits, name: str, variables=None):
        self.limits = limits
        self.name = name
        self.steps = 0
        self.lines = 0
        self.deadline = time.monotonic() + limits.timeout
        self.max_chars = limits.max_chars
        # the caller's own containers, measured once: id -> (size, items, depth); they are
        # alive (and, in the immutable sandbox, unchanged) for the whole render
        self.known = {}
        self.inputs = variables
        if variables is not None:
            self.max_chars += 4 * self._measure(variables, None, self.known, cap=float("inf"))[0]

    def fail(self, what):
        raise ChatTemplateError(f"chat template {self.name!r} stopped: {what}")

    def step(self):
        self.steps += 1
        if self.steps > self.limits.max_steps:
            self.fail(f"it ran more than {self.limits.max_steps} steps (max_steps: a loop that does not end, "
                      f"or nested loops over large ranges)")
        self.check_time()

    def check_time(self):
        if time.monotonic() > self.deadline:
            self.fail(f"it ran longer than {self.limits.timeout:g} s (timeout)")

    def size(self, n, what):
        """Refuse a value predicted to be n in size."""
        if n > self.max_chars:
            self.fail(f"{what} would build {n} characters, more than max_chars={self.max_chars}")

    def arg(self, v, what):
        """Refuse a width or count larger than max_arg."""
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > self.limits.max_arg:
            self.fail(f"{what} was given {v}, more than max_arg={self.limits.max_arg}")

    def measure(self, v, what, leaf=None):
        """(size, items, depth) of v; refuses it when its size is over
        max_chars. items: the container items it holds, counted as size is;
        depth: how deeply its containers nest. leaf(x) sizes a str (its len
        unless given)."""
        if type(v) is str or type(v) is int:
            n = len(v) if type(v) is str else _scalar_size(v)
            if n > self.max_chars:
                self.size(n, what)
            return n, 0, 0
        if leaf is None and id(v) in self.known:
            return self.known[id(v)]
        return self._measure(v, what, {}, self.max_chars, leaf)

    def _measure(self, v, what, memo, cap, leaf=None):
        kids = _children(v)
        if kids is None:
            n = leaf(v) if leaf is not None and isinstance(v, str) else _scalar_size(v)
            if n > cap:
                self.size(n, what)
            return n, 0, 0
        known = self.known if leaf is None else {}
        on_path = {id(v)}
        stack = [[v, kids, 0, _CONTAINER, 0, 1]]  # value, its items, next item, size, items, depth
        while stack:
            f = stack[-1]
            kids, i, n = f[1], f[2], len(f[1])
            size, items, depth = f[3], f[4], f[5]
            while i < n:
                k = kids[i]
                if type(k) is str and leaf is None:
                    size += _ITEM + len(k)
                    items += 1
                elif type(k) is int:
                    size += _ITEM + k.bit_length() // 3 + 2
                    items += 1
                else:
                    r = memo.get(id(k)) or known.get(id(k))
                    if r is None:
                        k_kids = _children(k)
                        if k_kids is None:
                            r = (leaf(k) if leaf is not None and isinstance(k, str) else _scalar_size(k), 0, 0)
                        elif id(k) in on_path:
                            r = (_ITEM, 0, 0)  # a cycle: printed as [...]
                        else:
                            f[2:] = [i, size, items, depth]
                            on_path.add(id(k))
                            stack.append([k, k_kids, 0, _CONTAINER, 0, 1])
                            break
                    size += _ITEM + r[0]
                    items += 1 + r[1]
                    depth = max(depth, r[2] + 1)
                if size > cap:
                    self.fail(f"{what} would build more than max_chars={self.max_chars} characters "
                              f"(counting an item each time it appears)")
                i += 1
            else:
                memo[id(f[0])] = (size, items, depth)
                on_path.discard(id(f[0]))
                stack.pop()
        return memo[id(v)]

    def value(self, v, what):
        """Refuse a value that is too large (after an operation)."""
        if isinstance(v, int) and not isinstance(v, bool):
            if v.bit_length() > self.limits.max_int_bits:
                self.fail(f"{what} gave an integer of {v.bit_length()} bits (more than "
                          f"max_int_bits={self.limits.max_int_bits})")
        elif isinstance(v, str):
            self.size(len(v), what)
        else:
            self.measure(v, what)
        return v

    def items(self, it, what):
        """A list of what `it` yields, each item and the whole measured as they come."""
        if isinstance(it, range):
            return list(it)  # at most MAX_RANGE small integers
        out, n = [], _CONTAINER
        for x in it:
            n += _ITEM + self.measure(x, what)[0]
            if n > self.max_chars:
                self.size(n, what)
            out.append(x)
        return out

    def iterate(self, it, what):
        """`it`, each item measured as it is yielded."""
        for x in it:
            yield self.value(x, what)

    def text(self, v, what) -> int:
        """The length v has as text (str(v)), bounded, without building it."""
        return self.measure(v, what)[0]


def _budget():
    return getattr(_state, "budget", None)


# ---- predicting what an operation builds ----

_PERCENT_FIELD = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.)", re.S)


def _field_text(b, v, conversion, what) -> int:
    """The most characters one value may take in a format field, before width."""
    n = b.text(v, what)
    if isinstance(v, float):
        n = 330  # '%f' of 1e308
    if conversion in ("r", "a"):
        n = 10 * n + 2  # repr() escapes: '\x01' is 4 characters, ascii() of an emoji 10
    return n


def _percent_size(b, fmt, right, what) -> int:
    """An upper bound on len(fmt % right), refusing widths over max_arg."""
    positional = right if isinstance(right, tuple) else (right,)
    total, pos = len(fmt), 0
    for key, width, precision, conversion in _PERCENT_FIELD.findall(fmt):
        for v in (width, precision):
            if v == "*" or (v and int(v) > b.limits.max_arg):
                b.fail(f"a %-format field width or precision {v!r} is larger than "
                       f"max_arg={b.limits.max_arg}")
            total += int(v) if v.isdigit() else 0
        if conversion == "%":
            continue
        if key and isinstance(right, Mapping):
            v = right.get(key, "")
        elif pos < len(positional):
            v, pos = positional[pos], pos + 1
        else:
            v = ""
        total += _field_text(b, v, conversion, what)
        b.size(total, what)
    return total


def _format_size(b, fmt, args, kwargs, what) -> int:
    """An upper bound on len(fmt.format(*args, **kwargs)), refusing widths
    over max_arg and widths taken from arguments."""
    try:
        fields = list(Formatter().parse(fmt))
    except ValueError:
        return len(fmt)  # format() itself will raise on it
    total, auto = 0, 0
    for literal, name, spec, conversion in fields:
        total += len(literal)
        if name is None:
            continue
        if spec and ("{" in spec or any(int(n) > b.limits.max_arg for n in re.findall(r"\d+", spec))):
            b.fail(f"a format field {spec!r} asks for a width larger than max_arg={b.limits.max_arg} "
                   f"(or one taken from an argument)")
        total += sum(int(n) for n in re.findall(r"\d+", spec or ""))
        head = re.split(r"[.\[]", name, maxsplit=1)[0]
        if head == "":
            v, auto = (args[auto] if auto < len(args) else ""), auto + 1
        elif head.isdigit():
            v = args[int(head)] if int(head) < len(args) else ""
        else:
            v = kwargs.get(head, "")
        total += _field_text(b, v, conversion, what)
        b.size(total, what)
    return total


def _replaced_size(text, old, new, count) -> int:
    if len(new) <= len(old):
        return len(text)
    n = text.count(old) if old else len(text) + 1
    if count is not None and count >= 0:
        n = min(n, count)
    return len(text) + n * (len(new) - len(old))


def _joined_size(b, sep, items, what) -> int:
    """len(sep.join(map(str, items))), bounded; items is a list or a str."""
    if isinstance(items, str):
        return len(items) + len(sep) * max(len(items) - 1, 0)
    return len(sep) * max(len(items) - 1, 0) + b.text(items, what)  # the list's size is at least its items' text


def _predict_binop(b, op, left, right):
    what = f"the operator {op}"
    if op == "*":
        for s, n in ((left, right), (right, left)):
            if isinstance(s, (str, list, tuple)) and isinstance(n, int):
                size = len(s) if isinstance(s, str) else b.measure(s, what)[0]
                b.size(size * max(n, 0), "a repetition (*)")
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > b.limits.max_int_bits:
                b.fail(f"a multiplication gave an integer too large (max_int_bits={b.limits.max_int_bits})")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if left.bit_length() * right > b.limits.max_int_bits:
                b.fail(f"a power ({left} ** {right}) is too large (max_int_bits={b.limits.max_int_bits})")
    elif op == "+":
        if isinstance(left, str) and isinstance(right, str):
            b.size(len(left) + len(right), "a concatenation (+)")
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            b.size(b.measure(left, what)[0] + b.measure(right, what)[0], "a concatenation (+)")
    elif op == "%" and isinstance(left, str):
        b.size(_percent_size(b, left, right, what), what)


# ---- methods: the allowed ones, and the checks they need ----

# str methods whose result is no larger than the string (or a few times it,
# for case changes), or small
_STR_SAFE = frozenset("""
    capitalize casefold count encode endswith find index isalnum isalpha isascii isdecimal isdigit
    isidentifier islower isnumeric isprintable isspace istitle isupper lower lstrip partition
    removeprefix removesuffix rfind rindex rpartition rsplit rstrip split splitlines startswith strip
    swapcase title upper escape unescape striptags
""".split())
_STR_METHODS = _STR_SAFE | {"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join",
                            "format", "format_map"}
_DICT_METHODS = frozenset(["get", "items", "keys", "values", "copy", "fromkeys"])
_LIST_METHODS = frozenset(["count", "index", "copy"])
_BUILTIN_VALUES = (str, bytes, bytearray, int, float, complex, list, tuple, dict, set, frozenset, range) + _VIEWS


def _allowed_methods(owner):
    kind = owner if isinstance(owner, type) else type(owner)  # a classmethod's owner is the class
    if issubclass(kind, str):
        return _STR_METHODS
    if issubclass(kind, dict):
        return _DICT_METHODS
    if issubclass(kind, (list, tuple)):
        return _LIST_METHODS
    return frozenset()


def _is_builtin_value(owner) -> bool:
    return isinstance(owner, _BUILTIN_VALUES) or (isinstance(owner, type) and issubclass(owner, _BUILTIN_VALUES))


def _check_method(b, name, owner, args, kwargs):
    """Refuse a method of a built-in value that is not on the list, or one
    that would build too much; returns args, with an iterator given to
    join() turned into a (bounded) list."""
    what = f"{name}()"
    if name not in _allowed_methods(owner):
        kind = owner if isinstance(owner, type) else type(owner)
        b.fail(f"{kind.__name__}.{name}() is not allowed in a chat template")
    if not isinstance(owner, str):
        return args
    if name in ("center", "ljust", "rjust", "zfill") and args:
        b.arg(args[0], what)
        if isinstance(args[0], int):
            b.size(max(len(owner), args[0]), what)
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        b.arg(tab, what)
        if isinstance(tab, int):
            b.size(len(owner) + owner.count("\t") * max(tab, 0), what)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = args[2] if len(args) > 2 else kwargs.get("count")
        b.size(_replaced_size(owner, args[0], args[1], count if isinstance(count, int) else None), what)
    elif name == "join" and args:
        items = args[0]
        if isinstance(items, Iterator) or isinstance(items, (set, frozenset, dict) + _VIEWS):
            items = b.items(items, what)
            args = (items,) + tuple(args[1:])
        if isinstance(items, (str, list, tuple)):
            b.size(_joined_size(b, owner, items, what), what)
    elif name == "format":
        b.size(_format_size(b, owner, args, kwargs, what), what)
    elif name == "format_map" and args and isinstance(args[0], Mapping):
        b.size(_format_size(b, owner, (), args[0], what), what)
    return args


# ---- filters: the checks each needs before it runs ----

def _predict_center(b, a, what):
    b.arg(a["width"], what)
    if isinstance(a["width"], int):
        b.size(max(b.text(a["value"], what), a["width"]), what)


def _predict_indent(b, a, what):
    width, s = a["width"], a["s"]
    if isinstance(width, int):
        b.arg(width, what)
    step = len(width) if isinstance(width, str) else max(width, 0) if isinstance(width, int) else 0
    text = s if isinstance(s, str) else ""
    breaks = sum(text.count(c) for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
    b.size(b.text(s, what) + (breaks + 2) * (step + 1), what)


def _predict_wordwrap(b, a, what):
    b.arg(a["width"], what)
    wrap = a["wrapstring"] if isinstance(a["wrapstring"], str) else "\n"
    n = b.text(a["s"], what)
    b.size(n + (n + 1) * len(wrap), what)  # a line holds at least one character


def _predict_replace(b, a, what):
    s, old, new = a["s"], a["old"], a["new"]
    if all(isinstance(v, str) for v in (s, old, new)):
        count = a["count"] if isinstance(a["count"], int) else None
        b.size(_replaced_size(s, old, new, count), what)


def _predict_format(b, a, what):
    if isinstance(a["value"], str):
        b.size(_percent_size(b, a["value"], a["kwargs"] or a["args"], what), what)


def _predict_escape(b, a, what):
    v = next(iter(a.values())) if "value" not in a else a["value"]
    if isinstance(v, str):
        b.size(len(v) + 4 * sum(v.count(c) for c in "&<>\"'"), what)
    else:
        b.size(5 * b.text(v, what), what)


def _predict_urlencode(b, a, what):
    b.size(12 * b.text(a["value"], what), what)  # a character is up to 4 UTF-8 bytes, each %XX


def _predict_xmlattr(b, a, what):
    b.size(5 * b.text(a["d"], what), what)


def _predict_urlize(b, a, what):
    n = b.text(a["value"], what)
    attrs = sum(5 * len(v) for v in (a["target"], a["rel"]) if isinstance(v, str))
    b.size(12 * n + (n // 2 + 1) * (attrs + 64), what)  # every word a link: <a href="...">...</a>


def _predict_truncate(b, a, what):
    end = a["end"] if isinstance(a["end"], str) else ""
    b.size(b.text(a["s"], what) + len(end), what)


def _json_str_size(s) -> int:
    """An upper bound on len(json.dumps(s)) with ensure_ascii=True or False."""
    n = len(s) + 2 + s.count('"') + s.count("\\")
    if not (s.isascii() and s.isprintable()):
        n += 5 * (len(s) - len(s.translate(_C0_DELETE)))  # control characters: \u0001
        if not s.isascii():
            n += 5 * (len(s) - len(s.encode("ascii", "ignore")))           # \u00e9
            n += 6 * (len(s.encode("utf-16-le", "surrogatepass")) // 2 - len(s))  # a surrogate pair
    return n


_C0_DELETE = dict.fromkeys(range(32))


def _predict_tojson(b, a, what):
    indent, separators = a["indent"], a["separators"]
    step = len(indent) if isinstance(indent, str) else max(indent, 0) if isinstance(indent, int) else 0
    if isinstance(indent, int):
        b.arg(indent, what)
    seps = sum(len(s) for s in separators if isinstance(s, str)) if isinstance(separators, (list, tuple)) else 4
    size, items, depth = b.measure(a["value"], what, leaf=_json_str_size)
    per_item = seps + (1 + step * depth if indent is not None else 0)
    b.size(size + items * per_item + (1 + step * depth if indent is not None else 0), what)


def _predict_list(b, a, what):
    v = a["value"]
    if isinstance(v, str):
        b.size(_CONTAINER + (_ITEM + 1) * len(v), what)  # a list of one-character strings


def _predict_slice(b, a, what):
    b.arg(a["slices"], what)
    _predict_list(b, a, what)


# filters whose output can be far larger than their input, and the check each needs first
# (the others are no larger than what they are given, and are measured after)
_FILTER_CHECKS = {
    "center": _predict_center,
    "indent": _predict_indent,
    "wordwrap": _predict_wordwrap,
    "replace": _predict_replace,
    "format": _predict_format,
    "escape": _predict_escape, "e": _predict_escape, "forceescape": _predict_escape,
    "urlencode": _predict_urlencode,
    "xmlattr": _predict_xmlattr,
    "urlize": _predict_urlize,
    "truncate": _predict_truncate,
    "tojson": _predict_tojson,
    "list": _predict_list, "sort": _predict_list, "groupby": _predict_list,
    "slice": _predict_slice,
    "batch": lambda b, a, what: b.arg(a["linecount"], what),
}
# filters that turn their argument into text: it is measured first (str() of a
# structure that shares its items would otherwise run for ever)
_SERIALIZING = frozenset(["string", "safe", "striptags", "title", "capitalize", "upper", "lower", "trim",
                          "wordcount", "length", "count"])


@pass_eval_context
def _bounded_join(eval_ctx, value, d="", attribute=None):
    """jinja's join, with the joined size predicted before it is built."""
    from jinja2.filters import do_join

    b = _budget()
    if b is None:
        return do_join(eval_ctx, value, d, attribute)
    what = "the join filter"
    items = value if isinstance(value, (str, list, tuple)) else b.items(value, what)
    if attribute is not None:
        items = [make_attrgetter(eval_ctx.environment, attribute)(x) for x in items]
    b.size(_joined_size(b, d if isinstance(d, str) else str(d), items, what), what)
    return do_join(eval_ctx, items, d)


@pass_environment
def _bounded_sum(environment, iterable, attribute=None, start=0):
    """jinja's sum, in linear time: lists or tuples are chained, not added
    one by one (which copies the total so far at every item)."""
    b = _budget()
    what = "the sum filter"
    items = b.items(iterable, what) if b is not None else list(iterable)
    if attribute is not None:
        items = [make_attrgetter(environment, attribute)(x) for x in items]
    for kind in (list, tuple):
        if type(start) is kind and all(type(x) is kind for x in items):
            if b is not None:
                b.size(b.measure(start, what)[0] + sum(b.measure(x, what)[0] for x in items), what)
            return kind(v for part in [start] + items for v in part)
    total = start
    for x in items:
        if b is not None:
            _predict_binop(b, "+", total, x)
            b.check_time()
        total = total + x
    return total


def _no_pprint(value):
    raise ChatTemplateError("the pprint filter is not available in chat templates (its output has no bound)")


def _bounded_lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (jinja's own argument names)
    b = _budget()
    if b is not None:
        what = "the lipsum global"
        for v in (n, min, max):
            b.arg(v, what)
        if all(isinstance(v, int) for v in (n, min, max)):
            b.size(n * (16 * (max + 1) + 16), what)  # the longest lorem word has 13 letters
    return generate_lorem_ipsum(n, html, min, max)


# jinja's filters, globals and tests, each read for what it can build and how
# long it can run: a filter a later jinja adds is left out until it is read
_REVIEWED_FILTERS = frozenset("""
    abs attr batch capitalize center count d default dictsort e escape filesizeformat first float
    forceescape format groupby indent int items join last length list lower map max min pprint random
    reject rejectattr replace reverse round safe select selectattr slice sort string striptags sum title
    tojson trim truncate unique upper urlencode urlize wordcount wordwrap xmlattr
""".split())
_REVIEWED_GLOBALS = frozenset(["range", "dict", "lipsum", "cycler", "joiner", "namespace"])
# tests are O(1), or compare values, which the bound on what is built keeps short
_REVIEWED_TESTS = frozenset("""
    != < <= == > >= boolean callable defined divisibleby eq equalto escaped even false filter float ge
    greaterthan gt in integer iterable le lessthan lower lt mapping ne none number odd sameas sequence
    string test true undefined upper
""".split())

_REPLACED_FILTERS = {"join": _bounded_join, "sum": _bounded_sum, "pprint": _no_pprint}


def _bounded_filter(name, f):
    if getattr(f, "jinja_async_variant", False):
        f = f.__wrapped__  # the sync function, what an environment that is not async runs
    pass_arg = getattr(f, "jinja_pass_arg", None)
    skip = 1 if pass_arg is not None else 0  # the context jinja passes first
    check = _FILTER_CHECKS.get(name)
    try:
        signature = inspect.signature(f)
    except (TypeError, ValueError):
        signature = None

    @wraps(f)
    def checked(*args, **kwargs):
        b = _budget()
        if b is None:
            return f(*args, **kwargs)
        what = f"the {name} filter"
        b.step()
        if len(args) > skip and isinstance(args[skip], Iterator):
            args = args[:skip] + (b.items(args[skip], what),) + args[skip + 1:]  # a generator's items, bounded
        if name in _SERIALIZING and len(args) > skip:
            b.measure(args[skip], what)
        if check is not None and signature is not None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                pass  # the call itself will raise
            else:
                bound.apply_defaults()
                check(b, bound.arguments, what)
        out = f(*args, **kwargs)
        if isinstance(out, Iterator):
            return b.iterate(out, what)
        return b.value(out, what)

    if pass_arg is not None:
        checked.jinja_pass_arg = pass_arg
    return checked


class _BoundedFilters(dict):
    """The filter table: every filter put in it, now or later, is bounded;
    join, sum and pprint are replaced by bounded versions."""

    def __init__(self, filters):
        super().__init__()
        for name, f in filters.items():
            self[name] = f

    def __setitem__(self, name, f):
        super().__setitem__(name, _bounded_filter(name, _REPLACED_FILTERS.get(name, f)))

    def update(self, *args, **kwargs):
        for name, f in dict(*args, **kwargs).items():
            self[name] = f


def _finalize(value):
    """Every {{ value }} before it becomes text."""
    b = _budget()
    if b is not None:
        b.measure(value, "an output")
    return value


# ---- the environment ----

class _BoundedCodeGenerator(CodeGenerator):
    """Compiles `a ~ b` so that the size of the result is predicted from its
    operands before it is built, and list, tuple and dict literals so that
    what they build is measured (jinja's visit_* with the checks around them)."""

    @optimizeconst
    def visit_Concat(self, node, frame):
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"environment.bounded_concat({func_name}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _measured(self, visit, what, node, frame):
        if getattr(node, "ctx", "load") != "load":  # an assignment target: (a, b) = ...
            return visit(node, frame)
        self.write("environment.bounded_value(")
        visit(node, frame)
        self.write(f", {what!r})")

    def visit_List(self, node, frame):
        self._measured(super().visit_List, "a list", node, frame)

    def visit_Tuple(self, node, frame):
        self._measured(super().visit_Tuple, "a tuple", node, frame)

    def visit_Dict(self, node, frame):
        self._measured(super().visit_Dict, "a dict", node, frame)


class Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _BoundedCodeGenerator
    # Intercepted operators are also never folded at compile time, where
    # `'ab' * 400000000` would otherwise be built before any render.
    intercepted_binops = frozenset(["*", "**", "+", "%", "//"])

    def __init__(self, **kwargs):
        super().__init__(finalize=_finalize, **kwargs)
        self.filters = _BoundedFilters({n: f for n, f in self.filters.items() if n in _REVIEWED_FILTERS})
        self.globals = {n: v for n, v in self.globals.items() if n in _REVIEWED_GLOBALS}
        self.globals["lipsum"] = _bounded_lipsum
        self.tests = {n: t for n, t in self.tests.items() if n in _REVIEWED_TESTS}

    def unsafe_undefined(self, obj, attribute):
        # jinja2 returns an Undefined that renders as "" and only fails when used
        # further; a template that reaches for __class__ is hostile, say so now.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def concat(self, pieces):
        """The text of a block ({% set %}...{% endset %}, a macro's body, a
        {% filter %} block): its size is known from its pieces before it is joined."""
        b = _budget()
        if b is not None:
            pieces = pieces if isinstance(pieces, list) else list(pieces)
            b.size(sum(len(p) for p in pieces if isinstance(p, str)), "a block's text")
        return "".join(pieces)

    def bounded_value(self, value, what):
        b = _budget()
        return value if b is None else b.value(value, what)

    def bounded_concat(self, join, operands):
        b = _budget()
        if b is not None:
            what = "a concatenation (~)"
            b.size(sum(len(v) if isinstance(v, str) else b.text(v, what) for v in operands), what)
        return join(operands)

    def call_binop(self, context, operator, left, right):
        b = _budget()
        if b is not None:
            _predict_binop(b, operator, left, right)
        out = super().call_binop(context, operator, left, right)
        return out if b is None else b.value(out, f"the operator {operator}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        b = _budget()
        what = f"{getattr(__obj, '__name__', 'a call')}()"
        if b is not None:
            b.step()
            owner = getattr(__obj, "__self__", None)
            if _is_builtin_value(owner):
                args = _check_method(b, getattr(__obj, "__name__", "?"), owner, args, kwargs)
            elif isinstance(__obj, BuiltinFunctionType) and owner is None and "." in __obj.__qualname__:
                b.fail(f"{__obj.__qualname__}() is not allowed in a chat template")  # str.maketrans
            elif __obj is safe_range:
                for v in args:
                    b.arg(v, what)
            elif isinstance(__obj, Macro) and (__obj.catch_varargs or __obj.catch_kwargs):
                b.measure([args, kwargs], f"the arguments of macro {__obj.name}")  # become varargs / kwargs
        out = super().call(__context, __obj, *args, **kwargs)
        return out if b is None else b.value(out, what)

    def wrap_str_format(self, value):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt, name = value.__self__, value.__name__

        @wraps(wrapper)
        def checked(*args, **kwargs):
            b = _budget()
            if b is not None:
                what = f"{name}()"
                if name == "format_map":
                    b.size(_format_size(b, fmt, (), args[0] if args else {}, what), what)
                else:
                    b.size(_format_size(b, fmt, args, kwargs, what), what)
            return wrapper(*args, **kwargs)

        return checked


class GenerationTag(ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers marks the assistant's
    tokens with it for training masks; when rendering a prompt it is a no-op."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)  # the tag name
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# ---- running a render under a budget ----

def compile_template(env, source: str, name: str, limits: TemplateLimits = DEFAULT_LIMITS):
    """env.from_string(source) under a budget: jinja folds constant filter
    calls at compile time ('x'|center(10**9) is built then), and a filter
    refused here is left for the render, where it is refused again."""
    outer = _budget()
    _state.budget = _Budget(limits, name)
    try:
        return env.from_string(source)
    finally:
        _state.budget = outer


def render(compiled, variables: dict, name: str, limits: TemplateLimits = DEFAULT_LIMITS) -> str:
    """compiled.render(variables), stopped with ChatTemplateError by any
    bound of `limits`. Other exceptions of the template pass through.

    A trace function counts the template's lines as steps, and checks the
    deadline every few lines of any other Python code the render runs (a
    filter's loop, textwrap, markupsafe), which no template step would
    interrupt."""
    b = _Budget(limits, name, variables)
    outer = _budget()
    previous = sys.gettrace()

    def template_line(frame, event, arg):
        b.step()
        return template_line

    def library_line(frame, event, arg):
        b.lines += 1
        if not b.lines % _LIBRARY_LINES:
            b.check_time()
        return library_line

    def chained(own, inner):
        def trace(frame, event, arg):
            nonlocal inner
            own(frame, event, arg)
            if inner is not None:
                inner = inner(frame, event, arg)
            return trace
        return trace

    def on_call(frame, event, arg):
        inner = previous(frame, event, arg) if previous is not None else None
        if frame.f_code.co_filename == __file__:
            return inner  # this module's own loops are bounded by what they measure
        own = template_line if frame.f_code.co_filename == _TEMPLATE_FILE else library_line
        own(frame, event, arg)
        return own if inner is None else chained(own, inner)

    _state.budget = b
    sys.settrace(on_call)
    try:
        out, n = [], 0
        for piece in compiled.generate(variables):
            n += len(piece)
            b.size(n, "the rendered prompt")
            out.append(piece)
        return "".join(out)
    finally:
        sys.settrace(previous)
        _state.budget = outer
