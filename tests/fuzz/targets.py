"""What the fuzzers run on each input, and what counts as a finding.

A target takes bytes. Any exception that is an LLMInferError is the right
answer to a bad input; any other exception is a finding (re-raised so the
fuzzer records it), and so is a crash or a hang of the process.

    load_gguf(data)           GGUFFile, every tensor's bytes, build_spec,
                              the tokenizer and chat format from the metadata
    load_gguf(data, run=True) also LLM(): load, eval two tokens, generate
    render_template(data)     a chat template (the bytes as UTF-8) compiled
                              and rendered on a small conversation
    http_request(data)        "PATH\nBODY": the body POSTed to the server's
                              app (in process, a tiny model); a 5xx answer,
                              an exception, or an event stream that does not
                              end with [DONE] is a finding
"""

from __future__ import annotations

import os
import tempfile
import warnings

from llminfer.errors import LLMInferError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>&</b>"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]

_tmpdir = None


def _path():
    global _tmpdir
    if _tmpdir is None:
        _tmpdir = tempfile.mkdtemp(prefix="llminfer-fuzz-")
    return os.path.join(_tmpdir, "input.gguf")


def load_gguf(data: bytes, run: bool = False) -> str:
    """'ok' when the file loads (and runs), 'refused' when it raises an
    LLMInferError; anything else propagates."""
    from llminfer.text.chat import chat_format_for
    from llminfer.text.chat_sandbox import TemplateLimits
    from llminfer.core.gguf_file import GGUFFile
    from llminfer.models import build_spec
    from llminfer.text.tokenizer import Tokenizer

    path = _path()
    with open(path, "wb") as f:
        f.write(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with GGUFFile(path) as g:
                for name in g.tensors:
                    g.tensor_bytes(name).sum()
                spec = build_spec(g)
                Tokenizer.from_metadata(g.metadata)
                fmt = chat_format_for(g.metadata)
                fmt.limits = TemplateLimits(max_steps=200_000, timeout=2.0)
                fmt.render(MESSAGES)
                del spec
            if run:
                _run(path)
    except LLMInferError:
        return "refused"
    return "ok"


def _run(path):
    import numpy as np

    import llminfer

    with llminfer.LLM(path, n_ctx=16, n_batch=4, n_threads=1) as llm:
        ids = llm.tokenize("ab")[:4]
        if ids:
            logits = llm.eval(ids)
            assert logits.shape == (len(ids), llm.n_vocab)
            np.isfinite(logits).all()
            llm.reset()
            llm.generate("ab", max_tokens=2, temperature=0)


def render_template(data: bytes) -> str:
    from llminfer.text.chat import ChatFormat
    from llminfer.text.chat_sandbox import TemplateLimits

    source = data.decode("utf-8", errors="replace")
    limits = TemplateLimits(max_steps=100_000, timeout=2.0, max_chars=1 << 20)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # jinja's DeprecationWarning on odd escapes in literals
            fmt = ChatFormat("fuzz", source, bos_token="<s>", eos_token="</s>", limits=limits)
            fmt.render(MESSAGES)
            fmt.adds_bos
    except LLMInferError:
        return "refused"
    return "ok"


HTTP_PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/tokenize", "/detokenize"]
_client = None


class ServerError(Exception):
    """The server answered 5xx, or cut a stream short: a finding."""


def _http_client():
    """A TestClient over create_app() with a tiny llama, made once: small
    context, bounded generations and body, so each input runs in
    milliseconds."""
    global _client
    if _client is None:
        from starlette.testclient import TestClient

        from gguf_bytes import tiny_llama
        from llminfer.server import ServeArgs, create_app

        path = os.path.join(os.path.dirname(_path()), "server.gguf")
        with open(path, "wb") as f:
            f.write(tiny_llama())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no chat template: the chatml fallback warns once
            app = create_app(ServeArgs(model=path, n_ctx=64, n_threads=1, max_tokens_limit=4,
                                       max_body_bytes=1 << 17))
        _client = TestClient(app, raise_server_exceptions=True)
        _client.__enter__()  # the lifespan (the engine thread) runs until the process ends
    return _client


def http_request(data: bytes) -> str:
    """'ok' for a 2xx answer, 'refused' for a 4xx; a 5xx, an exception or a
    stream without [DONE] raises."""
    path, _, body = data.partition(b"\n")
    path = path.decode("latin-1")
    if path not in HTTP_PATHS:
        path = HTTP_PATHS[sum(path.encode("latin-1")) % len(HTTP_PATHS)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = _http_client().post(path, content=body, headers={"content-type": "application/json"})
    if r.status_code >= 500:
        raise ServerError(f"{path} answered {r.status_code}: {r.text[:300]}")
    if r.headers.get("content-type", "").startswith("text/event-stream") and \
            not r.text.rstrip().endswith("data: [DONE]"):
        raise ServerError(f"{path}'s stream ended without [DONE]: ...{r.text[-300:]}")
    return "ok" if r.status_code < 400 else "refused"


TARGETS = {"gguf": load_gguf, "gguf-run": lambda d: load_gguf(d, run=True), "template": render_template,
           "http": http_request}
