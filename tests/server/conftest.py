"""The server the server tests share: SmolLM2 behind `llminfer serve` on a
loopback port (one per test module), and an openai client of it. A module
that needs another server or client defines its own fixture of that name."""

import pytest


@pytest.fixture(scope="module")
def server(smollm2_path):
    pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
    from servers import ServerThread

    from llminfer.server import ServeArgs

    s = ServerThread(ServeArgs(model=str(smollm2_path), n_ctx=512, kv_pool_tokens=8192, n_threads=1,
                               max_batch_tokens=256))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(server):
    openai = pytest.importorskip("openai", reason="the server tests use the openai client")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(oai):
    return oai


@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id
