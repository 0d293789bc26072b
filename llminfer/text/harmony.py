"""gpt-oss's harmony format, read from the text a model writes: messages on
channels, each a header, <|message|>, a body and its end.

    <|channel|>analysis<|message|>The user asks ...<|end|>             -> reasoning
    <|start|>assistant<|channel|>final<|message|>It is 4.<|return|>    -> content
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
                                                                        -> a tool call

The prompt ends in "<|start|>assistant", so the reply opens with a header.
The recipient ("to=functions.NAME") may stand before the channel or after
it; a commentary message without one is a preamble meant for the user
(content). <|return|> and <|call|> end the generation (end-of-generation
tokens; as text when the vocabulary spells them, they are the chat's stop
texts), so the last body usually ends with the text itself; <|end|> ends a
message and the next one follows.

    split = HarmonySplitter()
    for piece in pieces:
        reasoning, content = split.feed(piece)      # either may be ""
    reasoning, content = split.finish()
    split.calls                                     # [{"name", "arguments": dict}]

The tags are matched in the text, so a vocabulary that spells them over
several tokens reads the same (a tag's possible start is held back). The
splitter has the phases of llminfer.text.reasoning.ReasoningSplitter: "start" (in
a header), "thinking" (analysis), "answer" (final, or a preamble), plus
"call" (a tool call's arguments), so the generation core's ThinkingTracker
follows it alike.
"""

from __future__ import annotations

import re

from llminfer.text import jsonlimits
from llminfer.errors import InvalidArgumentError

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
# what ends a body: the message, or (written as text) the generation
_BODY_ENDS = (END, RETURN, CALL)
# a message header may open with these (after the first one, <|start|>assistant)
_HEADER_OPENS = (START, CHANNEL, " to=", "to=")
_HEADER_LIMIT = 512  # a header longer than this is not one: the text is content
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
# the closing that the reasoning budget forces: end the analysis, open the final answer
FORCED_CLOSE = f"{END}{START}assistant{CHANNEL}final{MESSAGE}"


def is_harmony(template: str, tokenizer=None) -> bool:
    """Whether a chat template (or the vocabulary) is harmony's: it writes
    <|channel|> (as llama.cpp's common/chat.cpp tells gpt-oss's template)."""
    return CHANNEL in (template or "") or (tokenizer is not None and tokenizer.token_id(CHANNEL) is not None)


def _partial_suffix(text: str, tags) -> int:
    """Length of the longest end of text that begins one of tags (0: none)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


def _call_of(name: str, body: str):
    """{"name", "arguments": dict} of a call's recipient and JSON body, or None."""
    try:
        args = jsonlimits.loads(body.strip() or "{}", "a tool call's arguments", default=None)
    except InvalidArgumentError:  # nested too deep to be a call's arguments
        return None
    return {"name": name, "arguments": args} if isinstance(args, dict) else None


class HarmonySplitter:
    """Text in, (reasoning, content) out, tool calls gathered in calls; see
    the module's doc."""

    def __init__(self):
        self.phase = "start"
        self.pending = ""
        self.calls: list = []
        self._first = True  # the reply's first header: text that is no header is content
        self._call_name = ""

    def _open(self, header: str):
        """Enter the body of the message whose header is `header`."""
        m = _CHANNEL_NAME.search(header)
        channel = m.group(1) if m else ""
        to = _RECIPIENT.search(header)
        recipient = to.group(1) if to else ""
        if recipient.startswith("functions."):
            self.phase, self._call_name = "call", recipient[len("functions."):]
        elif channel == "analysis":
            self.phase = "thinking"
        else:  # final, a commentary preamble, or a channel we do not know: the user's
            self.phase = "answer"
        self._first = False

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        reasoning, content = [], []
        while True:
            p = self.pending
            if self.phase == "start":
                i = p.find(MESSAGE)
                if i >= 0:
                    self._open(p[:i])
                    self.pending = p[i + len(MESSAGE):]
                    continue
                lead = p.lstrip()
                if self._first and lead and not any(lead.startswith(o) or o.startswith(lead) for o in _HEADER_OPENS):
                    self.phase = "raw"  # a model that writes no header: all of it is content
                    continue
                if len(p) > _HEADER_LIMIT:
                    self.phase = "raw"
                    continue
                break
            if self.phase == "raw":
                content.append(p)
                self.pending = ""
                break
            # a body: up to the first end tag; hold what may begin one
            ends = [(p.find(t), t) for t in _BODY_ENDS if t in p]
            if ends:
                i, tag = min(ends)
                self._take(p[:i], reasoning, content, closed=True)
                self.pending = p[i + len(tag):]
                self.phase = "start"
                continue
            if self.phase == "call":
                break  # the arguments are parsed whole, at their end
            cut = len(p) - _partial_suffix(p, _BODY_ENDS)
            self._take(p[:cut], reasoning, content, closed=False)
            self.pending = p[cut:]
            break
        return "".join(reasoning), "".join(content)

    def _take(self, body: str, reasoning: list, content: list, closed: bool):
        if self.phase == "thinking":
            reasoning.append(body)
        elif self.phase == "answer":
            content.append(body)
        elif self.phase == "call" and closed:
            call = _call_of(self._call_name, body)
            if call is not None:
                self.calls.append(call)
            else:  # arguments that are not a JSON object: shown as they are
                content.append(body)

    def finish(self) -> tuple[str, str]:
        """What is held back when the generation ends: the body being
        written is complete (a cut analysis is reasoning; a call's arguments
        end at <|call|>, which is not in the text); a header alone is
        dropped."""
        p, self.pending = self.pending, ""
        reasoning, content = [], []
        if self.phase == "raw":
            content.append(p)
        elif self.phase in ("thinking", "answer", "call"):
            self._take(p, reasoning, content, closed=True)
        return "".join(reasoning), "".join(content)

    @classmethod
    def split(cls, text: str) -> tuple[str | None, str, list]:
        """(reasoning or None, content, calls) of a whole output."""
        s = cls()
        r1, c1 = s.feed(text)
        r2, c2 = s.finish()
        return (r1 + r2) or None, c1 + c2, s.calls
