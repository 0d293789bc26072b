"""OpenAI's Responses API (/v1/responses, stateless) over real HTTP on
loopback, with SmolLM2, through the openai client (create, stream, parse)
and raw server-sent events: each reply is what the server's chat
completions give for the same conversation (greedy), in the Responses
shapes."""

import json
import re

import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")
openai = pytest.importorskip("openai", reason="the server tests use the openai client")
pydantic = pytest.importorskip("pydantic", reason="responses.parse takes a pydantic model")

from servers import wait_idle  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                       "required": ["zone"]}}
THINKING = 'root ::= "<think>" [a-z]{3,8} " " [a-z]{3,8} "</think>" "\\n\\n" [A-Z] [a-z]{3,8} "."'


def chat(client, messages, max_tokens, **kw):
    return client.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens, temperature=0,
                                          **kw)


def events(response):
    """[(event name, data)] of a Responses server-sent-event stream."""
    out, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name, (name, data)
            out.append((name, data))
        else:
            assert not line, line
    assert [d["sequence_number"] for _, d in out] == list(range(len(out)))
    return out


STATUS = {"stop": "completed", "length": "incomplete", "tool_calls": "completed"}


# ---- text ----

@pytest.mark.parametrize("instructions", [None, "Answer in one short sentence."])
def test_a_response_is_the_chat_completion_of_the_same_turns(server, client, model, instructions):
    out = client.responses.create(model="gpt-5-codex", input="Name a colour.", instructions=instructions,
                                  max_output_tokens=24, temperature=0)
    msgs = ([{"role": "system", "content": instructions}] if instructions else []) + \
        [{"role": "user", "content": "Name a colour."}]
    want = chat(client, msgs, 24)
    assert out.object == "response" and out.id.startswith("resp_") and out.model == model
    assert out.store is False and out.previous_response_id is None
    assert [o.type for o in out.output] == ["message"]
    assert out.output_text == want.choices[0].message.content
    assert out.status == STATUS[want.choices[0].finish_reason]
    if out.status == "incomplete":
        assert out.incomplete_details.reason == "max_output_tokens"
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens, want.usage.total_tokens)
    assert out.usage.output_tokens_details.reasoning_tokens == 0
    wait_idle(server.url)


def test_input_items_multi_turn(server, client):
    """input as message items: input_text parts, an earlier assistant reply
    as output_text, a developer message (the system's role)."""
    items = [{"type": "message", "role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "My name is Ada. "},
                                          {"type": "input_text", "text": "Remember it."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I will, Ada."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}]
    out = client.responses.create(model="m", input=items, max_output_tokens=20, temperature=0)
    want = chat(client, [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "My name is Ada. Remember it."},
                         {"role": "assistant", "content": "I will, Ada."},
                         {"role": "user", "content": "What is my name?"}], 20)
    assert out.output_text == want.choices[0].message.content
    assert out.usage.input_tokens == want.usage.prompt_tokens
    wait_idle(server.url)


def test_streamed_events_come_in_order(server, client):
    """response.created, response.in_progress, output_item.added,
    content_part.added, output_text.delta…, output_text.done,
    content_part.done, output_item.done, then response.completed or
    response.incomplete; sequence numbers 0, 1, 2…; the deltas make the text
    the whole response has."""
    req = dict(model="m", input="Tell me about the sea.", max_output_tokens=16, temperature=0)
    whole = client.responses.create(**req)
    with httpx.stream("POST", server.url + "/v1/responses", json={**req, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        evs = events(r)
    names = " ".join(n.removeprefix("response.") for n, _ in evs)
    assert re.fullmatch(r"created in_progress output_item\.added content_part\.added (output_text\.delta )+"
                        r"output_text\.done content_part\.done output_item\.done (completed|incomplete)", names), names
    assert evs[0][1]["response"]["status"] == "in_progress" and evs[0][1]["response"]["output"] == []
    rid = evs[0][1]["response"]["id"]
    item = evs[2][1]["item"]
    assert item["type"] == "message" and item["status"] == "in_progress"
    text = "".join(d["delta"] for n, d in evs if n == "response.output_text.delta")
    assert all(d["item_id"] == item["id"] for n, d in evs[3:-2]) and evs[-2][1]["item"]["id"] == item["id"]
    assert text == evs[-4][1]["text"] == whole.output_text
    final = evs[-1][1]["response"]
    assert final["id"] == rid and final["status"] == whole.status
    assert final["output"][0]["content"][0]["text"] == text and final["output"][0]["id"] == item["id"]
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens
    # the client's own stream
    kinds = [e.type for e in client.responses.create(**req, stream=True)]
    assert kinds == [n for n, _ in evs]
    wait_idle(server.url)


# ---- structured output ----

class City(pydantic.BaseModel):
    name: str
    population: int


def test_text_format_json_schema(server, client):
    """text.format json_schema constrains the text as the chat path's
    response_format does: responses.parse gives the pydantic object, and the
    text is the chat completion's."""
    out = client.responses.parse(model="m", input="Describe a city as JSON.", text_format=City,
                                 max_output_tokens=80, temperature=0)
    assert out.status == "completed" and isinstance(out.output_parsed, City)
    schema = out.text.format.schema_
    want = chat(client, [{"role": "user", "content": "Describe a city as JSON."}], 80,
                response_format={"type": "json_schema", "json_schema": {"name": "City", "schema": schema}})
    assert out.output_text == want.choices[0].message.content
    with client.responses.stream(model="m", input="Describe a city as JSON.", text_format=City,
                                 max_output_tokens=80, temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == out.output_parsed
    obj = client.responses.create(model="m", input="Some JSON, please.", text={"format": {"type": "json_object"}},
                                  max_output_tokens=40, temperature=0)
    if obj.status == "completed":
        assert isinstance(json.loads(obj.output_text), dict)
    wait_idle(server.url)


# ---- function tools ----

def test_a_function_call_round_trip(server, client):
    """tool_choice "required" or a named function forces a call:
    function_call output items (call_id, name, JSON arguments that fit the
    schema), the call the chat path makes; streamed, as
    function_call_arguments events. The call and its output then go back as
    input items, and the reply is the chat path's reply to that history."""
    jsonschema = pytest.importorskip("jsonschema")
    ask = "What is the time in Berlin?"
    tools = [WEATHER, TIME]
    out = client.responses.create(model="m", input=ask, tools=tools,
                                  tool_choice={"type": "function", "name": "get_time"}, temperature=0,
                                  max_output_tokens=60)
    assert out.status == "completed" and [o.type for o in out.output] == ["function_call"]
    call = out.output[0]
    assert call.name == "get_time" and call.call_id and call.id.startswith("fc_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), TIME["parameters"])
    chat_tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
                  for t in tools]
    want = chat(client, [{"role": "user", "content": ask}], 60, tools=chat_tools,
                tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0].message.tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == (want.function.name, json.loads(want.function.arguments))
    # streamed
    with httpx.stream("POST", server.url + "/v1/responses", json={
            "model": "m", "input": ask, "tools": tools, "tool_choice": "required", "stream": True,
            "temperature": 0, "max_output_tokens": 60}, timeout=60) as r:
        evs = events(r)
    names = [n.removeprefix("response.") for n, _ in evs]
    assert names == ["created", "in_progress", "output_item.added", "function_call_arguments.delta",
                     "function_call_arguments.done", "output_item.done", "completed"]
    added, done = evs[2][1]["item"], evs[5][1]["item"]
    assert added["type"] == "function_call" and added["arguments"] == "" and added["id"] == done["id"]
    assert evs[3][1]["delta"] == evs[4][1]["arguments"] == done["arguments"]
    jsonschema.validate(json.loads(done["arguments"]), next(t for t in tools if t["name"] == done["name"])
                        ["parameters"])
    with client.responses.stream(model="m", input=ask, tools=tools, temperature=0, max_output_tokens=60,
                                 tool_choice={"type": "function", "name": "get_time"}) as stream:
        final = stream.get_final_response()
    assert (final.output[0].name, final.output[0].arguments) == (call.name, call.arguments)
    # the output goes back
    items = [{"role": "user", "content": ask}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "14:05"}]
    reply = client.responses.create(model="m", input=items, tools=tools, max_output_tokens=24, temperature=0)
    history = [{"role": "user", "content": ask},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.call_id, "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": call.call_id, "content": "14:05"}]
    want = chat(client, history, 24, tools=chat_tools)
    assert reply.usage.input_tokens == want.usage.prompt_tokens
    assert reply.output_text == (want.choices[0].message.content or "")
    wait_idle(server.url)


# ---- reasoning ----

def test_thinking_comes_as_a_reasoning_item(server, client):
    """A reply that opens with <think>…</think>: a reasoning item (its text
    as reasoning_text content) before the message; streamed, as
    reasoning_text deltas in an item of its own."""
    ids = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "Think."}]}).json()
    raw = httpx.post(server.url + "/v1/completions", json={"prompt": ids["tokens"], "grammar": THINKING,
                                                           "temperature": 0, "max_tokens": 40}).json()
    thought, answer = re.fullmatch(r"<think>(.*)</think>\s*(.*)", raw["choices"][0]["text"], re.S).groups()
    req = {"model": "m", "input": "Think.", "temperature": 0, "max_output_tokens": 40, "grammar": THINKING}
    out = client.responses.create(**{k: v for k, v in req.items() if k != "grammar"},
                                  extra_body={"grammar": THINKING})
    assert [o.type for o in out.output] == ["reasoning", "message"]
    assert out.output[0].content[0].text == thought and out.output[0].summary == []
    assert out.output_text == answer and out.status == "completed"
    assert 0 < out.usage.output_tokens_details.reasoning_tokens < out.usage.output_tokens
    with httpx.stream("POST", server.url + "/v1/responses", json={**req, "stream": True}, timeout=60) as r:
        evs = events(r)
    names = " ".join(n.removeprefix("response.") for n, _ in evs)
    assert re.fullmatch(r"created in_progress output_item\.added content_part\.added (reasoning_text\.delta )+"
                        r"reasoning_text\.done content_part\.done output_item\.done "
                        r"output_item\.added content_part\.added (output_text\.delta )+output_text\.done "
                        r"content_part\.done output_item\.done completed", names), names
    assert "".join(d["delta"] for n, d in evs if n == "response.reasoning_text.delta") == thought
    assert "".join(d["delta"] for n, d in evs if n == "response.output_text.delta") == answer
    assert [d["output_index"] for n, d in evs if n == "response.output_item.done"] == [0, 1]
    wait_idle(server.url)


# ---- errors ----

BAD = [
    ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
    ({"input": "hi", "conversation": "conv_123"}, "conversation"),
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"input": [{"type": "web_search_call"}]}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": 3}, "temperature"),
    ({"input": "hi", "instructions": 5}, "instructions"),
    ({"input": "x" * 5000}, "input"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_are_openai_shaped_400s(server, body, param):
    r = httpx.post(server.url + "/v1/responses", json={"model": "m", **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error" and err["param"] == param


def test_deep_and_broken_bodies_are_400_and_the_server_goes_on(server, client):
    schema = '{"type": "array", "items": ' * 3000 + '{"type": "integer"}' + "}" * 3000
    bodies = ['{"input": "hi", "metadata": %s}' % ("[" * 5000 + "]" * 5000),
              '{"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": %s}]}' % schema,
              '{"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": %s}}}' % schema,
              '{"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": %s}, '
              '{"type": "function_call_output", "call_id": "c", "output": "x"}]}' % json.dumps("[" * 300 + "]" * 300),
              "{not json", "[1, 2]"]
    for data in bodies:
        r = httpx.post(server.url + "/v1/responses", content=data.encode(),
                       headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    assert client.responses.create(model="m", input="hi", max_output_tokens=2).usage.output_tokens >= 1
    wait_idle(server.url)


def test_a_stream_that_fails_ends_with_error_and_response_failed():
    """An engine fault mid-stream: an `error` event, then response.failed
    (status "failed", its error set), each numbered in sequence."""
    from llminfer.server import responses as api
    from llminfer.server.chatrun import EventStream
    from servers import FailingRun, run_asgi

    run = FailingRun()
    meta = {"id": "resp_1", "object": "response"}
    body, sent = run_asgi(EventStream(api._stream(run, meta), run, lambda e: b""))
    evs = [json.loads(e.split(b"\n")[1][len(b"data: "):]) for e in body.split(b"\n\n") if e]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert [e["type"] for e in evs][-3:] == ["response.output_text.delta", "error", "response.failed"]
    assert evs[-2]["message"] == "the engine failed: RuntimeError: boom"
    failed = evs[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == evs[-2]["message"]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False} and run.cancelled
