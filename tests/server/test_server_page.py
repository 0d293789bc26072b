"""The server's pages: the chat page at / driven in a real headless Chromium
(Debian's package; skipped when absent) against a server with SmolLM2
over loopback, /docs, and /openapi.json describing every route of both the
one-model and the many-model server; the pages' files shipped in the wheel
and the sdist. The chat test prints the path of its screenshot (see it with
pytest -rP)."""

import fnmatch
import json
import re
import time
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")

from servers import ServerThread  # noqa: E402
from tiny_models import TinyConfig, write_model  # noqa: E402

from llminfer.server import ServeArgs, create_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "llminfer" / "server" / "static"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("page") / "tiny.gguf", TinyConfig(context_length=1024))


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=512, n_threads=1, max_batch_tokens=256))
    yield s
    s.stop()


@pytest.fixture
def browser(tmp_path):
    pytest.importorskip("websockets.sync.client", reason="the browser tests speak CDP through websockets>=12")
    from browser import Chromium, find_chromium

    if find_chromium() is None:
        pytest.skip("no Chromium found: apt-get install chromium (or set LLMINFER_CHROMIUM to its path)")
    with Chromium(tmp_path) as b:
        yield b


def _open_chat(browser, server):
    browser.goto(server.url + "/")
    browser.wait("document.querySelectorAll('#model option').length > 0")
    assert browser.eval("document.getElementById('settings').offsetParent === null")  # folded at first


def _type_and_send(browser, text, system="", temperature=0, max_tokens=40):
    """Fill the settings (the panel opened with its button) and the message, and click Send."""
    if browser.eval("document.getElementById('settings').offsetParent === null"):
        browser.eval("document.getElementById('settings-toggle').click()")
    assert browser.eval("document.getElementById('settings').offsetParent !== null")
    browser.eval(f"""(() => {{
        document.getElementById('system').value = {json.dumps(system)};
        document.getElementById('temperature').value = {json.dumps(str(temperature))};
        document.getElementById('max-tokens').value = {json.dumps(str(max_tokens))};
        document.getElementById('input').value = {json.dumps(text)};
        document.getElementById('send').click();
    }})()""")


def test_the_chat_page_streams_a_reply_in_chromium(server, browser, tmp_path):
    _open_chat(browser, server)
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    assert browser.eval("document.getElementById('model').value") == model
    _type_and_send(browser, "Hello, who are you?", system="Answer briefly.")
    browser.wait("window.chatState.last !== null")
    last = browser.eval("window.chatState.last")
    assert last["outcome"] == "done", (last, browser.console)
    # the page streamed: the reply was drawn event by event, not at the end
    assert browser.eval("window.chatState.updates") > 1
    # what it shows is what the API answers the same request with
    want = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "temperature": 0, "max_tokens": 40,
        "messages": [{"role": "system", "content": "Answer briefly."},
                     {"role": "user", "content": "Hello, who are you?"}]}).json()
    assert last["content"] == want["choices"][0]["message"]["content"] != ""
    # drawn as the page renders it, and words of the reply are on the screen
    answer = "document.querySelector('.msg.assistant .answer')"
    assert browser.eval(f"""(() => {{
        const want = document.createElement('div');
        want.innerHTML = window.renderMarkdown(window.chatState.last.content);
        return {answer}.innerHTML === want.innerHTML;
    }})()""")
    shown = browser.eval(f"{answer}.innerText")
    assert set(shown.split()) & set(last["content"].split())
    assert browser.eval("document.querySelector('.msg.user').textContent").endswith("Hello, who are you?")
    browser.eval("document.getElementById('settings-toggle').click()")  # folded again for the picture
    path = browser.screenshot(tmp_path / "chat.png")
    assert Path(path).stat().st_size > 1000
    print(f"screenshot of the chat page: {path}")


def _running(url) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(r"^llminfer:num_requests_running\{[^}]*\} (\S+)$", text, re.M).group(1))


def test_the_stop_button_ends_a_stream(server, browser):
    _open_chat(browser, server)
    # Stop clicked as the first piece of the reply is drawn (the page counts its draws)
    browser.eval("""(() => {
        const s = window.chatState;
        let n = s.updates;
        Object.defineProperty(s, 'updates', {
            get: () => n,
            set: (v) => { n = v; if (v === 1 && s.busy) document.getElementById('stop').click(); },
        });
    })()""")
    _type_and_send(browser, "Write a long story about a cat.", max_tokens=400)
    browser.wait("window.chatState.last !== null")
    last = browser.eval("window.chatState.last")
    assert last["outcome"] == "stopped", last
    assert browser.eval("document.getElementById('status').textContent") == "stopped"
    assert browser.eval("document.getElementById('send').disabled") is False
    assert browser.eval("document.getElementById('stop').disabled") is True
    assert browser.eval("window.chatState.updates") == 1  # nothing drawn after Stop
    # the server let the request go: nothing runs
    deadline = time.monotonic() + 60
    while _running(server.url):
        assert time.monotonic() < deadline, "the stopped request still runs"
        time.sleep(0.05)


def test_model_text_is_escaped_and_reasoning_shown_apart(server, browser):
    _open_chat(browser, server)
    hostile = ('<img src=x onerror="window.pwned=1"> **bold** `<b>code</b>` [bad](javascript:alert(1)) '
               '[good](https://example.com/a?b="c") <script>window.pwned=2</script>\n\n```\n<i>x</i>\n```')
    html = browser.eval(f"""(() => {{
        const div = document.createElement('div');
        div.innerHTML = window.renderMarkdown({json.dumps(hostile)});
        document.body.append(div);
        return div.innerHTML;
    }})()""")
    tags = set(re.findall(r"<([a-z]+)", html))
    assert tags <= {"p", "strong", "em", "code", "pre", "a", "br"}, html
    assert browser.eval("document.querySelectorAll('a[href^=\"javascript\"]').length") == 0
    assert browser.eval("window.pwned === undefined")
    assert "&lt;img" in html and "<strong>bold</strong>" in html and 'href="https://example.com' in html
    # a server that sends reasoning_content: the page's fetch answered with such a stream
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"reasoning_content": "Let me <think> it over."}}]},
              {"choices": [{"index": 0, "delta": {"content": "The answer is **42**."}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    browser.eval(f"""(() => {{
        const real = window.fetch;
        window.fetch = (url, opts) => url === '/v1/chat/completions'
            ? Promise.resolve(new Response({json.dumps(body)}, {{headers: {{'content-type': 'text/event-stream'}}}}))
            : real(url, opts);
    }})()""")
    _type_and_send(browser, "What is the answer?")
    browser.wait("window.chatState.last !== null")
    assert browser.eval("window.chatState.last.reasoning") == "Let me <think> it over."
    assert browser.eval("document.querySelector('.msg.assistant .reasoning .text').textContent") == \
        "Let me <think> it over."
    assert browser.eval("document.querySelector('.msg.assistant .reasoning').hidden") is False
    assert browser.eval("document.querySelector('.msg.assistant .answer').innerHTML") == \
        "<p>The answer is <strong>42</strong>.</p>"


def test_the_page_picks_among_many_models(tmp_path, browser):
    (tmp_path / "models").mkdir()
    for i, name in enumerate(("alpha", "beta")):
        write_model(tmp_path / "models" / f"{name}.gguf", TinyConfig(seed=i))
    s = ServerThread(ServeArgs(models_dir=str(tmp_path / "models"), n_ctx=256, n_threads=1))
    try:
        browser.goto(s.url + "/")
        labels = "[...document.querySelectorAll('#model option')].map((o) => o.textContent)"
        assert browser.wait(f"{labels}.length === 2 && {labels}") == ["alpha (unloaded)", "beta (unloaded)"]
        browser.eval("document.getElementById('model').value = 'beta'")
        _type_and_send(browser, "hi", max_tokens=4)
        browser.wait("window.chatState.last !== null")
        assert browser.eval("window.chatState.last.outcome") == "done"
        states = {m["id"]: m["status"]["value"] for m in httpx.get(s.url + "/v1/models").json()["data"]}
        assert states == {"alpha": "unloaded", "beta": "loaded"}
        browser.wait(f"{labels}[1] === 'beta (loaded)'")  # the picker shows it after the reply
        assert browser.eval("document.getElementById('model').value") == "beta"
    finally:
        s.stop()


def test_the_docs_page_lists_every_operation(server, browser):
    doc = httpx.get(server.url + "/openapi.json").json()
    n_ops = sum(len(item) for item in doc["paths"].values())
    browser.goto(server.url + "/docs")
    browser.wait(f"document.querySelectorAll('section.op').length === {n_ops}")
    assert browser.eval("document.getElementById('post-/v1/chat/completions') !== null")


# ---- without a browser ----

def _operations(app) -> set:
    out = set()
    for r in app.routes:
        for m in r.methods or ():
            if m != "HEAD":
                out.add((re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path), m.lower()))
    return out


@pytest.mark.parametrize("many", [False, True], ids=["one-model", "many-models"])
def test_openapi_describes_every_route(model_path, many):
    from starlette.testclient import TestClient

    args = ServeArgs(models_dir=str(Path(model_path).parent), n_threads=1) if many else \
        ServeArgs(model=str(model_path), n_ctx=256, n_threads=1)
    app = create_app(args)
    with TestClient(app) as c:
        doc = c.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.1") and doc["info"]["title"]
        described = {(p, m) for p, item in doc["paths"].items() for m in item}
        assert described == _operations(app)
        for p, item in doc["paths"].items():
            for m, op in item.items():
                assert op["summary"] != "(undocumented)" and op["responses"], (p, m)
                assert set(re.findall(r"\{(\w+)\}", p)) == {x["name"] for x in op.get("parameters", [])}
        assert {"/v1/messages", "/v1/responses", "/v1/chat/completions", "/"} <= set(doc["paths"])
        ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
        assert len(ids) == len(set(ids))
        page = c.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text + c.get("/docs").text):
            assert c.get(src).status_code == 200, src
        assert "http" not in re.sub(r"https?://example", "", page.text)  # nothing from elsewhere
        assert c.get("/static/../app.py").status_code == 404
        assert c.get("/static/nothing.js").status_code == 404


def test_the_pages_are_in_the_wheel_and_the_sdist():
    files = sorted(p.name for p in STATIC.iterdir())
    assert {"index.html", "chat.js", "chat.css", "docs.html"} <= set(files)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"]["package-data"].get("llminfer.server", [])
    assert "llminfer.server" in project["tool"]["setuptools"]["packages"]
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", g) for g in data), f"{name} is not in the wheel"
    manifest = [line.split() for line in (ROOT / "MANIFEST.in").read_text().splitlines()]
    for name in files:
        assert any(w[0] == "recursive-include" and "llminfer/server/static".startswith(w[1])
                   and any(fnmatch.fnmatch(name, g) for g in w[2:]) for w in manifest if w), \
            f"{name} is not in the sdist"
