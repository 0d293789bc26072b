"""Anthropic's Messages API over the server's chat path: POST /v1/messages
(whole or streamed as Anthropic streams it) and POST
/v1/messages/count_tokens.

    client = anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="unused")
    client.messages.create(model="any", max_tokens=256, system="Be brief.",
                           messages=[{"role": "user", "content": "Hi"}])

A request is translated into an OpenAI-shaped chat request (system first,
tool_use blocks as an assistant's tool_calls, tool_result blocks as tool
messages, image blocks as image_url parts) and run by
llminfer.server.chatrun; the reply comes back as
thinking, text and tool_use blocks. max_tokens is required, as Anthropic
requires it, and capped at the room the context has left. Errors have
Anthropic's shape, {"type": "error", "error": {"type", "message"}}. The
x-api-key header is taken as the API key (as is Authorization: Bearer);
anthropic-version is accepted and not required.
"""

from __future__ import annotations

import hmac
import json
import logging

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

from llminfer.server.app import MAX_STOP_CHARS, MAX_STOPS, APIError, bad_request, shown
from llminfer.server.chatrun import EventStream, new_id, prompt_ids, start_chat

log = logging.getLogger("llminfer.server")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}

# llama-server's extensions, taken as the chat path takes them
EXTRA_FIELDS = ("seed", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "grammar", "json_schema")


def error_body(e: APIError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: ".encode() + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _check_auth(server, request: HTTPRequest):
    key = server.args.api_key
    if not key:
        return
    given = request.headers.get("x-api-key")
    if given is None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise APIError(401, "a valid API key is needed: send 'x-api-key: KEY' (or 'Authorization: Bearer KEY')")


def endpoint(server, fn):
    """fn(server, request) behind the API key, its errors in Anthropic's shape."""
    async def handle(request: HTTPRequest):
        try:
            _check_auth(server, request)
            return await fn(server, request)
        except Exception as e:  # noqa: BLE001 - a bug here is a 500 in Anthropic's shape
            if isinstance(e, APIError):
                err = e
            elif isinstance(e, ValueError):
                err = bad_request(str(e))
            else:
                log.exception("%s %s failed", request.method, request.url.path)
                err = APIError(500, f"internal error: {type(e).__name__}")
            return JSONResponse(error_body(err), status_code=err.status)
    return handle


# ---- the request ----

def _text_of(blocks, what: str) -> str:
    """A string, or the joined text of a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"{what} must be a string or a list of text blocks")
    out = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else None
            raise bad_request(f"{what}.{i}: only text blocks are supported here, got {shown(kind or b)}")
        out.append(b["text"])
    return "".join(out)


IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # the media types Anthropic takes


def _image_part(block, at: str) -> dict:
    """An image block as the chat path's image_url part: a base64 source
    as a data: URL, a url source as its URL (which the chat path takes or
    refuses as it does OpenAI's image_url: data: URLs alone today). The
    bytes are checked where the OpenAI route checks them
    (Server.image_part, llminfer.vision)."""
    src = block.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if kind == "base64":
        media, data = src.get("media_type"), src.get("data")
        if media not in IMAGE_TYPES:
            raise bad_request(f"{at}.source.media_type: must be one of {', '.join(IMAGE_TYPES)}, got {shown(media)}")
        if not isinstance(data, str) or not data:
            raise bad_request(f"{at}.source.data: must be the image's bytes in base64")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        if not isinstance(src.get("url"), str) or not src["url"]:
            raise bad_request(f"{at}.source.url: must be a URL")
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise bad_request(f"{at}.source: an image's source must be {{'type': 'base64', 'media_type', 'data'}} or "
                      f"{{'type': 'url', 'url'}}, got {shown(src)}")


def _content(parts: list, images: bool):
    """A message's content: its text joined, or with images the chat path's list of text and image_url parts."""
    if not images:
        return "".join(parts)
    return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]


def _messages(body) -> list:
    """The OpenAI chat messages of a Messages request's system and messages."""
    out = []
    system = body.get("system")
    if system is not None:
        text = _text_of(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages: a non-empty list of messages is required")
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise bad_request(f"{where}: each message must be an object with a role and content")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad_request(f"{where}.role: must be 'user' or 'assistant', got {shown(role)}")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"{where}.content: must be a string or a list of content blocks")
        text, calls, results, images = [], [], False, False
        for j, b in enumerate(content):
            at = f"{where}.content.{j}"
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "image" and role == "user":
                text.append(_image_part(b, at))
                images = True
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # earlier turns' thinking is not shown to the model again
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise bad_request(f"{at}: a tool_use block needs a name and an input object")
                calls.append({"id": str(b.get("id", "")), "type": "function",
                              "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
            elif kind == "tool_result" and role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise bad_request(f"{at}: a tool_result block needs a tool_use_id")
                result = b.get("content", "")
                result = _text_of(result, f"{at}.content") if result is not None else ""
                if b.get("is_error"):
                    result = f"Error: {result}"
                if text:  # text before the result stays before it
                    out.append({"role": "user", "content": _content(text, images)})
                    text, images = [], False
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
                results = True
            elif kind == "document":
                raise bad_request(f"{at}: document blocks are not supported by this server (text and images only)")
            else:
                raise bad_request(f"{at}: a {role} message cannot hold a block of type {shown(kind or b)}")
        if calls:
            out.append({"role": "assistant", "content": "".join(text) or None, "tool_calls": calls})
        elif text or not results:
            out.append({"role": role, "content": _content(text, images)})
    if msgs[-1].get("role") == "assistant":
        raise bad_request("messages: the last message must be the user's; continuing a prefilled assistant turn is "
                   "not supported by this server")
    return out


def _tools(body) -> tuple:
    """(OpenAI tools or None, OpenAI tool_choice or None)."""
    tools = body.get("tools")
    if tools is None:
        funcs = None
    else:
        if not isinstance(tools, list):
            raise bad_request("tools: must be a list of tools")
        funcs = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict):
                raise bad_request(f"tools.{i}: must be an object")
            if t.get("type") not in (None, "custom"):
                raise bad_request(f"tools.{i}: tool type {shown(t.get('type'))} is not supported by this server; "
                           f"only client tools (name, description, input_schema)")
            schema = t.get("input_schema")
            if not isinstance(t.get("name"), str) or not isinstance(schema, dict):
                raise bad_request(f"tools.{i}: a tool needs a name and an input_schema object")
            funcs.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                           "parameters": schema}})
    choice = body.get("tool_choice")
    if choice is None:
        return funcs, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return funcs, kind
    if kind == "any":
        return funcs, "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return funcs, {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(f"tool_choice: must be {{'type': 'auto' | 'any' | 'none'}} or {{'type': 'tool', 'name': ...}}, "
               f"got {shown(choice)}")


def _number(body, name, lo, hi, integer=False):
    v = body.get(name)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise bad_request(f"{name}: must be {kind} in [{lo}, {hi}], got {shown(v)}")
    return v


def to_chat(body: dict, count_only: bool = False) -> tuple[dict, int | None]:
    """(the OpenAI chat request of a Messages request, its max_tokens)."""
    chat = {"messages": _messages(body)}
    chat["tools"], chat["tool_choice"] = _tools(body)
    if count_only:
        return chat, None
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad_request("max_tokens: Field required")
    max_tokens = _number(body, "max_tokens", 1, 1 << 31, integer=True)
    if body.get("temperature") is not None:
        chat["temperature"] = _number(body, "temperature", 0.0, 1.0)
    if body.get("top_p") is not None:
        chat["top_p"] = _number(body, "top_p", 0.0, 1.0)
    if body.get("top_k") is not None:
        chat["top_k"] = _number(body, "top_k", 0, 1 << 31, integer=True)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request("stop_sequences: must be a list of non-empty strings")
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise bad_request(f"stop_sequences: at most {MAX_STOPS}, each of at most {MAX_STOP_CHARS} characters")
        chat["stop"] = stops
    fmt = (body.get("output_config") or {}).get("format") if isinstance(body.get("output_config"), dict) else None
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise bad_request("output_config.format: must be {'type': 'json_schema', 'schema': {...}}")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    for k in EXTRA_FIELDS:
        if body.get(k) is not None:
            chat[k] = body[k]
    chat.update(_thinking(body, max_tokens))
    if not isinstance(body.get("stream", False), bool):
        raise bad_request(f"stream: must be true or false, got {shown(body.get('stream'))}")
    return chat, max_tokens


def _thinking(body, max_tokens) -> dict:
    """The chat path's reasoning options of Anthropic's extended thinking:
    {"type": "enabled", "budget_tokens": N} thinks for at most N tokens
    (the end of the thinking is forced then, llminfer.text.reasoning's budget);
    {"type": "disabled"} does not think (the template is told
    enable_thinking false and the budget is 0); "adaptive" thinks as long
    as the model likes. Absent: the server's own reasoning options."""
    t = body.get("thinking")
    if t is None:
        return {}
    kind = t.get("type") if isinstance(t, dict) else None
    if kind == "disabled":
        return {"enable_thinking": False, "reasoning_budget": 0}
    if kind == "adaptive":
        return {"enable_thinking": True, "reasoning_budget": -1}
    if kind == "enabled":
        n = t.get("budget_tokens")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise bad_request(f"thinking.budget_tokens: must be a positive integer, got {shown(n)}")
        if max_tokens is not None and n >= max_tokens:
            raise bad_request(f"max_tokens must be greater than thinking.budget_tokens ({n}), got {max_tokens}")
        return {"enable_thinking": True, "reasoning_budget": n}
    raise bad_request(f"thinking: must be {{'type': 'enabled', 'budget_tokens': N}}, {{'type': 'disabled'}} or "
                      f"{{'type': 'adaptive'}}, got {shown(t)}")


# ---- the reply ----

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence",
                "tool_calls": "tool_use"}


def _tool_use(call) -> dict:
    return {"type": "tool_use", "id": new_id("toolu"), "name": call["name"], "input": call["arguments"]}


def _usage(reply) -> dict:
    return {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": reply.cached_tokens}


async def messages(server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    chat, max_tokens = to_chat(body)
    run = await start_chat(server, chat, max_tokens)
    model = server.model_name
    if body.get("stream"):
        return EventStream(_stream(run, model), run, lambda e: _sse("error", error_body(e)))
    reply = await run.whole(request)
    if reply is None:
        return JSONResponse({}, status_code=499)
    content = []
    if reply.thinking:
        content.append({"type": "thinking", "thinking": reply.thinking, "signature": ""})
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    content += [_tool_use(c) for c in reply.calls]
    return JSONResponse({"id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
                         "content": content, "stop_reason": STOP_REASONS[reply.finish],
                         "stop_sequence": reply.stop_sequence, "usage": _usage(reply)})


async def _stream(run, model):
    """Anthropic's events: message_start; per block content_block_start, its
    deltas and content_block_stop (a ping after the first start);
    message_delta with the stop reason and usage; message_stop."""
    n_prompt = len(run.job.reqs[0].prompt)
    yield _sse("message_start", {"type": "message_start", "message": {
        "id": new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": n_prompt, "output_tokens": 0}}})
    index, open_kind, pinged = -1, None, False

    def start(block):
        nonlocal index, open_kind, pinged
        index += 1
        open_kind = block["type"]
        out = [_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})]
        if not pinged:
            out.append(_sse("ping", {"type": "ping"}))
            pinged = True
        return out

    def stop():
        nonlocal open_kind
        out = []
        if open_kind == "thinking":
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "signature_delta", "signature": ""}}))
        if open_kind is not None:
            out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        open_kind = None
        return out

    async for kind, text in run.pieces():
        if kind != open_kind:
            for b in stop() + start({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                    else {"type": "text", "text": ""}):
                yield b
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
            {"type": "text_delta", "text": text}
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
    for b in stop():
        yield b
    reply = run.reply
    for call in reply.calls:
        block = _tool_use(call)
        for b in start(dict(block, input={})):
            yield b
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(call["arguments"], ensure_ascii=False)}})
        for b in stop():
            yield b
    if not pinged:
        yield _sse("ping", {"type": "ping"})
    yield _sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": STOP_REASONS[reply.finish],
                                           "stop_sequence": reply.stop_sequence},
                                 "usage": _usage(reply)})
    yield _sse("message_stop", {"type": "message_stop"})


async def count_tokens(server, request: HTTPRequest):
    """{"input_tokens": n}: the tokens the model would read for these
    messages, system and tools, as /v1/messages counts them."""
    body = await server.read_json(request)
    server.check_model(body)
    chat, _ = to_chat(body, count_only=True)
    ids = (await prompt_ids(server, chat))[0]
    return JSONResponse({"input_tokens": len(ids)})


def routes(server) -> list:
    from starlette.routing import Route

    return [Route("/v1/messages", endpoint(server, messages), methods=["POST"]),
            Route("/v1/messages/count_tokens", endpoint(server, count_tokens), methods=["POST"])]

