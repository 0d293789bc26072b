"""The sandbox chat templates run in, with bounds on the work they may do.

A chat template comes from a downloaded file (or from whoever passes
chat_template=), so it is untrusted code. jinja2's immutable sandbox stops it
reaching Python internals or mutating the caller's objects, and bounds one
range() to 100,000 items; it does not bound the total work, nor the size of
what is built. Here a render is also stopped, with ChatTemplateError, when it

- runs more than `max_steps` template lines (loop iterations count, empty
  ones too: every line the compiled template executes is a step),
- runs longer than `timeout` seconds of wall-clock time,
- builds a string, list or number larger than `max_chars` (checked before
  the operation where it can be predicted: `'ab' * 10**9`, `x ~ x`,
  `.center(10**9)`, `'%0999999999d' % 1`, replace() on a long string;
  after it otherwise), or writes more than `max_chars` of output.

Steps are counted with a trace function on the rendering thread (chained
to any debugger or coverage tracer already set), so they need nothing from
the template's cooperation; sizes are checked by intercepting jinja's binary
operators, its `~` concatenation, every call it makes, and every filter.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from functools import wraps
from string import Formatter

from jinja2 import ext
from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llminfer.errors import ChatTemplateError


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one render. max_chars grows by four times the text the
    caller passes in (messages and extra variables), so a long conversation
    is never refused for its own length."""

    max_steps: int = 5_000_000
    timeout: float = 10.0
    max_chars: int = 1 << 22
    max_int_bits: int = 4096    # integers a template computes
    max_arg: int = 100_000      # integer arguments of calls and filters (widths, counts)


DEFAULT_LIMITS = TemplateLimits()

_TEMPLATE_FILE = "<template>"  # the file name jinja gives compiled template code
_state = threading.local()     # the _Budget of the render running on this thread


class _Budget:
    """What one render may still spend; installed on its thread while it runs."""

    def __init__(self, limits: TemplateLimits, extra_chars: int, name: str):
        self.limits = limits
        self.max_chars = limits.max_chars + 4 * extra_chars
        self.steps = 0
        self.deadline = time.monotonic() + limits.timeout
        self.name = name

    def fail(self, what):
        raise ChatTemplateError(f"chat template {self.name!r} stopped: {what}")

    def step(self):
        self.steps += 1
        if self.steps > self.limits.max_steps:
            self.fail(f"it ran more than {self.limits.max_steps} steps (a loop that does not end, or "
                      f"nested loops over large ranges)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            self.fail(f"it ran longer than {self.limits.timeout:g} s")

    def size(self, n, what):
        if n > self.max_chars:
            self.fail(f"{what} would hold {n} items, more than the limit of {self.max_chars}")

    def value(self, v, what):
        """Refuse a value that is already too large (after an operation)."""
        if isinstance(v, (str, list, tuple, dict, set, bytes)):
            self.size(len(v), what)
        elif isinstance(v, int) and v.bit_length() > self.limits.max_int_bits:
            self.fail(f"{what} gave an integer of {v.bit_length()} bits (at most "
                      f"{self.limits.max_int_bits})")
        return v

    def walk(self, v, what):
        """Refuse a container whose text form would be too large: nested
        lists can share their items, so `[x, x]` ten times over is small in
        memory and huge as text. Stops counting at the limit."""
        if not isinstance(v, (list, tuple, dict, set)):
            return v
        n, stack = 0, [v]
        while stack:
            x = stack.pop()
            if isinstance(x, str):
                n += len(x) + 2
            elif isinstance(x, dict):
                n += 2 + 2 * len(x)
                stack.extend(x.keys())
                stack.extend(x.values())
            elif isinstance(x, (list, tuple, set)):
                n += 2 + 2 * len(x)
                stack.extend(x)
            else:
                n += 8
            if n > self.max_chars:
                self.fail(f"{what} would write a value of more than {self.max_chars} characters")
        return v

    def arg(self, v, what):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > self.limits.max_arg:
            self.fail(f"{what} was given {v}, more than {self.limits.max_arg}")


def _budget():
    return getattr(_state, "budget", None)


# ---- size checks before an operation ----

_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")


def _check_percent_format(b, fmt):
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for v in (width, precision):
            if v == "*" or (v and int(v) > b.limits.max_arg):
                b.fail(f"a %-format field width or precision {v!r} is larger than {b.limits.max_arg}")


def _check_format_spec(b, fmt):
    try:
        fields = list(Formatter().parse(fmt))
    except ValueError:
        return  # format() itself will raise on it
    for _, _, spec, _ in fields:
        if spec and ("{" in spec or any(int(n) > b.limits.max_arg for n in re.findall(r"\d+", spec))):
            b.fail(f"a format field {spec!r} asks for a width larger than {b.limits.max_arg} "
                   f"(or one taken from an argument)")


def _predict_binop(b, op, left, right):
    seq = (str, list, tuple)
    if op == "*":
        for s, n in ((left, right), (right, left)):
            if isinstance(s, seq) and isinstance(n, int):
                b.size(len(s) * max(n, 0), "a repetition (*)")
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > b.limits.max_int_bits:
                b.fail("a multiplication gave an integer too large")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if left.bit_length() * right > b.limits.max_int_bits:
                b.fail(f"a power ({left} ** {right}) is too large")
    elif op == "+":
        if isinstance(left, seq) and isinstance(right, seq):
            b.size(len(left) + len(right), "a concatenation (+)")
    elif op == "%" and isinstance(left, str):
        _check_percent_format(b, left)


def _predict_call(b, obj, args, kwargs):
    name = getattr(obj, "__name__", "a function")
    for v in list(args) + list(kwargs.values()):
        b.arg(v, f"{name}()")
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, str) and name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str) and isinstance(new, str) and len(new) > len(old):
            count = owner.count(old) if old else len(owner) + 1
            b.size(len(owner) + count * (len(new) - len(old)), "replace()")
    if isinstance(owner, str) and name == "join" and args:
        b.size(_joined_size(owner, args[0]), "join()")
    if isinstance(owner, str) and name in ("format", "format_map"):
        for v in list(args) + list(kwargs.values()):
            b.walk(v, f"{name}()")


def _joined_size(sep, items) -> int:
    if not isinstance(items, (list, tuple)):
        return 0  # a generator or a string: bounded by what made it
    return len(sep) * len(items) + sum(len(x) if isinstance(x, str) else 8 for x in items)


# filters that write their argument out as text
_SERIALIZING = frozenset(["tojson", "string", "pprint", "e", "escape", "forceescape", "safe",
                          "urlencode", "xmlattr", "format"])


def _bounded_filter(name, f):
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # the context jinja passes first

    @wraps(f)
    def checked(*args, **kwargs):
        b = _budget()
        if b is not None:
            what = f"the {name} filter"
            given = args[skip:]
            for v in list(given) + list(kwargs.values()):
                b.arg(v, what)
                if name in _SERIALIZING:
                    b.walk(v, what)
            if name == "format" and given and isinstance(given[0], str):
                _check_percent_format(b, given[0])
            if name == "replace" and len(given) >= 3 and all(isinstance(v, str) for v in given[:3]):
                text, old, new = given[:3]
                if len(new) > len(old):
                    count = text.count(old) if old else len(text) + 1
                    b.size(len(text) + count * (len(new) - len(old)), what)
            if name == "join" and given:
                sep = given[1] if len(given) > 1 and isinstance(given[1], str) else kwargs.get("d", "")
                b.size(_joined_size(sep if isinstance(sep, str) else "", given[0]), what)
        out = f(*args, **kwargs)
        if b is not None:
            b.value(out, f"the {name} filter")
        return out

    return checked


class _BoundedFilters(dict):
    """The filter table: every filter put in it, now or later, is bounded."""

    def __init__(self, filters):
        super().__init__()
        for name, f in filters.items():
            self[name] = f

    def __setitem__(self, name, f):
        super().__setitem__(name, _bounded_filter(name, f))

    def update(self, *args, **kwargs):
        for name, f in dict(*args, **kwargs).items():
            self[name] = f


def _finalize(value):
    """Every {{ value }} before it becomes text."""
    b = _budget()
    return value if b is None else b.walk(value, "an output")


# ---- the environment ----

class _BoundedCodeGenerator(CodeGenerator):
    """Compiles `a ~ b` so that each operand and the result are size-checked
    (jinja's visit_Concat with the checks around it)."""

    @optimizeconst
    def visit_Concat(self, node, frame):
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"environment.bounded_value({func_name}((")
        for arg in node.nodes:
            self.write("environment.bounded_operand(")
            self.visit(arg, frame)
            self.write("), ")
        self.write(")), 'a concatenation (~)')")


class Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _BoundedCodeGenerator
    # Intercepted operators are also never folded at compile time, where
    # `'ab' * 400000000` would otherwise be built before any render.
    intercepted_binops = frozenset(["*", "**", "+", "%", "//"])

    def __init__(self, **kwargs):
        super().__init__(finalize=_finalize, **kwargs)
        self.filters = _BoundedFilters(self.filters)

    def unsafe_undefined(self, obj, attribute):
        # jinja2 returns an Undefined that renders as "" and only fails when used
        # further; a template that reaches for __class__ is hostile, say so now.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def bounded_value(self, value, what):
        b = _budget()
        return value if b is None else b.value(value, what)

    def bounded_operand(self, value):
        b = _budget()
        return value if b is None else b.walk(value, "a concatenation (~)")

    def call_binop(self, context, operator, left, right):
        b = _budget()
        if b is not None:
            _predict_binop(b, operator, left, right)
            if operator == "%":
                b.walk(right, "the operator %")
        out = super().call_binop(context, operator, left, right)
        return out if b is None else b.value(out, f"the operator {operator}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        b = _budget()
        if b is not None:
            b.step()
            _predict_call(b, __obj, args, kwargs)
        out = super().call(__context, __obj, *args, **kwargs)
        return out if b is None else b.value(out, f"{getattr(__obj, '__name__', 'a call')}()")

    def wrap_str_format(self, value):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @wraps(wrapper)
        def checked(*args, **kwargs):
            b = _budget()
            if b is not None:
                _check_format_spec(b, fmt)
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

def _input_chars(value, depth=0) -> int:
    """Characters of text the caller passed in (messages, tools, documents)."""
    if depth > 20:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_input_chars(k, depth + 1) + _input_chars(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_input_chars(v, depth + 1) for v in value)
    return 0


def compile_template(env, source: str, name: str, limits: TemplateLimits = DEFAULT_LIMITS):
    """env.from_string(source) under a budget: jinja folds constant filter
    calls at compile time ('x'|center(10**9) is built then), and a filter
    refused here is left for the render, where it is refused again."""
    outer = _budget()
    _state.budget = _Budget(limits, 0, name)
    try:
        return env.from_string(source)
    finally:
        _state.budget = outer


def render(compiled, variables: dict, name: str, limits: TemplateLimits = DEFAULT_LIMITS) -> str:
    """compiled.render(variables), stopped with ChatTemplateError by any
    bound of `limits`. Other exceptions of the template pass through."""
    b = _Budget(limits, _input_chars(variables), name)
    outer = _budget()
    previous = sys.gettrace()

    def local(frame, event, arg):
        b.step()
        return local

    def chained_local(inner):
        def trace(frame, event, arg):
            nonlocal inner
            b.step()
            if inner is not None:
                inner = inner(frame, event, arg)
            return trace
        return trace

    def on_call(frame, event, arg):
        inner = previous(frame, event, arg) if previous is not None else None
        if frame.f_code.co_filename == _TEMPLATE_FILE:
            b.step()
            return local if inner is None else chained_local(inner)
        return inner

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
