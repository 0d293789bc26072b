"""llama-cpp-python's named chat formats (`Llama(chat_format=...)`), as templates.

llama_cpp/llama_chat_format.py builds each format's prompt with one of a few
Python helpers (`_format_add_colon_single`, `_format_chatml`, ...) from a role
map, separators and a system message. Here each helper is one branch of a
single jinja template (_STYLED) and each format is a row of parameters
(_FORMATS) baked into it, so the prompt goes through llminfer's one chat
rendering path and the text is the one llama-cpp-python writes, quirks
included (alpaca's missing response header, intel's literal
"{system_message}", saiga dropping assistant turns): code moved over from
llama-cpp-python gets the prompts its model saw there.

Handlers that are not prompt templates (functionary's tool grammar, the
llava/moondream vision handlers) raise InvalidArgumentError naming what to
use instead.
"""

from __future__ import annotations

import json

from llminfer.errors import InvalidArgumentError

__all__ = ["FORMAT_NAMES", "template_for"]

# One jinja body for every llama-cpp-python helper. Parameters (set in a
# header, see template_for): style, roles (role -> text), sep, sep2, system_*
# (how the system message is made), gen (append the empty turn of gen_role),
# tail (text after everything). A mapped turn is (roles[role], content);
# content "" is the empty turn, as None is there.
_STYLED = r"""
{%- set first = namespace(found=false, content='') -%}
{%- for m in messages -%}
{%- if m.role == 'system' and not first.found -%}{%- set first.found = true -%}{%- set first.content = m.content or '' -%}{%- endif -%}
{%- endfor -%}
{%- if system_kind == 'fixed' -%}{%- set system = system_text -%}
{%- else -%}
{%- set c = first.content if first.content else system_default -%}
{%- set system = (system_prefix ~ c ~ system_suffix) if (c or not system_if_present) else '' -%}
{%- endif -%}
{%- set seps = [sep, sep2] -%}
{%- if style == 'llama2' -%}{%- set out = namespace(text=system ~ sep) -%}
{%- elif style in ('add_colon_single', 'add_colon_space_single') -%}{%- set out = namespace(text=system ~ sep) -%}
{%- elif style == 'add_colon_two' -%}{%- set out = namespace(text=system ~ seps[0]) -%}
{%- elif style == 'chatml' -%}{%- set out = namespace(text='' if system == '' else system ~ sep ~ '\n') -%}
{%- else -%}{%- set out = namespace(text=system) -%}
{%- endif -%}
{%- for m in messages if m.role in roles -%}
{%- set r = roles[m.role] -%}{%- set c = m.content or '' -%}{%- set i = loop.index0 -%}
{%- if style == 'llama2' -%}
{%- if system and i == 0 -%}{%- set out.text = out.text ~ c ~ seps[i % 2] -%}
{%- elif c -%}{%- set out.text = out.text ~ r ~ c ~ ' ' ~ seps[i % 2] -%}
{%- else -%}{%- set out.text = out.text ~ r ~ ' ' -%}{%- endif -%}
{%- elif style == 'add_colon_single' -%}{%- set out.text = out.text ~ ((r ~ ': ' ~ c ~ sep) if c else (r ~ ':')) -%}
{%- elif style == 'add_colon_space_single' -%}{%- set out.text = out.text ~ ((r ~ ': ' ~ c ~ sep) if c else (r ~ ': ')) -%}
{%- elif style == 'add_colon_two' -%}{%- set out.text = out.text ~ ((r ~ ': ' ~ c ~ seps[i % 2]) if c else (r ~ ':')) -%}
{%- elif style == 'no_colon_single' -%}{%- set out.text = out.text ~ ((r ~ c ~ sep) if c else r) -%}
{%- elif style == 'chatml' -%}{%- set out.text = out.text ~ ((r ~ '\n' ~ c ~ sep ~ '\n') if c else (r ~ '\n')) -%}
{%- elif style == 'chatglm3' -%}{%- set out.text = out.text ~ ((r ~ '\n' ~ ' ' ~ c) if c else r) -%}
{%- endif -%}
{%- endfor -%}
{%- if gen and add_generation_prompt -%}
{%- set r = roles[gen_role] -%}
{%- if style == 'llama2' -%}{%- set out.text = out.text ~ r ~ ' ' -%}
{%- elif style in ('add_colon_single', 'add_colon_two') -%}{%- set out.text = out.text ~ r ~ ':' -%}
{%- elif style == 'add_colon_space_single' -%}{%- set out.text = out.text ~ r ~ ': ' -%}
{%- elif style == 'chatml' -%}{%- set out.text = out.text ~ r ~ '\n' -%}
{%- else -%}{%- set out.text = out.text ~ r -%}
{%- endif -%}
{%- endif -%}
{{- out.text ~ (tail if add_generation_prompt else '') -}}
"""

# mistral-instruct and saiga do not use a helper: their own loops.
_MISTRAL_INSTRUCT = r"""
{%- for m in messages -%}
{%- if m.role == 'user' -%}{{ '[INST] ' ~ m.content }}
{%- elif m.role == 'assistant' -%}{{ ' [/INST]' ~ m.content ~ '</s>' }}
{%- endif -%}
{%- endfor -%}
{{- ' [/INST]' if add_generation_prompt else '' -}}
"""

# saiga maps "assistant" to nothing (its role is "bot"), so assistant turns
# drop out, as in llama-cpp-python; the prompt is stripped at both ends.
_SAIGA = r"""
{%- set out = namespace(text='') -%}
{%- for m in messages if m.role in ('user', 'bot', 'system') -%}
{%- set out.text = out.text ~ (('<s>' ~ m.role ~ '\n' ~ m.content ~ '</s>') if m.content else ('<s>' ~ m.role ~ '\n')) -%}
{%- endfor -%}
{{- (out.text ~ ('<s>bot' if add_generation_prompt else '')) | trim -}}
"""

_OPENBUDDY_SYSTEM = (
    "You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.\n"
    "Always answer as helpfully and logically as possible, while being safe. Your answers should not include any "
    "harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure "
    "that your responses are socially unbiased and positive in nature.\n"
    "If a question does not make any sense, or is not factually coherent, explain why instead of answering "
    "something not correct. If you don't know the answer to a question, please don't share false information.\n"
    "You can speak fluently in many languages, for example: English, Chinese.\n"
    "You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.\n"
    "You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are "
    "based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.\n\n")
_OPEN_ORCA_SYSTEM = (
    "You are a helpful assistant. Please answer truthfully and write out your thinking step by step to be sure "
    "you get the right answer. If you make a mistake or encounter an error in your thinking, say so out loud and "
    "attempt to correct it. If you don't know or aren't sure about something, say so clearly. You will act as a "
    "professional logician, mathematician, and physicist. You will also act as the most appropriate type of "
    "expert to answer any particular question or solve the relevant problem; state which expert type your are, "
    "if so. Also think of any particular named expert that would be ideal to answer the relevant question or "
    "solve the relevant problem; name and act as them, if appropriate.")
_VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                  "helpful, detailed, and polite answers to the user's questions.")
_SNOOZY_DEFAULT = ("The prompt below is a question to answer, a task to complete, or a conversation to respond "
                   "to; decide which and write an appropriate response.")


def _fixed(text):
    return {"system_kind": "fixed", "system_text": text}


def _tmpl(prefix="", suffix="", default="", if_present=False):
    return {"system_kind": "template", "system_prefix": prefix, "system_suffix": suffix,
            "system_default": default, "system_if_present": if_present}


def _row(style, roles, sep="", sep2="", system=None, gen=True, tail="", stop=(), gen_role="assistant"):
    params = dict(style=style, roles=roles, sep=sep, sep2=sep2, gen=gen, tail=tail, gen_role=gen_role,
                  **(system if system is not None else _tmpl()))
    return params, tuple(stop)


_HDR = "<|start_header_id|>{}<|end_header_id|>\n\n"

# name -> (parameters of _STYLED, or a template of its own; stop texts)
_FORMATS = {
    "llama-2": _row("llama2", {"user": "<s>[INST]", "assistant": "[/INST]"}, " ", "</s>",
                    _tmpl("[INST] <<SYS>>\n", "\n<</SYS>>", if_present=True), gen=False, tail="[/INST]"),
    "llama-3": _row("no_colon_single", {r: _HDR.format(r) for r in ("system", "user", "assistant")},
                    "<|eot_id|>", system=_fixed(""), stop=("<|eot_id|>",)),
    "alpaca": _row("add_colon_two", {"user": "### Instruction", "assistant": "### Response"}, "\n\n", "</s>",
                   gen=False),
    "qwen": _row("chatml", {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"}, "<|im_end|>",
                 system=_tmpl("<|im_start|>system\n", default="You are a helpful assistant."),
                 stop=("<|endoftext|>",)),
    "vicuna": _row("add_colon_two", {"user": "USER", "assistant": "ASSISTANT"}, " ", "</s>",
                   system=_fixed(_VICUNA_SYSTEM)),
    "oasst_llama": _row("no_colon_single", {"user": "<|prompter|>", "assistant": "<|assistant|>"}, "</s>",
                        system=_tmpl("[INST] <<SYS>>\n", "\n<</SYS>>\n\n")),
    "baichuan-2": _row("no_colon_single", {"user": "<reserved_106>", "assistant": "<reserved_107>"}),
    "baichuan": _row("no_colon_single", {"user": "<reserved_102>", "assistant": "<reserved_103>"}),
    "openbuddy": _row("add_colon_single", {"user": "User", "assistant": "Assistant"}, "\n",
                      system=_fixed(_OPENBUDDY_SYSTEM)),
    "redpajama-incite": _row("add_colon_single", {"user": "<human>", "assistant": "<bot>"}, "\n",
                             stop=("<human>",)),
    "snoozy": _row("add_colon_single", {"user": "### Prompt", "assistant": "### Response"}, "\n",
                   system=_tmpl(default=_SNOOZY_DEFAULT), stop=("###",)),
    "phind": _row("add_colon_single", {"user": "### User Message", "assistant": "### Assistant"}, "\n\n",
                  system=_fixed("### System Prompt\nYou are an intelligent programming assistant.")),
    "intel": _row("add_colon_single", {"user": "### User:", "assistant": "### Assistant:"}, "\n",
                  system=_fixed("### System:\n{system_message}")),
    # roles as dict(zip(roles, roles)) with roles ("User", "Assistant"): the
    # messages' "user"/"assistant" are not in it, so only the appended empty
    # Assistant turn is written, as in llama-cpp-python
    "open-orca": _row("add_colon_space_single", {"User": "User", "Assistant": "Assistant"}, "<|end_of_turn|>\n",
                      system=_fixed(_OPEN_ORCA_SYSTEM), stop=("User",), gen_role="Assistant"),
    "mistrallite": _row("no_colon_single", {"user": "<|prompter|>", "assistant": "</s>\n<|assistant|>"}, " ",
                        system=_tmpl("<|system|>", "</s>")),
    "zephyr": _row("chatml", {"user": "<|user|>\n", "assistant": "<|assistant|>\n"}, "</s>",
                   system=_tmpl("<|system|>\n"), stop=("</s>",)),
    "pygmalion": _row("chatml", {"user": "<|user|>", "assistant": "<|model|>"}, "\n",
                      system=_tmpl("<|system|>"), stop=("\n",)),
    "chatml": _row("chatml", {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"}, "<|im_end|>",
                   system=_tmpl("<|im_start|>system\n"), stop=("<|im_end|>",)),
    "mistral-instruct": (_MISTRAL_INSTRUCT, ("</s>",)),
    "chatglm3": _row("chatglm3", {"user": "<|user|>", "assistant": "<|assistant|>"}, "</s>",
                     system=_tmpl("<|system|>\n"), stop=("</s>",)),
    "openchat": _row("chatml", {"user": "GPT4 Correct User: ", "assistant": "<|end_of_turn|>GPT4 Correct Assistant: "},
                     "<|end_of_turn|>", system=_tmpl(suffix="<|end_of_turn|>"), stop=("<|end_of_turn|>",)),
    "saiga": (_SAIGA, ()),
    "gemma": _row("no_colon_single", {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"},
                  "<end_of_turn>\n", system=_fixed(""), stop=("<end_of_turn>\n",)),
}

FORMAT_NAMES: tuple[str, ...] = tuple(sorted(_FORMATS))

# llama-cpp-python handlers that are code, not prompt templates: what to use instead
_HANDLERS = {
    "functionary": "functionary's handler writes its own tool grammar; use chat_format='chatml-function-calling' "
                   "or the model's own template (no chat_format) with tools=",
    "functionary-v1": "see 'functionary'",
    "functionary-v2": "see 'functionary'",
    "llava-1-5": "llminfer has no vision models: the llava/moondream chat handlers cannot be used",
    "llava-1-6": "see 'llava-1-5'",
    "moondream": "see 'llava-1-5'",
    "nanollava": "see 'llava-1-5'",
    "llama-3-vision-alpha": "see 'llava-1-5'",
    "minicpm-v-2.6": "see 'llava-1-5'",
    "qwen2.5-vl": "see 'llava-1-5'",
}


def _literal(value) -> str:
    """A jinja literal for a str, bool or dict of str (JSON's spelling is jinja's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def template_for(name: str) -> tuple[str, tuple]:
    """(jinja template, stop texts) of llama-cpp-python's chat_format `name`."""
    if name in _HANDLERS:
        raise InvalidArgumentError(f"chat_format {name!r} is a llama-cpp-python chat handler, not a prompt "
                                   f"format llminfer can render: {_HANDLERS[name]}")
    if name not in _FORMATS:
        raise InvalidArgumentError(f"chat_format {name!r} is not one llminfer knows: "
                                   f"{', '.join(FORMAT_NAMES + ('chatml-function-calling',))}")
    spec, stops = _FORMATS[name]
    if isinstance(spec, str):
        return spec, stops
    header = "".join(f"{{%- set {k} = {_literal(v)} -%}}" for k, v in spec.items())
    return header + _STYLED, stops


class MTMDChatHandler:
    """llama-cpp-python's vision chat handlers (its libmtmd ones), as far as
    llminfer takes them: `Llama(model_path=..., chat_handler=
    Gemma3ChatHandler(clip_model_path="mmproj.gguf"))` loads the mmproj
    beside the model (the same as Llama(..., mmproj=...)); the model's own
    chat template renders the messages, image_url parts included. The
    mmproj's projector type (clip.projector_type), not the handler's class,
    decides how its images are encoded and laid out: MTMDChatHandler itself
    serves the types llama-cpp-python names no handler for (LFM2-VL's lfm2,
    SmolVLM's idefics3), as it does there."""

    def __init__(self, clip_model_path: str, verbose: bool = True, **kwargs):
        import os

        if not isinstance(clip_model_path, (str, os.PathLike)):
            from llminfer.errors import InvalidArgumentError

            raise InvalidArgumentError(f"clip_model_path must be a path, got {clip_model_path!r}")
        self.clip_model_path = os.fspath(clip_model_path)
        self.verbose = verbose


class Gemma3ChatHandler(MTMDChatHandler):
    """Gemma 3's (a gemma3 mmproj), see MTMDChatHandler."""


class Gemma4ChatHandler(MTMDChatHandler):
    """Gemma 4's (a gemma4v mmproj), see MTMDChatHandler."""


class Qwen25VLChatHandler(MTMDChatHandler):
    """Qwen2.5-VL's (a qwen2.5vl_merger mmproj beside a qwen2vl model; a
    Qwen3-VL qwen3vl_merger one too), see MTMDChatHandler."""
