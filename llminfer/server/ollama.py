"""Ollama's native API over the server's chat path: POST /api/chat and
/api/generate (streamed as newline-delimited JSON by default, one object
with "stream": false), POST /api/show, GET /api/tags, /api/ps and
/api/version.

    client = ollama.Client(host="http://127.0.0.1:8000")
    client.chat(model="any", messages=[{"role": "user", "content": "Hi", "images": [png_bytes]}])

A request is translated into an OpenAI-shaped chat request and run by
llminfer.server.chatrun, as /v1/messages is: a message's `images` (base64
strings) become image_url parts before its text (where Ollama puts them),
checked where the OpenAI route checks them (needs --mmproj); `options`
become the sampling fields (temperature, top_p, top_k, min_p, seed,
repeat_penalty, presence_penalty, frequency_penalty, stop; num_predict is
the most tokens to generate, -1 and -2 all the context has left; the
others, num_ctx among them, are the server's to set and are ignored, as
Ollama ignores options it does not know); `format` "json" or a JSON
schema becomes structured output; `think` becomes enable_thinking (or
reasoning_effort for "low" | "medium" | "high"). Options left out take the
server's defaults, as an OpenAI request's do, not Ollama's Modelfile ones.
/api/generate renders its prompt (and system, images) through the chat
template, or with "raw": true tokenizes it as it is; a "suffix" is laid out
for fill-in-the-middle. Errors have Ollama's shape, {"error": "..."}, with
the status the OpenAI route would give.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from functools import lru_cache

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

import llminfer
from llminfer.server.app import APIError, bad_request, shown
from llminfer.server.chatrun import EventStream, start_chat

log = logging.getLogger("llminfer.server")

# Ollama's options that are our sampling fields, under the names the chat path reads
SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty",
                    "frequency_penalty")
EFFORTS = ("low", "medium", "high")


def endpoint(server, fn):
    """fn(server, request) behind the API key (Authorization: Bearer), its errors in Ollama's shape."""
    async def handle(request: HTTPRequest):
        try:
            server.check_auth(request)
            return await fn(server, request)
        except Exception as e:  # noqa: BLE001 - a bug here is a 500 in Ollama's shape
            if isinstance(e, APIError):
                err = e
            elif isinstance(e, ValueError):
                err = bad_request(str(e))
            else:
                log.exception("%s %s failed", request.method, request.url.path)
                err = APIError(500, f"internal error: {type(e).__name__}")
            return JSONResponse(error_body(err), status_code=err.status)
    return handle


def error_body(e: APIError) -> dict:
    return {"error": e.message}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


# ---- the request ----

def _images(images, where: str) -> list:
    """A message's `images` (base64 strings) as the chat path's image_url parts."""
    if images is None:
        return []
    if not isinstance(images, list):
        raise bad_request(f"{where}.images: must be a list of base64-encoded images")
    parts = []
    for k, img in enumerate(images):
        if not isinstance(img, str) or not img:
            raise bad_request(f"{where}.images[{k}]: an image must be a base64 string, got {shown(img)}")
        # the media type is not read: the bytes say what they are (llminfer.vision.image)
        parts.append({"type": "image_url", "image_url": {"url": "data:image;base64," + img}})
    return parts


def _message(m, where: str) -> dict:
    if not isinstance(m, dict):
        raise bad_request(f"{where}: each message must be an object with a role and content")
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise bad_request(f"{where}.role: must be system, user, assistant or tool, got {shown(role)}")
    content = m.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise bad_request(f"{where}.content: must be a string")
    images = _images(m.get("images"), where)
    out = {"role": role, "content": images + [{"type": "text", "text": content}] if images else content}
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls: an assistant's list of {{'function': {{name, arguments}}}}")
        out["tool_calls"] = []
        for k, c in enumerate(calls):
            f = c.get("function") if isinstance(c, dict) else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) \
                    or not isinstance(f.get("arguments", {}), dict):
                raise bad_request(f"{where}.tool_calls[{k}]: must be {{'function': {{'name', 'arguments': {{}}}}}}")
            out["tool_calls"].append({"id": f"call_{k}", "type": "function", "function": {
                "name": f["name"], "arguments": json.dumps(f.get("arguments", {}))}})
    if role == "tool" and isinstance(m.get("tool_name"), str):
        out["name"] = m["tool_name"]
    return out


def _options(body) -> tuple[dict, int | None]:
    """(the chat path's sampling fields of `options`, `format` and `think`, max_tokens or None)."""
    chat, max_tokens = {}, None
    opts = body.get("options")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise bad_request(f"options: must be an object, got {shown(opts)}")
    for k in SAMPLING_OPTIONS:
        if opts.get(k) is not None:
            chat[k] = opts[k]
    if opts.get("stop") is not None:
        chat["stop"] = opts["stop"]
    n = opts.get("num_predict")
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n == 0 or n < -2:
            raise bad_request(f"options.num_predict: must be a positive integer, or -1 or -2 for as many as the "
                              f"context has room for, got {shown(n)}")
        max_tokens = n if n > 0 else None
    fmt = body.get("format")
    if fmt == "json":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt}}
    elif fmt not in (None, ""):
        raise bad_request(f"format: must be \"json\" or a JSON schema object, got {shown(fmt)}")
    think = body.get("think")
    if think is True:
        chat["enable_thinking"] = True
    elif think is False:
        chat.update(enable_thinking=False, reasoning_budget=0)
    elif think in EFFORTS:
        chat["reasoning_effort"] = think
    elif think is not None:
        raise bad_request(f"think: must be true, false or one of {', '.join(EFFORTS)}, got {shown(think)}")
    if body.get("logprobs"):
        raise bad_request("logprobs: not given by this server's Ollama API; /v1/chat/completions gives them")
    if not isinstance(body.get("stream", True), bool):
        raise bad_request(f"stream: must be true or false, got {shown(body.get('stream'))}")
    return chat, max_tokens


def chat_request(body) -> tuple[dict, int | None]:
    """(the OpenAI chat request of an /api/chat request, its max_tokens or None)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise bad_request("messages: must be a list of messages")
    chat, max_tokens = _options(body)
    chat["messages"] = [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
    if body.get("tools") is not None:
        chat["tools"] = body["tools"]
    return chat, max_tokens


def generate_request(body) -> tuple[dict, int | None]:
    """(the OpenAI chat request of a templated /api/generate request, its max_tokens or None)."""
    chat, max_tokens = _options(body)
    msgs = []
    if body.get("system") is not None:
        msgs.append(_message({"role": "system", "content": body["system"]}, "system"))
    msgs.append(_message({"role": "user", "content": body.get("prompt"), "images": body.get("images")}, "prompt"))
    chat["messages"] = msgs
    return chat, max_tokens


# ---- the reply ----

def _stats(run) -> dict:
    """Ollama's counts and durations (ns) of a finished run: the prompt's
    until the first token came, the generation's after it."""
    r = run.reply
    end = run.ended_ns or run.started_ns
    first = run.first_token_ns or end
    return {"total_duration": end - run.started_ns, "load_duration": 0, "prompt_eval_count": r.prompt_tokens,
            "prompt_eval_duration": first - run.started_ns, "eval_count": r.completion_tokens,
            "eval_duration": end - first}


def _done_reason(reply) -> str:
    return "length" if reply.finish == "length" else "stop"


def _calls(reply) -> list:
    return [{"function": {"name": c["name"], "arguments": c["arguments"]}} for c in reply.calls]


def _line(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _loaded(model, chat: bool) -> JSONResponse:
    """An empty request: Ollama loads the model and says so."""
    head = {"model": model, "created_at": _now()}
    body = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse({**head, **body, "done": True, "done_reason": "load"})


async def _answer(run, request, model, chat: bool, stream: bool):
    """The run's reply as /api/chat (chat) or /api/generate give it."""
    def piece(kind, text):
        if chat:
            return {"message": {"role": "assistant", ("thinking" if kind == "thinking" else "content"): text}}
        return {"thinking": text} if kind == "thinking" else {"response": text}

    def last(reply, whole: bool):
        if chat:
            msg = {"role": "assistant", "content": reply.text if whole else ""}
            if whole and reply.thinking:
                msg["thinking"] = reply.thinking
            if reply.calls:
                msg["tool_calls"] = _calls(reply)
            out = {"message": msg}
        else:
            out = {"response": reply.text if whole else ""}
            if whole and reply.thinking:
                out["thinking"] = reply.thinking
        return {"model": model, "created_at": _now(), **out, "done": True, "done_reason": _done_reason(reply),
                **_stats(run)}

    if stream:
        async def lines():
            async for kind, text in run.pieces():
                yield _line({"model": model, "created_at": _now(), **piece(kind, text), "done": False})
            yield _line(last(run.reply, False))
        return EventStream(lines(), run, lambda e: _line(error_body(e)), media_type="application/x-ndjson")
    reply = await run.whole(request)
    if reply is None:
        return JSONResponse({}, status_code=499)
    return JSONResponse(last(reply, True))


async def chat(server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    server.check_generates()
    req, max_tokens = chat_request(body)
    if not req["messages"]:
        return _loaded(server.model_name, True)
    run = await start_chat(server, req, max_tokens)
    return await _answer(run, request, server.model_name, True, body.get("stream", True))


async def generate(server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    server.check_generates()
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise bad_request(f"prompt: must be a string, got {shown(prompt)}")
    for name in ("template", "context"):
        if body.get(name):
            raise bad_request(f"{name}: not supported by this server (the model's own chat template is used; "
                              f"send the conversation to /api/chat to continue it)")
    suffix = body.get("suffix")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise bad_request(f"raw: must be true or false, got {shown(raw)}")
    if not prompt and not body.get("images") and not suffix:
        return _loaded(server.model_name, False)
    if raw or suffix:
        if body.get("images"):
            raise bad_request("images: need the chat template; they cannot go with raw or suffix")
        req, max_tokens = _options(body)
        fields = {"prompt": prompt or ""} if raw and not suffix else {"prompt": prompt or "", "suffix": suffix}
        ids = (await run_in_threadpool(server.prompt_ids, fields))[0]
        run = await start_chat(server, req, max_tokens, prompt=ids)
    else:
        req, max_tokens = generate_request(body)
        run = await start_chat(server, req, max_tokens)
    return await _answer(run, request, server.model_name, False, body.get("stream", True))


# ---- what the model is ----

def _human(n: int) -> str:
    """A parameter count as Ollama writes it: 135.1M, 8.0B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


@lru_cache(maxsize=8)
def _describe(path: str, mtime_ns: int) -> dict:
    """(details, model_info, template) of a GGUF file, from its header."""
    import gguf
    import numpy as np

    from llminfer.core.gguf_file import GGUFFile

    with GGUFFile(path) as f:
        md, tensors = f.metadata, f.tensors
        arch = md.get("general.architecture", "")
        n_params = sum(int(np.prod(t.shape)) for t in tensors.values())
        try:
            quant = gguf.LlamaFileType(md["general.file_type"]).name.removeprefix("MOSTLY_")
        except (KeyError, ValueError):
            by_type = {}
            for t in tensors.values():
                by_type[t.type_name] = by_type.get(t.type_name, 0) + t.nbytes
            quant = max(by_type, key=by_type.get) if by_type else ""
        info = {k: v for k, v in md.items()
                if isinstance(v, (str, int, float, bool)) and k != "tokenizer.chat_template"}
        info["general.parameter_count"] = n_params
        details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                   "parameter_size": _human(n_params), "quantization_level": quant}
        return {"details": details, "model_info": info, "template": md.get("tokenizer.chat_template", "")}


def _model_path(server) -> str:
    return os.fspath(server.engine.model_path if server.engine is not None else server.embedder.model_path)


def describe_file(path, vision: bool = False) -> dict:
    """A GGUF file as Ollama describes a model: details, model_info,
    template, modified_at, size (vision: it has a projector, "clip" among
    its families as Ollama lists it)."""
    path = os.fspath(path)
    st = os.stat(path)
    out = dict(_describe(path, st.st_mtime_ns))
    out["modified_at"] = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat()
    out["size"] = st.st_size
    if vision:
        out["details"] = dict(out["details"], families=out["details"]["families"] + ["clip"])
    return out


def describe(server) -> dict:
    return describe_file(_model_path(server), server.vision is not None)


def listed(name: str, d: dict) -> dict:
    """A model as /api/tags lists it, d its describe_file()."""
    return {"name": name, "model": name, "modified_at": d["modified_at"], "size": d["size"], "details": d["details"]}


def running(name: str, d: dict, n_ctx: int) -> dict:
    """A loaded model as /api/ps lists it."""
    return dict(listed(name, d), size_vram=0, context_length=n_ctx, expires_at="9999-12-31T23:59:59Z")


def _capabilities(server, d) -> list:
    if server.engine is None:
        return ["embedding"]
    caps = ["completion"]
    if server.vision is not None:
        caps.append("vision")
    if "tools" in d["template"]:
        caps.append("tools")
    return caps


async def show(server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    d = await run_in_threadpool(describe, server)
    return JSONResponse({"modelfile": f"FROM {_model_path(server)}\n", "parameters": "", "template": d["template"],
                         "details": d["details"], "model_info": d["model_info"],
                         "capabilities": _capabilities(server, d), "modified_at": d["modified_at"]})


async def tags(server, request: HTTPRequest):
    d = await run_in_threadpool(describe, server)
    return JSONResponse({"models": [listed(server.model_name, d)]})


async def ps(server, request: HTTPRequest):
    """The loaded model (always loaded: it never expires)."""
    d = await run_in_threadpool(describe, server)
    return JSONResponse({"models": [running(server.model_name, d, server.n_ctx)]})


async def version(server, request: HTTPRequest):
    return JSONResponse({"version": llminfer.__version__})


def routes(server) -> list:
    from starlette.routing import Route

    return [Route("/api/chat", endpoint(server, chat), methods=["POST"]),
            Route("/api/generate", endpoint(server, generate), methods=["POST"]),
            Route("/api/show", endpoint(server, show), methods=["POST"]),
            Route("/api/tags", endpoint(server, tags), methods=["GET"]),
            Route("/api/ps", endpoint(server, ps), methods=["GET"]),
            Route("/api/version", endpoint(server, version), methods=["GET"])]
