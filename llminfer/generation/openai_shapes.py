"""Every OpenAI-shaped object llminfer hands out, built in this one module:
ids, usage, completions and chat completions whole and as stream chunks,
their choices and messages, both logprobs shapes, and tool calls.

The library (LLM/Llama, llminfer.generation.completions) and the server
(llminfer.server.app) describe what was generated; this module says how
OpenAI writes it down:

    env = Envelope(model_name, chat=True)             # id, created, model, object names
    env.whole([chat_choice(0, message("Hi"), None, "stop")], usage(12, 3))
    env.delta_chunk({"content": "Hi"})                 # a chat.completion.chunk
    env.text_chunk("Hi")                               # a text_completion chunk

A chat reply is read here too, whole (chat_message) or streamed
(ChatDeltas): a thinking model's reasoning goes to reasoning_content beside
content (llminfer.text.reasoning), and tool calls are parsed from the answer
after it (llminfer.text.tools); a harmony reply's channels give all three
(llminfer.text.harmony).

Completions use OpenAI's legacy logprobs shape ({"tokens", "text_offset",
"token_logprobs", "top_logprobs"}), chat completions its chat shape
({"content": [{"token", "logprob", "bytes", "top_logprobs"}]}).
"""

from __future__ import annotations

import json
import time
import uuid

from llminfer.text.harmony import HarmonySplitter
from llminfer.text.reasoning import ReasoningSplitter
from llminfer.text.tools import ToolCallStream, parse_tool_calls


def new_id(kind: str) -> str:
    """A fresh id of an OpenAI object: "cmpl-" or "chatcmpl-" and 32 hex
    digits for a completion (kind "cmpl", "chatcmpl"), "call_" and 24 for a
    tool call (kind "call")."""
    if kind == "call":
        return "call_" + uuid.uuid4().hex[:24]
    if kind not in ("cmpl", "chatcmpl"):
        raise ValueError(f"no OpenAI id of kind {kind!r}")
    return f"{kind}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage object (with prompt_tokens_details when cached_tokens is given)."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def usage_of(outs) -> dict:
    """The usage of the Completions of one prompt's choices."""
    return usage(outs[0].prompt_tokens, sum(len(c.tokens) for c in outs))


class Envelope:
    """What every object of one response shares: its id, creation time and
    model, and whether it is a chat ("chat.completion", streamed as
    "chat.completion.chunk") or a completion ("text_completion" both ways)."""

    def __init__(self, model: str, chat: bool):
        self.chat = chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, choices: list, usage_: dict | None) -> dict:
        """The response of a call that does not stream."""
        out = {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def chunk(self, choices: list, usage_: dict | None = None) -> dict:
        """One chunk of a stream (choices may be empty: the usage chunk)."""
        out = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def text_chunk(self, text: str, index: int = 0, logprobs=None, finish_reason=None) -> dict:
        return self.chunk([text_choice(index, text, logprobs, finish_reason)])

    def delta_chunk(self, delta: dict, index: int = 0, logprobs=None, finish_reason=None) -> dict:
        return self.chunk([delta_choice(index, delta, logprobs, finish_reason)])


def text_choice(index: int, text: str, logprobs=None, finish_reason=None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_choice(index: int, message_: dict, logprobs=None, finish_reason=None) -> dict:
    return {"index": index, "message": message_, "logprobs": logprobs, "finish_reason": finish_reason}


def delta_choice(index: int, delta: dict, logprobs=None, finish_reason=None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def message(content, tool_calls: list | None = None, reasoning: str | None = None) -> dict:
    """An assistant message; tool_calls: OpenAI's (see tool_calls());
    reasoning: a thinking model's, as reasoning_content (left out when none)."""
    out = {"role": "assistant", "content": content}
    if reasoning:
        out["reasoning_content"] = reasoning
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


# ---- reading a chat reply ----

def _answer(full: str, reasoning) -> str:
    """The answer part of a reply (tool calls are parsed there, not in the thinking)."""
    return full if reasoning is None or reasoning.harmony else ReasoningSplitter.split(full, reasoning.in_thinking, reasoning.tags)[1]


def _harmony(reasoning) -> bool:
    """A harmony reply read apart (llminfer.text.harmony: its tool calls too)."""
    return reasoning is not None and reasoning.harmony and reasoning.parse


def chat_message(text: str, reasoning=None, tool_fmt: str | None = None, special_text=None) -> tuple[dict, list]:
    """(the assistant message, the calls parsed) of a whole reply. text: its
    text; reasoning: a llminfer.text.reasoning.Reasoning or None; tool_fmt: the
    tools' format when tools were offered, then special_text() gives the
    reply with its special tokens written out, which calls are parsed from."""
    thought = None
    if _harmony(reasoning):  # the calls are messages of their own, read with the rest
        thought, text, calls = HarmonySplitter.split(text)
        return message(text if text or not calls else None, tool_calls(calls), thought), calls
    if reasoning is not None and reasoning.parse:
        thought, text = ReasoningSplitter.split(text, reasoning.in_thinking, reasoning.tags)
    calls = []
    if tool_fmt:
        content, calls = parse_tool_calls(_answer(special_text(), reasoning), tool_fmt)
        if calls:
            text = content
    return message(text, tool_calls(calls), thought), calls


class ChatDeltas:
    """One streamed chat choice: the text pieces of its generation in, the
    deltas of OpenAI's chunks out ({"reasoning_content", "content"}, either
    or both, {} while text is held back), then the tool calls at its end.

        d = ChatDeltas(reasoning, tool_fmt)
        for piece in pieces: send(d.feed(piece))
        delta, calls = d.finish(special_text)       # the held text; tool_call_deltas(calls)

    parts() and finish_parts() give the same as (reasoning, content) pairs,
    for the wire formats that are not OpenAI chat (llminfer.server.chatrun)."""

    def __init__(self, reasoning=None, tool_fmt: str | None = None):
        self.reasoning = reasoning
        self.split = reasoning.splitter() if reasoning is not None and reasoning.parse else None
        # harmony's calls are read by its splitter, not from the answer
        self.tools = ToolCallStream(tool_fmt) if tool_fmt and not _harmony(reasoning) else None

    @property
    def thinking(self) -> bool:
        """Whether the text now coming is reasoning."""
        return self.split is not None and self.split.phase == "thinking"

    def _part(self, thought: str, content: str) -> tuple[str, str]:
        if content and self.tools is not None:
            content = self.tools.feed(content)
        return thought, content

    def parts(self, piece: str) -> tuple[str, str]:
        """(reasoning, content) of the next piece; either may be ""."""
        return self._part(*self.split.feed(piece)) if self.split is not None else self._part("", piece)

    def finish_parts(self, special_text=None, piece: str = "") -> tuple[str, str, list]:
        """(reasoning, content, calls) at the end: piece, the generation's
        last text; special_text() the whole reply with its special tokens
        written out (needed with tools)."""
        thought, content = self.parts(piece)
        if self.split is not None:
            t, c = self._part(*self.split.finish())
            thought, content = thought + t, content + c
        calls = list(self.split.calls) if _harmony(self.reasoning) else []
        if self.tools is not None:
            rest, calls = self.tools.finish(_answer(special_text(), self.reasoning))
            content += rest
        return thought, content, calls

    @staticmethod
    def _delta(thought: str, content: str) -> dict:
        out = {}
        if thought:
            out["reasoning_content"] = thought
        if content:
            out["content"] = content
        return out

    def feed(self, piece: str) -> dict:
        return self._delta(*self.parts(piece))

    def finish(self, special_text=None, piece: str = "") -> tuple[dict, list]:
        """(the last delta, the calls); see finish_parts."""
        thought, content, calls = self.finish_parts(special_text, piece)
        return self._delta(thought, content), calls


# ---- logprobs ----

def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def chat_logprob_item(piece: bytes, logprob, top: list) -> dict:
    """One token of OpenAI's chat logprobs: piece its bytes, top [(bytes, logprob)]."""
    return {"token": _text(piece), "logprob": logprob, "bytes": list(piece),
            "top_logprobs": [{"token": _text(b), "logprob": v, "bytes": list(b)} for b, v in top]}


def chat_logprobs(tokenizer, tokens, entries) -> dict:
    """OpenAI's chat logprobs object of tokens (entries: per token (logprob,
    [(token, logprob)]))."""
    def piece(t):
        return tokenizer.token_bytes(t, skip_special=False)

    content = [chat_logprob_item(piece(t), lp, [(piece(a), v) for a, v in top])
               for t, (lp, top) in zip(tokens, entries)]
    return {"content": content, "refusal": None}


def legacy_top(piece: str, logprob, top_pieces) -> dict | None:
    """A completion token's top_logprobs map: its alternatives, the chosen
    token listed too as OpenAI does (None for a token with no logprob: an
    echoed first one)."""
    if logprob is None:
        return None
    alts = {}
    for p, v in top_pieces:
        alts.setdefault(p, v)
    alts.setdefault(piece, logprob)
    return alts


def legacy_logprobs(tokenizer, tokens, entries, offset: int) -> dict:
    """OpenAI's completions logprobs object for tokens (entries: per token
    (logprob, top) or None where there is none: an echoed first token);
    offset: the text offset of the first token."""
    def piece(t):
        return _text(tokenizer.token_bytes(t, skip_special=False))

    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    for t, e in zip(tokens, entries):
        p = piece(t)
        out["tokens"].append(p)
        out["text_offset"].append(offset)
        offset += len(p)
        lp, top = e if e is not None else (None, [])
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(legacy_top(p, lp, [(piece(a), v) for a, v in top]))
    return out


# ---- tool calls ----

def tool_calls(calls) -> list:
    """OpenAI's tool_calls of parsed calls ([{"name", "arguments": dict}])."""
    return [{"id": new_id("call"), "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for c in calls]


def tool_call_deltas(calls):
    """The stream deltas of parsed calls, as OpenAI sends them: per call its
    index, id, type and name with empty arguments, then its arguments."""
    for i, call in enumerate(tool_calls(calls)):
        yield {"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                               "function": {"name": call["function"]["name"], "arguments": ""}}]}
        yield {"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]}
