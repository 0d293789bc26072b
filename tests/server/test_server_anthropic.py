"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) over
real HTTP on loopback, with SmolLM2, through the `anthropic` client and raw
server-sent events: each reply is what the server's chat completions give
for the same conversation (greedy), and each shape is Anthropic's."""

import json
import re

import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")
openai = pytest.importorskip("openai", reason="the server tests use the openai client")
anthropic = pytest.importorskip("anthropic", reason="the Messages API tests use the anthropic client")

from llminfer.server import ServeArgs  # noqa: E402
from servers import ServerThread, wait_idle  # noqa: E402
from servers import FailingRun, run_asgi  # noqa: E402

GREEDY = {"temperature": 0}  # the anthropic client takes it through extra_body
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "description": "The time in a time zone",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                         "required": ["zone"]}}
# text that thinks first, as a reasoning model writes it (forced through llama-server's grammar field)
THINKING = 'root ::= "<think>" [a-z]{3,8} " " [a-z]{3,8} "</think>" "\\n\\n" [A-Z] [a-z]{3,8} "."'


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def raw_reply(server, messages, grammar, max_tokens):
    """The text the model writes after the chat prompt of messages under
    grammar, greedy, through /v1/completions (which parses nothing out)."""
    ids = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]
    out = httpx.post(server.url + "/v1/completions", json={"prompt": ids, "grammar": grammar, "temperature": 0,
                                                           "max_tokens": max_tokens}, timeout=60).json()
    return out["choices"][0]["text"]


def chat(oai, messages, max_tokens, **kw):
    """The server's own chat completion of the same conversation, greedy."""
    return oai.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens, temperature=0, **kw)


STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def events(response):
    """[(event name, data)] of an Anthropic server-sent-event response."""
    out, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name, (name, data)
            out.append((name, data))
            name = None
        else:
            assert not line, line
    return out


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


# ---- text ----

@pytest.mark.parametrize("system", [None, "Answer in one short sentence.",
                                    [{"type": "text", "text": "Answer in one "}, {"type": "text", "text": "word."}]])
def test_a_reply_is_the_chat_completion_of_the_same_turns(server, client, oai, model, system):
    """Text, a system prompt (a string or text blocks) and usage: what
    /v1/chat/completions gives for the same messages."""
    msgs = [{"role": "user", "content": "Name a colour."}]
    kw = {"system": system} if system is not None else {}
    out = client.messages.create(model="claude-sonnet-4-5", max_tokens=24, messages=msgs, extra_body=GREEDY, **kw)
    sys_text = system if isinstance(system, str) else "".join(b["text"] for b in system or [])
    want = chat(oai, ([{"role": "system", "content": sys_text}] if system else []) + msgs, 24)
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_")
    assert out.model == model
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == want.choices[0].message.content
    assert out.stop_reason == STOP_REASON[want.choices[0].finish_reason] and out.stop_sequence is None
    assert (out.usage.input_tokens, out.usage.output_tokens) == (want.usage.prompt_tokens,
                                                                 want.usage.completion_tokens)
    wait_idle(server.url)


def test_multi_turn_with_content_blocks(server, client, oai):
    turns = [{"role": "user", "content": [{"type": "text", "text": "My name is Ada. "},
                                          {"type": "text", "text": "Remember it."}]},
             {"role": "assistant", "content": [{"type": "text", "text": "I will remember, Ada."}]},
             {"role": "user", "content": "What is my name?"}]
    out = client.messages.create(model="m", max_tokens=20, messages=turns, extra_body=GREEDY)
    flat = [{"role": t["role"], "content": t["content"] if isinstance(t["content"], str)
             else "".join(b["text"] for b in t["content"])} for t in turns]
    want = chat(oai, flat, 20)
    assert text_of(out) == want.choices[0].message.content
    assert out.usage.input_tokens == want.usage.prompt_tokens
    wait_idle(server.url)


def test_streamed_events_come_in_anthropics_order(server, client):
    """message_start, content_block_start, ping, content_block_delta
    (text_delta)…, content_block_stop, message_delta (stop reason, usage),
    message_stop: the raw stream, and the client's own accumulation of it,
    give the whole reply."""
    req = dict(model="m", max_tokens=16, messages=[{"role": "user", "content": "Tell me about the sea."}])
    whole = client.messages.create(**req, extra_body=GREEDY)
    with httpx.stream("POST", server.url + "/v1/messages", json={**req, **GREEDY, "stream": True},
                      headers={"anthropic-version": "2023-06-01", "x-api-key": "anything"}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        evs = events(r)
    names = " ".join(n for n, _ in evs)
    assert re.fullmatch(r"message_start content_block_start ping (content_block_delta )+content_block_stop "
                        r"message_delta message_stop", names), names
    start = evs[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    assert evs[1][1]["content_block"] == {"type": "text", "text": ""} and evs[1][1]["index"] == 0
    deltas = [d for n, d in evs if n == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == text_of(whole)
    end = evs[-2][1]
    assert end["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert end["usage"]["output_tokens"] == whole.usage.output_tokens
    with client.messages.stream(**req, extra_body=GREEDY) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == text_of(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    wait_idle(server.url)


def test_stop_sequences(server, client):
    """A reply cut at one of stop_sequences: the text before it,
    stop_reason "stop_sequence" and the sequence that matched, whole and
    streamed."""
    req = dict(model="m", messages=[{"role": "user", "content": "Describe a forest in detail."}])
    free = text_of(client.messages.create(**req, max_tokens=40, extra_body=GREEDY))
    words = re.findall(r"[A-Za-z]{4,}", free)
    assert len(words) >= 3, free
    stop = words[len(words) // 2]
    cut = free[:free.index(stop)]
    out = client.messages.create(**req, max_tokens=40, stop_sequences=["@@never@@", stop], extra_body=GREEDY)
    assert (text_of(out), out.stop_reason, out.stop_sequence) == (cut, "stop_sequence", stop)
    with client.messages.stream(**req, max_tokens=40, stop_sequences=[stop], extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert (text_of(final), final.stop_reason, final.stop_sequence) == (cut, "stop_sequence", stop)
    wait_idle(server.url)


# ---- tools ----

def test_a_tool_call_round_trip(server, client, oai):
    """tool_choice {"type": "tool"} forces the call (the server's call
    grammar): a tool_use block whose input fits the schema, stop_reason
    "tool_use", the call the chat path makes; streamed, its input comes as
    input_json_delta. The tool_result then goes back in a user turn, and the
    reply is the chat path's reply to the same history."""
    jsonschema = pytest.importorskip("jsonschema")
    ask = [{"role": "user", "content": "What is the time in Berlin?"}]
    tools = [WEATHER, TIME]
    out = client.messages.create(model="m", max_tokens=60, messages=ask, tools=tools,
                                 tool_choice={"type": "tool", "name": "get_time"}, extra_body=GREEDY)
    assert out.stop_reason == "tool_use" and [b.type for b in out.content][-1] == "tool_use"
    use = out.content[-1]
    assert use.name == "get_time" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, TIME["input_schema"])
    oai_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["input_schema"]}} for t in tools]
    want = chat(oai, ask, 60, tools=oai_tools, tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = want.choices[0].message.tool_calls[0]
    assert (use.name, use.input) == (call.function.name, json.loads(call.function.arguments))
    # streamed: a tool_use block opened with an empty input, then its JSON
    body = {"model": "m", "max_tokens": 60, "messages": ask, "tools": tools, "stream": True,
            "tool_choice": {"type": "any"}, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as r:
        evs = events(r)
    starts = [d["content_block"] for n, d in evs if n == "content_block_start"]
    assert starts[-1]["type"] == "tool_use" and starts[-1]["input"] == {}
    parts = [d["delta"]["partial_json"] for n, d in evs if n == "content_block_delta"
             and d["delta"]["type"] == "input_json_delta"]
    jsonschema.validate(json.loads("".join(parts)), next(t for t in tools if t["name"] == starts[-1]["name"])
                        ["input_schema"])
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"
    with client.messages.stream(model="m", max_tokens=60, messages=ask, tools=tools,
                                tool_choice={"type": "tool", "name": "get_time"}, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert (final.content[-1].name, final.content[-1].input) == (use.name, use.input)
    # the result goes back
    history = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": "14:05"}]}]}]
    reply = client.messages.create(model="m", max_tokens=24, messages=history, tools=tools, extra_body=GREEDY)
    oai_history = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "14:05"}]
    want = chat(oai, oai_history, 24, tools=oai_tools)
    assert reply.usage.input_tokens == want.usage.prompt_tokens
    assert text_of(reply) == (want.choices[0].message.content or "")
    assert client.messages.count_tokens(model="m", messages=history, tools=tools).input_tokens == \
        want.usage.prompt_tokens
    wait_idle(server.url)


# ---- thinking ----

def test_thinking_comes_as_a_thinking_block(server, client, oai):
    """A reply that opens with <think>…</think>: a thinking block, then the
    text after it; streamed, thinking_delta events in block 0 (closed with a
    signature_delta) and text_delta in block 1."""
    msgs = [{"role": "user", "content": "Think, then answer."}]
    extra = {**GREEDY, "grammar": THINKING}
    out = client.messages.create(model="m", max_tokens=40, messages=msgs, extra_body=extra)
    raw = raw_reply(server, msgs, THINKING, 40)
    thought, answer = re.fullmatch(r"<think>(.*)</think>\s*(.*)", raw, re.S).groups()
    assert [b.type for b in out.content] == ["thinking", "text"]
    assert (out.content[0].thinking, out.content[1].text) == (thought, answer)
    assert out.stop_reason == "end_turn"
    with httpx.stream("POST", server.url + "/v1/messages", json={"model": "m", "max_tokens": 40, "messages": msgs,
                                                                 "stream": True, **extra}, timeout=60) as r:
        evs = events(r)
    starts = [(d["index"], d["content_block"]["type"]) for n, d in evs if n == "content_block_start"]
    assert starts == [(0, "thinking"), (1, "text")]
    deltas = [(d["index"], d["delta"]["type"]) for n, d in evs if n == "content_block_delta"]
    split = deltas.index((1, "text_delta"))
    assert set(deltas[:split - 1]) == {(0, "thinking_delta")} and deltas[split - 1] == (0, "signature_delta")
    assert set(deltas[split:]) == {(1, "text_delta")}
    got = {0: "", 1: ""}
    for n, d in evs:
        if n == "content_block_delta":
            got[d["index"]] += d["delta"].get("thinking", d["delta"].get("text", ""))
    assert got == {0: thought, 1: answer}
    with client.messages.stream(model="m", max_tokens=40, messages=msgs, extra_body=extra) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == \
        [("thinking", thought), ("text", answer)]
    wait_idle(server.url)


# ---- count_tokens ----

def test_count_tokens_is_what_the_model_reads(server, client, smollm2_path):
    """count_tokens: the tokens of the conversation as the library renders
    and tokenizes it (LLM.chat_prompt), and the input_tokens a reply
    reports; tools add theirs."""
    from llminfer import LLM

    msgs = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": [{"type": "text", "text": "How are you?"}]}]
    n = client.messages.count_tokens(model="m", system="Be kind.", messages=msgs).input_tokens
    with LLM(smollm2_path, n_ctx=512, n_threads=1) as llm:
        flat = [{"role": "system", "content": "Be kind."}] + [
            {"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]}
            for m in msgs]
        assert n == len(llm.chat_prompt(flat))
    out = client.messages.create(model="m", max_tokens=1, system="Be kind.", messages=msgs)
    assert out.usage.input_tokens == n
    with_tools = client.messages.count_tokens(model="m", system="Be kind.", messages=msgs, tools=[WEATHER])
    assert with_tools.input_tokens > n
    wait_idle(server.url)


# ---- errors ----

USER = [{"role": "user", "content": "hi"}]
BAD = [
    {"messages": USER},                                                          # max_tokens is required
    {"max_tokens": 0, "messages": USER},
    {"max_tokens": "8", "messages": USER},
    {"max_tokens": 8},
    {"max_tokens": 8, "messages": []},
    {"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]},       # system is a field of its own
    {"max_tokens": 8, "messages": [{"role": "tool", "content": "hi"}]},
    {"max_tokens": 8, "messages": [{"role": "user", "content": 5}]},
    {"max_tokens": 8, "messages": ["hi"]},
    {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
    {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]},
    {"max_tokens": 8, "messages": USER + [{"role": "assistant", "content": "Sure"}]},  # a prefill
    {"max_tokens": 8, "messages": USER, "system": 5},
    {"max_tokens": 8, "messages": USER, "temperature": 1.5},
    {"max_tokens": 8, "messages": USER, "top_p": "x"},
    {"max_tokens": 8, "messages": USER, "stop_sequences": "x"},
    {"max_tokens": 8, "messages": USER, "stop_sequences": [""]},
    {"max_tokens": 8, "messages": USER, "tools": [{"name": "f"}]},
    {"max_tokens": 8, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    {"max_tokens": 8, "messages": USER, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
    {"max_tokens": 8, "messages": USER, "tools": [WEATHER], "tool_choice": "auto"},
    {"max_tokens": 8, "messages": USER, "stream": "yes"},
    {"max_tokens": 8, "messages": [{"role": "user", "content": "x" * 5000}]},  # longer than the context
]


@pytest.mark.parametrize("body", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_are_anthropic_shaped_400s(server, body):
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error" and err["error"]["message"]
    assert set(err) == {"type", "error"} and set(err["error"]) == {"type", "message"}


def test_deep_and_broken_bodies_are_400_and_the_server_goes_on(server, client):
    deep = '{"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "metadata": %s}' % (
        "[" * 5000 + "]" * 5000)
    schema = '{"type": "array", "items": ' * 3000 + '{"type": "integer"}' + "}" * 3000
    tool = ('{"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", '
            '"input_schema": %s}]}' % schema)
    use = ('{"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": '
           '[{"type": "tool_use", "id": "t", "name": "f", "input": {"a": %s}}]}, {"role": "user", "content": '
           '[{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]}' % ("[" * 200 + "]" * 200))
    for data in (deep, tool, use, "{not json", "[1, 2]"):
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(server.url + path, content=data.encode(), headers={"content-type": "application/json"},
                           timeout=60)
            assert r.status_code == 400, (path, r.text[:300])
            assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "robot", "content": "hi"}])
    assert "role" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="m", messages=[])
    assert client.messages.create(model="m", max_tokens=2, messages=USER).usage.output_tokens >= 1
    wait_idle(server.url)


def test_max_tokens_past_the_context_is_capped(server, client):
    """Clients send max_tokens for a large model (Claude Code: 32000): the
    reply stops where the context ends, stop_reason "max_tokens"."""
    out = client.messages.create(model="m", max_tokens=32000, messages=USER,
                                 extra_body={**GREEDY, "grammar": 'root ::= [a-z]{4000}'})
    assert out.stop_reason == "max_tokens"
    assert out.usage.input_tokens + out.usage.output_tokens == 512
    wait_idle(server.url)


@pytest.fixture(scope="module")
def guarded(smollm2_path):
    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=256, n_threads=1, api_key="sesame"))
    yield s
    s.stop()


def test_api_key_as_anthropic_sends_it(guarded):
    """With --api-key: x-api-key (the anthropic client's header) or a bearer
    token; without either, or with another key, a 401 in Anthropic's shape."""
    ok = anthropic.Anthropic(base_url=guarded.url, api_key="sesame", max_retries=0)
    assert ok.messages.create(model="m", max_tokens=1, messages=USER).type == "message"
    assert ok.messages.count_tokens(model="m", messages=USER).input_tokens > 0
    r = httpx.post(guarded.url + "/v1/messages/count_tokens", json={"messages": USER},
                   headers={"authorization": "Bearer sesame"})
    assert r.status_code == 200
    for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
        r = httpx.post(guarded.url + "/v1/messages", json={"max_tokens": 1, "messages": USER}, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=guarded.url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=1, messages=USER)


def test_a_stream_that_fails_ends_with_an_anthropic_error_event():
    from llminfer.server import anthropic as api
    from llminfer.server.chatrun import EventStream

    run = FailingRun()
    body, sent = run_asgi(EventStream(api._stream(run, "m"), run, lambda e: api._sse("error", api.error_body(e))))
    evs = [(e.split(b"\n")[0].decode(), json.loads(e.split(b"\n")[1][len(b"data: "):]))
           for e in body.split(b"\n\n") if e]
    assert [n for n, _ in evs][:3] == ["event: message_start", "event: content_block_start", "event: ping"]
    assert evs[-1] == ("event: error", {"type": "error", "error": {"type": "api_error",
                                                                   "message": "the engine failed: RuntimeError: boom"}})
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False} and run.cancelled
