"""Many models in one `llminfer serve` (llminfer.server.router) over real HTTP
on loopback, with the openai client and three tiny random models: the
catalog from a folder and from a config file, loading on first use, the
states /v1/models lists, concurrent requests to different models, LRU
unloading under --models-max-loaded 1 (each reply what a one-model server
gives), idle unloading, 404 for an unknown model, 503 with Retry-After when
every loaded model is busy, and per-model metrics."""

import json
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")
openai = pytest.importorskip("openai", reason="the server tests use the openai client")
parser = pytest.importorskip("prometheus_client.parser", reason="the metrics test parses with prometheus_client")

from servers import ServerThread  # noqa: E402
from tiny_models import TinyConfig, write_model  # noqa: E402

from llminfer.errors import InvalidArgumentError, ModelNotFoundError  # noqa: E402
from llminfer.server import ServeArgs, create_app  # noqa: E402

NAMES = ("alpha", "beta", "gamma")
COMMON = dict(n_ctx=256, n_threads=1, max_batch_tokens=128)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """Three tiny models of different weights, beside files a folder of
    models holds but that are not models to serve: a projector and a part
    of a split GGUF."""
    d = tmp_path_factory.mktemp("models")
    for i, name in enumerate(NAMES):
        write_model(d / f"{name}.gguf", TinyConfig(seed=10 + i))
    shutil.copy(d / "alpha.gguf", d / "mmproj-alpha-f16.gguf")
    shutil.copy(d / "beta.gguf", d / "split-00001-of-00002.gguf")
    return d


@pytest.fixture(scope="module")
def reference(models_dir):
    """What a one-model server (-m) answers each PROMPT with, at temperature 0."""
    out = {}
    for name in NAMES:
        s = ServerThread(ServeArgs(model=str(models_dir / f"{name}.gguf"), **COMMON))
        try:
            client = _client(s)
            out[name] = {p: _complete(client, "anything", p) for p in PROMPTS}
        finally:
            s.stop()
    return out


PROMPTS = ("Hello there", "The quick brown fox")


def _client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(client, model, prompt, max_tokens=8):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return r.model, r.choices[0].text


def _states(s) -> dict:
    return {m["id"]: m["status"]["value"] for m in httpx.get(s.url + "/v1/models").json()["data"]}


@pytest.fixture
def serve(models_dir):
    started = []

    def start(**kw):
        s = ServerThread(ServeArgs(**{**COMMON, "models_dir": str(models_dir), **kw}))
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


def test_a_folder_lists_its_models_unloaded_and_loads_one_on_first_use(serve, reference):
    s = serve()
    assert _states(s) == {n: "unloaded" for n in NAMES}  # no projector, no part of a split model
    client = _client(s)
    assert [m.id for m in client.models.list().data] == list(NAMES)
    assert _complete(client, "beta", PROMPTS[0]) == ("beta", reference["beta"][PROMPTS[0]][1])
    assert _states(s) == {"alpha": "unloaded", "beta": "loaded", "gamma": "unloaded"}
    card = httpx.get(s.url + "/v1/models/beta").json()
    assert card["status"]["value"] == "loaded" and card["max_model_len"] == 256
    # the Anthropic route is dispatched the same way, and answers in its own shape
    r = httpx.post(s.url + "/v1/messages", json={"model": "gamma", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["model"] == "gamma"
    assert _states(s)["gamma"] == "loaded"


def test_concurrent_requests_to_different_models_each_get_their_own_engine(serve, reference):
    s = serve(models_max_loaded=3)
    client = _client(s)
    jobs = [(n, p) for p in PROMPTS for n in NAMES] * 2
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: _complete(client, *job), jobs))
    assert got == [(n, reference[n][p][1]) for n, p in jobs]
    assert _states(s) == {n: "loaded" for n in NAMES}
    # many requests for one model still unloaded: they wait for the one load
    s2 = serve(models_max_loaded=1)
    client2 = _client(s2)
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda i: _complete(client2, "gamma", PROMPTS[i % 2]), range(6)))
    assert got == [("gamma", reference["gamma"][PROMPTS[i % 2]][1]) for i in range(6)]


def test_max_loaded_one_unloads_the_least_recently_used_while_requests_alternate(serve, reference):
    s = serve(models_max_loaded=1)
    client = _client(s)
    for name in ("alpha", "beta", "alpha", "gamma", "beta"):
        for p in PROMPTS:
            assert _complete(client, name, p) == (name, reference[name][p][1])
        assert _states(s) == {n: "loaded" if n == name else "unloaded" for n in NAMES}
    # two loaded at most: the least recently used goes
    s2 = serve(models_max_loaded=2)
    client2 = _client(s2)
    for name in ("alpha", "beta", "alpha", "gamma"):
        _complete(client2, name, PROMPTS[0])
    assert _states(s2) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}


def test_a_memory_budget_keeps_what_fits(serve, models_dir):
    one = httpx.get(serve().url + "/v1/models").json()["data"][0]["status"]["size_bytes"]
    s = serve(models_memory_gib=1.5 * one / (1 << 30), models_max_loaded=None)  # room for one model, not two
    client = _client(s)
    _complete(client, "alpha", PROMPTS[0])
    _complete(client, "beta", PROMPTS[0])
    assert _states(s) == {"alpha": "unloaded", "beta": "loaded", "gamma": "unloaded"}
    tiny = serve(models_memory_gib=0.5 * one / (1 << 30))
    with pytest.raises(openai.InternalServerError) as e:
        _complete(_client(tiny), "alpha", PROMPTS[0])
    assert e.value.status_code == 503 and "budget" in str(e.value)


def test_an_idle_model_is_unloaded(serve, reference):
    s = serve(models_idle_timeout=0.3)
    client = _client(s)
    assert _complete(client, "alpha", PROMPTS[1]) == ("alpha", reference["alpha"][PROMPTS[1]][1])
    deadline = time.monotonic() + 60
    while _states(s)["alpha"] != "unloaded":
        assert time.monotonic() < deadline, "the idle model was never unloaded"
        time.sleep(0.05)
    assert _complete(client, "alpha", PROMPTS[1]) == ("alpha", reference["alpha"][PROMPTS[1]][1])


def test_an_unknown_model_is_a_404_naming_the_models(serve):
    s = serve()
    client = _client(s)
    with pytest.raises(openai.NotFoundError) as e:
        _complete(client, "delta", PROMPTS[0])
    assert all(f"'{n}'" in str(e.value) for n in NAMES)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="mmproj-alpha-f16", messages=[{"role": "user", "content": "x"}])
    assert httpx.get(s.url + "/v1/models/delta").status_code == 404
    r = httpx.post(s.url + "/v1/messages", json={"model": "delta", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["type"] == "error"  # Anthropic's error shape
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"})  # three models: which?
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert _states(s) == {n: "unloaded" for n in NAMES}


def test_ollamas_api_lists_and_dispatches_by_model(serve, reference):
    """/api/tags lists every model known (nothing loads for it), /api/ps
    those loaded; /api/generate is dispatched by its model; an unknown one
    is a 404 in Ollama's shape."""
    s = serve()
    tags = httpx.get(s.url + "/api/tags").json()["models"]
    assert [m["name"] for m in tags] == list(NAMES) and all(m["details"]["format"] == "gguf" for m in tags)
    assert httpx.get(s.url + "/api/ps").json() == {"models": []}
    r = httpx.post(s.url + "/api/generate", timeout=60, json={
        "model": "beta", "prompt": PROMPTS[0], "raw": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 8}}).json()
    assert (r["model"], r["response"]) == ("beta", reference["beta"][PROMPTS[0]][1])
    assert [m["name"] for m in httpx.get(s.url + "/api/ps").json()["models"]] == ["beta"]
    r = httpx.post(s.url + "/api/chat", json={"model": "delta", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and set(r.json()) == {"error"} and "'alpha'" in r.json()["error"]
    assert _states(s) == {"alpha": "unloaded", "beta": "loaded", "gamma": "unloaded"}


@pytest.fixture(scope="module")
def long_models(tmp_path_factory):
    """Two tiny models with a context long enough for a stream that outlasts the test's checks."""
    d = tmp_path_factory.mktemp("long")
    for name in ("long", "other"):
        write_model(d / f"{name}.gguf", TinyConfig(context_length=8192, seed=len(name)))
    return d


def _hold_stream(url, model) -> socket.socket:
    """A streamed completion, long, read up to its first event and then not
    read: the server cannot finish sending it, so it holds its model."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps({"model": model, "prompt": "a", "max_tokens": 8000, "ignore_eos": True, "stream": True,
                       "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"data: " not in got:
        got += sock.recv(1024)
    return sock


def test_a_request_that_cannot_fit_is_a_503_with_retry_after(long_models):
    s = ServerThread(ServeArgs(models_dir=str(long_models), n_ctx=8192, n_threads=1, models_max_loaded=1))
    try:
        held = _hold_stream(s.url, "long")
        try:
            card = httpx.get(s.url + "/v1/models/long").json()
            assert card["status"] == {**card["status"], "value": "loaded", "requests": 1}
            r = httpx.post(s.url + "/v1/completions", json={"model": "other", "prompt": "x", "max_tokens": 2})
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
            assert "'long'" in r.json()["error"]["message"] and r.json()["error"]["code"] == "models_busy"
            assert _states(s) == {"long": "loaded", "other": "unloaded"}  # never unloaded under its request
        finally:
            held.close()
        deadline = time.monotonic() + 60
        while True:  # the client gone, the stream is cancelled and the model let go
            r = httpx.post(s.url + "/v1/completions", json={"model": "other", "prompt": "x", "max_tokens": 2})
            if r.status_code == 200:
                break
            assert r.status_code == 503 and time.monotonic() < deadline, r.text
            time.sleep(0.05)
        assert _states(s) == {"long": "unloaded", "other": "loaded"}
    finally:
        s.stop()


def test_a_model_in_use_outlives_its_idle_timeout(long_models):
    s = ServerThread(ServeArgs(models_dir=str(long_models), n_ctx=8192, n_threads=1, models_idle_timeout=0.1))
    try:
        held = _hold_stream(s.url, "long")
        try:
            time.sleep(1.0)  # ten idle timeouts: the reaper has looked many times
            card = httpx.get(s.url + "/v1/models/long").json()
            assert card["status"]["value"] == "loaded" and card["status"]["requests"] == 1
        finally:
            held.close()
        deadline = time.monotonic() + 60
        while _states(s)["long"] != "unloaded":  # let go, then idle: unloaded
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        s.stop()


def test_a_model_that_fails_to_load_is_a_shaped_error_and_stays_listed(tmp_path, models_dir):
    shutil.copy(models_dir / "alpha.gguf", tmp_path / "good.gguf")
    write_model(tmp_path / "broken.gguf", TinyConfig(),
                tensor_hook=lambda name, data, t: None if name == "output_norm.weight" else (data, t))
    s = ServerThread(ServeArgs(models_dir=str(tmp_path), **COMMON))
    try:
        r = httpx.post(s.url + "/v1/completions", json={"model": "broken", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
        assert "broken" in r.json()["error"]["message"]
        card = httpx.get(s.url + "/v1/models/broken").json()
        assert card["status"]["value"] == "unloaded" and card["status"]["failed"]
        r = httpx.post(s.url + "/v1/completions", json={"model": "good", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200  # the server goes on
    finally:
        s.stop()


def test_without_the_api_key_nothing_loads(serve):
    s = serve(api_key="sesame")
    for path in ("/v1/completions", "/v1/messages", "/v1/responses"):
        r = httpx.post(s.url + path, json={"model": "alpha", "prompt": "x", "input": "x", "max_tokens": 2,
                                           "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401, path
    assert httpx.get(s.url + "/v1/models").status_code == 401
    assert httpx.get(s.url + "/health").status_code == 200
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0, timeout=120)
    assert [m.status["value"] for m in client.models.list().data] == ["unloaded"] * 3  # nothing loaded
    assert _complete(client, "alpha", PROMPTS[0])[0] == "alpha"
    r = httpx.post(s.url + "/v1/messages", headers={"x-api-key": "sesame"},
                   json={"model": "beta", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["model"] == "beta"


def test_metrics_carry_each_loaded_model_by_name(serve):
    s = serve()
    client = _client(s)
    _complete(client, "alpha", PROMPTS[0], max_tokens=3)
    _complete(client, "gamma", PROMPTS[0], max_tokens=5)
    samples = {}
    for fam in parser.text_string_to_metric_families(httpx.get(s.url + "/metrics").text):
        for x in fam.samples:
            samples[(x.name, x.labels.get("model_name"))] = x.value
    assert samples[("llminfer:generation_tokens_total", "alpha")] == 3
    assert samples[("llminfer:generation_tokens_total", "gamma")] == 5
    assert ("llminfer:generation_tokens_total", "beta") not in samples
    assert [samples[("llminfer:model_loaded", n)] for n in NAMES] == [1, 0, 1]


@pytest.mark.parametrize("kind", ["json", "toml"])
def test_a_config_file_names_models_and_their_options(tmp_path, models_dir, reference, kind):
    a, b = models_dir / "alpha.gguf", models_dir / "beta.gguf"
    if kind == "json":
        cfg = tmp_path / "models.json"
        cfg.write_text(json.dumps({"models": {"small": {"path": str(a), "n_ctx": 128}, "b": str(b)}}))
    else:
        shutil.copy(b, tmp_path / "beta-copy.gguf")
        cfg = tmp_path / "models.toml"
        cfg.write_text(f'[small]\npath = "{a}"\nn_ctx = 128\n\n[b]\npath = "beta-copy.gguf"\n')  # relative to the file
    s = ServerThread(ServeArgs(models_config=str(cfg), **COMMON))
    try:
        cards = {m["id"]: m for m in httpx.get(s.url + "/v1/models").json()["data"]}
        assert sorted(cards) == ["b", "small"] and cards["small"]["max_model_len"] == 128
        client = _client(s)
        assert _complete(client, "small", PROMPTS[0]) == ("small", reference["alpha"][PROMPTS[0]][1])
        assert _complete(client, "b", PROMPTS[1]) == ("b", reference["beta"][PROMPTS[1]][1])
        with pytest.raises(openai.BadRequestError):  # the model's own n_ctx of 128
            _complete(client, "small", "x", max_tokens=200)
    finally:
        s.stop()


def test_a_bad_catalog_is_refused_at_start(tmp_path, models_dir):
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"m": {"path": str(models_dir / "alpha.gguf"), "n_ctxx": 5}}))
    with pytest.raises(InvalidArgumentError, match="n_ctxx"):
        create_app(ServeArgs(models_config=str(cfg)))
    cfg.write_text(json.dumps({"m": {"path": "nowhere.gguf"}}))
    with pytest.raises(ModelNotFoundError, match="nowhere.gguf"):
        create_app(ServeArgs(models_config=str(cfg)))
    with pytest.raises(ModelNotFoundError, match="no GGUF model"):
        create_app(ServeArgs(models_dir=str(tmp_path)))
