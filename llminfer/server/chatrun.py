"""One chat generation as the non-OpenAI wire formats see it: the internal
request that /v1/messages (Anthropic) and /v1/responses (OpenAI Responses)
are translated into, and the reply as pieces of thinking, answer text and
tool calls that they translate back.

    run = await start_chat(server, body, max_tokens)   # body: an OpenAI chat request's fields
    async for kind, text in run.pieces():              # ("thinking" | "text", text) as they come
        ...
    run.reply                                          # ChatReply: calls, finish, stop_sequence, usage

The request goes the way of /v1/chat/completions: the server's sampling
parameters, chat template, tools and grammar (app._Server.sampling,
chat_ids) and one _Job on the scheduler. Nothing here builds OpenAI chat
dicts; each translator shapes its own.

A reply that opens with <think> (or whose prompt ends in an opened <think>,
as reasoning models' templates write it) is split at </think>: the part
before is thinking, the rest the answer, parsed for tool calls as the chat
path parses them (llminfer.tools).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from llminfer.generation import TokenEvent
from llminfer.server.app import APIError, _bad, _Job, _until_disconnect
from llminfer.tools import ToolCallStream

log = logging.getLogger("llminfer.server")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def new_id(prefix: str) -> str:
    """A fresh object id as Anthropic and the Responses API write them: "msg_", "toolu_", "resp_", "fc_"..."""
    return f"{prefix}_{uuid.uuid4().hex}"


class ThinkSplit:
    """A streamed reply split into thinking and answer at <think>…</think>.
    feed(text) and finish() give [(kind, text)], kind "thinking" or "text";
    a piece that might be the start of a tag is held back. Blanks that open
    the thinking, and the answer after it, are dropped."""

    def __init__(self, opened: bool = False):
        self.state = "thinking" if opened else "start"
        self.buf = ""
        self.lead = opened  # drop the blanks that open the next piece

    def _emit(self, out, kind, text):
        if self.lead:
            text = text.lstrip()
            if not text:
                return
            self.lead = False
        if text:
            out.append((kind, text))

    def feed(self, text: str) -> list:
        self.buf += text
        out = []
        while True:
            if self.state == "start":  # does the reply open with <think>?
                s = self.buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self.buf, self.state, self.lead = s[len(THINK_OPEN):], "thinking", True
                    continue
                if not s or THINK_OPEN.startswith(s):
                    return out
                self.state = "answer"
                continue
            if self.state == "thinking":
                i = self.buf.find(THINK_CLOSE)
                if i >= 0:
                    self._emit(out, "thinking", self.buf[:i])
                    self.buf, self.state, self.lead = self.buf[i + len(THINK_CLOSE):], "answer", True
                    continue
                keep = _partial_suffix(self.buf, THINK_CLOSE)
                cut = len(self.buf) - keep
                self._emit(out, "thinking", self.buf[:cut])
                self.buf = self.buf[cut:]
                return out
            self._emit(out, "text", self.buf)
            self.buf = ""
            return out

    def finish(self) -> list:
        out = []
        self._emit(out, "thinking" if self.state == "thinking" else "text", self.buf)
        self.buf = ""
        return out

    @property
    def thinking(self) -> bool:
        return self.state == "thinking"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that is a proper start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def answer_part(full: str, opened: bool) -> str:
    """The answer of a whole reply: what follows its thinking, if it thinks."""
    if opened or full.lstrip().startswith(THINK_OPEN):
        i = full.find(THINK_CLOSE)
        return full[i + len(THINK_CLOSE):] if i >= 0 else ""
    return full


@dataclass
class ChatReply:
    """How a reply ended. finish: "stop" (end of turn), "length",
    "stop_sequence" (then stop_sequence says which) or "tool_calls"; calls:
    [{"name", "arguments": dict}]; thinking and text: the whole of each."""

    finish: str = "stop"
    stop_sequence: str | None = None
    calls: list = field(default_factory=list)
    thinking: str = ""
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class ChatRun:
    """A submitted chat generation (see the module's doc)."""

    def __init__(self, server, job: _Job, stops: list, opened: bool):
        self.server = server
        self.job = job
        self.stops = stops  # the request's own stop strings (not the template's)
        self.opened = opened
        self.reply = ChatReply()

    def cancel(self):
        self.job.cancel()

    async def pieces(self):
        """("thinking" | "text", text) as the reply comes; then self.reply is
        complete. An engine failure raises its APIError."""
        job, tok = self.job, self.server.tokenizer
        tools = job.tools
        think = ThinkSplit(self.opened)
        split = ToolCallStream(tools.fmt) if tools is not None else None
        tokens, emitted = [], []
        reply = self.reply
        finish = None
        async for _req, ev in job.events():
            if isinstance(ev, TokenEvent):
                tokens.append(ev.token)
                if think.thinking:
                    reply.reasoning_tokens += 1
            else:
                finish = ev
                if ev.reason == "error":
                    raise job.error()
            emitted.append(ev.text)
            parts = think.feed(ev.text) + (think.finish() if finish is not None else [])
            for kind, text in parts:
                if kind == "thinking":
                    reply.thinking += text
                    yield kind, text
                    continue
                if split is not None:
                    text = split.feed(text)
                if text:
                    reply.text += text
                    yield kind, text
        reply.prompt_tokens = finish.prompt_tokens
        reply.completion_tokens = finish.completion_tokens
        reply.cached_tokens = finish.cached_tokens
        reply.finish = finish.reason if finish.reason in ("stop", "length") else "stop"
        if split is not None:
            full = answer_part(tok.decode(tokens, skip_special=False), self.opened)
            rest, calls = split.finish(full)
            if rest:
                reply.text += rest
                yield "text", rest
            if calls:
                reply.calls = calls
                reply.finish = "tool_calls"
        if reply.finish == "stop" and self.stops:
            reply.stop_sequence = self._stop_hit(tokens, "".join(emitted))
            if reply.stop_sequence is not None:
                reply.finish = "stop_sequence"

    def _stop_hit(self, tokens, emitted: str) -> str | None:
        """The stop string the reply ended at, if one of the request's did:
        the text of the tokens goes on, past what was sent, with it."""
        raw = b"".join(self.server.tokenizer.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")
        if not raw.startswith(emitted):
            return None
        after = raw[len(emitted):]
        hits = [s for s in self.stops if after.startswith(s)]
        return max(hits, key=len) if hits else None

    async def whole(self, request) -> ChatReply | None:
        """The whole reply, or None when the client went away first (the
        generation is cancelled then)."""
        async def gather():
            async for _ in self.pieces():
                pass

        try:
            done = await _until_disconnect(gather(), request.receive)
        except BaseException:
            self.cancel()
            raise
        if not done:
            self.cancel()
            return None
        return self.reply


async def prompt_ids(server, body) -> tuple[list, list, object]:
    """(prompt ids, template stop texts, tools) of an OpenAI-shaped chat body."""
    server.check_generates()
    return await run_in_threadpool(server.chat_ids, body)


async def start_chat(server, body: dict, max_tokens: int | None) -> ChatRun:
    """Submit the chat request `body` (OpenAI chat fields: messages, tools,
    tool_choice, response_format, stop and sampling) for at most max_tokens
    new tokens, fewer when the context has less room (None: all it has)."""
    server.check_generates()
    params, _, _, stops, ignore_eos, _, grammar, _ = await run_in_threadpool(server.sampling, body, True)
    ids, chat_stops, tools = await run_in_threadpool(server.chat_ids, body)
    if tools is not None and tools.grammar is not None:
        if grammar is not None:
            raise _bad(f"a structured-output format cannot be combined with a required tool call "
                       f"(tool_choice {tools.choice!r})", "tool_choice")
        grammar = tools.grammar
    room = server.check_length(ids, None)
    limit = room if max_tokens is None else min(max_tokens, room)
    job = _Job(server, [ids], params, [limit], 1, chat_stops + stops, ignore_eos, None, grammar)
    job.tools = tools
    tail = server.tokenizer.decode(ids[-8:], skip_special=False).rstrip()
    run = ChatRun(server, job, stops, tail.endswith(THINK_OPEN))
    job.submit()
    return run


class EventStream:
    """A server-sent-event response over the byte chunks `chunks` makes: the
    run is cancelled when the client goes away or the stream ends early, and
    a failure while making chunks ends the stream with on_error(APIError)'s
    bytes instead of a cut connection."""

    def __init__(self, chunks, run: ChatRun, on_error):
        self.chunks, self.run, self.on_error = chunks, run, on_error

    async def _guarded(self):
        try:
            async for data in self.chunks:
                yield data
        except Exception as e:  # noqa: BLE001 - the client gets a shaped error event, the log the traceback
            if not isinstance(e, (APIError, ValueError)):
                log.exception("a stream failed")
            err = e if isinstance(e, APIError) else _bad(str(e)) if isinstance(e, ValueError) else \
                APIError(500, f"internal error: {type(e).__name__}")
            yield self.on_error(err)

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})

        async def pump():
            async for data in self._guarded():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await _until_disconnect(pump(), receive)
        except OSError:
            pass  # the connection broke mid-write: as good as a disconnect
        finally:
            self.run.cancel()
