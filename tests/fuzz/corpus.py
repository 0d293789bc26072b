"""Seed inputs: small valid GGUF files (a tiny llama that loads and runs,
its variants, bare headers) and chat templates (the built-in formats, the
templates of the cached test models, a few that lean on the sandbox, and
the hostile ones the sandbox must stop)."""

from __future__ import annotations

import glob
import os

from gguf import GGMLQuantizationType, GGUFValueType

from gguf_bytes import Tensor, gguf_bytes, kv, tiny_llama

_TEMPLATE_OF_LLAMA = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                      "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                      "{% endif %}")


def gguf_seeds() -> list:
    F32 = GGMLQuantizationType.F32
    return [
        tiny_llama(),
        tiny_llama(n_layer=2, n_head=4, n_head_kv=2, seed=1),
        tiny_llama(replace={"tokenizer.chat_template": kv("tokenizer.chat_template", _TEMPLATE_OF_LLAMA)}),
        tiny_llama(alignment=64, replace={"general.alignment": kv("general.alignment", 64)}),
        gguf_bytes([kv("general.architecture", "llama"), kv("a", [1, 2, 3], etype=GGUFValueType.INT64),
                    kv("s", ["x", "yz"]), kv("f", 1.5, GGUFValueType.FLOAT64)],
                   [Tensor("w", (2, 32), GGMLQuantizationType.Q8_0, bytes(68)), Tensor("v", (8,), F32, bytes(32))]),
        gguf_bytes([]),
    ]


def template_seeds() -> list:
    from llminfer.chat import _BUILTINS

    out = [t for t, _ in _BUILTINS.values()]
    out += [
        "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content %}{% endfor %}{{ ns.s }}",
        "{% macro f(n) %}{{ n }}{% if n < 5 %}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
        "{{ messages|tojson(indent=2) }}{{ '%s-%d' % ('a', 3) }}{{ '{:>4}'.format('x') }}",
        "{% for i in range(10) %}{{ loop.index }}{{ 'ab' * i }}{% endfor %}{{ raise_exception('no') if false }}",
        "{{ bos_token }}{% for m in messages %}{{ m.role|upper|center(12) }}{{ m.content|replace('a', 'bb') }}"
        "{% endfor %}",
    ]
    out += _hostile_templates()
    from llminfer.gguf_file import GGUFFile

    cache = os.environ.get("LLMINFER_CACHE", os.path.expanduser("~/.cache/llminfer"))
    for path in sorted(glob.glob(os.path.join(cache, "models", "*.gguf"))):
        try:
            with GGUFFile(path) as g:
                t = g.metadata.get("tokenizer.chat_template")
        except Exception:
            continue
        if isinstance(t, str):
            out.append(t)
    return [t.encode("utf-8") for t in out]


def _hostile_templates() -> list:
    """The hostile constructs of test_chat_sandbox.py (a filter, global,
    method or operator asked to build gigabytes, structures that share their
    items), which the sandbox stops by a size bound, before they are built;
    those stopped by the deadline would spend it on every mutation."""
    from test_chat_sandbox import HOSTILE

    return [template for _, template, _, limits in HOSTILE if "timeout" not in limits]


SEEDS = {"gguf": gguf_seeds, "gguf-run": gguf_seeds, "template": template_seeds}


def write(directory, target):
    """Write the seeds of `target` as files (for atheris's corpus directory)."""
    os.makedirs(directory, exist_ok=True)
    for i, data in enumerate(SEEDS[target]()):
        with open(os.path.join(directory, f"seed-{i:02d}"), "wb") as f:
            f.write(data)
