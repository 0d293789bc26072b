"""The chat-template sandbox's bounds (llminfer/text/chat_sandbox.py).

Each hostile template below used to run unbounded in time or memory: one
call of a filter, global, method or operator built gigabytes, or ran for
minutes inside one C call or one library loop where no step was counted.
Each is rendered in a child process with a hard timeout and an address-space
limit, so a regression fails here instead of hanging the test run or
exhausting the machine; the child reports the error and how much its peak
memory grew.
"""

import json
import os
import re
import subprocess
import tempfile
import sys
import textwrap

import pytest

from llminfer.text.chat import ChatFormat
from llminfer.text.chat_sandbox import TemplateLimits
from llminfer.errors import ChatTemplateError
from hostile_templates import HOSTILE

USER = {"role": "user", "content": "What is the capital of France?"}
CHILD_TIMEOUT = 20         # seconds: a render that is still running then hangs
MEMORY_GROWTH_MB = 200     # the most a refused render may add to the child's peak memory
ADDRESS_SPACE_GB = 2       # above the child's start, so a hole fails with MemoryError, not the machine

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from llminfer.text.chat import ChatFormat
    from llminfer.text.chat_sandbox import TemplateLimits
    from llminfer.errors import ChatTemplateError

    template, limits, extra_gb = json.loads(sys.stdin.read())
    with open("/proc/self/statm") as f:
        vsize = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vsize + int(extra_gb * 2**30), resource.RLIM_INFINITY))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    out = {"error": None, "message": ""}
    try:
        fmt = ChatFormat("test", template, limits=TemplateLimits(**limits))
        text = fmt.render([{"role": "user", "content": "What is the capital of France?"}])
        out["length"] = len(text)
    except BaseException as e:
        out["error"], out["message"] = type(e).__name__, str(e)[:500]
    out["seconds"] = time.monotonic() - start
    out["growth_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(json.dumps(out))
""")


def render_in_child(template, **limits):
    """Render `template` in a fresh interpreter; its report as a dict."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        # cwd away from the checkout: `python -c` puts its folder first on sys.path,
        # where a source tree without the compiled core would shadow the package
        proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps([template, limits, ADDRESS_SPACE_GB]),
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=env,
                              cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        pytest.fail(f"the render was still running after {CHILD_TIMEOUT} s: {template[:200]!r}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("template, fragment, limits", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_template_is_stopped_in_bounded_time_and_memory(template, fragment, limits):
    got = render_in_child(template, **limits)
    assert got["error"] == "ChatTemplateError", got
    assert "chat template 'test' stopped:" in got["message"], got
    assert re.search(fragment, got["message"]), got
    assert got["growth_mb"] < MEMORY_GROWTH_MB, got


def test_a_runaway_render_is_stopped_at_its_deadline_in_process():
    """The same bound without a child: library code (textwrap) that loops
    without a template step is stopped within a moment of the deadline."""
    fmt = ChatFormat("test", "{{ ('x' * 1000000)|wordwrap(2) }}", limits=TemplateLimits(timeout=0.5))
    with pytest.raises(ChatTemplateError, match=r"stopped: it ran longer than 0.5 s \(timeout\)"):
        fmt.render([USER])


# ------------------------------------------------------------------ what stays allowed renders as before

def _reference(template, messages):
    """The template rendered by jinja's own immutable sandbox, set up as llminfer's."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from llminfer.text.chat import _tojson

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="",
                                            eos_token="", tools=None, documents=None)


ORDINARY = [
    "{{ 'ab'|center(9) }}|{{ 'x'.ljust(4) }}|{{ 'x'.rjust(4, '.') }}|{{ '7'.zfill(3) }}|{{ 'a\\tb'.expandtabs(4) }}",
    "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent('> ', first=true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}",
    "{{ 'the quick brown fox jumps over the lazy dog'|wordwrap(10) }}|{{ 'abcdefghij'|wordwrap(3, wrapstring='/') }}",
    "{{ messages|join(', ', attribute='role') }}|{{ [1, 2, 3]|join('-') }}|{{ range(5)|join }}"
    "|{{ ', '.join(['a', 'b']) }}|{{ [[1], [2]]|join }}|{{ '-'.join('abc') }}"
    "|{{ (messages|map(attribute='role'))|join }}",
    "{{ [1, 2, 3]|sum }}|{{ [[1], [2, 3]]|sum(start=[]) }}|{{ [(1,), (2,)]|sum(start=()) }}"
    "|{{ [{'n': 1}, {'n': 2}]|sum(attribute='n') }}|{{ [1.5, 2]|sum }}",
    "{{ '%s is %d' % ('Ann', 30) }}|{{ '%(a)s-%(a)s' % {'a': 'x'} }}|{{ '%5.1f%%' % 3.14159 }}"
    "|{{ '%s'|format('y') }}|{{ '%(k)s'|format(k='v') }}",
    "{{ '{} and {}'.format('a', 'b') }}|{{ '{0}{0}'.format('x') }}|{{ '{name:>6}'.format(name='z') }}"
    "|{{ '{:,}'.format(1234567890) }}|{{ '{a}'.format_map({'a': 1}) }}|{{ '{0[1]}'.format('xy') }}",
    "{{ 'aXbXc'|replace('X', '--') }}|{{ 'aXbXc'|replace('X', '--', 1) }}|{{ 'aaa'.replace('a', 'bb', 2) }}",
    "{{ 'see www.example.com now'|urlize }}|{{ 'a long sentence here'|truncate(9) }}"
    "|{{ 'abcdef'|truncate(4, true, '!', 0) }}",
    "{{ 1000000000000|filesizeformat }}|{{ 123456789|string }}|{{ 10 ** 12 }}|{{ 2 ** 100 }}|{{ 123456789|abs }}",
    "{{ [3, 1, 2]|sort|list }}|{{ {'b': 1, 'a': 2}|dictsort }}|{{ [1, 1, 2]|unique|list }}"
    "|{{ range(7)|batch(3, 0)|list }}|{{ range(7)|slice(3, 0)|list }}|{{ [3, 1]|reverse|list }}|{{ 'abc'|reverse }}",
    "{{ 'Hello World'|list|length }}|{{ 'hi'|list }}|{{ messages|map(attribute='role')|list }}"
    "|{{ messages|selectattr('role', 'eq', 'user')|list|length }}|{{ [1, 2, 3]|select('odd')|list }}",
    "{{ '<b>x</b> & y'|striptags }}|{{ '<a & b>'|e }}|{{ {'a': 'b c'}|xmlattr }}|{{ 'a b&c'|urlencode }}"
    "|{{ 'Hello World'|wordcount }}|{{ 'hello'|title }}|{{ [1, 2]|first }}|{{ [1, 2]|max }}",
    "{{ [1, [2, {'a': 'x'}]] }}|{{ (1, 2) }}|{{ {'k': [1, 2]} }}|{{ [1] * 3 }}|{{ [1] + [2] }}|{{ 'ab' ~ 3 ~ [1] }}"
    "|{{ 'ab' * 3 }}|{{ 7 // 2 }}|{{ 2 ** 10 }}|{% for a, b in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}",
    "{% set ns = namespace(a=[]) %}{% for m in messages %}{% set ns.a = ns.a + [m.role] %}{% endfor %}{{ ns.a }}",
    "{% macro m(x) %}[{{ x }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ m(1, 2, k=3) }}"
    "{% set t %}{{ m(4) }}{{ m(5) }}{% endset %}{{ t }}{% filter upper %}abc{% endfilter %}",
    "{{ lipsum(1, false, 5, 6)|wordcount }}|{{ dict(a=1)|length }}|{% set c = cycler('a', 'b') %}{{ c.next() }}"
    "{{ c.next() }}|{% set j = joiner('/') %}{{ j() }}x{{ j() }}y",
    "{{ messages[0].content.split()|length }}|{{ messages[0].content.strip().upper() }}"
    "|{{ messages[0].items()|list|length }}|{{ messages[0].get('role') }}|{{ messages[0].keys()|list }}"
    "|{{ messages[0].content.startswith('What') }}|{{ messages[0].content.rsplit(' ', 1)[-1] }}",
    "{{ {'a': 1, 'b': [1, 2]}|tojson }}|{{ {'a': [1, {'b': 2}]}|tojson(indent=2) }}"
    "|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': 'é\\n'}|tojson(sort_keys=true) }}"
    "|{{ ['é😀\\x01']|tojson(ensure_ascii=true) }}",
]


@pytest.mark.parametrize("template", ORDINARY)
def test_ordinary_uses_of_each_filter_and_method_render_as_jinja_renders_them(template):
    """The bounds refuse what is too large, not what is unusual: numbers
    above max_arg given as values (not widths) render too."""
    messages = [USER, {"role": "assistant", "content": "Paris."}]
    assert ChatFormat("test", template).render(messages) == _reference(template, messages)


@pytest.mark.parametrize("template, fragment", [
    ("{{ (5).bit_length() }}", r"int.bit_length\(\) is not allowed"),
    ("{{ 'x'.translate({}) }}", r"str.translate\(\) is not allowed"),
    ("{{ 'x'.maketrans('a', 'b') }}", r"str.maketrans\(\) is not allowed"),
    ("{{ [1].__len__() }}", "unsafe"),
    ("{{ 'x'|pprint }}", "the pprint filter is not available"),
])
def test_methods_off_the_list_are_refused(template, fragment):
    with pytest.raises(ChatTemplateError, match=fragment):
        ChatFormat("test", template).render([USER])


def test_every_filter_global_and_test_was_reviewed():
    """A filter, global or test a later jinja adds is left out until it is
    read for what it can build (chat_sandbox._REVIEWED_*)."""
    import jinja2.defaults

    from llminfer.text.chat import _ENV
    from llminfer.text.chat_sandbox import _REVIEWED_FILTERS, _REVIEWED_GLOBALS, _REVIEWED_TESTS

    assert set(_ENV.filters) == set(jinja2.defaults.DEFAULT_FILTERS) & _REVIEWED_FILTERS | {"tojson"}
    assert set(_ENV.tests) == set(jinja2.defaults.DEFAULT_TESTS) & _REVIEWED_TESTS
    assert set(_ENV.globals) == set(jinja2.defaults.DEFAULT_NAMESPACE) & _REVIEWED_GLOBALS \
        | {"raise_exception", "strftime_now"}
    assert set(jinja2.defaults.DEFAULT_FILTERS) <= _REVIEWED_FILTERS, "a new jinja filter to review"
    assert set(jinja2.defaults.DEFAULT_TESTS) <= _REVIEWED_TESTS, "a new jinja test to review"
