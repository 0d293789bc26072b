"""LLM.create_completion and LLM.create_chat_completion: OpenAI's calls over
llminfer.LLM, with their options beyond plain generation: log-probabilities,
echo, fill-in-the-middle (suffix), n choices, and tools (llminfer.text.tools).
The objects themselves are built by llminfer.generation.openai_shapes.

    llm.create_completion("def add(a, b):", suffix="\\n    return c", max_tokens=32)
    llm.create_completion("The sky is", n=3, logprobs=2, echo=True, seed=1)
    llm.create_chat_completion(messages, logprobs=True, top_logprobs=3)

Log-probabilities are those of the model's own distribution (log-softmax of
the logits, before any sampling stage), as OpenAI and llama.cpp's server give
them. Completions use OpenAI's legacy shape ({"tokens", "text_offset",
"token_logprobs", "top_logprobs"}), chat completions its chat shape
({"content": [{"token", "logprob", "bytes", "top_logprobs"}]}).

Fill-in-the-middle needs a model trained for it: its GGUF names the tokens
(tokenizer.ggml.fim_pre_token_id, fim_suf_token_id, fim_mid_token_id; older
files prefix_/suffix_/middle_token_id) and the prompt is laid out
prefix-suffix-middle, as llama.cpp's infill does: [BOS] <PRE> prompt <SUF>
suffix <MID>, the model then writing the middle.
"""

from __future__ import annotations

import numpy as np

from llminfer.generation import openai_shapes
from llminfer.errors import InvalidArgumentError
from llminfer.generation.generator import stop_list, token_logprobs
from llminfer.generation.openai_shapes import (ChatDeltas, Envelope, chat_choice, chat_message, new_id, text_choice,
                                    tool_call_deltas, usage_of)
from llminfer.text.reasoning import ChatOptions
from llminfer.generation.sampling import SamplingParams
from llminfer.text.tools import check_tools, tool_prompt

__all__ = ["create_completion", "create_chat_completion", "new_id", "usage_of", "fim_ids", "fim_layout",
           "legacy_logprobs", "chat_logprobs"]

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat; the legacy API allowed 5
MAX_N = 1024           # choices of one call: each is a sequence in one batch

_CHAT_EXTRAS = ("logprobs", "top_logprobs", "n")

_FIM_KEYS = {  # (current key, older key) per role
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
}


def wants_chat_extras(kwargs) -> bool:
    return any(k in kwargs for k in _CHAT_EXTRAS)


def check_logprobs(n):
    if n is not None and (not isinstance(n, (int, np.integer)) or isinstance(n, bool)
                          or not 0 <= n <= MAX_TOP_LOGPROBS):
        raise InvalidArgumentError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}] (how many "
                                   f"alternatives to list), got {_shown(n)}")


def _shown(v) -> str:
    """v as a message quotes it (repr() of an integer of 5,000 digits raises ValueError)."""
    if isinstance(v, int) and abs(v) >= 10 ** 30:
        return f"an integer of {v.bit_length()} bits"
    return repr(v)[:60]


def fim_ids(llm, prompt: str, suffix: str) -> list:
    """The token ids of a fill-in-the-middle prompt."""
    return fim_layout(llm.metadata, llm.tokenizer, llm.n_vocab, llm.model_path, prompt, suffix)


def fim_layout(meta, tok, n_vocab: int, name, prompt: str, suffix: str) -> list:
    """fim_ids from the model's metadata and tokenizer (name: the model, for
    the error)."""
    ids = {}
    for role, keys in _FIM_KEYS.items():
        found = next((meta[k] for k in keys if k in meta), None)
        if found is None or not 0 <= int(found) < n_vocab:
            raise InvalidArgumentError(
                f"suffix= needs a fill-in-the-middle model, and {name} names no {role} token "
                f"({keys[0]}); use a coder model trained for infilling")
        ids[role] = int(found)
    if not isinstance(prompt, str) or not isinstance(suffix, str):
        raise InvalidArgumentError("with suffix=, the prompt and the suffix must be strings")
    head = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return (head + [ids["pre"]] + tok.encode(prompt, add_bos=False, special=False) + [ids["suf"]]
            + tok.encode(suffix, add_bos=False, special=False) + [ids["mid"]])


def legacy_logprobs(llm, tokens, entries, offset: int) -> dict:
    """OpenAI's completions logprobs object for tokens (openai_shapes.legacy_logprobs)."""
    return openai_shapes.legacy_logprobs(llm.tokenizer, tokens, entries, offset)


def chat_logprobs(llm, tokens, entries) -> dict:
    """OpenAI's chat logprobs object (openai_shapes.chat_logprobs)."""
    return openai_shapes.chat_logprobs(llm.tokenizer, tokens, entries)


def _echo_entries(llm, ids, top_n) -> list:
    """Per prompt token, its (logprob, top) given the tokens before it (None
    for the first). Evaluates the prompt afresh (the generation that follows
    reuses it from the context)."""
    llm.reset()
    rows = llm.eval(ids)
    return [None] + [token_logprobs(rows[i - 1], ids[i], top_n) for i in range(1, len(ids))]


def _choice_seeds(llm, seed, n):
    base = seed if seed is not None else llm.seed
    return [None if base is None else base + i for i in range(n)]


def _check_n(n):
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise InvalidArgumentError(f"n must be an integer in [1, {MAX_N}] (choices to generate), got {_shown(n)}")
    return int(n)


def create_completion(llm, prompt, max_tokens=16, stream=False, suffix=None, echo=False, n=1, logprobs=None,
                      best_of=None, seed=None, **kwargs):
    """LLM.create_completion: OpenAI's text_completion (or, streaming, its
    chunks), with echo, suffix, n and logprobs (see the module docstring)."""

    n = _check_n(n)
    check_logprobs(logprobs)
    if best_of not in (None, n):
        raise InvalidArgumentError("best_of is not supported (it would rank choices by log-probability); "
                                   "leave it out or equal to n")
    if not isinstance(echo, bool):
        raise InvalidArgumentError(f"echo must be True or False, got {echo!r}")
    if stream and n > 1:
        raise InvalidArgumentError("stream=True takes n=1")
    if suffix is not None:
        ids = fim_ids(llm, prompt, suffix)
    else:
        ids = llm._prompt_ids(prompt)
    prompt_text = prompt if isinstance(prompt, str) and suffix is None else llm.detokenize(ids)
    echo_entries = None
    if echo and logprobs is not None:
        echo_entries = _echo_entries(llm, ids, logprobs)
    env = Envelope(str(llm.model_path), chat=False)

    def logprobs_of(c, toks, entries, offset):
        if logprobs is None:
            return None
        if echo:
            return legacy_logprobs(llm, list(ids) + toks, echo_entries + entries, 0)
        return legacy_logprobs(llm, toks, entries, offset)

    if stream:
        out = llm.complete(ids, max_tokens=max_tokens, stream=True, logprobs=logprobs,
                           **({"seed": seed} if seed is not None else {}), **kwargs)
        return _stream_chunks(llm, out, env, prompt_text, echo, logprobs)

    if n == 1:
        outs = [llm.complete(ids, max_tokens=max_tokens, logprobs=logprobs,
                             **({"seed": seed} if seed is not None else {}), **kwargs)]
    else:
        sampling = [SamplingParams(seed=s) for s in _choice_seeds(llm, seed, n)]
        outs = llm.complete([ids] * n, max_tokens=max_tokens, logprobs=logprobs, sampling=sampling, **kwargs)
    choices = []
    for i, c in enumerate(outs):
        text = (prompt_text if echo else "") + c.text
        lp = logprobs_of(c, c.tokens, c.logprobs or [], len(prompt_text) if not echo else 0)
        choices.append(text_choice(i, text, lp, c.finish_reason))
    return env.whole(choices, usage_of(outs))


def _stream_chunks(llm, out, env, prompt_text, echo, logprobs):
    # text offsets count from the start of the prompt, as in the whole result
    offset = len(prompt_text)
    if echo:
        yield env.text_chunk(prompt_text)
    seen = 0
    r = out.result
    for text in out:
        lp = None
        if logprobs is not None:
            lp = legacy_logprobs(llm, r.tokens[seen:], r.logprobs[seen:], offset)
            seen = len(r.tokens)
            # by the tokens' own text, as the whole result counts: the text
            # streamed may lag them (held back for a stop string or a split character)
            offset += sum(len(t) for t in lp["tokens"])
        yield env.text_chunk(text, logprobs=lp)
    yield env.text_chunk("", finish_reason=r.finish_reason)


def create_chat_completion(llm, messages, max_tokens=512, stream=False, tools=None, tool_choice=None,
                           logprobs=False, top_logprobs=None, n=1, seed=None, **kwargs):
    """LLM.create_chat_completion: OpenAI's chat.completion (or, streaming,
    its chunks), with logprobs/top_logprobs, n choices, and tools
    (llminfer.text.tools: the reply parsed for calls)."""
    with_tools = tools is not None or tool_choice is not None
    n = _check_n(n)
    if not isinstance(logprobs, bool) and logprobs is not None:
        raise InvalidArgumentError(f"logprobs must be True or False for a chat, got {logprobs!r}")
    if top_logprobs is not None and not logprobs:
        raise InvalidArgumentError("top_logprobs needs logprobs=True")
    check_logprobs(top_logprobs)
    want = (top_logprobs or 0) if logprobs else None
    if stream and n > 1:
        raise InvalidArgumentError("stream=True takes n=1")
    options = ChatOptions.pop(kwargs)
    tool_fmt = None
    first = {"role": "assistant"}
    if with_tools:
        ids, tool_fmt, grammar, reasoning = _tool_prompt(llm, messages, tools, tool_choice, kwargs, options)
        if grammar is not None:
            kwargs = dict(kwargs, grammar=grammar)
        first = {"role": "assistant", "content": ""}
    else:
        ids, reasoning = llm._chat_render(messages, options)
    env = Envelope(str(llm.model_path), chat=True)
    stops = list(llm.chat_format.stop_texts) + stop_list(kwargs.pop("stop", None))
    if stream:
        out = llm.complete(ids, max_tokens=max_tokens, stop=stops, stream=True, logprobs=want, reasoning=reasoning,
                           **({"seed": seed} if seed is not None else {}), **kwargs)
        return _chat_chunks(llm, out, env, want is not None, tool_fmt, first)
    if n == 1:
        outs = [llm.complete(ids, max_tokens=max_tokens, stop=stops, logprobs=want, reasoning=reasoning,
                             **({"seed": seed} if seed is not None else {}), **kwargs)]
    else:
        sampling = [SamplingParams(seed=s) for s in _choice_seeds(llm, seed, n)]
        outs = llm.complete([ids] * n, max_tokens=max_tokens, stop=stops, logprobs=want, sampling=sampling,
                            reasoning=reasoning, **kwargs)
    choices = []
    for i, c in enumerate(outs):
        # calls are parsed with the special tokens written out ([TOOL_CALLS],
        # <|python_tag|> may be control tokens)
        msg, calls = chat_message(c.text, reasoning, tool_fmt,
                                  lambda c=c: llm.detokenize(c.tokens, skip_special=False))
        lp = chat_logprobs(llm, c.tokens, c.logprobs) if want is not None else None
        choices.append(chat_choice(i, msg, lp, "tool_calls" if calls else c.finish_reason))
    return env.whole(choices, usage_of(outs))


def _tool_prompt(llm, messages, tools, tool_choice, kwargs, options: ChatOptions):
    """(prompt ids, the format to parse the reply in or None when no tool is
    offered, the grammar of a required call or None, the reply's Reasoning
    or None)."""
    funcs, choice = check_tools(tools, tool_choice)
    for k in ("grammar", "json_schema", "response_format"):
        if kwargs.get(k) is not None and choice not in ("none", "auto"):
            raise InvalidArgumentError(f"{k} cannot be combined with tool_choice={choice!r}")
    fmt_obj = llm.chat_format
    text, offered, parse_fmt, grammar = tool_prompt(fmt_obj, llm.metadata, llm.tokenizer, messages, funcs, choice,
                                                    options.template_kwargs)
    ids = llm.tokenize(text, add_bos=not fmt_obj.adds_bos, special=True)
    return ids, (parse_fmt if offered else None), grammar, options.reasoning(text, fmt_obj.template, llm.tokenizer)


def _chat_chunks(llm, out, env, with_logprobs, tool_fmt, first):
    """The chunks of a streamed chat: text as it comes, a thinking model's
    reasoning apart (openai_shapes.ChatDeltas; with a tool format, held back
    from where a call may begin), then each call parsed from the whole
    reply, as OpenAI streams one."""
    yield env.delta_chunk(first)
    r = out.result
    deltas = ChatDeltas(r.reasoning, tool_fmt)
    seen = 0
    for piece in out:
        lp = None
        if with_logprobs:
            lp = chat_logprobs(llm, r.tokens[seen:], r.logprobs[seen:])
            seen = len(r.tokens)
        delta = deltas.feed(piece)
        if delta or lp is not None:
            yield env.delta_chunk(delta or {"content": ""}, logprobs=lp)
    delta, calls = deltas.finish(lambda: llm.detokenize(r.tokens, skip_special=False))
    if delta:
        yield env.delta_chunk(delta)
    for d in tool_call_deltas(calls):
        yield env.delta_chunk(d)
    yield env.delta_chunk({}, finish_reason="tool_calls" if calls else r.finish_reason)
