"""Ollama's API (/api/chat, /api/generate, /api/show, /api/tags, /api/ps,
/api/version) over real HTTP on loopback, with SmolLM2, through the
`ollama` client and raw NDJSON: each reply is what the server's OpenAI
routes give for the same request (greedy), and each shape is Ollama's.
Images: tests/test_server_vision.py."""

import json

import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")
openai = pytest.importorskip("openai", reason="the server tests use the openai client")
ollama = pytest.importorskip("ollama", reason="the Ollama API tests use the ollama client")

from llminfer.server import ServeArgs  # noqa: E402
from servers import ServerThread, wait_idle  # noqa: E402

GREEDY = {"temperature": 0}
HI = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=512, kv_pool_tokens=8192, n_threads=1,
                               max_batch_tokens=256))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(oai, messages, max_tokens, **kw):
    return oai.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens, temperature=0, **kw)


# ---- /api/chat ----

def test_chat_is_the_chat_completion_of_the_same_turns(server, client, oai):
    """Whole and streamed: the text, the counts and the done reason of
    /v1/chat/completions for the same messages and limit."""
    msgs = [{"role": "system", "content": "Answer in one short sentence."}] + HI
    want = chat(oai, msgs, 12)
    r = client.chat(model="smollm2", messages=msgs, options={**GREEDY, "num_predict": 12})
    assert r.message.role == "assistant" and r.message.content == want.choices[0].message.content
    assert r.done and r.done_reason == ("length" if want.choices[0].finish_reason == "length" else "stop")
    assert (r.prompt_eval_count, r.eval_count) == (want.usage.prompt_tokens, want.usage.completion_tokens)
    assert r.total_duration >= r.eval_duration >= 0 and r.prompt_eval_duration >= 0
    parts = list(client.chat(model="smollm2", messages=msgs, options={**GREEDY, "num_predict": 12}, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts) == want.choices[0].message.content
    assert parts[-1].eval_count == want.usage.completion_tokens and parts[-1].done_reason == r.done_reason
    wait_idle(server.url)


def test_chat_streams_ndjson_by_default(server):
    """No "stream" field: newline-delimited JSON objects, the last done."""
    body = {"model": "m", "messages": HI, "options": {**GREEDY, "num_predict": 5}}
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["eval_count"] == 5 and lines[-1]["done_reason"] == "length"
    whole = httpx.post(server.url + "/api/chat", json={**body, "stream": False}, timeout=60).json()
    assert "".join(x["message"]["content"] for x in lines) == whole["message"]["content"]


def test_options_map_onto_the_sampling_parameters(server, client, oai):
    """A seeded sample at temperature 0.9 with top_k, top_p and a repeat
    penalty is the OpenAI route's with the same fields; stop ends the reply
    where the OpenAI route's stop does."""
    opts = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "repeat_penalty": 1.2, "seed": 7, "num_predict": 16}
    r = client.chat(model="m", messages=HI, options=opts)
    want = oai.chat.completions.create(model="m", messages=HI, max_tokens=16, temperature=0.9, top_p=0.9, seed=7,
                                       extra_body={"top_k": 20, "repeat_penalty": 1.2})
    assert r.message.content == want.choices[0].message.content
    full = chat(oai, HI, 16).choices[0].message.content
    words = full.split()
    assert len(words) > 2, full
    stop = " " + words[2]
    r = client.chat(model="m", messages=HI, options={**GREEDY, "num_predict": 16, "stop": [stop]})
    assert r.message.content == full[:full.index(stop)] and r.done_reason == "stop"
    wait_idle(server.url)


def test_format_json_and_a_schema_give_json(server, client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"]}
    r = client.chat(model="m", messages=HI, format=schema, options={**GREEDY, "num_predict": 40})
    assert set(json.loads(r.message.content)) == {"colour"}
    r = client.chat(model="m", messages=HI + [{"role": "user", "content": "Answer in JSON."}], format="json",
                    options={**GREEDY, "num_predict": 40})
    assert r.message.content.lstrip()[:1] in ("{", "[")  # a json_object grammar: JSON from the first character
    wait_idle(server.url)


# keys in the order the ollama client's Tool model sends them (the template writes the JSON as given)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}


def test_tools_and_a_tool_exchange_are_the_chat_completions(server, client, oai):
    """tools offered, then the assistant's call and the tool's answer sent
    back: the same reply (calls or text) as /v1/chat/completions gives."""
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    want = chat(oai, ask, 40, tools=[WEATHER])
    r = client.chat(model="m", messages=ask, tools=[WEATHER], options={**GREEDY, "num_predict": 40})
    calls = want.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls or []]
    assert r.message.content == (want.choices[0].message.content or "")
    turns = ask + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C and sunny", "tool_name": "get_weather"}]
    oai_turns = ask + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "18 C and sunny", "name": "get_weather"}]
    want = chat(oai, oai_turns, 24, tools=[WEATHER])
    r = client.chat(model="m", messages=turns, tools=[WEATHER], options={**GREEDY, "num_predict": 24})
    assert r.message.content == want.choices[0].message.content and not r.message.tool_calls
    assert r.prompt_eval_count == want.usage.prompt_tokens
    wait_idle(server.url)


def test_a_replys_tool_calls_and_thinking_in_ollamas_shape():
    """A reply with thinking and a call (SmolLM2 makes neither when asked):
    the body the ollama client reads into message.thinking and
    message.tool_calls, arguments an object, done_reason stop."""
    import asyncio

    from llminfer.server.chatrun import ChatReply
    from llminfer.server.ollama import _answer

    class Run:
        started_ns, first_token_ns, ended_ns = 100, 250, 1000
        reply = ChatReply(finish="tool_calls", thinking="hmm", text="", prompt_tokens=7, completion_tokens=5,
                          calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])

        async def whole(self, request):
            return self.reply

    body = json.loads(asyncio.run(_answer(Run(), None, "m", True, False)).body)
    r = ollama.ChatResponse(**body)
    assert r.message.thinking == "hmm" and r.done and r.done_reason == "stop"
    assert [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    assert (r.prompt_eval_count, r.eval_count, r.prompt_eval_duration, r.eval_duration, r.total_duration) == \
        (7, 5, 150, 750, 900)


def test_empty_messages_load_the_model(client):
    r = client.chat(model="m", messages=[])
    assert r.done and r.done_reason == "load" and r.message.content == ""


# ---- /api/generate ----

def test_generate_renders_the_prompt_through_the_chat_template(server, client, oai):
    want = chat(oai, [{"role": "system", "content": "Be brief."}] + HI, 10)
    r = client.generate(model="m", prompt=HI[0]["content"], system="Be brief.", options={**GREEDY, "num_predict": 10})
    assert r.response == want.choices[0].message.content and r.prompt_eval_count == want.usage.prompt_tokens
    parts = list(client.generate(model="m", prompt=HI[0]["content"], system="Be brief.", stream=True,
                                 options={**GREEDY, "num_predict": 10}))
    assert "".join(p.response for p in parts) == r.response and parts[-1].done
    wait_idle(server.url)


def test_raw_generate_is_the_completion_of_the_text(server, client, oai):
    prompt = "The capital of France is"
    want = oai.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0)
    r = client.generate(model="m", prompt=prompt, raw=True, options={**GREEDY, "num_predict": 8})
    assert r.response == want.choices[0].text and r.prompt_eval_count == want.usage.prompt_tokens
    wait_idle(server.url)


def test_an_empty_generate_loads_the_model(client):
    r = client.generate(model="m")
    assert r.done and r.done_reason == "load" and r.response == ""


# ---- what the model is ----

def test_tags_show_ps_and_version(server, client, smollm2_path):
    listed = client.list().models
    assert len(listed) == 1 and listed[0].size == smollm2_path.stat().st_size
    d = listed[0].details
    assert d.format == "gguf" and d.family == "llama" and d.parameter_size.endswith("M")
    shown = client.show(listed[0].model)
    assert shown.modelinfo["general.architecture"] == "llama" and shown.template
    assert 100e6 < shown.modelinfo["general.parameter_count"] < 200e6
    assert "completion" in shown.capabilities and "vision" not in shown.capabilities
    running = client.ps().models
    assert running[0].model == listed[0].model and running[0].context_length == 512
    import llminfer

    assert httpx.get(server.url + "/api/version").json() == {"version": llminfer.__version__}


# ---- errors ----

@pytest.mark.parametrize("body", [
    {"messages": HI, "options": {"temperature": -1}},
    {"messages": HI, "options": {"num_predict": 0}},
    {"messages": HI, "options": "hot"},
    {"messages": HI, "format": "xml"},
    {"messages": HI, "think": "very"},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "hi", "images": ["aGVsbG8="]}]},  # no --mmproj here
    {"messages": [{"role": "user", "content": "hi", "images": [3]}]},
    {"messages": "hi"},
])
def test_bad_chat_requests_are_400_in_ollamas_shape(server, body):
    r = httpx.post(server.url + "/api/chat", json={"model": "m", "stream": False, **body}, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"} and r.json()["error"], r.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kw", [{"options": {"temperature": -1}},
                                {"messages": [{"role": "wizard", "content": "hi"}]},
                                {"messages": [{"role": "user", "content": "hi", "images": [b"GIF89a"]}]}])
def test_the_client_reads_our_errors(client, kw, stream):
    """The ollama client's ResponseError, whole or streamed: status 400 and our message."""
    with pytest.raises(ollama.ResponseError) as e:
        r = client.chat(model="m", **{"messages": HI, **kw}, stream=stream)
        if stream:
            list(r)
    assert e.value.status_code == 400 and e.value.error and not e.value.error.startswith("{")


@pytest.mark.parametrize("body", [{"prompt": "hi", "context": [1, 2, 3]}, {"prompt": "hi", "template": "{{ x }}"},
                                  {"prompt": "hi", "raw": "yes"}, {"prompt": 5}])
def test_bad_generate_requests_are_400(server, body):
    r = httpx.post(server.url + "/api/generate", json={"model": "m", "stream": False, **body}, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"}, r.text


def test_an_api_key_is_asked_for_in_ollamas_shape(smollm2_path):
    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=128, kv_pool_tokens=512, n_threads=1, api_key="k"))
    try:
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=s.url).chat(model="m", messages=HI, options={"num_predict": 1})
        assert e.value.status_code == 401
        ok = ollama.Client(host=s.url, headers={"Authorization": "Bearer k"})
        assert ok.chat(model="m", messages=HI, options={"num_predict": 1}).done
    finally:
        s.stop()
