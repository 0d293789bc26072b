"""llama-cpp-python's `Llama` class over llminfer, for code written against it.

    from llminfer import Llama          # instead of: from llama_cpp import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048, seed=1337, verbose=False)
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"], echo=True)
    print(out["choices"][0]["text"])

The constructor takes llama-cpp-python's arguments and the methods return its
shapes: OpenAI-shaped dicts from __call__/create_completion/
create_chat_completion (iterators of chunks when streaming), bytes from
detokenize, methods (not attributes) for n_ctx(), n_vocab(), token_bos(),
token_eos(). Everything runs through one llminfer.LLM (`.llm`), so the
llminfer API is there too.

Also there: the token-level eval()/sample()/generate() with scores and
input_ids in llama-cpp-python's [n_ctx, ...] layout, save_state()/load_state()
with LlamaState, set_cache() (llminfer.compat.llama_cache), grammar= with a
LlamaGrammar (llminfer.compat.llama_grammar), and Python callbacks: logits_processor
(input_ids, scores) -> scores and stopping_criteria (input_ids, logits) -> bool,
run on every token of a single-prompt generation; each call builds a numpy
array of the ids so far and copies the [n_vocab] logits, so they cost Python
time per token. n_gpu_layers on an install without a usable GPU runs on the
CPU after one warning, as llama-cpp-python's CPU build does (require_gpu=True
raises GPUUnavailableError instead).

What it does not do says so: arguments that ask for something llminfer does
not have (LoRA adapters, a custom chat handler, a draft model, a layer split
over several GPUs)
raise InvalidArgumentError naming the argument; arguments that only tune
llama.cpp's internals (n_ubatch, use_mlock, flash_attn, numa...) are accepted
and have no effect.
"""

from __future__ import annotations

import random
import sys
import warnings
from collections import deque

import numpy as np

from llminfer.errors import InvalidArgumentError
from llminfer.core.gguf_file import StringArray
from llminfer.compat.llama_cache import BaseLlamaCache, LlamaState, longest_token_prefix
from llminfer.generation.llm import LLM
from llminfer.generation.sampling import Sampler, SamplingParams

__all__ = ["Llama", "LLAMA_DEFAULT_SEED", "LlamaState", "LogitsProcessorList", "StoppingCriteriaList",
           "MinTokensLogitsProcessor"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick a random seed"

# chat_format names that go to llminfer's own formats: llama-cpp-python's
# function-calling handler is ChatML with tools (llminfer.text.tools), and
# "llama3" is llminfer's name. Every other llama-cpp-python name renders the
# prompt llama-cpp-python writes (llminfer.compat.llama_chat_format).
_CHAT_FORMATS = {"chatml-function-calling": "chatml", "llama3": "llama3"}

# Arguments that need something llminfer does not have: a non-default value is an error.
_UNSUPPORTED = {
    "lora_base": None, "chat_handler": None, "draft_model": None, "tokenizer": None,
    "kv_overrides": None, "vocab_only": False, "rope_freq_base": 0.0, "rope_freq_scale": 0.0,
    "tensor_split": None, "spm_infill": False, "split_mode": 1,
}
# Arguments that tune llama.cpp itself; accepted, without effect here.
_IGNORED = {"main_gpu", "use_mlock", "n_ubatch", "n_threads_batch", "rope_scaling_type",
            "pooling_type", "attention_type", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
            "yarn_beta_slow", "yarn_orig_ctx", "offload_kqv", "flash_attn", "op_offload", "swa_full",
            "no_perf", "last_n_tokens_size", "numa", "type_k", "type_v"}

_gpu_warned = False


def _cpu_fallback(n_gpu_layers: int, require_gpu: bool) -> int:
    """n_gpu_layers as this install can honour it: llama-cpp-python's CPU
    build runs any n_gpu_layers on the CPU, so without a usable GPU it becomes
    0, with one warning per process; require_gpu=True keeps llminfer's
    GPUUnavailableError instead."""
    global _gpu_warned
    if n_gpu_layers == 0 or require_gpu:
        return n_gpu_layers
    from llminfer.core import gpu

    info = gpu.info()
    if info["available"]:
        return n_gpu_layers
    if not _gpu_warned:
        _gpu_warned = True
        warnings.warn(f"n_gpu_layers={n_gpu_layers} runs on the CPU: {info['reason']}. "
                      f"Pass require_gpu=True to make this an error.", RuntimeWarning, stacklevel=3)
    return 0


class LogitsProcessorList(list):
    """Logits processors, (input_ids, scores) -> scores, applied in order."""

    def __call__(self, input_ids, scores):
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Stopping criteria, (input_ids, logits) -> bool: true when any is."""

    def __call__(self, input_ids, logits) -> bool:
        return any([bool(c(input_ids, logits)) for c in self])


class MinTokensLogitsProcessor:
    """Bans the end-of-sequence token until min_tokens have been generated."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens = min_tokens
        self.token_eos = token_eos
        self.prompt_tokens = None

    def __call__(self, input_ids, scores):
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


# llama-cpp-python's completion arguments that name llminfer sampling fields differently
_RENAMED = {"temp": "temperature", "mirostat_mode": "mirostat"}


def _kv_type(type_k, type_v):
    """llama.cpp's GGML type numbers for the KV cache -> llminfer's names."""
    names = {0: "f32", 1: "f16", 2: "q4_0", 8: "q8_0"}
    if type_k is None and type_v is None:
        return "f16"
    if type_k != type_v and None not in (type_k, type_v):
        raise InvalidArgumentError(f"type_k={type_k} and type_v={type_v} differ; llminfer keeps keys and values "
                                   f"in one type")
    t = type_k if type_k is not None else type_v
    if t not in names:
        raise InvalidArgumentError(f"KV cache type {t} is not one llminfer has: {names}")
    return names[t]


def _trained_context(model_path) -> int:
    """The context length a model file declares (n_ctx=0 asks for it)."""
    from llminfer.core.gguf_file import GGUFFile
    from llminfer.hub import resolve
    from llminfer.models import build_spec

    with GGUFFile(resolve(model_path)) as g:
        return build_spec(g).context_length


class Llama:
    """A llama-cpp-python `Llama` drop-in (see the module docstring)."""

    def __init__(self, model_path: str, *, n_gpu_layers: int = 0, seed: int = LLAMA_DEFAULT_SEED,
                 n_ctx: int = 512, n_batch: int = 512, n_threads: int | None = None,
                 use_mmap: bool = True, logits_all: bool = False, embedding: bool = False,
                 chat_format: str | None = None, verbose: bool = True, require_gpu: bool = False, **kwargs):
        if not isinstance(n_gpu_layers, int) or isinstance(n_gpu_layers, bool):
            raise InvalidArgumentError(f"n_gpu_layers must be an integer, got {n_gpu_layers!r}")
        spec = None
        mmproj = kwargs.pop("mmproj", None)
        handler = kwargs.pop("chat_handler", None)
        if handler is not None:
            from llminfer.compat.llama_chat_format import MTMDChatHandler

            if not isinstance(handler, MTMDChatHandler):
                raise InvalidArgumentError("chat_handler= takes llminfer.compat.llama_chat_format's "
                                           "MTMDChatHandler, Gemma3ChatHandler, Gemma4ChatHandler or "
                                           "Qwen25VLChatHandler (clip_model_path=...); other handlers are "
                                           "llama-cpp-python features llminfer does not have")
            if mmproj is not None and mmproj != handler.clip_model_path:
                raise InvalidArgumentError("mmproj= and chat_handler's clip_model_path name different files")
            mmproj = handler.clip_model_path
        draft = kwargs.pop("draft_model", None)
        if draft is not None:
            from llminfer.compat.llama_speculative import LlamaPromptLookupDecoding

            if not isinstance(draft, LlamaPromptLookupDecoding):
                raise InvalidArgumentError("draft_model= takes a LlamaPromptLookupDecoding "
                                           "(from llminfer.compat.llama_speculative); for a draft model file use "
                                           "llminfer.LLM(model, draft_model=PATH)")
            spec = draft.spec_config()
        lora = None
        lora_path = kwargs.pop("lora_path", None)
        lora_scale = kwargs.pop("lora_scale", 1.0)
        if lora_path is not None:  # llama-cpp-python's one adapter at lora_scale (llminfer.runtime.lora)
            lora = [(lora_path, lora_scale)]
        for name, value in kwargs.items():
            if name in _UNSUPPORTED:
                if value != _UNSUPPORTED[name]:
                    raise InvalidArgumentError(f"{name}= is a llama-cpp-python feature llminfer does not have")
            elif name not in _IGNORED:
                raise InvalidArgumentError(f"Llama() got an unknown argument {name!r}")
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 0:
            raise InvalidArgumentError(f"n_ctx must be a non-negative integer (0: the model's), got {n_ctx!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise InvalidArgumentError(f"seed must be an integer, got {seed!r}")
        fmt, template, self._chat_stops = None, None, ()
        if chat_format is not None:
            if not isinstance(chat_format, str):
                raise InvalidArgumentError(f"chat_format must be a string, got {chat_format!r}")
            if chat_format in _CHAT_FORMATS:
                fmt = _CHAT_FORMATS[chat_format]
            else:
                from llminfer.compat.llama_chat_format import template_for

                template, self._chat_stops = template_for(chat_format)
        self.verbose = bool(verbose)
        self.logits_all = bool(logits_all)
        self.embedding = bool(embedding)
        self.model_path = str(model_path)
        self._seed = None if seed in (-1, LLAMA_DEFAULT_SEED) else seed
        if self._seed is not None and self._seed < 0:
            raise InvalidArgumentError(f"seed must be >= 0, or -1 for a random one; got {seed}")
        if n_ctx == 0:
            n_ctx = _trained_context(model_path)
        # n_gpu_layers as llama.cpp reads it (-1: all); without a usable GPU
        # it runs on the CPU (a warning says why), as llama-cpp-python's CPU
        # build does, unless require_gpu
        n_gpu_layers = _cpu_fallback(n_gpu_layers, bool(require_gpu))
        self.llm = LLM(model_path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, seed=self._seed,
                       kv_type=_kv_type(kwargs.get("type_k"), kwargs.get("type_v")), chat_format=fmt,
                       chat_template=template, mmap=use_mmap, n_gpu_layers=n_gpu_layers,
                       main_gpu=kwargs.get("main_gpu", 0), spec=spec, mmproj=mmproj, lora=lora)
        self.chat_format = chat_format
        self.n_batch = self.llm.n_batch
        self.n_threads = self.llm.n_threads
        # llama-cpp-python's scores, float32 [n_ctx, n_vocab], made on first
        # use (np.zeros: pages are only committed as rows are written)
        self._scores_buf = None
        self.cache: BaseLlamaCache | None = None
        self._rng = random.Random(self._seed)
        if self.verbose:
            print(f"llminfer: loaded {self.model_path} ({self.llm.architecture}, {self.llm.n_vocab} tokens of "
                  f"vocabulary) with n_ctx={self.llm.n_ctx}, n_threads={self.n_threads}", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, *, cache_dir=None, local_dir=None,
                        revision: str | None = None, **kwargs) -> "Llama":
        """Download `filename` (a glob such as "*Q4_K_M.gguf" is allowed) from a
        Hugging Face repository, then load it like Llama(model_path=...)."""
        from llminfer.hub.hf import download

        path = download(repo_id, filename, revision=revision, cache_dir=cache_dir, local_dir=local_dir,
                        quiet=not kwargs.get("verbose", True))
        return cls(model_path=str(path), **kwargs)

    # ---- facts ----

    def n_ctx(self) -> int:
        return self.llm.n_ctx

    def n_vocab(self) -> int:
        return self.llm.n_vocab

    def n_embd(self) -> int:
        return self.llm.spec.n_embd

    def token_bos(self) -> int:
        t = self.llm.tokenizer.bos_id
        return -1 if t is None else int(t)

    def token_eos(self) -> int:
        t = self.llm.tokenizer.eos_id
        return -1 if t is None else int(t)

    def token_nl(self) -> int:
        ids = self.llm.tokenize("\n", add_bos=False)
        return ids[-1] if ids else -1

    @property
    def metadata(self) -> dict:
        """The GGUF metadata as llama-cpp-python gives it: every value a string."""
        return {k: str(v) for k, v in self.llm.metadata.items()
                if not isinstance(v, (list, tuple, np.ndarray, StringArray))}

    # ---- tokens ----

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list:
        return self.llm.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens, prev_tokens=None, special: bool = False) -> bytes:
        """The bytes of `tokens` (control tokens left out unless special). With
        prev_tokens, the bytes `tokens` add after them (a SentencePiece word's
        leading space included)."""
        tok = self.llm.tokenizer
        if prev_tokens:
            whole = tok.decode(list(prev_tokens) + list(tokens), skip_special=not special).encode("utf-8")
            head = tok.decode(list(prev_tokens), skip_special=not special).encode("utf-8")
            return whole[len(head):] if whole.startswith(head) else whole
        return b"".join(tok.token_bytes(int(t), skip_special=not special) for t in tokens)

    # ---- evaluation ----

    @property
    def input_ids(self) -> np.ndarray:
        """np.intc [n_ctx]: the context's tokens, then zeros (llama-cpp-python's
        layout; the first n_tokens are meaningful)."""
        ids = np.zeros(self.llm.n_ctx, dtype=np.intc)
        held = self.llm.tokens
        ids[:len(held)] = held
        return ids

    @property
    def _input_ids(self) -> np.ndarray:
        return np.array(self.llm.tokens, dtype=np.intc)

    @property
    def n_tokens(self) -> int:
        return len(self.llm.tokens)

    @property
    def eval_tokens(self) -> deque:
        return deque(self.llm.tokens, maxlen=self.llm.n_ctx)

    def _buffer(self) -> np.ndarray:
        if self._scores_buf is None:
            self._scores_buf = np.zeros((self.llm.n_ctx, self.llm.n_vocab), dtype=np.float32)
        return self._scores_buf

    @property
    def scores(self) -> np.ndarray:
        """float32 [n_ctx, n_vocab], llama-cpp-python's layout: row i holds the
        logits after token i of the context. Rows are written by eval() (every
        row with logits_all=True) and the last token's row is always current;
        other rows are stale, as in llama-cpp-python."""
        buf = self._buffer()
        n = self.n_tokens
        if n:
            buf[n - 1] = self.llm.last_logits
        return buf

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[:self.n_tokens]

    @property
    def eval_logits(self) -> deque:
        rows = self._scores if self.logits_all else self._scores[-1:]
        return deque((row.tolist() for row in rows), maxlen=self.llm.n_ctx if self.logits_all else 1)

    def eval(self, tokens):  # noqa: A003
        """Append tokens to the context (evaluating them); their logits go to
        scores (every row with logits_all, else the last)."""
        n_past = self.n_tokens
        # llm.eval refuses what is not a sequence of token ids (None, text, floats)
        logits = self.llm.eval(tokens, logits_all=self.logits_all)
        tokens = self.llm.tokens[n_past:]
        if len(logits):
            buf = self._buffer()
            if self.logits_all:
                buf[n_past:n_past + len(tokens)] = logits
            else:
                buf[n_past + len(tokens) - 1] = logits[-1]

    def reset(self):
        self.llm.reset()

    def set_seed(self, seed: int):
        self._seed = None if seed in (-1, LLAMA_DEFAULT_SEED) else int(seed)
        self.llm.seed = self._seed
        self._rng = random.Random(self._seed)

    def set_cache(self, cache: BaseLlamaCache | None):
        """Cache prompt states (llminfer.compat.llama_cache's LlamaRAMCache or
        LlamaDiskCache; None: none). See that module."""
        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise InvalidArgumentError(f"set_cache takes a LlamaRAMCache or LlamaDiskCache (from "
                                       f"llminfer.compat.llama_cache), got {type(cache).__name__}")
        self.cache = cache

    # ---- token-level sampling ----

    def _sampler(self, top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                 presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta, tfs_z=1.0) -> Sampler:
        if tfs_z not in (None, 1.0):
            raise InvalidArgumentError("tfs_z (tail-free sampling) was removed from llama.cpp; llminfer does "
                                       "not have it")
        seed = self._seed if self._seed is not None else self._rng.randrange(2 ** 32)
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, mirostat=mirostat_mode,
                                mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, seed=seed)
        return Sampler(params.validate(self.llm.n_vocab), self.llm.n_vocab, self.llm.tokenizer)

    def _constraint(self, grammar):
        if grammar is None:
            return None
        from llminfer.text.structured import Constraint, grammar_from_args

        return Constraint(grammar_from_args(grammar), self.llm.tokenizer, self.llm.n_vocab)

    def _pick(self, sampler, logits, history, logits_processor, constraint) -> int:
        if logits_processor is not None:
            logits = np.asarray(logits_processor(np.asarray(history, dtype=np.intc), logits.copy()),
                                dtype=np.float32)
        if constraint is not None:
            logits = constraint.apply(logits)
        return sampler.sample(logits, history)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
               mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor=None, grammar=None, idx: int | None = None) -> int:
        """A token drawn from the logits after the context's last token (or
        after token idx, from scores, with logits_all). A grammar here starts
        from its beginning each call; generate() carries it along."""
        if self.n_tokens == 0:
            raise InvalidArgumentError("sample() needs evaluated tokens: call eval() first")
        sampler = self._sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta, tfs_z)
        logits = self.llm.last_logits if idx is None else self.scores[idx].copy()
        constraint = self._constraint(grammar)
        try:
            return self._pick(sampler, logits, self.llm.tokens, logits_processor, constraint)
        finally:
            if constraint is not None:
                constraint.close()

    def generate(self, tokens, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor=None, stopping_criteria=None, grammar=None):
        """llama-cpp-python's token generator: evaluates `tokens` (with reset,
        after the longest prefix the context already holds; without, after
        the whole context), then yields one sampled token after another,
        end-of-sequence tokens included, until the caller stops, a stopping
        criterion is true (the token drawn is then not yielded) or the context
        is full (ContextFullError). send(list) feeds extra tokens after the
        one just yielded. Every step runs the Python callbacks: each costs a
        numpy array of the context's ids and a copy of the logits."""
        sampler = self._sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                presence_penalty, mirostat_mode, mirostat_tau, mirostat_eta, tfs_z)
        tokens = list(tokens)
        if not tokens and (reset or self.n_tokens == 0):
            raise InvalidArgumentError("generate() needs prompt tokens (or reset=False after eval())")
        if reset:
            if tokens:
                tokens = tokens[self.llm.keep_prefix(tokens):]
            else:
                self.reset()
        constraint = self._constraint(grammar)
        try:
            while True:
                self.eval(tokens)
                history = self.llm.tokens
                logits = self.llm.last_logits
                token = self._pick(sampler, logits, history, logits_processor, constraint)
                if stopping_criteria is not None and stopping_criteria(np.asarray(history, dtype=np.intc),
                                                                       logits):
                    return
                extra = yield token
                tokens = [token] + (list(extra) if extra is not None else [])
                if constraint is not None and token not in self.llm.tokenizer.eog_ids:
                    constraint.advance(token)
                    if constraint.done:  # nothing may follow but the end
                        eos = constraint.eos_id
                        self.eval(tokens)
                        yield eos
                        return
        finally:
            if constraint is not None:
                constraint.close()

    # ---- completion ----

    def _sampling(self, kwargs):
        """llama-cpp-python's sampling arguments -> llminfer's names; arguments
        at the values that mean "off" are dropped."""
        out = {}
        for k, v in kwargs.items():
            if k in ("model", "tfs_z", "penalize_nl"):
                if k == "tfs_z" and v not in (None, 1.0):
                    raise InvalidArgumentError("tfs_z (tail-free sampling) was removed from llama.cpp; "
                                               "llminfer does not have it")
                continue
            out[_RENAMED.get(k, k)] = v
        if out.get("seed") in (-1, LLAMA_DEFAULT_SEED):
            out["seed"] = None
        if out.get("seed") is None:
            out.pop("seed", None)
        if out.get("stop") == []:
            out.pop("stop")
        for name in ("grammar", "logit_bias", "logits_processor", "stopping_criteria"):
            if out.get(name) is None:
                out.pop(name, None)
        return out

    def create_completion(self, prompt, suffix=None, max_tokens=16, temperature=0.8, top_p=0.95, min_p=0.05,
                          typical_p=1.0, logprobs=None, echo=False, stop=None, frequency_penalty=0.0,
                          presence_penalty=0.0, repeat_penalty=1.0, top_k=40, stream=False, seed=None,
                          mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1, **kwargs):
        """llama-cpp-python's create_completion: a text_completion dict, or an
        iterator of chunks with stream=True."""
        args = dict(temperature=temperature, top_p=top_p, min_p=min_p, frequency_penalty=frequency_penalty,
                    presence_penalty=presence_penalty, repeat_penalty=repeat_penalty, top_k=top_k, seed=seed,
                    stop=stop, **kwargs)
        extras = dict(typical_p=typical_p, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                      mirostat_eta=mirostat_eta, suffix=suffix, logprobs=logprobs, echo=echo)
        defaults = dict(typical_p=1.0, mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1, suffix=None,
                        logprobs=None, echo=False)
        args.update({k: v for k, v in extras.items() if v != defaults[k]})
        if args.get("mirostat_mode"):
            args.setdefault("mirostat_tau", mirostat_tau)
            args.setdefault("mirostat_eta", mirostat_eta)
        args = self._sampling(args)
        if self.cache is None:
            return self.llm.create_completion(prompt, max_tokens=max_tokens, stream=stream, **args)
        ids = prompt if isinstance(prompt, (list, tuple, np.ndarray)) and not \
            (len(prompt) and isinstance(prompt[0], str)) else None
        if ids is None and isinstance(prompt, (str, bytes)):
            ids = self.llm.tokenize(prompt, add_bos=True, special=True)
        if ids is not None:
            self._cache_load(ids)
        out = self.llm.create_completion(prompt, max_tokens=max_tokens, stream=stream, **args)
        return self._cache_after(out, stream)

    def __call__(self, prompt, *args, **kwargs):
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages, functions=None, function_call=None, tools=None, tool_choice=None,
                               temperature=0.2, top_p=0.95, top_k=40, min_p=0.05, typical_p=1.0, stream=False,
                               stop=None, seed=None, response_format=None, max_tokens=None,
                               presence_penalty=0.0, frequency_penalty=0.0, repeat_penalty=1.0,
                               mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1, logprobs=None,
                               top_logprobs=None, **kwargs):
        """llama-cpp-python's create_chat_completion: a chat.completion dict, or
        an iterator of chat.completion.chunk dicts with stream=True."""
        if functions is not None or function_call is not None:
            raise InvalidArgumentError("functions=/function_call= are OpenAI's deprecated form; pass tools= and "
                                       "tool_choice= instead")
        if self._chat_stops:  # the stop texts llama-cpp-python's format adds
            stop = ([stop] if isinstance(stop, str) else list(stop or [])) + list(self._chat_stops)
        args = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, stop=stop,
                    presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                    repeat_penalty=repeat_penalty, **kwargs)
        optional = dict(tools=tools, tool_choice=tool_choice, response_format=response_format,
                        logprobs=logprobs, top_logprobs=top_logprobs)
        args.update({k: v for k, v in optional.items() if v is not None and v is not False})
        if typical_p != 1.0:
            args["typical_p"] = typical_p
        if mirostat_mode:
            args.update(mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta)
        args = self._sampling(args)
        if self.cache is not None and tools is None and tool_choice is None:
            options = {k: args[k] for k in ("chat_template_kwargs", "enable_thinking", "reasoning_budget",
                                                  "reasoning_effort") if k in args}
            self._cache_load(self.llm.chat_prompt(messages, **options))
            out = self.llm.create_chat_completion(messages, max_tokens=max_tokens, stream=stream, **args)
            return self._cache_after(out, stream)
        return self.llm.create_chat_completion(messages, max_tokens=max_tokens, stream=stream, **args)

    def create_chat_completion_openai_v1(self, *args, **kwargs):
        """create_chat_completion's result as the openai package's pydantic
        types (ChatCompletion, or an iterator of ChatCompletionChunk); needs
        `pip install openai`."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package: "
                              "pip install openai") from None
        stream = kwargs.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidArgumentError(f"stream must be True or False, got {stream!r}")
        out = self.create_chat_completion(*args, **kwargs)
        if stream:
            return (ChatCompletionChunk(**chunk) for chunk in out)
        return ChatCompletion(**out)

    # ---- the prompt cache (set_cache) ----

    def _cache_load(self, ids):
        """Load the cached state that shares more of ids than the context does."""
        try:
            item = self.cache[list(ids)]
        except KeyError:
            if self.verbose:
                print("Llama: cache miss", file=sys.stderr)
            return
        ids = [int(t) for t in ids]
        if longest_token_prefix(item.input_ids[:item.n_tokens].tolist(), ids) > \
                longest_token_prefix(self.llm.tokens, ids):
            self.load_state(item)
            if self.verbose:
                print("Llama: cache hit", file=sys.stderr)

    def _cache_store(self):
        if self.cache is not None and self.n_tokens:
            self.cache[self.llm.tokens] = self.save_state()

    def _cache_after(self, out, stream):
        if not stream:
            self._cache_store()
            return out

        def chunks():
            yield from out
            self._cache_store()
        return chunks()

    # ---- embeddings (llminfer.LLM's, when it has them) ----

    def create_embedding(self, input, model=None):  # noqa: A002
        return self._embedding_call("create_embedding", input)

    def embed(self, input, normalize: bool = False, truncate: bool = True, return_count: bool = False):  # noqa: A002
        """llama-cpp-python's embed: a vector (a list of floats) for a text, a
        list of them for a list of texts, not normalized unless asked; with
        return_count, (embeddings, the number of tokens read)."""
        out = self._embedding_call("embed", input, normalize=normalize, truncate=truncate)
        if not return_count:
            return out
        texts = [input] if isinstance(input, str) else list(input)
        count = 0
        for t in texts:
            n = len(self.llm.tokenize(t, add_bos=True))
            count += min(n, self.llm.n_ctx) if truncate else n
        return out, count

    def rank(self, query: str, documents) -> list:
        """A relevance score per document (in their order) from a reranker
        GGUF (pooling_type rank: Qwen3-Reranker); llama-cpp-python has no
        such method: this is llminfer's (LLM.rank). For a cross-encoder
        (bert), llminfer.Embedder(path).rank."""
        return self._embedding_call("rank", query, documents)

    def create_rerank(self, query: str, documents, top_n: int | None = None, return_documents: bool = False):
        """The /v1/rerank response (Jina's and Cohere's shape) of LLM.create_rerank."""
        return self._embedding_call("create_rerank", query, documents, top_n=top_n,
                                    return_documents=return_documents)

    def _embedding_call(self, name, *args, **kwargs):
        fn = getattr(self.llm, name, None)
        if fn is None:
            raise InvalidArgumentError(f"{name} needs llminfer's embeddings, which this build does not have")
        return fn(*args, **kwargs)

    # ---- state ----

    def save_state(self) -> LlamaState:
        """The context as llama-cpp-python's LlamaState: input_ids, scores
        (every evaluated row with logits_all, else the last one), n_tokens,
        llama_state (llminfer's state bytes: tokens, KV cache, last logits),
        llama_state_size and seed."""
        blob = self.llm.save_state()
        n = self.n_tokens
        scores = self._scores.copy() if self.logits_all else self.scores[max(n - 1, 0):n].copy()
        return LlamaState(input_ids=self.input_ids, scores=scores, n_tokens=n, llama_state=blob,
                          llama_state_size=len(blob), seed=self._seed)

    def load_state(self, state) -> None:
        """Restore a LlamaState (or llminfer's state bytes)."""
        if isinstance(state, (bytes, bytearray, memoryview)):
            self.llm.load_state(bytes(state))
            return
        if not isinstance(getattr(state, "llama_state", None), (bytes, bytearray)):
            raise InvalidArgumentError(f"load_state takes a LlamaState from save_state(), got "
                                       f"{type(state).__name__}")
        self.llm.load_state(bytes(state.llama_state))
        n = int(state.n_tokens)
        rows = np.asarray(state.scores, dtype=np.float32)
        if n and len(rows):
            buf = self._buffer()
            if len(rows) == n:
                buf[:n] = rows
            else:
                buf[n - len(rows):n] = rows
        self._seed = state.seed
        self.llm.seed = self._seed

    # ---- llama-cpp-python's static helpers ----

    longest_token_prefix = staticmethod(longest_token_prefix)

    @staticmethod
    def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
        """log-softmax of logits along axis, float32."""
        x = np.asarray(logits, dtype=np.float32)
        m = np.max(x, axis=axis, keepdims=True)
        shifted = x - np.where(np.isfinite(m), m, 0)
        return (shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))).astype(np.float32)

    # ---- lifetime ----

    def close(self):
        self.llm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Llama(model_path={self.model_path!r}, n_ctx={self.llm.n_ctx})"
