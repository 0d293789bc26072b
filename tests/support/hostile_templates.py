"""Chat templates that try to build gigabytes or escape the sandbox, with
the limits each must hit (the sandbox tests and the fuzz corpus)."""

DOUBLED = ("{% set ns = namespace(a=['x'], b=['x']) %}{% for i in range(64) %}"
           "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}")

# (an id, the template, the error's fragment naming the bound, TemplateLimits fields for the child)
HOSTILE = [
    # globals
    ("lipsum", "{{ lipsum(100000, false, 50000, 100000) }}", "the lipsum global would build", {}),
    # text filters whose output grows with a width, a count or a repeated argument
    ("wordwrap-wrapstring", "{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 100000) }}",
     "the wordwrap filter would build", {}),
    ("wordwrap-long-word", "{{ ('x' * 1000000)|wordwrap(2) }}", "it ran longer than 2 s", {"timeout": 2.0}),
    ("indent-lines", "{{ ('a\\n' * 1000000)|indent(100000) }}", "the indent filter would build", {}),
    ("indent-string", "{{ ('a\\n' * 1000000)|indent('x' * 100000) }}", "the indent filter would build", {}),
    ("urlize-target", "{{ ('www.a.com ' * 100000)|urlize(target='x' * 100000) }}",
     "the urlize filter would build", {}),
    ("format-filter-repeated-key", "{{ ('%(a)s' * 200000)|format(a='x' * 100000) }}",
     "the format filter would build", {}),
    ("percent-repeated-key", "{{ ('%(a)s' * 200000) % {'a': 'x' * 100000} }}", r"the operator % would build", {}),
    ("str-format-repeated-field", "{{ ('{0}' * 250000).format('x' * 100000) }}", r"format\(\) would build", {}),
    ("str-expandtabs", "{{ ('\\t' * 100000).expandtabs(100000) }}", r"expandtabs\(\) would build", {}),
    ("str-translate", "{{ ('x' * 100000).translate({120: 'y' * 100000}) }}", r"translate\(\) is not allowed", {}),
    # joins: of nested lists, of a generator, of a string
    ("join-nested-lists", "{% set a = ['x' * 1000] * 1000 %}{{ ([a] * 1000)|join }}", "would build", {}),
    ("join-generator", "{{ range(100000)|join('x' * 100000) }}", "the join filter would build", {}),
    ("str-join-string", "{{ ('x' * 100000).join('y' * 100000) }}", r"join\(\) would build", {}),
    ("join-sliced-fill", "{{ ['a']|slice(100000, 'x' * 1000000)|map('join')|join }}", "would build", {}),
    # containers: huge sums, lists of characters, lists of lists
    ("sum-lists", "{% set a = range(1000)|list %}{{ ([a] * 100000)|sum(start=[])|length }}", "would build", {}),
    ("list-of-characters", "{{ ('\u20ac' * 4000000)|list|length }}", "the list filter would build", {}),
    ("batch-of-one", "{{ ('x' * 4000000)|batch(1)|list|length }}", "would build", {}),
    # structures that share their items: small in memory, exponential to compare, hash or print
    ("compare-shared", DOUBLED + "{{ ns.a == ns.b }}", "a list would build", {}),
    ("sort-shared", DOUBLED + "{{ [ns.b, ns.a]|sort|length }}", "a list would build", {}),
    ("test-in-shared", DOUBLED + "{{ ns.a is in [ns.b] }}", "a list would build", {}),
    ("hash-shared-tuple", "{% set ns = namespace(t=(1,)) %}{% for i in range(64) %}{% set ns.t = (ns.t, ns.t) %}"
     "{% endfor %}{{ ns.t in {} }}", "a tuple would build", {}),
    ("dictsort-shared", DOUBLED + "{{ {'k': ns.a, 'j': ns.b}|dictsort(by='value') }}", "a list would build", {}),
    ("namespace-shared", "{% set ns = namespace(x=1) %}{% for i in range(64) %}"
     "{% set ns.x = namespace(a=ns.x, b=ns.x) %}{% endfor %}{{ ns.x }}", "Namespace\\(\\) would build", {}),
    ("tojson-indent", "{% set ns = namespace(x=1) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}"
     "{{ ns.x|tojson(indent=100000) }}", "the tojson filter would build", {}),
    ("tojson-indent-string", "{% set ns = namespace(x=1) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}"
     "{% endfor %}{{ ns.x|tojson(indent='x' * 100000) }}", "the tojson filter would build", {}),
    ("tojson-separators", "{{ (range(100000)|list)|tojson(separators=('x' * 100000, ':')) }}",
     "the tojson filter would build", {}),
    # text joined by the template itself: ~ chains, block sets, macro bodies
    ("tilde-chain", "{% set s = 'x' * 4000000 %}{{ (" + " ~ ".join(["s"] * 200) + ")|length }}",
     r"a concatenation \(~\) would build", {}),
    ("block-set", "{% set s = 'x' * 4000000 %}{% set t %}" + "{{ s }}" * 200 + "{% endset %}{{ t|length }}",
     "a block's text would build", {}),
    ("macro-body", "{% macro m(s) %}" + "{{ s }}" * 200 + "{% endmacro %}{{ m('x' * 4000000)|length }}",
     "a block's text would build", {}),
    # widths and counts (refused before this change too; kept here under the same child's bounds)
    ("str-ljust", "{{ 'x'.ljust(10**9) }}", r"ljust\(\) was given 1000000000, more than max_arg", {}),
    ("str-zfill", "{{ '1'.zfill(10**9) }}", r"zfill\(\) was given 1000000000, more than max_arg", {}),
    ("str-center", "{{ 'x'.center(10**9) }}", r"center\(\) was given 1000000000, more than max_arg", {}),
    ("range", "{{ range(10**9)|list }}", r"safe_range\(\) was given 1000000000, more than max_arg", {}),
    ("replace-growing", "{{ ('x' * 4000000)|replace('x', 'yy') }}", "the replace filter would build", {}),
    # library code that loops without a template step: the deadline is checked there too
    ("striptags-loop", "{% set s = '<a> ' * 1000000 %}{% for i in range(100000) %}{{ s|striptags }}{% endfor %}",
     "it ran longer than 2 s", {"timeout": 2.0}),
]
