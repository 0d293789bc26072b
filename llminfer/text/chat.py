"""Chat prompt formatting: a conversation, a list of {"role": str, "content": str}
dicts, rendered to the prompt text the model was tuned on.

Every format is a jinja2 chat template, the form Hugging Face ships them in and
GGUF files carry them in (tokenizer.chat_template); the built-in formats below
are templates too, so there is one rendering path. It is set up as transformers'
apply_chat_template sets it up, so a template renders here as it does there:
trim_blocks and lstrip_blocks, the loop-control tags, a tojson that does not
escape HTML, raise_exception() and strftime_now(), and bos_token / eos_token
from the vocabulary.

A template inside a downloaded file is code that runs on the user's machine, so
it runs in jinja2's immutable sandbox: no underscore attributes, no mutating
the caller's messages, bounded range(). Here an unsafe attribute raises at once,
where plain jinja2 would hand back an undefined that renders as "", and a
render is bounded in steps, time and the size of what it builds
(llminfer.text.chat_sandbox); a template that goes past a bound raises
ChatTemplateError.

The rendered text is meant to be tokenized with special tokens recognised, so
"<start_of_turn>" becomes one token. ChatFormat.adds_bos says whether the text
already opens with the BOS piece, in which case the caller must not add another.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime
from functools import cached_property

from jinja2 import TemplateSyntaxError, ext

from llminfer.text import chat_sandbox
from llminfer.text.chat_sandbox import DEFAULT_LIMITS, GenerationTag, Sandbox, TemplateLimits
from llminfer.errors import ChatTemplateError, InvalidArgumentError

GGUF_TEMPLATE_KEY = "tokenizer.chat_template"
MAX_TEMPLATE_CHARS = 1 << 20  # the longest published templates (tool calling) are about 20 KB


class ChatFormatWarning(UserWarning):
    """No chat template was given or found, and a built-in format was guessed."""


# ---------------------------------------------------------------------------
# Built-in formats, written as templates. Each renders string contents only.

# ChatML (Qwen, SmolLM, many fine-tunes): no BOS, every turn closed by <|im_end|>.
_CHATML = r"""
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Gemma (1, 2, 3): BOS once, then user/model turns. There is no system role: as in
# Gemma 3's own template, a leading system message is put at the head of the first
# user turn, followed by a blank line, and contents are stripped.
_GEMMA = r"""
{{- bos_token }}
{%- set turns = messages %}
{%- set system_prefix = '' %}
{%- if messages[0].role == 'system' %}
{%- set system_prefix = messages[0].content + '\n\n' %}
{%- set turns = messages[1:] %}
{%- endif %}
{%- for message in turns %}
{%- if (message.role == 'user') != (loop.index0 is even) %}
{{- raise_exception('gemma format: after an optional system message, roles must alternate '
                    ~ 'user, assistant, user, ... (turn ' ~ loop.index ~ ' is ' ~ message.role ~ ')') }}
{%- endif %}
{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' }}
{%- if loop.first %}{{ system_prefix }}{% endif %}
{{- message.content | trim }}
{{- '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<start_of_turn>model\n' }}
{%- endif %}
"""

# Llama 3 instruct: BOS, then a header per turn; contents are stripped.
_LLAMA3 = r"""
{{- bos_token }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# name -> (template, the texts that end a model turn)
_BUILTINS = {
    "chatml": (_CHATML, ("<|im_end|>",)),
    "gemma": (_GEMMA, ("<end_of_turn>",)),
    "llama3": (_LLAMA3, ("<|eot_id|>",)),
}
BUILTIN_FORMATS: tuple[str, ...] = tuple(_BUILTINS)

# End-of-turn markers of well-known templates. A template that writes one of these
# ends its turns with it, so generation stops there.
_KNOWN_END_MARKERS = (
    "<|im_end|>",             # ChatML
    "<end_of_turn>",          # Gemma
    "<|eot_id|>",             # Llama 3
    "<|eom_id|>",             # Llama 3.1, after a tool call
    "<|end|>",                # Phi-3
    "<|END_OF_TURN_TOKEN|>",  # Command R
    "<|endoftext|>",
    "</s>",
)

# gpt-oss's harmony format (llminfer.text.harmony): a turn ends at <|return|>, or
# at <|call|> after a tool call
_HARMONY_CHANNEL = "<|channel|>"
_HARMONY_ENDS = ("<|return|>", "<|call|>")

_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3", "gemma3n")
_LLAMA3_PIECES = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_CHATML_PIECES = ("<|im_start|>", "<|im_end|>")


# ---------------------------------------------------------------------------
# The jinja environment: transformers' settings, with a stricter sandbox.

def _raise_exception(message):
    raise ChatTemplateError(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja2's own tojson escapes <, >, & and ' for HTML, which would change the
    # prompt; templates expect json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment():
    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols, GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def _template_line(exc):
    """The template line an exception was raised at: jinja rewrites tracebacks so
    that template frames carry the file name "<template>" and the template's line."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_messages(messages):
    if not isinstance(messages, (list, tuple)):
        raise InvalidArgumentError(
            f"messages must be a list of {{'role': str, 'content': str}} dicts, got {type(messages).__name__}: "
            f"{_short(messages)}")
    if not messages:
        raise InvalidArgumentError("messages is empty: a conversation needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidArgumentError(
                f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}: "
                f"{_short(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise InvalidArgumentError(f"messages[{i}] has no {key!r}: {_short(message)}")
            if not isinstance(message[key], str):
                raise InvalidArgumentError(
                    f"messages[{i}][{key!r}] must be a str, got {type(message[key]).__name__}: "
                    f"{_short(message[key])}")
    return list(messages)


# ---------------------------------------------------------------------------

class ChatFormat:
    """A compiled chat template and what goes with it.

    name: "gguf" (the file's own template), a BUILTIN_FORMATS name, or "custom".
    template: the jinja source. bos_token / eos_token: the vocabulary's pieces,
    given to the template. stop_texts: the texts that end a model turn, where
    generation must stop. A template that does not parse raises ChatTemplateError.
    """

    def __init__(self, name: str, template: str, *, bos_token: str = "", eos_token: str = "",
                 stop_texts: tuple[str, ...] = (), limits: TemplateLimits = DEFAULT_LIMITS):
        if not isinstance(template, str):
            raise InvalidArgumentError(f"chat template must be a str, got {type(template).__name__}")
        if not isinstance(limits, TemplateLimits):
            raise InvalidArgumentError(f"limits must be a TemplateLimits, got {type(limits).__name__}")
        if len(template) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(f"chat template {name!r} has {len(template)} characters, more than "
                                    f"{MAX_TEMPLATE_CHARS}: not a chat template")
        self.limits = limits
        self.name = name
        self.template = template
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.stop_texts = tuple(dict.fromkeys(s for s in stop_texts if s))  # ordered, unique, non-empty
        try:
            self._compiled = chat_sandbox.compile_template(_ENV, template, name, limits)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template {name!r} does not parse: {e.message} (line {e.lineno})") from e
        except (RecursionError, MemoryError, SyntaxError, ValueError, OverflowError) as e:
            # nesting deeper than the parser's or Python's compiler's stack,
            # or code the compiler refuses
            raise ChatTemplateError(f"chat template {name!r} cannot be compiled: {type(e).__name__}: "
                                    f"{str(e)[:200]}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """The prompt text for a conversation. With add_generation_prompt the text
        ends with the opening of a model turn, ready for generation. extra goes to
        the template as variables (tools=, documents=, or any a template reads)
        and may replace the defaults, strftime_now included."""
        variables = {
            "messages": _check_messages(messages),
            "add_generation_prompt": bool(add_generation_prompt),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None,
            "documents": None,
        }
        variables.update(extra)
        try:
            return chat_sandbox.render(self._compiled, variables, self.name, self.limits)
        except ChatTemplateError:
            raise  # the template's own raise_exception: its message is for the user as written
        except Exception as e:  # anything a template can do wrong: undefined, TypeError, sandbox refusal
            line = _template_line(e)
            where = f" at line {line}" if line is not None else ""
            raise ChatTemplateError(f"chat template {self.name!r} failed{where}: {type(e).__name__}: {e}") from e

    @cached_property
    def adds_bos(self) -> bool:
        """Whether the rendered text begins with the BOS piece (then the caller
        must not prepend another). Found by rendering a one-turn conversation,
        or, for templates that demand one, a system turn and a user turn."""
        if not self.bos_token:
            return False
        probes = ([{"role": "user", "content": "Hi"}],
                  [{"role": "system", "content": "Hi"}, {"role": "user", "content": "Hi"}])
        for i, probe in enumerate(probes):
            try:
                return self.render(probe).startswith(self.bos_token)
            except ChatTemplateError:
                if i == len(probes) - 1:
                    raise

    def __repr__(self):
        return f"ChatFormat(name={self.name!r}, stop_texts={self.stop_texts!r})"


# ---------------------------------------------------------------------------
# Choosing a format for a model

def _token_piece(metadata, which):
    """The vocabulary's piece for a special token ("bos", "eos", "eot"), or ""."""
    token_id = metadata.get(f"tokenizer.ggml.{which}_token_id")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if token_id is None or not tokens:
        return ""
    token_id = int(token_id)
    return tokens[token_id] if 0 <= token_id < len(tokens) else ""


def _has_pieces(metadata, pieces):
    tokens = metadata.get("tokenizer.ggml.tokens") or ()
    found = set(pieces).intersection(tokens)
    return len(found) == len(set(pieces))


def _template_stops(template, metadata):
    """Stop texts for a template we did not write: the known end-of-turn markers
    it writes, the vocabulary's end-of-turn pieces, and EOS."""
    stops = [m for m in _KNOWN_END_MARKERS if m in template]
    if _HARMONY_CHANNEL in template:  # harmony: <|end|> ends a message (the analysis), not the turn
        stops = [m for m in stops if m != "<|end|>"] + list(_HARMONY_ENDS)
    stops += [_token_piece(metadata, "eot"), _token_piece(metadata, "eom"), _token_piece(metadata, "eos")]
    return tuple(stops)


def _builtin(name, metadata):
    template, ends = _BUILTINS[name]
    eos = _token_piece(metadata, "eos")
    return ChatFormat(name, template, bos_token=_token_piece(metadata, "bos"), eos_token=eos,
                      stop_texts=ends + (eos,))


def _from_template(name, template, metadata):
    return ChatFormat(name, template, bos_token=_token_piece(metadata, "bos"),
                      eos_token=_token_piece(metadata, "eos"), stop_texts=_template_stops(template, metadata))


def _guess(metadata):
    """(built-in format, reason) for a file without a chat template."""
    arch = metadata.get("general.architecture")
    if arch in _GEMMA_ARCHS:
        return "gemma", f"general.architecture is {arch!r}, and Gemma models take <start_of_turn>/<end_of_turn> turns"
    if arch == "llama" and _has_pieces(metadata, _LLAMA3_PIECES):
        return "llama3", "general.architecture is 'llama' and the vocabulary has Llama 3's header and <|eot_id|> tokens"
    why = (f"general.architecture {arch!r} has no known turn format" if arch is not None
           else "the file names no general.architecture")
    if not _has_pieces(metadata, _CHATML_PIECES):
        why += " (and the vocabulary has no <|im_start|>/<|im_end|> tokens, so the model may not follow it)"
    return "chatml", why


def check_chat_args(chat_format=None, chat_template=None) -> None:
    """Validate LLM(chat_format=, chat_template=) when they are given, before
    any model is read, so a typo fails at the call that made it rather than
    at the first chat: chat_format must be "gguf" or a BUILTIN_FORMATS name,
    chat_template a non-empty string that compiles."""
    if chat_format is not None and (not isinstance(chat_format, str)
                                    or (chat_format != "gguf" and chat_format not in _BUILTINS)):
        raise InvalidArgumentError(f"unknown chat_format {_short(chat_format)}: "
                                   f"choose from {', '.join(('gguf',) + BUILTIN_FORMATS)}")
    if chat_template is not None:
        if not isinstance(chat_template, str) or not chat_template.strip():
            raise InvalidArgumentError(f"chat_template must be a non-empty jinja string, got {_short(chat_template)}")
        ChatFormat("custom", chat_template)  # raises ChatTemplateError if it does not compile


def chat_format_for(metadata: dict, chat_format: str | None = None, chat_template: str | None = None) -> ChatFormat:
    """The chat format for a model, from its GGUF metadata.

    In order: chat_template (a jinja string, named "custom"), then chat_format
    (a BUILTIN_FORMATS name, or "gguf" to insist on the file's own template),
    then the file's tokenizer.chat_template ("gguf"), then a built-in guessed from
    the architecture and vocabulary, with a ChatFormatWarning saying which and why.
    """
    if chat_template is not None:
        if not isinstance(chat_template, str) or not chat_template.strip():
            raise InvalidArgumentError(f"chat_template must be a non-empty jinja string, got {_short(chat_template)}")
        if chat_format is not None:
            warnings.warn(f"chat_format={chat_format!r} is ignored: chat_template was given and takes precedence",
                          ChatFormatWarning, stacklevel=2)
        return _from_template("custom", chat_template, metadata)

    own = metadata.get(GGUF_TEMPLATE_KEY)
    if own is not None and not isinstance(own, str):
        raise ChatTemplateError(f"{GGUF_TEMPLATE_KEY} is a {type(own).__name__}, not a string")

    if chat_format is not None:
        if chat_format == "gguf":
            if not own:
                raise ChatTemplateError(f"chat_format='gguf' asks for the file's own template, "
                                        f"but it has no {GGUF_TEMPLATE_KEY}")
            return _from_template("gguf", own, metadata)
        if chat_format not in _BUILTINS:
            raise InvalidArgumentError(f"unknown chat_format {_short(chat_format)}: "
                                       f"choose from {', '.join(('gguf',) + BUILTIN_FORMATS)}")
        return _builtin(chat_format, metadata)

    if own:
        return _from_template("gguf", own, metadata)

    name, why = _guess(metadata)
    model = metadata.get("general.name") or "this model"
    warnings.warn(f"{model} has no chat template ({GGUF_TEMPLATE_KEY}); using the built-in {name!r} format "
                  f"because {why}. Pass chat_format= or chat_template= to choose another.",
                  ChatFormatWarning, stacklevel=2)
    return _builtin(name, metadata)
