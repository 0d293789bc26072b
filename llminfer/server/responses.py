"""OpenAI's Responses API over the server's chat path: POST /v1/responses,
whole or streamed (response.created … response.completed), stateless.

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.responses.create(model="any", instructions="Be brief.", input="Hi")

`input` (a string, or a list of message, function_call and
function_call_output items) and `instructions` become an OpenAI chat
request run by llminfer.server.chatrun; the reply comes back as output
items: a reasoning item (when the model thinks in <think>…</think>), a
message with its output_text, and function_call items. `text.format`
constrains the text as response_format does (llminfer.text.structured).
Nothing is stored: `store` is ignored (the response says false), and
previous_response_id or an item_reference, which need a stored response,
are refused with a 400. Errors have OpenAI's shape.
"""

from __future__ import annotations

import json
import time

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

from llminfer.text.reasoning import EFFORTS
from llminfer.server.app import APIError, bad_request, openai_endpoint, shown
from llminfer.server.chatrun import EventStream, new_id, start_chat

# llama-server's extensions, taken as the chat path takes them
EXTRA_FIELDS = ("seed", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "grammar")

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


# ---- the request ----

def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", "input")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise bad_request(f"{where}[{j}]: {kind} is not supported by this server (text only)", "input")
        else:
            raise bad_request(f"{where}[{j}] must be an input_text part, got {shown(kind or part)}", "input")
    return "".join(out)


def _messages(body) -> list:
    """The OpenAI chat messages of instructions and input."""
    out = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions must be a string", "instructions")
        if instructions:
            out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input must be a string or a non-empty list of items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role"))
            if role is None:
                raise bad_request(f"{where}.role must be 'user', 'assistant', 'system' or 'developer', "
                           f"got {shown(item.get('role'))}", "input")
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str):
                raise bad_request(f"{where}: a function_call needs a name and its arguments as a JSON string", "input")
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the same turn: its text and its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a function_call_output needs a call_id", "input")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _content(item.get("output", ""), f"{where}.output")})
        elif kind == "reasoning":
            continue  # earlier turns' reasoning is not shown to the model again
        elif kind == "item_reference":
            raise bad_request(f"{where}: item_reference needs stored responses; this server stores none (send the "
                       f"items themselves)", "input")
        else:
            raise bad_request(f"{where}: items of type {shown(kind)} are not supported by this server", "input")
    return out


def _tools(body) -> tuple:
    tools = body.get("tools")
    funcs = None
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("tools must be a list of function tools", "tools")
        funcs = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else t
                raise bad_request(f"tools[{i}]: tool type {shown(kind)} is not supported by this server; only "
                           f"{{'type': 'function', 'name': ..., 'parameters': {{...}}}}", "tools")
            funcs.append({"type": "function", "function": {
                "name": t.get("name"), "description": t.get("description") or "",
                "parameters": t.get("parameters") or {"type": "object", "properties": {}}}})
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'name': ...}}, "
                       f"got {shown(choice)}", "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return funcs, choice


def _format(body):
    """text.format as response_format, or None."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_request("text must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("text.format of type json_schema needs a 'schema' object", "text.format")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "output"), "schema": fmt["schema"],
                                                       "strict": fmt.get("strict")}}
    raise bad_request(f"text.format type must be 'text', 'json_object' or 'json_schema', got {shown(kind)}",
               "text.format")


def to_chat(body: dict) -> tuple[dict, int | None]:
    """(the OpenAI chat request of a Responses request, its max_output_tokens)."""
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise bad_request(f"{key} needs stored responses; this server is stateless and stores none: send the "
                       f"whole conversation as input items", key)
    chat = {"messages": _messages(body)}
    chat["tools"], chat["tool_choice"] = _tools(body)
    fmt = _format(body)
    if fmt is not None:
        chat["response_format"] = fmt
    for k in ("temperature", "top_p") + EXTRA_FIELDS:
        if body.get(k) is not None:
            chat[k] = body[k]
    chat.update(_reasoning(body))
    limit = body.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise bad_request(f"max_output_tokens must be a positive integer, got {shown(limit)}", "max_output_tokens")
    if not isinstance(body.get("stream", False), bool):
        raise bad_request(f"stream must be true or false, got {shown(body.get('stream'))}", "stream")
    return chat, limit


def _reasoning(body) -> dict:
    """The chat path's reasoning options of the Responses API's reasoning
    object: its effort is the chat request's reasoning_effort (none: no
    thinking; minimal, low, medium, high: the template's reasoning_effort,
    minimal as low; llminfer.text.reasoning.ChatOptions). summary is accepted;
    the reasoning item carries the whole reasoning text, no summary."""
    r = body.get("reasoning")
    if r is None:
        return {}
    if not isinstance(r, dict):
        raise bad_request(f"reasoning must be an object, got {shown(r)}", "reasoning")
    effort = r.get("effort")
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(EFFORTS)}, got {shown(effort)}",
                          "reasoning.effort")
    return {"reasoning_effort": effort}


# ---- the reply ----

class _Output:
    """A response's output items as they are made."""

    def __init__(self):
        self.items = []

    def reasoning(self, text, status="completed"):
        return {"type": "reasoning", "id": new_id("rs"), "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": status}

    def message(self, text, status="completed"):
        return {"type": "message", "id": new_id("msg"), "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    def call(self, call, status="completed"):
        return {"type": "function_call", "id": new_id("fc"), "call_id": new_id("call"), "name": call["name"],
                "arguments": json.dumps(call["arguments"], ensure_ascii=False), "status": status}


def _usage(reply) -> dict:
    return {"input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def _response(meta, status, output, reply=None) -> dict:
    """The Response object: meta (id, created_at, the request's settings)
    with its status, output and usage."""
    r = dict(meta, status=status, output=output, usage=_usage(reply) if reply is not None else None)
    if status == "incomplete":
        r["incomplete_details"] = {"reason": "max_output_tokens"}
    if status == "completed":
        r["completed_at"] = int(time.time())
    return r


def _meta(server, body, chat) -> dict:
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    return {"id": new_id("resp"), "object": "response", "created_at": int(time.time()), "model": server.model_name,
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)), "previous_response_id": None,
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None}, "store": False,
            "temperature": chat.get("temperature", 1.0), "text": {"format": fmt or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or ("auto" if body.get("tools") else "none"),
            "tools": body.get("tools") or [], "top_p": chat.get("top_p", 1.0), "truncation": "disabled",
            "user": body.get("user")}


async def responses(server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    chat, limit = to_chat(body)
    try:
        run = await start_chat(server, chat, limit)
    except APIError as e:  # name the Responses field, not the chat one it became
        e.param = {"response_format": "text.format", "max_tokens": "max_output_tokens", "prompt": "input",
                   "messages": "input"}.get(e.param, e.param)
        raise
    meta = _meta(server, body, chat)
    if body.get("stream"):
        return EventStream(_stream(run, meta), run, lambda e: _sse("error", {
            "type": "error", "code": e.code or e.type, "message": e.message, "param": e.param,
            "sequence_number": 0}))
    reply = await run.whole(request)
    if reply is None:
        return JSONResponse({}, status_code=499)
    out = _Output()
    status = "incomplete" if reply.finish == "length" else "completed"
    items = []
    if reply.thinking:
        items.append(out.reasoning(reply.thinking))
    if reply.text or not reply.calls:
        items.append(out.message(reply.text, status))
    items += [out.call(c) for c in reply.calls]
    return JSONResponse(_response(meta, status, items, reply))


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: ".encode() + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _stream(run, meta):
    """The Responses stream: response.created and .in_progress; per output
    item .output_item.added, its parts and deltas, .output_item.done; then
    response.completed (or response.incomplete at max_output_tokens). Every
    event carries its sequence_number."""
    seq = 0
    out = _Output()
    done_items = []

    def ev(kind, **data):
        nonlocal seq
        seq += 1
        return _sse(kind, {"type": kind, "sequence_number": seq - 1, **data})

    yield ev("response.created", response=_response(meta, "in_progress", []))
    yield ev("response.in_progress", response=_response(meta, "in_progress", []))
    item, kind_open, text = None, None, ""

    def open_item(kind):
        nonlocal item, kind_open, text
        item = out.reasoning("", "in_progress") if kind == "thinking" else out.message("", "in_progress")
        item["content"] = []
        kind_open, text = kind, ""
        part = {"type": "reasoning_text", "text": ""} if kind == "thinking" else \
            {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        idx = len(done_items)
        return [ev("response.output_item.added", output_index=idx, item=item),
                ev("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0, part=part)]

    def close_item(status="completed"):
        nonlocal item, kind_open
        if item is None:
            return []
        idx = len(done_items)
        if kind_open == "thinking":
            part = {"type": "reasoning_text", "text": text}
            evs = [ev("response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0,
                      text=text)]
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            evs = [ev("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                      text=text, logprobs=[])]
        evs.append(ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                      part=part))
        final = dict(item, content=[part], status=status if kind_open == "text" else "completed")
        evs.append(ev("response.output_item.done", output_index=idx, item=final))
        done_items.append(final)
        item, kind_open = None, None
        return evs

    pieces = run.pieces()
    while True:
        try:
            kind, piece = await pieces.__anext__()
        except StopAsyncIteration:
            break
        except APIError as e:  # the engine failed: an error event, and the response failed
            yield ev("error", code=e.code or e.type, message=e.message, param=e.param)
            failed = _response(meta, "failed", done_items)
            failed["error"] = {"code": "server_error", "message": e.message}
            yield ev("response.failed", response=failed)
            return
        if kind != kind_open:
            for b in close_item() + open_item(kind):
                yield b
        text += piece
        idx = len(done_items)
        if kind == "thinking":
            yield ev("response.reasoning_text.delta", item_id=item["id"], output_index=idx, content_index=0,
                     delta=piece)
        else:
            yield ev("response.output_text.delta", item_id=item["id"], output_index=idx, content_index=0,
                     delta=piece, logprobs=[])
    reply = run.reply
    status = "incomplete" if reply.finish == "length" else "completed"
    had_text = kind_open == "text" or any(i["type"] == "message" for i in done_items)
    for b in close_item(status):
        yield b
    if not had_text and not reply.calls:  # a reply with no text and no call: an empty message
        for b in open_item("text") + close_item(status):
            yield b
    for call in reply.calls:
        idx = len(done_items)
        final = out.call(call)
        yield ev("response.output_item.added", output_index=idx, item=dict(final, arguments="", status="in_progress"))
        yield ev("response.function_call_arguments.delta", item_id=final["id"], output_index=idx,
                 delta=final["arguments"])
        yield ev("response.function_call_arguments.done", item_id=final["id"], output_index=idx,
                 arguments=final["arguments"], name=final["name"])
        yield ev("response.output_item.done", output_index=idx, item=final)
        done_items.append(final)
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    yield ev(kind, response=_response(meta, status, done_items, reply))


def routes(server) -> list:
    from starlette.routing import Route

    return [Route("/v1/responses", openai_endpoint(server, responses), methods=["POST"])]
