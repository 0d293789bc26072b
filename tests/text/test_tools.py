"""Tool calling (llminfer.text.tools): the parsers of each family's format on
text, tools rendered by templates, and the end-to-end path with SmolLM2
where a required call must parse and validate against its schema."""

import json

import pytest

from llminfer import LLM
from llminfer.text.chat import ChatFormat
from llminfer.errors import InvalidArgumentError
from llminfer.text.tools import check_tools, detect_format, parse_tool_calls, prepare_messages

jsonschema = pytest.importorskip("jsonschema")

W = {"city": "Paris", "unit": "c"}
A = {"a": 2, "b": 3.5}


# ---- parsers, one family at a time ----

@pytest.mark.parametrize("fmt, text, content", [
    # Qwen 2.5 / 3, Hermes
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>', None),
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
               '\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3.5}}\n</tool_call>',
     "Let me check."),
    # Llama 3.1 / 3.2 JSON (parameters), with and without <|python_tag|>
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', None),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}; '
               '{"name": "add", "parameters": {"a": 2, "b": 3.5}}', None),
    # Mistral v0.3 and the newer [ARGS] form
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
                '{"name": "add", "arguments": {"a": 2, "b": 3.5}}]', None),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}', None),
    # Gemma: Python calls in a tool_code block, or a bare list of calls
    ("gemma", 'Sure.\n```tool_code\nget_weather(city="Paris", unit=\'c\')\n```', "Sure."),
    ("gemma", '[get_weather(city="Paris", unit="c"), add(a=2, b=3.5)]', None),
    ("gemma", '```tool_code\n{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}\n```', None),
    # Phi-4-mini
    ("phi", 'functools[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
            '{"name": "add", "arguments": {"a": 2, "b": 3.5}}]', None),
    ("phi", '<|tool_call|>[{"type": "function", "function": {"name": "get_weather", '
            '"arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"c\\"}"}}]<|/tool_call|>', None),
])
def test_parsers(fmt, text, content):
    got_content, calls = parse_tool_calls(text, fmt)
    assert got_content == content
    assert calls[0] == {"name": "get_weather", "arguments": W}
    if len(calls) > 1:
        assert calls[1] == {"name": "add", "arguments": A}


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "gemma", "phi"])
def test_plain_text_has_no_calls(fmt):
    for text in ["The weather in Paris is fine.", 'A JSON example: {"a": 1} in a sentence.',
                 "<tool_call>\nnot json\n</tool_call>", "```python\nprint(1)\n```", "functools[oops"]:
        content, calls = parse_tool_calls(text, fmt)
        assert calls == [] and content == text, (fmt, text)


def test_a_format_falls_back_to_the_others():
    # a ChatML model (SmolLM2) prompted with the Hermes system prompt
    _, calls = parse_tool_calls('functools[{"name": "add", "arguments": {"a": 2, "b": 3.5}}]', "hermes")
    assert calls == [{"name": "add", "arguments": A}]


def test_detect_format():
    assert detect_format("{% for t in tools %}<tool_call>{% endfor %}", {}) == "hermes"
    assert detect_format("[TOOL_CALLS]", {}) == "mistral"
    assert detect_format("<|python_tag|>", {"general.architecture": "llama"}) == "llama3"
    assert detect_format("x", {"general.architecture": "gemma3"}) == "gemma"
    assert detect_format("x", {"general.architecture": "phi3"}) == "phi"
    assert detect_format("x", {"general.architecture": "llama"}) == "hermes"


# ---- arguments and messages ----

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "additionalProperties": False,
                                                     "properties": {"city": {"type": "string", "maxLength": 40},
                                                                    "unit": {"enum": ["c", "f"]}},
                                                     "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "additionalProperties": False,
                                                     "properties": {"a": {"type": "integer", "minimum": -9999,
                                                                          "maximum": 9999},
                                                                    "b": {"type": "integer", "minimum": -9999,
                                                                          "maximum": 9999}},
                                                     "required": ["a", "b"]}}},
]


def test_check_tools():
    funcs, choice = check_tools(TOOLS, None)
    assert [f["name"] for f in funcs] == ["get_weather", "add"] and choice == "auto"
    assert check_tools(TOOLS, {"type": "function", "function": {"name": "add"}})[1] == "add"
    with pytest.raises(InvalidArgumentError, match="not in tools"):
        check_tools(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(InvalidArgumentError, match="tool_choice"):
        check_tools(TOOLS, "always")
    with pytest.raises(InvalidArgumentError, match="tools"):
        check_tools([{"type": "retrieval"}], None)
    with pytest.raises(InvalidArgumentError, match="needs tools"):
        check_tools(None, "required")
    with pytest.raises(InvalidArgumentError, match="distinct"):
        check_tools(TOOLS + TOOLS[:1], None)


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
]

# the tool part of Qwen 2.5's template, enough to check what it is given
_QWEN_LIKE = r"""
{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}<|im_start|>assistant
"""


def test_tool_turns_render_in_a_tool_template():
    fmt = ChatFormat("qwen-like", _QWEN_LIKE)
    text = fmt.render(prepare_messages(HISTORY, True), tools=TOOLS)
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}' in text  # a dict, not a string
    assert "<tool_response>18 C</tool_response>" in text
    assert '"name": "add"' in text


def test_tool_turns_render_in_a_plain_template():
    fmt = ChatFormat("chatml", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                               "{% endfor %}")
    text = fmt.render(prepare_messages(HISTORY, False))
    assert "<tool_call>" in text and '"city": "Paris"' in text
    assert "<tool_response>\n18 C\n</tool_response>" in text


# ---- end to end with SmolLM2 ----
# The tools' schemas bound every argument (lengths, ranges), so a required
# call fits in max_tokens and always closes.

@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with LLM(smollm2_path, n_ctx=2048, n_threads=2) as m:
        yield m


def _schema(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


@pytest.mark.parametrize("prompt", ["What's the weather in Rome, in fahrenheit?", "What is 2 plus 40?"])
def test_required_call_is_valid(smollm2, prompt):
    for seed in range(2):
        out = smollm2.create_chat_completion([{"role": "user", "content": prompt}], tools=TOOLS,
                                             tool_choice="required", max_tokens=96, seed=seed, temperature=0.8)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        calls = choice["message"]["tool_calls"]
        assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
        f = calls[0]["function"]
        jsonschema.validate(json.loads(f["arguments"]), _schema(f["name"]))


def test_named_function(smollm2):
    out = smollm2.create_chat_completion([{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
                                         tool_choice={"type": "function", "function": {"name": "add"}},
                                         max_tokens=96, seed=3)
    f = out["choices"][0]["message"]["tool_calls"][0]["function"]
    assert f["name"] == "add"
    jsonschema.validate(json.loads(f["arguments"]), _schema("add"))


def test_streamed_call(smollm2):
    chunks = list(smollm2.create_chat_completion([{"role": "user", "content": "Add 1 and 2."}], tools=TOOLS,
                                                 tool_choice="required", max_tokens=96, seed=4, stream=True))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert deltas[0]["index"] == 0 and deltas[0]["type"] == "function" and deltas[0]["function"]["arguments"] == ""
    name = deltas[0]["function"]["name"]
    args = "".join(d["function"].get("arguments", "") for d in deltas)
    jsonschema.validate(json.loads(args), _schema(name))


def test_auto_and_none_and_history(smollm2):
    out = smollm2.create_chat_completion(HISTORY, tools=TOOLS, tool_choice="auto", max_tokens=24, seed=5)
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant"
    if msg.get("tool_calls"):
        assert out["choices"][0]["finish_reason"] == "tool_calls"
    else:
        assert isinstance(msg["content"], str)
    out = smollm2.create_chat_completion(HISTORY, tools=TOOLS, tool_choice="none", max_tokens=8, seed=5)
    assert "tool_calls" not in out["choices"][0]["message"]
    # tool turns without tools= too
    assert isinstance(smollm2.chat(HISTORY, max_tokens=4, seed=1), str)


DEEP = "[" * 5000  # a model can write this by itself; json's parser recurses once per level


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "gemma", "phi"])
@pytest.mark.parametrize("reply", [
    "<tool_call>" + DEEP, '<tool_call>{"name": "f", "arguments": ' + DEEP, "[TOOL_CALLS]" + DEEP,
    "```tool_code\nf(a=" + DEEP + ")\n```", "functools" + DEEP, '{"name": "f", "arguments": ' + DEEP,
    "[TOOL_CALLS]f[ARGS]" + '{"a":' * 3000, '<tool_call>{"name": "f", "arguments": "' + "[" * 3000 + '"}',
    "<tool_call>" + "[" * 300 + "]" * 300 + "</tool_call>",
    '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 500 + "]" * 500 + "}}</tool_call>",
], ids=["hermes-open", "args-open", "mistral", "gemma-python", "phi", "bare", "mistral-args", "args-string",
        "hermes-300", "args-500"])
def test_a_reply_nested_too_deep_is_plain_text(fmt, reply):
    """A reply nested past jsonlimits.MAX_DEPTH is not a call: its text comes
    back as content, never a RecursionError."""
    content, calls = parse_tool_calls(reply, fmt)
    assert calls == [] and content == reply


def test_deep_arguments_and_parameters_in_a_request_are_refused():
    deep = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidArgumentError, match=r"tools\[0\].function.parameters nests deeper"):
        check_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                   "x": deep}}}], "auto")
    for args in ({"a": deep}, DEEP + "]" * 5000, "[" * 200 + "]" * 200):
        msgs = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": args}}]}]
        with pytest.raises(InvalidArgumentError, match=r"messages\[0\].tool_calls' arguments nests deeper"):
            prepare_messages(msgs, knows_tools=False)
    # arguments that are not JSON are rendered as the text they are
    msgs = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{no"}}]}]
    assert "{no" in prepare_messages(msgs, knows_tools=False)[0]["content"]
