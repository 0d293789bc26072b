"""A thinking model's reasoning kept apart from its answer: the text between
<think> and </think> (Qwen3, the DeepSeek-R1 distills, any chat whose model
wraps its thoughts so) is reasoning_content, what follows is content, as
llama-server's --reasoning-format deepseek and vLLM's reasoning parsers
return them.

    split = ReasoningSplitter(in_thinking=True)     # the prompt ended in "<think>"
    for piece in pieces:
        reasoning, content = split.feed(piece)      # either may be ""
    reasoning, content = split.finish()             # what was held back

The output may start inside the thinking (the template wrote the opening tag
into the prompt: in_thinking) or open it itself (leading blanks, then the
tag); output that starts with anything else is all content. A tag split
over several tokens is held back until it is known whole; a generation cut
inside the thinking gives what was thought as reasoning. Blanks around the
reasoning, and between it and the answer, are dropped.

Gemma 4 wraps its thoughts in "<|channel>thought" and "<channel|>" (its
template writes an empty pair into the prompt when thinking is off): the
same splitter with those tags (GEMMA4_TAGS), chosen by the template.

gpt-oss's harmony format (llminfer.text.harmony: the analysis channel is the
reasoning, the final channel the answer, commentary to=functions.NAME a tool
call) is read the same way when the template is harmony's: Reasoning.harmony,
and splitter() gives a HarmonySplitter with the same feed/finish.

ThinkingTracker follows the same text token by token for the generation
core (llminfer.generation.generator): whether the sequence is thinking (a grammar
applies to the answer only), and the reasoning budget (after N thinking
tokens the closing tag is forced; for harmony the end of the analysis and
the opening of the final message).
"""

from __future__ import annotations

from dataclasses import dataclass

from llminfer.text import harmony
from llminfer.errors import InvalidArgumentError

OPEN, CLOSE = "<think>", "</think>"
THINK_TAGS = (OPEN, CLOSE)
GEMMA4_TAGS = ("<|channel>thought", "<channel|>")  # llama.cpp's common/parsers/gemma4.cpp reads the same
FORMATS = ("deepseek", "none")
_BLANKS = " \t\r\n"


def check_format(fmt) -> str:
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"reasoning_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
        raise InvalidArgumentError(f"reasoning_budget must be -1 (unlimited), 0 (no thinking) or a number of "
                                   f"tokens, got {budget!r}")
    return budget


def template_thinks(template: str, tokenizer) -> bool:
    """Whether a chat template (or the vocabulary) knows thinking tags."""
    return thinking_tags(template, tokenizer) is not None


def thinking_tags(template: str, tokenizer) -> tuple | None:
    """The (opening, closing) tags a chat template's model thinks in:
    Gemma 4's channel markers, or <think> and </think> (named by the
    template or the vocabulary); None when neither."""
    if GEMMA4_TAGS[0] in template and GEMMA4_TAGS[1] in template:
        return GEMMA4_TAGS
    if OPEN in template or CLOSE in template or tokenizer.token_id(OPEN) is not None:
        return THINK_TAGS
    return None


def starts_in_thinking(prompt_text: str, tags: tuple = THINK_TAGS) -> bool:
    """Whether a rendered chat prompt leaves the model inside its thinking
    (the template wrote the opening tag, as DeepSeek-R1's do)."""
    return prompt_text.rstrip(_BLANKS).endswith(tags[0])


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that begins tag (0: none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Text in, (reasoning, content) out; see the module's doc. phase:
    "start" (the output may still open a thinking), "thinking", "after"
    (the tag closed, blanks dropped) or "answer"."""

    def __init__(self, in_thinking: bool = False, tags: tuple = THINK_TAGS):
        self.open, self.close = tags
        self.phase = "thinking" if in_thinking else "start"
        self.pending = ""
        self._lead = True  # blanks at the start of the reasoning are dropped

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        reasoning, content = [], []
        while True:
            p = self.pending
            if self.phase == "start":
                lead = p.lstrip(_BLANKS)
                if lead.startswith(self.open):
                    self.phase, self.pending = "thinking", lead[len(self.open):]
                    continue
                if not lead or self.open.startswith(lead):
                    break  # blanks, or maybe the opening tag: wait
                self.phase = "answer"
                continue
            if self.phase == "thinking":
                if self._lead:
                    p = self.pending = p.lstrip(_BLANKS)
                    if not p:
                        break
                    self._lead = False
                i = p.find(self.close)
                if i >= 0:
                    reasoning.append(p[:i].rstrip(_BLANKS))
                    self.phase, self.pending = "after", p[i + len(self.close):]
                    continue
                # hold back what may begin the closing tag, and the blanks
                # before it (they end the reasoning if the tag follows)
                cut = len(p) - _partial_suffix(p, self.close)
                cut = len(p[:cut].rstrip(_BLANKS))
                reasoning.append(p[:cut])
                self.pending = p[cut:]
                break
            if self.phase == "after":
                p = self.pending = p.lstrip(_BLANKS)
                if not p:
                    break
                self.phase = "answer"
            content.append(self.pending)
            self.pending = ""
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is held back when the generation ends: a thinking cut short
        is reasoning (its trailing blanks dropped); text that never opened
        one is content."""
        p, self.pending = self.pending, ""
        if self.phase == "thinking":
            return p.rstrip(_BLANKS), ""
        if self.phase == "after":
            return "", ""
        return "", p

    @classmethod
    def split(cls, text: str, in_thinking: bool = False, tags: tuple = THINK_TAGS) -> tuple[str | None, str]:
        """(reasoning or None when there is none, content) of a whole output."""
        s = cls(in_thinking, tags)
        r1, c1 = s.feed(text)
        r2, c2 = s.finish()
        return (r1 + r2) or None, c1 + c2


@dataclass
class Reasoning:
    """How one chat generation's thinking is read: in_thinking (the prompt
    opened it), budget (-1: unlimited; N: the closing tag is forced after N
    thinking tokens), and the tags' token ids in this vocabulary (open_id
    when <think> is one token, close_ids the tokens of </think>). harmony:
    the reply is in gpt-oss's harmony format (llminfer.text.harmony). tags: the
    (opening, closing) tags, <think> and </think> or Gemma 4's."""

    in_thinking: bool
    budget: int = -1
    open_id: int | None = None
    close_ids: tuple = ()
    parse: bool = True  # reasoning_format "deepseek": the OpenAI layer splits the text
    harmony: bool = False
    tags: tuple = THINK_TAGS

    @classmethod
    def for_prompt(cls, prompt_text: str, tokenizer, budget: int = -1, tags: tuple = THINK_TAGS) -> "Reasoning":
        close = tuple(tokenizer.encode(tags[1], add_bos=False, special=True))
        return cls(starts_in_thinking(prompt_text, tags), check_budget(budget), tokenizer.token_id(tags[0]), close,
                   tags=tags)

    @classmethod
    def for_harmony(cls, tokenizer, budget: int = -1) -> "Reasoning":
        """A harmony reply: it opens with a header (the prompt ends in
        <|start|>assistant); the budget closes the analysis and opens the
        final message."""
        close = tuple(tokenizer.encode(harmony.FORCED_CLOSE, add_bos=False, special=True))
        return cls(False, check_budget(budget), None, close, harmony=True)

    def splitter(self):
        """A ReasoningSplitter, or for harmony a llminfer.text.harmony.HarmonySplitter."""
        return harmony.HarmonySplitter() if self.harmony else ReasoningSplitter(self.in_thinking, self.tags)

    def tracker(self) -> "ThinkingTracker":
        return ThinkingTracker(self)


class ThinkingTracker:
    """One sequence's thinking, token by token, for the generation core:
    see(text) after each token; thinking / undecided say where the output
    is; forced() the token the budget imposes next, or None."""

    def __init__(self, r: Reasoning):
        self.r = r
        self.split = r.splitter()
        self.thought = 0  # tokens generated inside the thinking
        self._forcing: list | None = None

    @property
    def thinking(self) -> bool:
        return self.split.phase == "thinking"

    @property
    def undecided(self) -> bool:
        """The output may still open a thinking."""
        return self.split.phase == "start" and not self.r.harmony

    @property
    def free(self) -> bool:
        """No grammar applies now: the model thinks, or (harmony) writes a
        message header or a tool call."""
        return self.split.phase == "thinking" or (self.r.harmony and self.split.phase in ("start", "call"))

    def forced(self) -> int | None:
        if self._forcing is None and self.thinking and 0 <= self.r.budget <= self.thought and self.r.close_ids:
            self._forcing = list(self.r.close_ids)
        return self._forcing[0] if self._forcing else None

    def see(self, tok: int, text: str) -> bool:
        """Take the next token and its text; True when it belongs to the
        answer (a grammar consumes it), False when to the thinking or its tags."""
        before = self.split.phase
        if self._forcing and tok == self._forcing[0]:
            self._forcing.pop(0)
        if before == "thinking":
            self.thought += 1
        self.split.feed(text)
        if self.r.harmony:  # the answer is the final message's body
            return before in ("answer", "raw") and self.split.phase in ("answer", "raw")
        return before != "thinking" and self.split.phase != "thinking"


_RESERVED = ("messages", "add_generation_prompt", "tools")
# OpenAI's reasoning_effort values; the template is given low, medium or high
# (gpt-oss's reads reasoning_effort), "none" turns the thinking off
EFFORTS = ("none", "minimal", "low", "medium", "high")
OPTION_NAMES = ("chat_template_kwargs", "enable_thinking", "reasoning_format", "reasoning_budget",
                "reasoning_effort")


@dataclass
class ChatOptions:
    """A chat call's options on the template and the thinking:
    template_kwargs (variables for the chat template: chat_template_kwargs,
    with enable_thinking), reasoning_format ("deepseek": reasoning apart in
    reasoning_content; "none": the raw text in content) and
    reasoning_budget (-1 unlimited, 0 no thinking, N tokens).
    reasoning_effort (OpenAI's: none, minimal, low, medium, high) reaches
    the template as reasoning_effort (minimal as low); "none" is no
    thinking (enable_thinking false, budget 0) and low for the template."""

    template_kwargs: dict
    reasoning_format: str = "deepseek"
    reasoning_budget: int = -1

    @classmethod
    def make(cls, chat_template_kwargs=None, enable_thinking=None, reasoning_format="deepseek",
             reasoning_budget=-1, reasoning_effort=None) -> "ChatOptions":
        if chat_template_kwargs is None:
            chat_template_kwargs = {}
        if not isinstance(chat_template_kwargs, dict) or not all(isinstance(k, str) for k in chat_template_kwargs):
            raise InvalidArgumentError("chat_template_kwargs must be a dict of template variables by name, got "
                                       f"{type(chat_template_kwargs).__name__}")
        taken = [k for k in chat_template_kwargs if k in _RESERVED]
        if taken:
            raise InvalidArgumentError(f"chat_template_kwargs cannot set {', '.join(taken)} (the call's own)")
        kw = dict(chat_template_kwargs)
        if enable_thinking is not None:
            if not isinstance(enable_thinking, bool):
                raise InvalidArgumentError(f"enable_thinking must be True or False, got {enable_thinking!r}")
            kw["enable_thinking"] = enable_thinking
        budget = check_budget(reasoning_budget)
        if reasoning_effort is not None:
            if reasoning_effort not in EFFORTS:
                raise InvalidArgumentError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got "
                                           f"{reasoning_effort!r}")
            kw["reasoning_effort"] = reasoning_effort if reasoning_effort in ("low", "medium", "high") else "low"
            if reasoning_effort == "none":
                kw.setdefault("enable_thinking", False)
                budget = 0 if budget == -1 else budget
        if budget == 0:  # no thinking: the template is told so, as llama-server does
            kw.setdefault("enable_thinking", False)
        return cls(kw, check_format(reasoning_format), budget)

    @classmethod
    def pop(cls, kwargs: dict) -> "ChatOptions":
        """The options taken out of a call's keyword arguments."""
        return cls.make(**{k: kwargs.pop(k) for k in OPTION_NAMES if k in kwargs and kwargs[k] is not None})

    def reasoning(self, prompt_text: str, template: str, tokenizer) -> Reasoning | None:
        """How the generation after prompt_text thinks (None: a model whose
        template knows no thinking tags and is not harmony's)."""
        if harmony.is_harmony(template, tokenizer):
            r = Reasoning.for_harmony(tokenizer, self.reasoning_budget)
            r.parse = self.reasoning_format == "deepseek"
            return r
        tags = thinking_tags(template, tokenizer)
        if tags is None:
            return None
        r = Reasoning.for_prompt(prompt_text, tokenizer, self.reasoning_budget, tags)
        r.parse = self.reasoning_format == "deepseek"
        return r
