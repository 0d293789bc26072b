"""One chat generation as the non-OpenAI wire formats see it: the internal
request that /v1/messages (Anthropic), /v1/responses (OpenAI Responses)
and Ollama's /api/chat and /api/generate are translated into, and the reply as pieces of thinking, answer text and
tool calls that they translate back.

    run = await start_chat(server, body, max_tokens)   # body: an OpenAI chat request's fields
    async for kind, text in run.pieces():              # ("thinking" | "text", text) as they come
        ...
    run.reply                                          # ChatReply: calls, finish, stop_sequence, usage

The request goes the way of /v1/chat/completions: the server's sampling
parameters, chat template, tools and grammar (app.Server.sampling,
chat_ids) and one Job on the scheduler. Nothing here builds OpenAI chat
dicts; each translator shapes its own.

A reply that opens with <think> (or whose prompt ends in an opened <think>,
as reasoning models' templates write it) is split at </think>: the part
before is thinking, the rest the answer, parsed for tool calls as the chat
path parses them (llminfer.text.tools).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from llminfer.generation.generator import TokenEvent
from llminfer.text.reasoning import Reasoning
from llminfer.generation import openai_shapes as oai
from llminfer.server.app import APIError, Job, bad_request, until_disconnect

log = logging.getLogger("llminfer.server")

def new_id(prefix: str) -> str:
    """A fresh object id as Anthropic and the Responses API write them: "msg_", "toolu_", "resp_", "fc_"..."""
    return f"{prefix}_{uuid.uuid4().hex}"


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

    def __init__(self, server, job: Job, stops: list):
        self.server = server
        self.job = job
        self.stops = stops  # the request's own stop strings (not the template's)
        self.reply = ChatReply()
        # monotonic ns: submitted, first token out (the prompt read), last event in
        self.started_ns, self.first_token_ns, self.ended_ns = time.monotonic_ns(), None, None

    def cancel(self):
        self.job.cancel()

    async def pieces(self):
        """("thinking" | "text", text) as the reply comes; then self.reply is
        complete. An engine failure raises its APIError."""
        job, tok = self.job, self.server.tokenizer
        # the reply is read as /v1/chat/completions reads it: the thinking by
        # llminfer.text.reasoning, the calls by llminfer.text.tools, after the thinking
        read = oai.ChatDeltas(job.reasoning, job.tools.fmt if job.tools is not None else None)
        tokens, emitted = [], []
        reply = self.reply
        finish, calls = None, []
        async for _req, ev in job.events():
            if isinstance(ev, TokenEvent):
                if self.first_token_ns is None:
                    self.first_token_ns = time.monotonic_ns()
                tokens.append(ev.token)
                if read.thinking:
                    reply.reasoning_tokens += 1
                thought, text = read.parts(ev.text)
            else:
                finish = ev
                if ev.reason == "error":
                    raise job.error()
                thought, text, calls = read.finish_parts(lambda: tok.decode(tokens, skip_special=False), ev.text)
            emitted.append(ev.text)
            if thought:
                reply.thinking += thought
                yield "thinking", thought
            if text:
                reply.text += text
                yield "text", text
        self.ended_ns = time.monotonic_ns()
        reply.prompt_tokens = finish.prompt_tokens
        reply.completion_tokens = finish.completion_tokens
        reply.cached_tokens = finish.cached_tokens
        reply.finish = finish.reason if finish.reason in ("stop", "length") else "stop"
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
            done = await until_disconnect(gather(), request.receive)
        except BaseException:
            self.cancel()
            raise
        if not done:
            self.cancel()
            return None
        return self.reply


async def prompt_ids(server, body) -> tuple[list, list, object, object]:
    """(prompt ids, template stop texts, tools, reasoning) of an OpenAI-shaped chat body."""
    server.check_generates()
    return await run_in_threadpool(server.chat_ids, body)


async def start_chat(server, body: dict, max_tokens: int | None, prompt: list | None = None) -> ChatRun:
    """Submit the chat request `body` (OpenAI chat fields: messages, tools,
    tool_choice, response_format, stop and sampling) for at most max_tokens
    new tokens, fewer when the context has less room (None: all it has).
    prompt: token ids to run instead of the chat template's rendering of
    messages (a raw prompt, as Ollama's /api/generate "raw" sends): no
    template stops, no tools, the reply not read for thinking."""
    server.check_generates()
    params, _, _, stops, ignore_eos, _, grammar, _ = await run_in_threadpool(server.sampling, body, True)
    if prompt is not None:
        ids, chat_stops, tools, reasoning = prompt, [], None, None
    else:
        ids, chat_stops, tools, reasoning = await run_in_threadpool(server.chat_ids, body)
    if tools is not None and tools.grammar is not None:
        if grammar is not None:
            raise bad_request(f"a structured-output format cannot be combined with a required tool call "
                       f"(tool_choice {tools.choice!r})", "tool_choice")
        grammar = tools.grammar
    room = server.check_length(ids, None)
    limit = room if max_tokens is None else min(max_tokens, room)
    job = Job(server, [ids], params, [limit], 1, chat_stops + stops, ignore_eos, None, grammar, reasoning)
    job.tools = tools
    if reasoning is None and prompt is None:
        # a template that knows no <think>: the generation is not steered by
        # it, but a reply that opens with <think> is still read as thinking
        job.reasoning = Reasoning(in_thinking=False)
    run = ChatRun(server, job, stops)
    job.submit()
    return run


class EventStream:
    """A server-sent-event response over the byte chunks `chunks` makes: the
    run is cancelled when the client goes away or the stream ends early, and
    a failure while making chunks ends the stream with on_error(APIError)'s
    bytes instead of a cut connection."""

    def __init__(self, chunks, run: ChatRun, on_error, media_type: str = "text/event-stream"):
        self.chunks, self.run, self.on_error = chunks, run, on_error
        self.media_type = media_type  # Ollama's streams are application/x-ndjson

    async def _guarded(self):
        try:
            async for data in self.chunks:
                yield data
        except Exception as e:  # noqa: BLE001 - the client gets a shaped error event, the log the traceback
            if not isinstance(e, (APIError, ValueError)):
                log.exception("a stream failed")
            err = e if isinstance(e, APIError) else bad_request(str(e)) if isinstance(e, ValueError) else \
                APIError(500, f"internal error: {type(e).__name__}")
            yield self.on_error(err)

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", f"{self.media_type}; charset=utf-8".encode()),
                                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})

        async def pump():
            async for data in self._guarded():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await until_disconnect(pump(), receive)
        except OSError:
            pass  # the connection broke mid-write: as good as a disconnect
        finally:
            self.run.cancel()
