"""A thinking model's reasoning apart from its answer (llminfer.text.reasoning,
the OpenAI layer in llminfer.generation.openai_shapes): tiny random models whose chat
templates write <think> as Qwen3's and DeepSeek-R1's do. The replies are
forced token by token (a logits_processor that plays a script, then lets
the model go on), so the expected texts come from the script, not from
the model; where the model writes freely, the checks read its tokens."""

import json

import numpy as np
import pytest

from llminfer import LLM, Llama
from llminfer.text.reasoning import CLOSE, OPEN, ReasoningSplitter

from tiny_models import TinyConfig, write_model

# R1-style: the prompt opens the thinking unless enable_thinking is false,
# which writes an empty one (Qwen3's way of turning it off)
FORCED_OPEN = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n"
               "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
               "{% else %}<think>\n{% endif %}{% endif %}")
# Qwen3-style: the model opens its thinking itself
SELF_OPEN = FORCED_OPEN.replace("{% else %}<think>\n{% endif %}", "{% endif %}")
THINK_TOKENS = {OPEN: 4, CLOSE: 4}
MSGS = [{"role": "user", "content": "What is 2 + 2?"}]


def _model(tmp_path_factory, name, template, tokens):
    root = tmp_path_factory.mktemp(name)
    return str(write_model(root / f"{name}.gguf", TinyConfig(tie_output=False, context_length=2048),
                           extra_strings={"tokenizer.chat_template": template}, extra_tokens=tokens))


@pytest.fixture(scope="module")
def forced_path(tmp_path_factory):
    return _model(tmp_path_factory, "forced", FORCED_OPEN, THINK_TOKENS)


@pytest.fixture(scope="module")
def forced(forced_path):
    with LLM(forced_path, n_ctx=1024, n_threads=1) as m:
        yield m


@pytest.fixture(scope="module")
def self_open(tmp_path_factory):
    with LLM(_model(tmp_path_factory, "self", SELF_OPEN, THINK_TOKENS), n_ctx=1024, n_threads=1) as m:
        yield m


@pytest.fixture(scope="module")
def bytewise(tmp_path_factory):
    """No <think> token in the vocabulary: the tags are spelled over several tokens."""
    with LLM(_model(tmp_path_factory, "bytewise", SELF_OPEN, None), n_ctx=1024, n_threads=1) as m:
        yield m


class Script:
    """A logits_processor that makes the model write `text` (then the end
    of generation, or with then_free, whatever the model and its grammar
    choose)."""

    def __init__(self, llm, text, then_free=False):
        self.ids = llm.tokenize(text, add_bos=False, special=True)
        self.eos = llm.tokenizer.eos_id
        self.free = then_free
        self.i = 0

    def __call__(self, input_ids, scores):
        if self.i >= len(self.ids) and self.free:
            return scores
        tok = self.ids[self.i] if self.i < len(self.ids) else self.eos
        self.i += 1
        out = np.full_like(scores, -np.inf)
        out[tok] = 0.0
        return out


def _chat(llm, script_text, **kw):
    return llm.create_chat_completion(MSGS, max_tokens=kw.pop("max_tokens", 64), temperature=0,
                                      logits_processor=Script(getattr(llm, "llm", llm), script_text,
                                                              kw.pop("then_free", False)), **kw)


def _streamed(llm, script_text, **kw):
    """(reasoning, content, finish_reason, the deltas) of a streamed chat."""
    chunks = list(_chat(llm, script_text, stream=True, **kw))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    return reasoning, content, chunks[-1]["choices"][0]["finish_reason"], deltas


THOUGHT, ANSWER = "The user adds two and two. That is four.", "2 + 2 = 4."


def test_the_reply_of_a_prompt_that_opens_the_thinking_is_split(forced):
    out = _chat(forced, f"{THOUGHT}\n{CLOSE}\n\n{ANSWER}")
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == THOUGHT and msg["content"] == ANSWER
    assert out["choices"][0]["finish_reason"] == "stop"
    reasoning, content, finish, _ = _streamed(forced, f"{THOUGHT}\n{CLOSE}\n\n{ANSWER}")
    assert (reasoning, content, finish) == (THOUGHT, ANSWER, "stop")


def test_llama_create_chat_completion_splits_too(forced_path):
    llama = Llama(forced_path, n_ctx=1024, n_threads=1, verbose=False)
    try:
        msg = _chat(llama, f"{THOUGHT}{CLOSE}{ANSWER}")["choices"][0]["message"]
        assert msg["reasoning_content"] == THOUGHT and msg["content"] == ANSWER
        chunks = list(_chat(llama, f"{THOUGHT}{CLOSE}{ANSWER}", stream=True))
        assert "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks) == THOUGHT
        raw = _chat(llama, f"{THOUGHT}{CLOSE}{ANSWER}", reasoning_format="none")["choices"][0]["message"]
        assert raw["content"] == f"{THOUGHT}{CLOSE}{ANSWER}" and "reasoning_content" not in raw
    finally:
        llama.close()


@pytest.mark.parametrize("fixture", ["self_open", "bytewise"])
def test_a_reply_that_opens_its_own_thinking_is_split_whole_and_streamed(request, fixture):
    """The model writes <think> itself (Qwen3); with `bytewise` the tags come
    over several tokens, and no piece of one leaks into either part."""
    llm = request.getfixturevalue(fixture)
    if fixture == "bytewise":
        assert len(llm.tokenize(CLOSE, add_bos=False, special=True)) > 1
    text = f"{OPEN}\n{THOUGHT}\n{CLOSE}\n\n{ANSWER}"
    msg = _chat(llm, text)["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)
    reasoning, content, _, deltas = _streamed(llm, text)
    assert (reasoning, content) == (THOUGHT, ANSWER)
    assert not any("<" in (d.get("content") or "") + d.get("reasoning_content", "") for d in deltas)


def test_the_splitter_on_the_tokens_of_a_real_vocabulary(bytewise):
    """Fed one token's text at a time (a tag over several), the splitter
    gives what it gives on the whole text."""
    text = f"  {OPEN}{THOUGHT}  {CLOSE}  {ANSWER}"
    ids = bytewise.tokenize(text, add_bos=False, special=True)
    s = ReasoningSplitter()
    parts = [s.feed(bytewise.detokenize([t])) for t in ids] + [s.finish()]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (THOUGHT, ANSWER)
    assert ReasoningSplitter.split(text) == (THOUGHT, ANSWER)
    assert ReasoningSplitter.split("Just an answer.") == (None, "Just an answer.")


def test_a_reply_cut_inside_the_thinking_gives_what_was_thought(forced):
    text = f"{THOUGHT}{CLOSE}{ANSWER}"
    ids = forced.tokenize(text, add_bos=False, special=True)
    thought_so_far = forced.detokenize(ids[:5]).strip()
    out = _chat(forced, text, max_tokens=5)
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == thought_so_far and msg["content"] == ""
    assert out["choices"][0]["finish_reason"] == "length"
    reasoning, content, finish, _ = _streamed(forced, text, max_tokens=5)
    assert (reasoning, content, finish) == (thought_so_far, "", "length")


def test_enable_thinking_reaches_the_template(forced):
    plain = forced.detokenize(forced.chat_prompt(MSGS), skip_special=False)
    off = forced.detokenize(forced.chat_prompt(MSGS, enable_thinking=False), skip_special=False)
    kw = forced.detokenize(forced.chat_prompt(MSGS, chat_template_kwargs={"enable_thinking": False}),
                           skip_special=False)
    assert plain.endswith(f"{OPEN}\n") and off.endswith(f"{OPEN}\n\n{CLOSE}\n\n") and kw == off
    # the thinking closed in the prompt: the reply is all answer
    msg = _chat(forced, ANSWER, enable_thinking=False)["choices"][0]["message"]
    assert msg["content"] == ANSWER and "reasoning_content" not in msg


def test_the_reasoning_budget_forces_the_end_of_the_thinking(forced):
    """The model writes freely: after 3 thinking tokens the closing tag comes."""
    close_id = forced.tokenizer.token_id(CLOSE)
    free = forced.chat_completion(MSGS, max_tokens=8, temperature=0)
    assert close_id not in free.tokens  # left alone, it does not stop thinking here
    out = forced.chat_completion(MSGS, max_tokens=8, temperature=0, reasoning_budget=3)
    assert out.tokens[3] == close_id and out.tokens[:3] == free.tokens[:3]
    msg = forced.create_chat_completion(MSGS, max_tokens=8, temperature=0, reasoning_budget=3)["choices"][0]["message"]
    assert msg["reasoning_content"] == forced.detokenize(free.tokens[:3]).strip()
    assert msg["content"] == forced.detokenize(out.tokens[4:]).lstrip()


def test_the_budget_forces_a_closing_tag_of_several_tokens(bytewise):
    """The model opens its thinking itself (scripted), then writes freely;
    the closing tag, spelled over several tokens here, comes after 2."""
    opening = bytewise.tokenize(OPEN, add_bos=False, special=True)
    close = bytewise.tokenize(CLOSE, add_bos=False, special=True)
    n = len(opening) + 2
    out = bytewise.chat_completion(MSGS, max_tokens=n + len(close) + 3, temperature=0, reasoning_budget=2,
                                   logits_processor=Script(bytewise, OPEN, then_free=True))
    assert out.tokens[n:n + len(close)] == close
    thought, _ = ReasoningSplitter.split(out.text)
    assert thought == bytewise.detokenize(out.tokens[len(opening):n]).strip()


def test_a_tool_call_made_after_thinking(forced):
    """The required call's grammar begins after the thinking; the call is
    parsed from the answer, the thinking comes back as reasoning."""
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}]
    text = f"I should call ping.{CLOSE}"
    for stream in (False, True):
        out = _chat(forced, text, then_free=True, tools=tools, tool_choice="required", stream=stream,
                    max_tokens=96)
        if stream:
            chunks = list(out)
            deltas = [c["choices"][0]["delta"] for c in chunks]
            assert "".join(d.get("reasoning_content", "") for d in deltas) == "I should call ping."
            names = [tc["function"]["name"] for d in deltas for tc in d.get("tool_calls", []) if "id" in tc]
            assert names == ["ping"] and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        else:
            choice = out["choices"][0]
            assert choice["message"]["reasoning_content"] == "I should call ping."
            assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["ping"]
            assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {}
            assert choice["finish_reason"] == "tool_calls"


def test_response_format_applies_to_the_answer(forced):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    out = _chat(forced, f"Think first.{CLOSE}", then_free=True, max_tokens=64,
                response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == "Think first."
    assert isinstance(json.loads(msg["content"])["ok"], bool)
    assert out["choices"][0]["finish_reason"] == "stop"


def test_a_grammar_lets_the_model_open_its_thinking_first(self_open):
    """Qwen3-style: under a grammar the opening tag is allowed as the first
    token too; the grammar then waits for the end of the thinking."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    out = _chat(self_open, f"{OPEN}Plan.{CLOSE}", then_free=True, max_tokens=64,
                response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == "Plan." and isinstance(json.loads(msg["content"])["ok"], bool)


def test_reasoning_options_are_checked(forced):
    from llminfer.errors import InvalidArgumentError

    for kw, says in (({"reasoning_format": "xml"}, "reasoning_format must be one of"),
                     ({"reasoning_budget": -2}, "reasoning_budget must be"),
                     ({"reasoning_budget": "3"}, "reasoning_budget must be"),
                     ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs must be a dict"),
                     ({"chat_template_kwargs": {"messages": []}}, "cannot set messages"),
                     ({"enable_thinking": "no"}, "enable_thinking must be True or False")):
        with pytest.raises(InvalidArgumentError, match=says):
            forced.create_chat_completion(MSGS, max_tokens=2, **kw)
    ok = forced.create_chat_completion(MSGS, max_tokens=2, reasoning_format="deepseek", reasoning_budget=-1,
                                       chat_template_kwargs={}, enable_thinking=True)
    assert ok["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_server_returns_reasoning_content(forced_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from llminfer.server import ServeArgs
    from servers import ServerThread

    srv = ServerThread(ServeArgs(model=forced_path, n_ctx=1024, n_threads=1, reasoning_budget=3))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with LLM(forced_path, n_ctx=1024, n_threads=1) as llm:
            want = llm.create_chat_completion(MSGS, max_tokens=8, temperature=0, reasoning_budget=3)
        want = want["choices"][0]["message"]
        assert want["reasoning_content"]
        got = c.chat.completions.create(model="forced", messages=MSGS, max_tokens=8, temperature=0)
        msg = got.choices[0].message
        assert (msg.reasoning_content, msg.content) == (want["reasoning_content"], want["content"])
        parts = {"reasoning_content": "", "content": ""}
        for chunk in c.chat.completions.create(model="forced", messages=MSGS, max_tokens=8, temperature=0,
                                               stream=True):
            for k in parts:
                parts[k] += getattr(chunk.choices[0].delta, k, None) or "" if chunk.choices else ""
        assert parts == {"reasoning_content": want["reasoning_content"], "content": want["content"]}
        # per request: no budget (cut inside the thinking), the raw text, the template's switch
        cut = c.chat.completions.create(model="forced", messages=MSGS, max_tokens=4, temperature=0,
                                        extra_body={"reasoning_budget": -1}).choices[0].message
        assert cut.reasoning_content and not cut.content
        raw = c.chat.completions.create(model="forced", messages=MSGS, max_tokens=8, temperature=0,
                                        extra_body={"reasoning_format": "none"}).choices[0].message
        assert getattr(raw, "reasoning_content", None) is None and CLOSE in raw.content
        off = c.chat.completions.create(model="forced", messages=MSGS, max_tokens=1, temperature=0,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        on = c.chat.completions.create(model="forced", messages=MSGS, max_tokens=1, temperature=0)
        assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the empty thinking was rendered
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="forced", messages=MSGS, max_tokens=1,
                                      extra_body={"reasoning_format": "xml"})
    finally:
        srv.stop()


def test_the_cli_shows_the_thinking_apart_or_hides_it(capsys, forced_path):
    """`llminfer run`: the thinking, a blank line, the answer (stdout is not
    a terminal here, so nothing is dimmed); --hide-thinking: the answer alone."""
    from cli_runs import run_main

    with LLM(forced_path, n_ctx=1024, n_threads=1) as llm:
        out = llm.chat_completion([{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
                                  reasoning_budget=2)
    thought, answer = ReasoningSplitter.split(out.text, in_thinking=True)
    assert thought and answer
    args = ["run", forced_path, "hi", "-n", 8, "--temp", 0, "-t", 1, "-c", 1024, "--reasoning-budget", 2]
    code, shown, err = run_main(capsys, *args)
    assert code == 0, err
    assert shown == f"{thought}\n\n{answer}\n"
    code, shown, err = run_main(capsys, *args, "--hide-thinking")
    assert code == 0 and shown == f"{answer}\n", err


def test_write_reply_dims_the_thinking_on_a_terminal(forced):
    import io

    from llminfer.cli.chat_repl import DIM, RESET, write_reply

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = forced.chat_completion(MSGS, max_tokens=8, temperature=0, reasoning_budget=2, stream=True)
    term = Terminal()
    answer = write_reply(stream, term)
    thought, want = ReasoningSplitter.split(stream.result.text, in_thinking=True)
    assert answer == want and term.getvalue() == f"{DIM}{thought}{RESET}\n\n{answer}"


def test_the_chat_repl_hides_the_thinking(forced):
    import io

    from llminfer.cli.chat_repl import repl

    lines = iter(["hi"])

    def input_fn(prompt):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    want = forced.chat_completion([{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
                                  reasoning_budget=2)
    _, answer = ReasoningSplitter.split(want.text, in_thinking=True)
    out = io.StringIO()
    assert repl(forced, max_tokens=8, sampling={"temperature": 0}, input_fn=input_fn, out=out,
                hide_thinking=True, chat_options={"reasoning_budget": 2}) == 0
    assert out.getvalue() == f"{answer}\n\n"


def test_anthropic_and_responses_think_as_the_chat_path_does(forced_path):
    """/v1/messages and /v1/responses read the thinking with the chat path's
    parser and budget: Anthropic's thinking budget_tokens is the reasoning
    budget, {"type": "disabled"} and the Responses API's effort "none" turn
    the thinking off in the template."""
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    pytest.importorskip("uvicorn")
    from llminfer.server import ServeArgs
    from servers import ServerThread

    srv = ServerThread(ServeArgs(model=forced_path, n_ctx=1024, n_threads=1))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        a = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)
        want = c.chat.completions.create(model="m", messages=MSGS, max_tokens=8, temperature=0,
                                         extra_body={"reasoning_budget": 3}).choices[0].message
        assert want.reasoning_content and want.content
        greedy = {"extra_body": {"temperature": 0}}  # the anthropic client takes it so
        kw = dict(model="m", max_tokens=8, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 3}, **greedy)
        out = a.messages.create(**kw)
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in out.content] == \
            [("thinking", want.reasoning_content), ("text", want.content)]
        with a.messages.stream(**kw) as s:
            final = s.get_final_message()
        assert final.content[0].thinking == want.reasoning_content and final.content[1].text == want.content
        # thinking off: the template writes the empty thinking, the reply is all answer
        off = c.chat.completions.create(model="m", messages=MSGS, max_tokens=4, temperature=0,
                                        extra_body={"enable_thinking": False})
        out = a.messages.create(model="m", max_tokens=4, messages=MSGS, thinking={"type": "disabled"}, **greedy)
        assert [b.type for b in out.content] == ["text"] and out.content[0].text == off.choices[0].message.content
        assert out.usage.input_tokens == off.usage.prompt_tokens
        r = c.responses.create(model="m", input=MSGS[0]["content"], max_output_tokens=4, temperature=0,
                               reasoning={"effort": "none"})
        assert [o.type for o in r.output] == ["message"] and r.output_text == off.choices[0].message.content
        assert r.usage.input_tokens == off.usage.prompt_tokens
        # the model's own way: it thinks, cut here inside the thinking
        cut = c.chat.completions.create(model="m", messages=MSGS, max_tokens=4, temperature=0).choices[0].message
        r = c.responses.create(model="m", input=MSGS[0]["content"], max_output_tokens=4, temperature=0,
                               reasoning={"effort": "high"})
        assert r.output[0].type == "reasoning" and r.output[0].content[0].text == cut.reasoning_content
        assert r.usage.output_tokens_details.reasoning_tokens == 4
        with pytest.raises(anthropic.BadRequestError):
            a.messages.create(model="m", max_tokens=4, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 9})
        with pytest.raises(openai.BadRequestError):
            c.responses.create(model="m", input="hi", reasoning={"effort": "extreme"})
    finally:
        srv.stop()
