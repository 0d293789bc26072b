"""The server as the server tests run it: uvicorn serving create_app(args)
on a loopback port in a thread (ServerThread), its Prometheus metrics
(metrics, gauge, wait_idle), and an ASGI app run to its end without a
server (run_asgi) with a generation that fails midway (FailingRun)."""

import socket
import threading
import time

import httpx
import uvicorn
from prometheus_client import parser

from llminfer.server import ServeArgs, create_app


class ServerThread:
    """uvicorn serving create_app(args) on a free loopback port, in a thread."""

    def __init__(self, args: ServeArgs):
        self.app = create_app(args)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)

    @property
    def scheduler(self):
        return self.app.state.server.scheduler

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


def metrics(url) -> dict:
    """{(name, frozenset of labels other than model_name): value} of /metrics."""
    text = httpx.get(url + "/metrics").text
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k != "model_name")
            out[(s.name, labels)] = s.value
    return out


def gauge(url, name):
    return metrics(url)[(f"llminfer:{name}", frozenset())]


def wait_idle(url, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if m[("llminfer:num_requests_running", frozenset())] == 0 and \
                m[("llminfer:num_requests_waiting", frozenset())] == 0 and \
                m[("llminfer:kv_cache_usage_perc", frozenset())] == 0:
            return m
        assert time.monotonic() < deadline, f"the server did not go idle: {m}"
        time.sleep(0.05)


class FailingRun:
    """A generation that fails after its first piece, as an engine fault ends one."""

    class job:
        reqs = [type("R", (), {"prompt": [1, 2, 3]})()]

    cancelled = False

    async def pieces(self):
        from llminfer.server.app import APIError

        yield "text", "Hello"
        raise APIError(500, "the engine failed: RuntimeError: boom")

    def cancel(self):
        self.cancelled = True


def run_asgi(app_like):
    import asyncio

    sent = []

    async def receive():
        await asyncio.sleep(3600)

    async def send(msg):
        sent.append(msg)

    asyncio.run(app_like({"type": "http"}, receive, send))
    return b"".join(m.get("body", b"") for m in sent), sent
