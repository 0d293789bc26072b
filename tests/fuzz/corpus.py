"""Seed inputs: small valid GGUF files (a tiny llama that loads and runs,
its variants, bare headers) and chat templates (the built-in formats, the
templates of the cached test models, a few that lean on the sandbox, and
the hostile ones the sandbox must stop)."""

from __future__ import annotations

import glob
import json
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
    from llminfer.text.chat import _BUILTINS

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
    from llminfer.core.gguf_file import GGUFFile

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
    from hostile_templates import HOSTILE

    return [template for _, template, _, limits in HOSTILE if "timeout" not in limits]


def http_seeds() -> list:
    """Valid requests for each endpoint, as "PATH\nBODY"."""
    user = {"role": "user", "content": "ab"}
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    reqs = [
        ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "temperature": 0}),
        ("/v1/completions", {"prompt": ["ab", "cd"], "max_tokens": 1, "n": 2, "seed": 3, "top_p": 0.9,
                             "top_k": 5, "min_p": 0.1, "logit_bias": {"3": 1.5}, "stop": ["x"], "logprobs": 2}),
        ("/v1/completions", {"prompt": [3, 4, 5], "max_tokens": 2, "stream": True, "echo": True, "logprobs": 1,
                             "stream_options": {"include_usage": True}, "presence_penalty": 0.5,
                             "frequency_penalty": -0.5, "repeat_penalty": 1.1}),
        ("/v1/chat/completions", {"messages": [user], "max_tokens": 2, "temperature": 0.7, "seed": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"}, user], "max_tokens": 2,
                                  "stream": True, "logprobs": True, "top_logprobs": 2}),
        ("/v1/chat/completions", {"messages": [user], "max_tokens": 3, "response_format": {
            "type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object", "properties": {
                "a": {"type": "array", "items": {"type": "integer"}}}}}}}),
        ("/v1/chat/completions", {"messages": [user, call, {"role": "tool", "tool_call_id": "c1", "content": "2"}],
                                  "tools": [tool], "tool_choice": "auto", "max_tokens": 2, "stream": True}),
        ("/v1/chat/completions", {"messages": [user], "tools": [tool], "tool_choice": "required", "max_tokens": 4}),
        ("/v1/chat/completions", {"messages": [user], "max_tokens": 2, "grammar": 'root ::= "a" [b-d]*'}),
        ("/v1/embeddings", {"input": ["ab", "cd"], "encoding_format": "base64"}),
        ("/v1/embeddings", {"input": [[3, 4], [5]]}),
        ("/tokenize", {"prompt": "abc", "add_special_tokens": False}),
        ("/tokenize", {"messages": [user]}),
        ("/detokenize", {"tokens": [3, 4, 5]}),
    ]
    return [path.encode() + b"\n" + json.dumps(body).encode() for path, body in reqs]


SEEDS = {"gguf": gguf_seeds, "gguf-run": gguf_seeds, "template": template_seeds,
         "http": http_seeds}


def write(directory, target):
    """Write the seeds of `target` as files (for atheris's corpus directory)."""
    os.makedirs(directory, exist_ok=True)
    for i, data in enumerate(SEEDS[target]()):
        with open(os.path.join(directory, f"seed-{i:02d}"), "wb") as f:
            f.write(data)
