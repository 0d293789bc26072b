"""gpt-oss's harmony chat format (llminfer.text.harmony through llminfer.text.reasoning
and the OpenAI layer): the analysis channel is reasoning_content, the final
channel content, a commentary message to functions.NAME a tool call;
reasoning_effort reaches the template. Tiny random models carry a small
harmony template written here after gpt-oss's (its system message, the
developer message with the functions' TypeScript namespace, the
<|start|>role...<|message|>...<|end|> turns); the replies are forced token by
token as in test_reasoning.py, so the expected texts come from the script.
One vocabulary has harmony's tags as tokens (as o200k_harmony does), the
other spells them over several tokens."""

import json

import numpy as np
import pytest

from llminfer import LLM, Llama
from llminfer.text.harmony import FORCED_CLOSE, HarmonySplitter

from tiny_models import TinyConfig, write_model

HARMONY = (
    '{%- macro ts(p) -%}{%- if p.type == "string" -%}string{%- elif p.type in ["integer", "number"] -%}number'
    '{%- else -%}any{%- endif -%}{%- endmacro -%}'
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n\n"
    "Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "{%- if tools %}\nCalls to these tools must go to the commentary channel: 'functions'.{%- endif %}<|end|>"
    '{%- set system = messages | selectattr("role", "equalto", "system") | list %}'
    "{%- if system or tools %}<|start|>developer<|message|>"
    "{%- if system %}# Instructions\n\n{{ system[0].content }}\n\n{% endif %}"
    "{%- if tools %}# Tools\n\n## functions\n\nnamespace functions {\n"
    "{%- for t in tools %}\n\n// {{ t.function.description }}\ntype {{ t.function.name }} = (_: {\n"
    "{% for name, p in t.function.parameters.properties.items() %}{{ name }}: {{ ts(p) }},\n{% endfor %}"
    "}) => any;{%- endfor %}\n\n} // namespace functions{%- endif %}<|end|>{%- endif %}"
    "{%- for m in messages %}"
    '{%- if m.role == "user" %}<|start|>user<|message|>{{ m.content }}<|end|>'
    '{%- elif m.role == "assistant" and m.tool_calls %}{%- for c in m.tool_calls %}'
    "<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json<|message|>"
    "{{ c.function.arguments | tojson }}<|call|>{%- endfor %}"
    '{%- elif m.role == "assistant" %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>'
    '{%- elif m.role == "tool" %}<|start|>functions.{{ m.name | default("tool") }} to=assistant'
    "<|channel|>commentary<|message|>{{ m.content }}<|end|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")
TAGS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
MSGS = [{"role": "user", "content": "What is 2 + 2?"}]
THOUGHT, ANSWER = "The user adds two and two. That is four.", "2 + 2 = 4."
REPLY = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
         f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = ("<|channel|>analysis<|message|>I need the weather.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris"}<|call|>')


def _model(tmp_path_factory, name, tokens):
    root = tmp_path_factory.mktemp(name)
    return str(write_model(root / f"{name}.gguf", TinyConfig(tie_output=False, context_length=2048),
                           extra_strings={"tokenizer.chat_template": HARMONY}, extra_tokens=tokens))


@pytest.fixture(scope="module")
def harmony_path(tmp_path_factory):
    """o200k_harmony's way: the tags are control tokens."""
    return _model(tmp_path_factory, "harmony", {t: 3 for t in TAGS})


@pytest.fixture(scope="module")
def tagged(harmony_path):
    with LLM(harmony_path, n_ctx=1024, n_threads=1) as m:
        yield m


@pytest.fixture(scope="module")
def spelled(tmp_path_factory):
    """No harmony token in the vocabulary: each tag is spelled over several tokens."""
    with LLM(_model(tmp_path_factory, "spelled", None), n_ctx=1024, n_threads=1) as m:
        yield m


@pytest.fixture(params=["tagged", "spelled"])
def model(request):
    return request.getfixturevalue(request.param)


class Script:
    """A logits_processor that makes the model write `text` (then the end
    of generation, or with then_free, whatever the model chooses); prompt
    is the token ids it first saw."""

    def __init__(self, llm, text, then_free=False):
        self.ids = llm.tokenize(text, add_bos=False, special=True)
        self.eos = llm.tokenizer.eos_id
        self.free = then_free
        self.i = 0
        self.prompt = None

    def __call__(self, input_ids, scores):
        if self.prompt is None:
            self.prompt = list(input_ids)
        if self.i >= len(self.ids) and self.free:
            return scores
        tok = self.ids[self.i] if self.i < len(self.ids) else self.eos
        self.i += 1
        out = np.full_like(scores, -np.inf)
        out[tok] = 0.0
        return out


def _chat(llm, text, **kw):
    return llm.create_chat_completion(kw.pop("messages", MSGS), max_tokens=kw.pop("max_tokens", 256), temperature=0,
                                      logits_processor=Script(getattr(llm, "llm", llm), text), **kw)


def _streamed(llm, text, **kw):
    chunks = list(_chat(llm, text, stream=True, **kw))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas),
            chunks[-1]["choices"][0]["finish_reason"], deltas)


def test_the_template_is_harmony_and_end_is_no_stop(model):
    """<|end|> closes the analysis, not the turn: a harmony template's stops
    are <|return|> and <|call|> (end-of-generation tokens where they are tokens)."""
    stops = model.chat_format.stop_texts
    assert "<|end|>" not in stops and {"<|return|>", "<|call|>"} <= set(stops)
    assert model.detokenize(model.chat_prompt(MSGS), skip_special=False).endswith("<|start|>assistant")


def test_a_whole_reply_is_split_by_channel(model):
    out = _chat(model, REPLY)
    msg = out["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)
    assert out["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in msg


def test_a_streamed_reply_is_split_by_channel(model):
    reasoning, content, finish, deltas = _streamed(model, REPLY)
    assert (reasoning, content, finish) == (THOUGHT, ANSWER, "stop")
    assert not any("<|" in d.get("content", "") + d.get("reasoning_content", "") for d in deltas)
    assert sum(1 for d in deltas if d.get("reasoning_content")) > 1  # it streams, it is not held to the end


def test_a_reply_cut_inside_the_analysis_gives_what_was_thought(model):
    head = "<|channel|>analysis<|message|>"
    n = len(model.tokenize(head, add_bos=False, special=True)) + 6
    whole = _chat(model, REPLY, max_tokens=n)
    c = model.chat_completion(MSGS, max_tokens=n, temperature=0, logits_processor=Script(model, REPLY))
    thought = model.detokenize(c.tokens, skip_special=False)[len(head):]
    assert thought and THOUGHT.startswith(thought)
    msg = whole["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"], whole["choices"][0]["finish_reason"]) == (thought, "", "length")
    reasoning, content, finish, _ = _streamed(model, REPLY, max_tokens=n)
    assert (reasoning, content, finish) == (thought, "", "length")


def test_a_tool_call_on_the_commentary_channel(model):
    prompt = Script(model, CALL)
    out = model.create_chat_completion(MSGS, max_tokens=256, temperature=0, tools=[WEATHER], logits_processor=prompt)
    text = model.detokenize(prompt.prompt, skip_special=False)
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in text  # the template's own tool listing
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"] == "I need the weather."
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert choice["message"]["content"] is None
    reasoning, content, finish, deltas = _streamed(model, CALL, tools=[WEATHER])
    assert (reasoning, content, finish) == ("I need the weather.", "", "tool_calls")
    named = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert named[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(d["function"]["arguments"] for d in named)) == {"city": "Paris"}
    # the call and its result render in the next turn, as gpt-oss's template writes them
    turn = MSGS + [{"role": "assistant", "content": None, "tool_calls": [dict(call)]},
                   {"role": "tool", "tool_call_id": call["id"], "name": "get_weather", "content": "Sunny"}]
    text = model.detokenize(model.chat_prompt(turn), skip_special=False)
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            '<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>Sunny<|end|>') in text


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_reasoning_effort_reaches_the_template(tagged, harmony_path, effort):
    def prompt_text(**kw):
        return tagged.detokenize(tagged.chat_prompt(MSGS, **kw), skip_special=False)

    assert "Reasoning: medium\n" in prompt_text()  # the template's default
    assert f"Reasoning: {effort}\n" in prompt_text(reasoning_effort=effort)
    assert f"Reasoning: {effort}\n" in prompt_text(chat_template_kwargs={"reasoning_effort": effort})
    # through create_chat_completion, the prompt the model reads
    seen = Script(tagged, REPLY)
    tagged.create_chat_completion(MSGS, max_tokens=4, reasoning_effort=effort, logits_processor=seen)
    assert f"Reasoning: {effort}\n" in tagged.detokenize(seen.prompt, skip_special=False)
    with Llama(harmony_path, n_ctx=1024, n_threads=1, verbose=False) as llama:
        seen = Script(llama.llm, REPLY)
        out = llama.create_chat_completion(MSGS, max_tokens=256, temperature=0, reasoning_effort=effort,
                                           logits_processor=seen)
        assert f"Reasoning: {effort}\n" in llama.llm.detokenize(seen.prompt, skip_special=False)
        msg = out["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)


def test_the_budget_ends_the_analysis_and_opens_the_final_message(model):
    """The model opens its analysis (scripted), then writes freely: after 3
    tokens the end of the analysis and the final header are forced."""
    head = model.tokenize("<|channel|>analysis<|message|>", add_bos=False, special=True)
    close = model.tokenize(FORCED_CLOSE, add_bos=False, special=True)
    n = len(head) + 3
    out = model.chat_completion(MSGS, max_tokens=n + len(close) + 2, temperature=0, reasoning_budget=3,
                                logits_processor=Script(model, "<|channel|>analysis<|message|>", then_free=True))
    assert out.tokens[n:n + len(close)] == close
    thought, content, _ = HarmonySplitter.split(model.detokenize(out.tokens, skip_special=False))
    assert thought == model.detokenize(out.tokens[len(head):n], skip_special=False)
    assert content == model.detokenize(out.tokens[n + len(close):], skip_special=False)


def test_the_splitter_holds_a_tag_split_anywhere():
    """Fed one character at a time, and in every two-piece cut, the same
    split as whole."""
    want = HarmonySplitter.split(CALL.replace("<|call|>", "") + "<|end|>" + REPLY)
    text = CALL.replace("<|call|>", "") + "<|end|>" + REPLY
    for cuts in [list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]:
        s = HarmonySplitter()
        r = c = ""
        for piece in cuts:
            a, b = s.feed(piece)
            r, c = r + a, c + b
        a, b = s.finish()
        assert ((r + a) or None, c + b, s.calls) == want
    assert want == ("I need the weather." + THOUGHT, ANSWER, [{"name": "get_weather", "arguments": {"city": "Paris"}}])
    # a model that writes no header: all content
    assert HarmonySplitter.split("Hello there.") == (None, "Hello there.", [])


def _play_in_the_core(monkeypatch, llm):
    """play(text): every sequence the generation core runs from now on
    writes text, then ends (where no logits_processor can be passed: the
    server, the CLI)."""
    from llminfer.generation import generator as generation

    script = {}
    mask = generation.Generator.mask

    def scripted(self, logits):  # each sequence (Generator) plays the script from its start
        logits = mask(self, logits)
        i = getattr(self, "_script_i", 0)
        self._script_i = i + 1
        ids = script["ids"]
        out = np.full_like(logits, -np.inf)
        out[ids[i] if i < len(ids) else llm.tokenizer.eos_id] = 0.0
        return out

    monkeypatch.setattr(generation.Generator, "mask", scripted)
    return lambda text: script.update(ids=llm.tokenize(text, add_bos=False, special=True))


def test_the_server_reads_harmony(harmony_path, tagged, monkeypatch):
    """/v1/chat/completions with the openai client, whole and streamed, a
    tool call, and reasoning_effort in the prompt the model reads; the
    replies are forced by a script played in the generation core."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from llminfer.server import ServeArgs
    from servers import ServerThread

    play = _play_in_the_core(monkeypatch, tagged)
    srv = ServerThread(ServeArgs(model=harmony_path, n_ctx=1024, n_threads=1))
    try:
        prompt_len = {e: len(tagged.chat_prompt(MSGS, reasoning_effort=e)) for e in ("low", "high")}
        assert prompt_len["low"] != prompt_len["high"]
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        play(REPLY)
        out = c.chat.completions.create(model="gpt-oss", messages=MSGS, max_tokens=256, temperature=0)
        msg = out.choices[0].message
        assert (msg.reasoning_content, msg.content, out.choices[0].finish_reason) == (THOUGHT, ANSWER, "stop")
        parts = {"reasoning_content": "", "content": ""}
        for chunk in c.chat.completions.create(model="gpt-oss", messages=MSGS, max_tokens=256, temperature=0,
                                               stream=True):
            for k in parts:
                parts[k] += (getattr(chunk.choices[0].delta, k, None) or "") if chunk.choices else ""
        assert parts == {"reasoning_content": THOUGHT, "content": ANSWER}
        play(CALL)
        out = c.chat.completions.create(model="gpt-oss", messages=MSGS, max_tokens=256, temperature=0, tools=[WEATHER])
        (call,) = out.choices[0].message.tool_calls
        assert out.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        assert out.choices[0].message.reasoning_content == "I need the weather."
        anthropic = pytest.importorskip("anthropic")
        a = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)
        tool = {"name": "get_weather", "description": "The weather in a city",
                "input_schema": WEATHER["function"]["parameters"]}
        m = a.messages.create(model="gpt-oss", max_tokens=256, messages=MSGS, tools=[tool])
        assert [b.type for b in m.content] == ["thinking", "tool_use"] and m.stop_reason == "tool_use"
        assert (m.content[0].thinking, m.content[1].name, m.content[1].input) == \
            ("I need the weather.", "get_weather", {"city": "Paris"})
        play(REPLY)
        for effort in ("low", "high"):
            out = c.chat.completions.create(model="gpt-oss", messages=MSGS, max_tokens=2, reasoning_effort=effort)
            assert out.usage.prompt_tokens == prompt_len[effort]
        r = c.responses.create(model="gpt-oss", input=MSGS[0]["content"], max_output_tokens=96,
                               reasoning={"effort": "high"})
        assert [o.type for o in r.output] == ["reasoning", "message"]
        assert (r.output[0].content[0].text, r.output_text) == (THOUGHT, ANSWER)
    finally:
        srv.stop()


def test_a_grammar_applies_to_the_final_message_alone(model):
    """The header and the analysis are the model's (scripted here); the
    final message's body follows the schema (the model writes it freely)."""
    head = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    out = model.create_chat_completion(MSGS, max_tokens=256, temperature=0, logits_processor=Script(
        model, head, then_free=True), response_format={"type": "json_object", "schema": schema})
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == "Think."
    assert isinstance(json.loads(msg["content"])["n"], int) and out["choices"][0]["finish_reason"] == "stop"


def test_the_cli_passes_reasoning_effort_and_shows_the_analysis_apart(capsys, harmony_path, tagged, monkeypatch):
    """`llminfer run --reasoning-effort high`: the template gets it; the
    analysis is shown as the thinking, a blank line, then the final answer."""
    from llminfer.text import chat
    from cli_runs import run_main

    rendered = []
    render = chat.ChatFormat.render

    def recording(self, messages, add_generation_prompt=True, **extra):
        rendered.append(render(self, messages, add_generation_prompt, **extra))
        return rendered[-1]

    monkeypatch.setattr(chat.ChatFormat, "render", recording)
    play = _play_in_the_core(monkeypatch, tagged)
    play(REPLY)
    args = ["run", harmony_path, MSGS[0]["content"], "-n", 256, "--temp", 0, "-t", 1, "-c", 1024]
    code, shown, err = run_main(capsys, *args, "--reasoning-effort", "high")
    assert code == 0, err
    assert shown == f"{THOUGHT}\n\n{ANSWER}\n"
    asked = [t for t in rendered if MSGS[0]["content"] in t]  # (a probe renders "Hi" alone)
    assert asked and all("Reasoning: high\n" in t for t in asked)
    rendered.clear()
    code, shown, err = run_main(capsys, *args, "--hide-thinking")
    assert code == 0 and shown == f"{ANSWER}\n", err
    asked = [t for t in rendered if MSGS[0]["content"] in t]
    assert asked and all("Reasoning: medium\n" in t for t in asked)


def _gpt_oss_template():
    """gpt-oss's own chat template, from llama.cpp's models/templates (the
    peer's source tree, $LLMINFER_LLAMA_CPP or /work/peer/*/vendor/llama.cpp);
    None where there is none."""
    import glob
    import os
    from pathlib import Path

    roots = [os.environ["LLMINFER_LLAMA_CPP"]] if os.environ.get("LLMINFER_LLAMA_CPP") else \
        sorted(glob.glob("/work/peer/*/vendor/llama.cpp"))
    for root in roots:
        p = Path(root) / "models" / "templates" / "openai-gpt-oss-120b.jinja"
        if p.is_file():
            return p.read_text(encoding="utf-8")
    return None


def test_gpt_oss_own_template(tmp_path):
    """gpt-oss's real template (llama.cpp's copy) in llminfer's sandbox: read
    as harmony, reasoning_effort in its system message, the tools as its
    TypeScript namespace, a call and its result in the next turn; a reply
    read by channel."""
    template = _gpt_oss_template()
    if template is None:
        pytest.skip("llama.cpp's models/templates/openai-gpt-oss-120b.jinja is not here (set LLMINFER_LLAMA_CPP)")
    path = write_model(tmp_path / "gpt-oss.gguf", TinyConfig(tie_output=False, context_length=4096),
                       extra_strings={"tokenizer.chat_template": template}, extra_tokens={t: 3 for t in TAGS})
    with LLM(str(path), n_ctx=4096, n_threads=1) as m:
        assert "<|end|>" not in m.chat_format.stop_texts

        def text(msgs, **kw):
            return m.detokenize(m.chat_prompt(msgs, **kw), skip_special=False)

        assert "\nReasoning: medium\n" in text(MSGS) and "\nReasoning: high\n" in text(MSGS, reasoning_effort="high")
        seen = Script(m, CALL)
        out = m.create_chat_completion(MSGS, max_tokens=256, temperature=0, tools=[WEATHER], logits_processor=seen)
        assert "type get_weather = (_: {\ncity: string,\n}) => any;" in m.detokenize(seen.prompt, skip_special=False)
        (call,) = out["choices"][0]["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        turn = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": call["id"], "content": "Sunny"}]
        assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
                '<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>') in text(turn)
        msg = _chat(m, REPLY)["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)
