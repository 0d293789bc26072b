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

What it does not do says so: arguments that ask for something llminfer does
not have (LoRA adapters, a custom chat handler, a draft model, a layer split
over several GPUs)
raise InvalidArgumentError naming the argument; arguments that only tune
llama.cpp's internals (n_ubatch, use_mlock, flash_attn, numa...) are accepted
and have no effect.
"""

from __future__ import annotations

import sys
from collections import deque

import numpy as np

from llminfer.errors import InvalidArgumentError
from llminfer.gguf_file import StringArray
from llminfer.llm import LLM

__all__ = ["Llama", "LLAMA_DEFAULT_SEED"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick a random seed"

# llama-cpp-python's chat_format names -> llminfer's built-in formats
_CHAT_FORMATS = {
    "chatml": "chatml",
    "chatml-function-calling": "chatml",
    "gemma": "gemma",
    "llama-3": "llama3",
    "llama3": "llama3",
}

# Formats llminfer has no built-in for, as jinja templates of the prompts
# llama-cpp-python's llama_chat_format.py writes for them.
_LLAMA2_TEMPLATE = (
    "{%- set sys = namespace(text='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set sys.text = '<<SYS>>\\n' ~ m['content'] ~ '\\n<</SYS>>\\n\\n' -%}"
    "{%- elif m['role'] == 'user' -%}{{ bos_token }}[INST] {{ sys.text }}{{ m['content'] }} [/INST]"
    "{%- set sys.text = '' -%}"
    "{%- elif m['role'] == 'assistant' -%} {{ m['content'] }} {{ eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
_TEMPLATES = {"llama-2": _LLAMA2_TEMPLATE, "mistral-instruct": _LLAMA2_TEMPLATE}

# Arguments that need something llminfer does not have: a non-default value is an error.
_UNSUPPORTED = {
    "lora_base": None, "lora_path": None, "chat_handler": None, "draft_model": None, "tokenizer": None,
    "kv_overrides": None, "vocab_only": False, "rope_freq_base": 0.0, "rope_freq_scale": 0.0,
    "tensor_split": None, "spm_infill": False, "split_mode": 1,
}
# Arguments that tune llama.cpp itself; accepted, without effect here.
_IGNORED = {"main_gpu", "use_mlock", "n_ubatch", "n_threads_batch", "rope_scaling_type",
            "pooling_type", "attention_type", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
            "yarn_beta_slow", "yarn_orig_ctx", "offload_kqv", "flash_attn", "op_offload", "swa_full",
            "no_perf", "last_n_tokens_size", "lora_scale", "numa", "type_k", "type_v"}

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
    from llminfer.gguf_file import GGUFFile
    from llminfer.hub import resolve
    from llminfer.models import build_spec

    with GGUFFile(resolve(model_path)) as g:
        return build_spec(g).context_length


class Llama:
    """A llama-cpp-python `Llama` drop-in (see the module docstring)."""

    def __init__(self, model_path: str, *, n_gpu_layers: int = 0, seed: int = LLAMA_DEFAULT_SEED,
                 n_ctx: int = 512, n_batch: int = 512, n_threads: int | None = None,
                 use_mmap: bool = True, logits_all: bool = False, embedding: bool = False,
                 chat_format: str | None = None, verbose: bool = True, **kwargs):
        if not isinstance(n_gpu_layers, int) or isinstance(n_gpu_layers, bool):
            raise InvalidArgumentError(f"n_gpu_layers must be an integer, got {n_gpu_layers!r}")
        spec = None
        draft = kwargs.pop("draft_model", None)
        if draft is not None:
            from llminfer.llama_speculative import LlamaPromptLookupDecoding

            if not isinstance(draft, LlamaPromptLookupDecoding):
                raise InvalidArgumentError("draft_model= takes a LlamaPromptLookupDecoding "
                                           "(from llminfer.llama_speculative); for a draft model file use "
                                           "llminfer.LLM(model, draft_model=PATH)")
            spec = draft.spec_config()
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
        fmt, template = None, None
        if chat_format is not None:
            if chat_format in _TEMPLATES:
                template = _TEMPLATES[chat_format]
            elif chat_format in _CHAT_FORMATS:
                fmt = _CHAT_FORMATS[chat_format]
            else:
                known = sorted(set(_CHAT_FORMATS) | set(_TEMPLATES))
                raise InvalidArgumentError(f"chat_format {chat_format!r} is not one llminfer knows: {known}")
        self.verbose = bool(verbose)
        self.logits_all = bool(logits_all)
        self.embedding = bool(embedding)
        self.model_path = str(model_path)
        self._seed = None if seed in (-1, LLAMA_DEFAULT_SEED) else seed
        if self._seed is not None and self._seed < 0:
            raise InvalidArgumentError(f"seed must be >= 0, or -1 for a random one; got {seed}")
        if n_ctx == 0:
            n_ctx = _trained_context(model_path)
        # n_gpu_layers as llama.cpp reads it (-1: all); without a GPU build,
        # LLM raises GPUUnavailableError saying what to install
        self.llm = LLM(model_path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, seed=self._seed,
                       kv_type=_kv_type(kwargs.get("type_k"), kwargs.get("type_v")), chat_format=fmt,
                       chat_template=template, mmap=use_mmap, n_gpu_layers=n_gpu_layers,
                       main_gpu=kwargs.get("main_gpu", 0), spec=spec)
        self.chat_format = chat_format
        self.n_batch = self.llm.n_batch
        self.n_threads = self.llm.n_threads
        # the tokens eval() appended and, with logits_all, their logits
        self._scores: list = []
        if self.verbose:
            print(f"llminfer: loaded {self.model_path} ({self.llm.architecture}, {self.llm.n_vocab} tokens of "
                  f"vocabulary) with n_ctx={self.llm.n_ctx}, n_threads={self.n_threads}", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, *, cache_dir=None, local_dir=None,
                        revision: str | None = None, **kwargs) -> "Llama":
        """Download `filename` (a glob such as "*Q4_K_M.gguf" is allowed) from a
        Hugging Face repository, then load it like Llama(model_path=...)."""
        from llminfer.hf import download

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
        """The tokens the context holds."""
        return np.array(self.llm.tokens, dtype=np.intc)

    @property
    def n_tokens(self) -> int:
        return len(self.llm.tokens)

    @property
    def eval_tokens(self) -> deque:
        return deque(self.llm.tokens, maxlen=self.llm.n_ctx)

    @property
    def scores(self) -> np.ndarray:
        """Logits after each token eval() appended (logits_all=True), else only
        after the last one: float32 [rows, n_vocab]."""
        if not self._scores:
            return np.empty((0, self.llm.n_vocab), np.float32)
        return np.concatenate(self._scores)

    @property
    def eval_logits(self) -> deque:
        return deque((row.tolist() for row in self.scores), maxlen=self.llm.n_ctx if self.logits_all else 1)

    def eval(self, tokens):  # noqa: A003
        """Append tokens to the context (evaluating them)."""
        logits = self.llm.eval(tokens)  # which refuses what is not a sequence of token ids
        if len(logits):
            self._scores = (self._scores + [logits]) if self.logits_all else [logits[-1:]]

    def reset(self):
        self.llm.reset()
        self._scores = []

    def set_seed(self, seed: int):
        self._seed = None if seed in (-1, LLAMA_DEFAULT_SEED) else int(seed)
        self.llm.seed = self._seed

    # ---- completion ----

    def _sampling(self, kwargs):
        """llama-cpp-python's sampling arguments -> llminfer's names; arguments
        at the values that mean "off" are dropped."""
        out = {}
        for k, v in kwargs.items():
            if k in ("model", "stopping_criteria", "logits_processor", "tfs_z", "penalize_nl"):
                if k == "tfs_z" and v not in (None, 1.0):
                    raise InvalidArgumentError("tfs_z (tail-free sampling) was removed from llama.cpp; "
                                               "llminfer does not have it")
                if k in ("stopping_criteria", "logits_processor") and v is not None:
                    raise InvalidArgumentError(f"{k}= (Python callbacks) is not supported by llminfer")
                continue
            out[_RENAMED.get(k, k)] = v
        if out.get("seed") in (-1, LLAMA_DEFAULT_SEED):
            out["seed"] = None
        if out.get("seed") is None:
            out.pop("seed", None)
        if out.get("stop") == []:
            out.pop("stop")
        for name in ("grammar", "logit_bias"):
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
        return self.llm.create_completion(prompt, max_tokens=max_tokens, stream=stream, **self._sampling(args))

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
        return self.llm.create_chat_completion(messages, max_tokens=max_tokens, stream=stream,
                                               **self._sampling(args))

    # ---- embeddings (llminfer.LLM's, when it has them) ----

    def create_embedding(self, input, model=None):  # noqa: A002
        return self._embedding_call("create_embedding", input)

    def embed(self, input, normalize: bool = False, truncate: bool = True, return_count: bool = False):  # noqa: A002
        return self._embedding_call("embed", input, normalize=normalize, truncate=truncate,
                                    return_count=return_count)

    def _embedding_call(self, name, *args, **kwargs):
        fn = getattr(self.llm, name, None)
        if fn is None:
            raise InvalidArgumentError(f"{name} needs llminfer's embeddings, which this build does not have")
        return fn(*args, **kwargs)

    # ---- state ----

    def save_state(self):
        """The tokens and KV cache of the context (llminfer.state.LLMState)."""
        return self.llm.save_state()

    def load_state(self, state) -> None:
        self.llm.load_state(state)

    # ---- lifetime ----

    def close(self):
        self.llm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Llama(model_path={self.model_path!r}, n_ctx={self.llm.n_ctx})"
