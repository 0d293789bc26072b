"""`llminfer serve` over real HTTP on loopback, with SmolLM2: the openai
client and raw server-sent events, concurrent clients getting exactly what
they get alone, cancellation, prefix reuse, bad requests, API key, queue
bound and Prometheus metrics."""

import json
import math
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
uvicorn = pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")
openai = pytest.importorskip("openai", reason="the server tests use the openai client")
parser = pytest.importorskip("prometheus_client.parser", reason="the metrics test parses with prometheus_client")

from llminfer.server import ServeArgs, create_app  # noqa: E402
from servers import ServerThread, gauge, metrics, wait_idle  # noqa: E402


def sse(response):
    """The JSON events of a server-sent-event response, checking it ends with [DONE]."""
    events, done = [], False
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        assert not done, "data after [DONE]"
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
        else:
            events.append(json.loads(data))
    assert done
    return events


# ---- basics ----

def test_models_health_and_tokenize(server, model):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == model and models["data"][0]["max_model_len"] == 512
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) > 0
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert text == "Hello world"
    # a chat's prompt, as a chat completion would read it (its usage counts the same tokens)
    msgs = [{"role": "user", "content": "Hello world"}]
    chat = httpx.post(server.url + "/tokenize", json={"messages": msgs}).json()
    out = httpx.post(server.url + "/v1/chat/completions",
                     json={"model": model, "messages": msgs, "max_tokens": 1}, timeout=60).json()
    assert chat["count"] == out["usage"]["prompt_tokens"] > ids["count"]


def test_any_model_name_is_served(server, client, model, smollm2_path):
    """One model loaded: a request naming any model is served by it (as
    llama-server and llama-cpp-python's server do), its answer naming the
    model that wrote it; /v1/models/{id} gives the model by its names and
    404 for another."""
    ask = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0)
    mine = client.chat.completions.create(model=model, **ask)
    for name in ("gpt-4o", "claude-sonnet-4-5", "some-org/some-model:Q4_K_M"):
        other = client.chat.completions.create(model=name, **ask)
        assert other.model == model and other.choices[0].message.content == mine.choices[0].message.content
        assert client.completions.create(model=name, prompt="Hi", max_tokens=1).model == model
    for name in (model, str(smollm2_path)):
        card = client.models.retrieve(name)
        assert (card.id, card.object) == (model, "model") and card.max_model_len == 512
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    wait_idle(server.url)


def test_completion_streamed_and_not(server, client, model):
    req = dict(model=model, prompt="The capital of France is", max_tokens=12, temperature=0)
    full = client.completions.create(**req)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12 and full.usage.prompt_tokens > 0
    assert full.usage.prompt_tokens_details.cached_tokens == 0  # shorter than a block: nothing to reuse
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **req) if c.choices]
    assert "".join(pieces) == full.choices[0].text
    with httpx.stream("POST", server.url + "/v1/completions", json={**req, "stream": True}, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert "".join(e["choices"][0]["text"] for e in events) == full.choices[0].text
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 12


def test_chat_streamed_and_not(server, client, model):
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
    full = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0)
    text = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant" and text
    chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert full.choices[0].finish_reason in ("stop", "length")


# ---- structured output ----

# each bounds its output to fewer tokens than max_tokens, so a constrained
# generation closes its JSON and ends with "stop" whatever the model says
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "n": {"type": "integer", "minimum": -99, "maximum": 99}},
     "required": ["ok", "n"], "additionalProperties": False},
]


def _json_chat(client, model, k, stream=False, temperature=0, seed=None, n=1):
    kw = dict(model=model, messages=[{"role": "user", "content": f"Describe thing {k} as JSON."}], max_tokens=96,
              temperature=temperature, seed=seed, n=n,
              response_format={"type": "json_schema", "json_schema": {"name": f"s{k}", "schema": SCHEMAS[k]}})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), finish[-1]
    out = client.chat.completions.create(**kw)
    return [(c.message.content, c.finish_reason) for c in out.choices] if n > 1 else \
        (out.choices[0].message.content, out.choices[0].finish_reason)


def test_response_format_json_schema_as_the_library_gives_it(server, client, model, smollm2_path):
    """Each schema's output parses and validates, ends with "stop", and is
    the text LLM.create_chat_completion gives for the same request
    (greedy); streamed, and with the schemas' requests batched together."""
    jsonschema = pytest.importorskip("jsonschema")
    from llminfer import LLM

    alone = [_json_chat(client, model, k) for k in range(len(SCHEMAS))]
    with LLM(smollm2_path, n_ctx=512, n_threads=1) as llm:
        for k, (text, finish) in enumerate(alone):
            assert finish == "stop", text
            jsonschema.validate(json.loads(text), SCHEMAS[k])
            lib = llm.create_chat_completion(
                [{"role": "user", "content": f"Describe thing {k} as JSON."}], max_tokens=96, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": f"s{k}", "schema": SCHEMAS[k]}})
            assert text == lib["choices"][0]["message"]["content"]
    assert _json_chat(client, model, 0, stream=True) == alone[0]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda i: _json_chat(client, model, i % 3, stream=i >= 3), range(6)))
    assert together == alone + alone
    for text, finish in _json_chat(client, model, 2, temperature=1.0, seed=11, n=3):  # sampled choices
        assert finish == "stop"
        jsonschema.validate(json.loads(text), SCHEMAS[2])
    wait_idle(server.url)


def test_json_object_and_llama_server_grammar_fields(server, client, model):
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "A JSON object:"}],
                                         max_tokens=200, temperature=0, response_format={"type": "json_object"})
    text = out.choices[0].message.content
    assert text.lstrip().startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    gbnf = 'root ::= ("yes" | "no") " because " [a-z ]{3,20} "."'
    for seed in range(3):
        c = client.completions.create(model=model, prompt="Is water wet? Answer:", max_tokens=40, seed=seed,
                                      extra_body={"grammar": gbnf})
        assert re.fullmatch(r"(yes|no) because [a-z ]{3,20}\.", c.choices[0].text), c.choices[0].text
    c = client.completions.create(model=model, prompt="Days in a week:", max_tokens=8, temperature=0,
                                  extra_body={"json_schema": {"type": "integer", "minimum": 0, "maximum": 99}})
    assert 0 <= json.loads(c.choices[0].text) <= 99 and c.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": 7}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"json_schema": {"type": "integer"}, "grammar": 'root ::= "a"'}, "json_schema"),
])
def test_bad_structured_requests_are_400(server, client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       extra_body=extra)
    assert e.value.body["param"] == param and e.value.body["message"]
    wait_idle(server.url)


# ---- tool calls ----

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
                       "required": ["zone"], "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _calls(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _streamed_calls(chunks):
    """(content, [(name, arguments)], finish) from a stream's deltas, joined as a client joins them."""
    content, calls, finish = "", {}, None
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    return content, [(e["name"], json.loads(e["arguments"])) for _, e in sorted(calls.items())], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}, "auto",
                                    "none"])
def test_tool_calls_as_the_library_makes_them(server, client, model, smollm2_path, choice):
    """tools and tool_choice: the reply (greedy) is what
    LLM.create_chat_completion gives, content and calls alike, whole and
    streamed; a required or named call always parses and fits its schema."""
    jsonschema = pytest.importorskip("jsonschema")
    from llminfer import LLM

    kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0)
    out = client.chat.completions.create(**kw)
    msg, finish = out.choices[0].message, out.choices[0].finish_reason
    with LLM(smollm2_path, n_ctx=512, n_threads=1) as llm:
        lib = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0)
    lib_msg = lib["choices"][0]["message"]
    lib_calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in lib_msg.get("tool_calls") or []]
    assert (msg.content, _calls(msg), finish) == (lib_msg["content"], lib_calls, lib["choices"][0]["finish_reason"])
    if choice == "none":
        assert not msg.tool_calls and msg.content
    if choice not in ("auto", "none"):
        assert finish == "tool_calls" and len(msg.tool_calls) == 1 and msg.tool_calls[0].id
        name, args = _calls(msg)[0]
        want = "get_time" if isinstance(choice, dict) else name
        assert name == want
        jsonschema.validate(args, next(t for t in TOOLS if t["function"]["name"] == name)["function"]["parameters"])
    content, calls, sfinish = _streamed_calls(client.chat.completions.create(stream=True, **kw))
    assert (content or None, calls, sfinish) == (msg.content or None, _calls(msg), finish)
    wait_idle(server.url)


def test_a_tool_exchange_goes_on(server, client, model):
    """The follow-up turn: the assistant's call (content null) and the tool's
    answer render, and the model replies."""
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=80, temperature=0).choices[0].message
    call = first.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None,
                      "tool_calls": [{"id": call.id, "type": "function",
                                      "function": {"name": call.function.name,
                                                   "arguments": call.function.arguments}}]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    reply = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=24,
                                           temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.choices[0].message.content or reply.choices[0].message.tool_calls
    wait_idle(server.url)


@pytest.mark.parametrize("extra, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_requests_are_400(server, model, extra, param):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": model, "messages": ASK, "max_tokens": 4, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    wait_idle(server.url)


# ---- embeddings ----

def test_embeddings_are_what_llm_embed_gives(server, client, model, smollm2_path):
    """/v1/embeddings (the openai client asks for base64 by default) gives
    LLM.embed's vectors bit for bit, as floats too and from token ids; run
    while a generation streams, neither changes the other."""
    from llminfer import LLM

    texts = ["The cat sat on the mat.", "A completely different sentence about the stock market.", "x"]
    with LLM(smollm2_path, n_ctx=512, n_threads=1) as llm:
        want = np.array(llm.embed(texts), dtype=np.float32)
        ids = llm.tokenize(texts[0])
    got = client.embeddings.create(model=model, input=texts)
    assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 10
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], dtype=np.float32), want)
    floats = httpx.post(server.url + "/v1/embeddings", json={"model": model, "input": texts[1],
                                                             "encoding_format": "float"}, timeout=60).json()
    np.testing.assert_array_equal(np.array(floats["data"][0]["embedding"], dtype=np.float32), want[1])
    from_ids = client.embeddings.create(model=model, input=ids, encoding_format="float")
    np.testing.assert_array_equal(np.array(from_ids.data[0].embedding, dtype=np.float32), want[0])

    kw = dict(model=model, prompt="Once upon a time", max_tokens=48, temperature=0, extra_body={"ignore_eos": True})
    alone = client.completions.create(**kw).choices[0].text
    with ThreadPoolExecutor(2) as ex:
        gen = ex.submit(lambda: "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)
                                        if c.choices))
        time.sleep(0.05)
        during = [ex.submit(client.embeddings.create, model=model, input=texts) for _ in range(3)]
        assert gen.result() == alone
        for f in during:
            np.testing.assert_array_equal(np.array([d.embedding for d in f.result().data], dtype=np.float32), want)
    wait_idle(server.url)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"), ({"input": ""}, "input"), ({"input": [[]]}, "input"), ({"input": 5}, "input"),
    ({"input": [1, 10 ** 9]}, "input"), ({"input": ["ok", 5]}, "input"), ({"input": ["a"] * 300}, "input"),
    ({"input": "word " * 600}, "input"), ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "dimensions": 7}, "dimensions"),
])
def test_bad_embedding_requests_are_400(server, model, body, param):
    r = httpx.post(server.url + "/v1/embeddings", json={"model": model, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    wait_idle(server.url)


@pytest.fixture(scope="module")
def encoder_server(tmp_path_factory):
    from tiny_models import write_encoder

    path = write_encoder(tmp_path_factory.mktemp("enc") / "bert.gguf", arch="bert", qtype="Q8_0")
    s = ServerThread(ServeArgs(model=str(path), n_threads=1))
    yield s, path
    s.stop()


def test_an_encoder_model_serves_embeddings_only(encoder_server):
    """A bert GGUF: /v1/embeddings gives Embedder's vectors bit for bit; a
    completion or chat is a 400 saying the model only embeds; the tokenizer
    endpoints, health and metrics work."""
    from llminfer import Embedder

    srv, path = encoder_server
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    name = c.models.list().data[0].id
    texts = ["the cat sat on the mat", "a dog ran"]
    with Embedder(path, n_threads=1) as e:
        want = np.array(e.embed(texts), dtype=np.float32)
        n_tokens = sum(len(e._ids(t, True)) for t in texts)
    got = c.embeddings.create(model=name, input=texts)
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], dtype=np.float32), want)
    assert got.usage.prompt_tokens == n_tokens
    for call in (lambda: c.completions.create(model=name, prompt="hi", max_tokens=2),
                 lambda: c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["code"] == "model_not_generative" and "embedding model" in err.value.body["message"]
    assert httpx.post(srv.url + "/tokenize", json={"messages": [{"role": "user", "content": "x"}]}).status_code == 400
    ids = httpx.post(srv.url + "/tokenize", json={"prompt": "the cat"}).json()["tokens"]
    assert httpx.post(srv.url + "/detokenize", json={"tokens": ids}).status_code == 200
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    assert metrics(srv.url)[("llminfer:num_requests_running", frozenset())] == 0


# ---- echo ----

def test_echo_gives_the_prompt_and_its_logprobs(server, client, model, smollm2_path):
    """echo: the prompt before each completion; with logprobs, the prompt
    tokens' log-probabilities given the tokens before them (the first has
    none), as the model's logits give them; max_tokens 0 asks for those
    alone, as evaluation harnesses (lm-eval's loglikelihood) do."""
    from llminfer import LLM

    prompt = "The quick brown fox jumps over the lazy dog"
    only = client.completions.create(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    c = only.choices[0]
    assert c.text == prompt and only.usage.completion_tokens == 0
    with LLM(smollm2_path, n_ctx=512, n_threads=1) as llm:
        ids = llm.tokenize(prompt)
        rows = llm.eval(ids).astype(np.float64)
    lse = np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1)) + rows.max(axis=1)
    want = [rows[i - 1, ids[i]] - lse[i - 1] for i in range(1, len(ids))]
    lp = c.logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) == only.usage.prompt_tokens
    np.testing.assert_allclose(lp.token_logprobs[1:], want, rtol=0, atol=1e-4)
    assert lp.top_logprobs[0] is None and all(len(t) >= 1 for t in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and "".join(lp.tokens) == prompt

    plain = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0)
    both = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, echo=True, logprobs=1)
    assert both.choices[0].text == prompt + plain.choices[0].text
    assert both.choices[0].logprobs.token_logprobs[:len(ids)] == lp.token_logprobs
    assert len(both.choices[0].logprobs.tokens) == len(ids) + both.usage.completion_tokens
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == both.choices[0].text
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert streamed == both.choices[0].logprobs.tokens
    two = client.completions.create(model=model, prompt=["Red is", "Blue is"], max_tokens=0, echo=True, n=2)
    assert [ch.text for ch in two.choices] == ["Red is", "Red is", "Blue is", "Blue is"]
    wait_idle(server.url)


# ---- fill in the middle ----

@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    """A tiny random model whose metadata names FIM tokens (SmolLM2's names none)."""
    from tiny_models import TinyConfig, vocab, write_model

    tokens, _ = vocab()
    fim = {k: tokens.index(c) for k, c in (("pre", "x"), ("suf", "y"), ("mid", "z"))}
    path = write_model(tmp_path_factory.mktemp("fim") / "fim.gguf", TinyConfig(tie_output=False), extra_uint32={
        "tokenizer.ggml.fim_pre_token_id": fim["pre"], "tokenizer.ggml.fim_suf_token_id": fim["suf"],
        "tokenizer.ggml.fim_mid_token_id": fim["mid"]})
    s = ServerThread(ServeArgs(model=str(path), n_ctx=96, n_threads=1))
    yield s, path
    s.stop()


def test_suffix_fills_in_the_middle_as_the_library_does(fim_server, server, model):
    from llminfer import LLM

    srv, path = fim_server
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    name = c.models.list().data[0].id
    out = c.completions.create(model=name, prompt="the cat", suffix=" the mat", max_tokens=5, temperature=0)
    with LLM(path, n_ctx=96, n_threads=1) as llm:
        lib = llm.create_completion("the cat", suffix=" the mat", max_tokens=5, temperature=0)
    assert out.choices[0].text == lib["choices"][0]["text"]
    assert out.usage.prompt_tokens == lib["usage"]["prompt_tokens"]
    for body, param in (({"prompt": ["a", "b"], "suffix": "c"}, "prompt"), ({"prompt": "a", "suffix": 5}, "suffix")):
        r = httpx.post(srv.url + "/v1/completions", json={"model": name, "max_tokens": 2, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # a model that names no FIM tokens says so
    r = httpx.post(server.url + "/v1/completions", json={"model": model, "prompt": "def f():", "suffix": "  return 1",
                                                         "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]


# ---- batching ----

def _ask(client, model, i, stream):
    animal = ["cat", "dog", "fox", "owl", "bee", "cow", "elk", "emu", "yak", "ant", "bat", "eel", "hen", "ram", "pig",
              "rat"][i]
    kw = dict(model=model, prompt=f"Story number {i}: once upon a time, a {animal}",
              max_tokens=16, ignore_eos=True)
    kw["temperature"] = 0 if i % 2 == 0 else 0.9
    if i % 2:
        kw["seed"] = 1000 + i
    extra = {"ignore_eos": kw.pop("ignore_eos")}
    if stream:
        return "".join(c.choices[0].text for c in client.completions.create(stream=True, extra_body=extra, **kw)
                       if c.choices)
    return client.completions.create(extra_body=extra, **kw).choices[0].text


def test_concurrent_clients_get_what_they_get_alone(server, client, model):
    n = 16
    alone = [_ask(client, model, i, stream=False) for i in range(n)]
    assert len(set(alone)) == n  # distinct prompts, distinct texts: the comparison means something
    steps = server.scheduler.steps
    with ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda i: _ask(client, model, i, stream=i % 3 == 0), range(n)))
    assert together == alone
    # 16 requests of 16 tokens in far fewer steps than 256: they were batched
    assert server.scheduler.steps - steps < 16 * 16 // 2
    wait_idle(server.url)


def test_n_choices_with_a_seed_are_reproducible(client, model):
    kw = dict(model=model, prompt="My favourite food is", max_tokens=10, temperature=1.0, seed=7, n=3)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    assert 0 < a.usage.completion_tokens <= 30 and a.usage.prompt_tokens == b.usage.prompt_tokens < 10


def test_several_prompts_and_streamed_choices(server, client, model):
    many = client.completions.create(model=model, prompt=["Red is", "Blue is"], max_tokens=6, temperature=0)
    assert [c.index for c in many.choices] == [0, 1]
    for c, p in zip(many.choices, ["Red is", "Blue is"]):
        assert c.text == client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0).choices[0].text
    body = {"model": model, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6,
            "temperature": 1.0, "seed": 3, "n": 2}
    whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        events = sse(r)
    texts = {0: "", 1: ""}
    for e in events:
        for ch in e["choices"]:
            texts[ch["index"]] += ch["delta"].get("content") or ""
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert events[-1]["usage"][k] == whole["usage"][k]
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # the same prompt, one block


# ---- cancellation, prefix cache ----

def test_cancel_mid_stream_frees_its_blocks(server, model):
    before = wait_idle(server.url)
    aborted = before.get(("llminfer:request_success_total", frozenset({("finished_reason", "abort")})), 0)
    body = {"model": model, "prompt": "Count: 1, 2, 3,", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = 0
            while got < 3:
                if next(lines).startswith("data: "):
                    got += 1
            assert gauge(server.url, "num_requests_running") == 1
            assert gauge(server.url, "kv_cache_usage_perc") > 0
    after = wait_idle(server.url, timeout=30)
    assert after[("llminfer:request_success_total", frozenset({("finished_reason", "abort")}))] == aborted + 1
    assert after[("llminfer:generation_tokens_total", frozenset())] < \
        before[("llminfer:generation_tokens_total", frozenset())] + 400


def test_prefix_reuse_shows_in_usage(server, client, model):
    system = ("You are a helpful assistant for a small bakery. You answer questions about bread, cakes, "
              "opening hours and prices. Opening hours are 7am to 6pm, Monday to Saturday. A loaf of "
              "sourdough costs four pounds and a croissant costs one pound fifty. ") * 2
    def chat(question):
        return client.chat.completions.create(
            model=model, max_tokens=8, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    first = chat("When do you open?")
    second = chat("How much is a croissant?")
    again = chat("How much is a croissant?")
    assert first.usage.prompt_tokens > 128
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 96 and cached % 32 == 0 and cached < second.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= cached
    assert again.choices[0].message.content == second.choices[0].message.content
    m = metrics(server.url)
    assert m[("llminfer:prefix_cache_hits_total", frozenset())] >= cached


# ---- logprobs ----

def test_logprobs_match_the_model(server, client, model, smollm2_path):
    from llminfer import LLM

    prompt = "The quick brown fox"
    out = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0, logprobs=5)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        values = list(top.values())
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert math.isclose(chosen, values[0], abs_tol=1e-6)  # greedy takes the most likely
        assert top[tok] == chosen  # the chosen token is listed
    # sampled, with no alternatives asked: the chosen token alone, as OpenAI gives it
    zero = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=1.0, seed=2, logprobs=0)
    lz = zero.choices[0].logprobs
    assert [list(t) for t in lz.top_logprobs] == [[t] for t in lz.tokens]
    assert [t[k] for t, k in zip(lz.top_logprobs, lz.tokens)] == lz.token_logprobs
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
    with LLM(smollm2_path, n_ctx=64, n_threads=1) as llm:
        logits = llm.eval(ids)[-1].astype(np.float64)
    ref = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    want = np.sort(ref)[::-1][:5]
    assert np.allclose(sorted(lp.top_logprobs[0].values(), reverse=True), want, atol=1e-4)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(bytes(c.bytes).decode("utf-8", "replace") == c.token for c in content)


# ---- bad requests ----

BAD = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"prompt": "hi", "model": 5}, 400, "model"),
    ({"prompt": "hi", "temperature": 5}, 400, "temperature"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),  # 0 only with echo
    ({"prompt": "hi", "max_tokens": 10 ** 9}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 512}, 400, "max_tokens"),  # with the prompt, past n_ctx=512
    ({"prompt": "word " * 600}, 400, "prompt"),
    ({"prompt": [1, 2, 10 ** 7]}, 400, "prompt"),
    ({"prompt": [1, -2]}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": 42}, 400, "prompt"),
    ({"prompt": "hi", "n": 100}, 400, "n"),
    ({"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ({"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"999999999": 1}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 1000}}, 400, "5"),
    ({"prompt": "hi", "stop": [1, 2]}, 400, "stop"),
    ({"prompt": "hi", "stop": ["x" * 5000]}, 400, "stop"),
    ({"prompt": ["hi"] * 100}, 400, "prompt"),
    ({"prompt": ["hi"] * 10, "n": 10}, 400, "n"),
    ({"prompt": "hi", "seed": 1.5}, 400, "seed"),
    ({"prompt": "hi", "echo": True, "suffix": "x"}, 400, "echo"),
    ({"prompt": "hi", "suffix": "x"}, 400, "suffix"),  # SmolLM2 names no FIM tokens
    ({"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ({"prompt": "hi", "stream": "yes"}, 400, "stream"),
    # integers no float holds: a 400 naming the field, not an OverflowError's 500
    *[({"prompt": "hi", field: 10 ** 400}, 400, field) for field in (
        "temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "max_tokens",
        "seed", "n", "top_k", "logprobs", "best_of")],
    ({"prompt": "hi", "temperature": -10 ** 400}, 400, "temperature"),
    ({"prompt": "hi", "seed": -10 ** 400}, 400, "seed"),
    ({"prompt": "hi", "logit_bias": {"5": 10 ** 400}}, 400, "5"),
    ({"prompt": "hi", "logit_bias": {"5": -10 ** 400}}, 400, "5"),
    ({"prompt": "hi", "logit_bias": {"1" + "0" * 400: 1}}, 400, "logit_bias"),
    ({"prompt": [10 ** 400]}, 400, "prompt"),
    (b'{"prompt": "hi", "temperature": 1' + b"0" * 5000 + b"}", 400, None),  # past int()'s 4300 digits
    # nested thousands deep: a 400 saying so, not a RecursionError's 500
    (b'{"prompt": "hi", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, None),
    (b'{"prompt": "hi", "x": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}", 400, None),
    (b'{"prompt": "hi", "x": ' + b"[" * 200 + b"]" * 200 + b"}", 400, None),
    (b"[" * 5000, 400, None),
    (json.dumps({"prompt": "hi", "json_schema": "[" * 5000 + "]" * 5000}).encode(), 400, "json_schema"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_completion_requests(server, model, body, status, param):
    if isinstance(body, dict):
        body = json.dumps({"model": model, **body}).encode()
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert err["param"] == param


def test_deep_chat_requests_are_400_naming_the_problem(server, model):
    """A response_format schema, tool parameters or a tool call's arguments
    nested thousands deep: 400 saying it nests too deep, and still serving."""
    deep_schema = '{"type": "array", "items": ' * 3000 + '{"type": "integer"}' + "}" * 3000  # as JSON text
    user = json.dumps({"role": "user", "content": "hi"})
    call = '{"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", ' \
           '"function": {"name": "f", "arguments": %s}}]}'
    bodies = [
        '"messages": [%s], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": %s}}'
        % (user, deep_schema),
        '"messages": [%s], "tools": [{"type": "function", "function": {"name": "f", "parameters": %s}}]'
        % (user, deep_schema),
        '"messages": [%s, %s]' % (call % json.dumps("[" * 5000 + "]" * 5000), user),
        '"messages": [%s, %s]' % (call % json.dumps("[" * 300 + "]" * 300), user),
    ]
    with httpx.Client(timeout=60) as c:
        for body in bodies:
            data = ('{"model": %s, "max_tokens": 1, %s}' % (json.dumps(model), body)).encode()
            r = c.post(server.url + "/v1/chat/completions", content=data, headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text[:300]
            assert "nests deeper" in r.json()["error"]["message"]
        user = {"role": "user", "content": "hi"}
        ok = c.post(server.url + "/v1/chat/completions", json={"model": model, "max_tokens": 1, "messages": [user]})
        assert ok.status_code == 200
    wait_idle(server.url)


def test_a_stream_that_fails_ends_with_an_error_event_and_done():
    """Whatever raises while a stream's chunks are made, the client gets an
    error event in OpenAI's shape and [DONE], not a cut connection."""
    import asyncio

    from llminfer.server.app import _SSEResponse

    async def chunks():
        yield b'data: {"x": 1}\n\n'
        raise RecursionError("maximum recursion depth exceeded")

    sent, closed = [], []

    async def receive():
        await asyncio.sleep(3600)

    async def send(msg):
        sent.append(msg)

    asyncio.run(_SSEResponse(chunks(), lambda: closed.append(True))({"type": "http"}, receive, send))
    body = b"".join(m.get("body", b"") for m in sent)
    events = [e[len(b"data: "):] for e in body.split(b"\n\n") if e]
    assert events[0] == b'{"x": 1}' and events[-1] == b"[DONE]", body
    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error" and "RecursionError" in err["message"]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False} and closed


def test_bad_chat_requests_and_limits(server, client, model):
    for body in ({"messages": []}, {"messages": "hi"}, {"messages": [{"content": "no role"}]},
                 {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                 {"messages": [{"role": "user", "content": ["not a part"]}]},
                 {"messages": [{"role": "user", "content": 5}]}, {"messages": ["hi"]},
                 {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3},
                 {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
                 {"messages": [{"role": "assistant", "content": None, "tool_calls": "x"}]}):
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": model, **body})
        assert r.status_code == 400, (body, r.text)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], temperature=-1)
    huge = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'
    assert httpx.post(server.url + "/v1/completions", content=huge, timeout=60).status_code == 413
    assert httpx.get(server.url + "/v1/nowhere").json()["error"]["message"]
    assert httpx.get(server.url + "/v1/completions").status_code == 405
    # still serving, nothing held
    ok = client.completions.create(model=model, prompt="Hello", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2
    wait_idle(server.url)


ODD_VALUES = [None, "x", -1, 0, 2.5, 1e308, True, [1], {"a": 1}]
FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty",
          "frequency_penalty", "seed", "n", "stop", "logprobs", "logit_bias", "ignore_eos", "stream", "model",
          "stream_options", "best_of", "suffix", "echo", "user", "response_format", "json_schema", "grammar",
          "tools", "tool_choice"]


def test_odd_values_in_every_field_never_break_the_server(server, model):
    """Each field given each odd value: answered 200 or 4xx, never 5xx, and
    the server is idle afterwards with nothing held."""
    statuses = set()
    with httpx.Client(timeout=60) as c:
        for field in FIELDS:
            for v in ODD_VALUES:
                body = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0, field: v}
                if field == "max_tokens" and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 4:
                    continue  # a valid long generation: slow, not odd
                r = c.post(server.url + "/v1/completions", json=body)
                statuses.add(r.status_code)
                assert r.status_code in (200, 400, 404), (field, v, r.status_code, r.text[:200])
                if r.status_code != 200:
                    assert r.json()["error"]["message"]
                else:
                    r.read()
        chat = {"model": model, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
        for field in ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", "tools"):
            for v in ODD_VALUES:
                if field == "max_completion_tokens" and isinstance(v, float) and v > 4:
                    continue
                r = c.post(server.url + "/v1/chat/completions", json={**chat, field: v})
                assert r.status_code in (200, 400), (field, v, r.status_code, r.text[:200])
        for v in ODD_VALUES + [[None], ["x"], [{"type": "text"}]]:
            for body in ({**chat, "messages": [{"role": "user", "content": v}]},
                         {**chat, "messages": [{"role": v, "content": "Hi"}]}, {**chat, "messages": [v]}):
                r = c.post(server.url + "/v1/chat/completions", json=body)
                assert r.status_code in (200, 400), (body, r.status_code, r.text[:200])
    assert {200, 400} <= statuses
    wait_idle(server.url)


# ---- metrics ----

def test_metrics_parse_as_prometheus_text(server, client, model):
    client.completions.create(model=model, prompt="Metrics", max_tokens=3, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    for name, kind in [("llminfer:num_requests_running", "gauge"), ("llminfer:num_requests_waiting", "gauge"),
                       ("llminfer:kv_cache_usage_perc", "gauge"), ("llminfer:prompt_tokens", "counter"),
                       ("llminfer:generation_tokens", "counter"),
                       ("llminfer:time_to_first_token_seconds", "histogram"),
                       ("llminfer:inter_token_latency_seconds", "histogram"),
                       ("llminfer:e2e_request_latency_seconds", "histogram")]:
        assert fams[name].type == kind, name
    for name in ("llminfer:time_to_first_token_seconds", "llminfer:inter_token_latency_seconds"):
        samples = fams[name].samples
        buckets = [s.value for s in samples if s.name.endswith("_bucket")]
        count = next(s.value for s in samples if s.name.endswith("_count"))
        assert buckets == sorted(buckets) and buckets[-1] == count > 0
    assert fams["llminfer:generation_tokens"].samples[0].value >= 3


# ---- API key and queue bound ----

@pytest.fixture(scope="module")
def guarded(smollm2_path):
    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=256, kv_pool_tokens=1024, n_threads=1,
                               api_key="sekret", max_running=1, max_waiting=1))
    yield s
    s.stop()


def test_api_key(guarded):
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    bad = httpx.get(guarded.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(guarded.url + "/health").status_code == 200
    c = openai.OpenAI(base_url=guarded.url + "/v1", api_key="sekret", max_retries=0)
    assert c.completions.create(model=c.models.list().data[0].id, prompt="Hi", max_tokens=2).usage.total_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=guarded.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_queue_bound_answers_429(guarded):
    headers = {"Authorization": "Bearer sekret"}
    body = {"prompt": "Tell me a long story", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60, headers=headers) as c1, httpx.Client(timeout=60, headers=headers) as c2:
        with c1.stream("POST", guarded.url + "/v1/completions", json=body) as r1:
            lines = r1.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # running
            with c2.stream("POST", guarded.url + "/v1/completions", json=body) as r2:
                assert r2.status_code == 200  # waiting
                r3 = httpx.post(guarded.url + "/v1/completions", json={**body, "stream": False}, headers=headers)
                assert r3.status_code == 429 and r3.json()["error"]["type"] == "rate_limit_error"
    wait_idle(guarded.url)
    ok = httpx.post(guarded.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=headers)
    assert ok.status_code == 200


@pytest.fixture(scope="module")
def tight(smollm2_path):
    """A pool of 10 blocks of 32 positions, no more than one request of n_ctx needs."""
    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=256, kv_pool_tokens=256, n_threads=1))
    yield s
    s.stop()


def test_refused_side_requests_give_back_their_blocks(tight):
    """Embeddings and echo + logprobs run beside the batch; when the pool is
    busy their first pass fails (a 503), and the blocks it had taken go back:
    the server goes idle at zero usage and serves a full-context request
    after (before, every refusal leaked them, for good)."""
    long = " ".join(f"w{i}" for i in range(400))
    ids = httpx.post(tight.url + "/tokenize", json={"prompt": long}).json()["tokens"][:240]
    prompt = httpx.post(tight.url + "/detokenize", json={"tokens": ids}).json()["prompt"]
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    refused = 0
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", tight.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = 0
            while got < 100:  # the stream now holds 4 of the 10 blocks
                if next(lines).startswith("data: "):
                    got += 1
            for _ in range(3):
                for path, req in (("/v1/embeddings", {"input": prompt}),
                                  ("/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True,
                                                       "logprobs": 1})):
                    out = c.post(tight.url + path, json=req)
                    assert out.status_code in (200, 503), out.text
                    if out.status_code == 503:
                        assert out.json()["error"]["code"] == "kv_pool_full"
                        refused += 1
            for _ in lines:
                pass
    assert refused > 0  # the case under test happened
    wait_idle(tight.url, timeout=20)
    full = httpx.post(tight.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                      timeout=60)
    assert full.status_code == 200 and full.json()["usage"]["completion_tokens"] == 8


# ---- the command ----

def test_serve_command_starts_and_stops(smollm2_path, tmp_path):
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llminfer", "serve", "-m", str(smollm2_path), "-t", "1",
                             "-c", "256", "--port", str(port), "--api-key", "k", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                       headers={"Authorization": "Bearer k"}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        rc = proc.wait(30)
    # uvicorn shuts down cleanly on SIGTERM, then dies of it as a process would by default
    out = proc.stdout.read().decode()
    assert rc in (0, -signal.SIGTERM) and "Traceback" not in out, out


def test_serve_command_refuses_bad_arguments(tmp_path, capsys):
    from llminfer.cli.commands import main

    with socket.socket() as s:  # a free port: serve binds it before it looks for the model
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "-m", str(tmp_path / "missing.gguf"), "--port", str(port)]) == 1
    assert "missing.gguf" in capsys.readouterr().err
    assert main(["serve", "-c", "1024", "--kv-pool-tokens", "512"]) == 1
    assert "--kv-pool-tokens 512 is less than --ctx-size 1024" in capsys.readouterr().err


def test_a_model_reply_nested_thousands_deep_streams_to_done(tmp_path):
    """A model may write `<tool_call>[[[[...` by itself (here a grammar makes
    it): parsed for tool calls, that reply is plain text, and both the
    stream and the whole reply end cleanly, never a RecursionError."""
    from starlette.testclient import TestClient

    from tiny_models import TinyConfig, write_model

    path = write_model(tmp_path / "tiny.gguf", TinyConfig(context_length=2048))
    app = create_app(ServeArgs(model=str(path), n_ctx=2048, n_threads=1))
    reply = "<tool_call>" + "[" * 1100
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1200, "temperature": 0,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "grammar": f"root ::= {json.dumps(reply)}"}
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/chat/completions", json={**body, "stream": True})
        assert r.status_code == 200
        events = sse(r)
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        assert text == reply and not any("tool_calls" in e["choices"][0]["delta"] for e in events if e.get("choices"))
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text[:300]
        message = r.json()["choices"][0]["message"]
        assert message["content"] == reply and not message.get("tool_calls")
