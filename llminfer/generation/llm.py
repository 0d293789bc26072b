"""The user-facing model object: load a GGUF, tokenize, evaluate, generate, chat.

    llm = llminfer.LLM("smollm2-135m-instruct")
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0))
    for piece in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="", flush=True)

One LLM holds one sequence: the tokens in its context (`llm.tokens`) and their
keys and values in the KV cache. A new prompt that begins with tokens already
in the context reuses them (prompt caching), so a chat's history is not
recomputed turn after turn.

Thread safety: calls on one LLM are serialized by a lock (a second thread
waits); use one LLM per thread to run sequences in parallel. The native
forward pass releases the GIL. A stream holds the lock until it is exhausted
or closed; on its own thread, other calls may run between its pieces, and the
stream then restores its context (recomputing the tokens that differ).
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from llminfer.generation import completions

from llminfer import hub
from llminfer.generation.completions import check_logprobs, wants_chat_extras
from llminfer.runtime.engine import KV_TYPES, Engine, check_positive_int
from llminfer.errors import ContextFullError, InvalidArgumentError, LLMInferError
from llminfer.generation.generator import Generator, stop_list
from llminfer.text.reasoning import ChatOptions
from llminfer.generation.sampling import Sampler, SamplingParams
from llminfer.text.structured import Constraint, grammar_from_args
from llminfer.vision.prompt import PromptIds


@dataclass
class Timings:
    """Wall-clock figures of one generation."""

    prompt_tokens: int = 0        # tokens evaluated for the prompt (after prompt caching)
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    time_to_first_token: float = 0.0  # from the call to the first token sampled
    cached_tokens: int = 0        # prompt tokens reused from the context
    native_seconds: float = 0.0   # of generation_seconds, the time spent in the native forward pass
    # speculative decoding (llminfer.generation.speculative): tokens drafted, drafts the
    # model accepted, and forward passes that verified drafts
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens accepted (0 without speculation)."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    def as_dict(self) -> dict:
        """Every figure, the derived ones included, as a plain dict."""
        out = dataclasses.asdict(self)
        for name in ("python_share", "prompt_tokens_per_second", "generation_tokens_per_second",
                     "acceptance_rate"):
            out[name] = getattr(self, name)
        return out

    @property
    def python_share(self) -> float:
        """Share of generation time spent outside the native forward pass
        (sampling, detokenizing, bookkeeping, and whatever the consumer of a
        stream does between pieces)."""
        if self.generation_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.native_seconds / self.generation_seconds)

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tokens_per_second(self) -> float:
        # the first token comes from the prompt's logits; the rest each cost a forward pass
        n = self.generated_tokens - 1
        return n / self.generation_seconds if n > 0 and self.generation_seconds > 0 else 0.0


@dataclass
class Completion:
    """A finished generation: text, token ids, why it stopped, and timings.
    finish_reason is "stop" (end-of-generation token or stop string) or
    "length" (max_tokens reached)."""

    text: str
    tokens: list = field(default_factory=list)
    prompt_tokens: int = 0
    finish_reason: str = "length"
    timings: Timings = field(default_factory=Timings)
    # with complete(logprobs=n): per token of `tokens`, (its log-probability,
    # the n most likely [(token, log-probability)]) under the model's logits
    logprobs: list | None = None
    top_logprobs: int = 0
    # a chat with a thinking model: how its text reads (llminfer.text.reasoning.Reasoning;
    # Reasoning.splitter() parts the thinking from the answer), else None
    reasoning: object = None


_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)


def _sampling(params: SamplingParams | None, kwargs: dict) -> SamplingParams:
    unknown = set(kwargs) - _SAMPLING_FIELDS
    if unknown:
        raise InvalidArgumentError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}; "
                                   f"known: {', '.join(sorted(_SAMPLING_FIELDS))}")
    base = params if params is not None else SamplingParams()
    return base.replace(**kwargs) if kwargs else base.validate()


def _lora_args(lora) -> list:
    """LLM's lora argument as [(path, scale)]: a path, or a list of paths and (path, scale) pairs."""
    import os

    from llminfer.runtime.lora import check_scale

    items = [lora] if isinstance(lora, (str, os.PathLike)) else lora
    if not isinstance(items, (list, tuple)):
        raise InvalidArgumentError(f"lora must be a path or a list of paths and (path, scale) pairs, got {lora!r}")
    out = []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            out.append((item, 1.0))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], (str, os.PathLike)):
            out.append((item[0], check_scale(item[1], f"the scale of LoRA adapter {item[0]}")))
        else:
            raise InvalidArgumentError(f"a lora entry must be a path or (path, scale), got {item!r}")
    return out


class LLM:
    """A GGUF model loaded for generation.

    model: a path to a .gguf file, or a known model name (see llminfer.hub;
    fetched on first use). n_ctx: context length in tokens. n_threads: threads
    for the native kernels (default: physical cores). n_batch: most prompt
    tokens evaluated per forward pass (at most n_ctx). seed: default seed for sampling.
    kv_type: "f16" (default) or "f32" for the KV cache. chat_format /
    chat_template: override the chat prompt format (see llminfer.text.chat).
    n_gpu_layers: the first N layers run on the GPU (-1: every layer and the
    output head; 0, the default: none), on device main_gpu; needs a GPU
    build (docs/gpu.md), else GPUUnavailableError says what is missing.

    Speculative decoding (llminfer.generation.speculative; the output is unchanged):
    spec="ngram" drafts from n-grams of the prompt and text so far;
    draft_model (a path or name of a smaller model with the same vocabulary)
    drafts with that model (spec="draft", the default when it is given);
    draft_max caps the tokens drafted per pass; a SpecConfig for full control.
    A call may override it with spec= ("ngram", "draft", "off").

    mmproj: the path of the model's vision tower (llminfer.vision); chat
    messages may then hold OpenAI image_url parts (data: URLs, file:// URLs
    or paths) or {"type": "image", "image": bytes, path or PIL image}.

    lora: LoRA adapters (GGUF, as llama.cpp's convert_lora_to_gguf.py
    writes them; llminfer.runtime.lora), each a path (scale 1.0) or (path, scale);
    they apply to everything this LLM runs. set_lora changes the scales (0
    turns one off: the base model's output, bit for bit)."""

    def __init__(self, model, n_ctx: int = 4096, n_threads: int | None = None, n_batch: int = 512,
                 seed: int | None = None, kv_type: str = "f16", chat_format: str | None = None,
                 chat_template: str | None = None, kv_pool_tokens: int | None = None, mmap: bool = True,
                 n_gpu_layers: int = 0, main_gpu: int = 0, draft_model=None, spec=None,
                 draft_max: int | None = None, mmproj=None, lora=None):
        check_positive_int("n_ctx", n_ctx)
        check_positive_int("n_batch", n_batch)
        if not isinstance(kv_type, str) or kv_type not in KV_TYPES:
            raise InvalidArgumentError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        if seed is not None:
            SamplingParams(seed=seed)  # raises on a seed that is not an integer
        if chat_format is not None or chat_template is not None:
            from llminfer.text.chat import check_chat_args  # jinja2 only when a chat is asked for

            check_chat_args(chat_format, chat_template)
        self._lock = threading.RLock()
        self._engine = Engine(model, n_ctx=int(n_ctx), kv_pool_tokens=kv_pool_tokens, n_batch=int(n_batch),
                              n_threads=n_threads, kv_type=kv_type, mmap=mmap, n_gpu_layers=n_gpu_layers,
                              main_gpu=main_gpu)
        eng = self._engine
        self.model_path = eng.model_path
        self._gguf = eng.gguf
        self.spec = eng.spec
        if n_ctx > self.spec.context_length:
            warnings.warn(f"n_ctx={n_ctx} exceeds the {self.spec.context_length} tokens the model "
                          f"was trained on; quality may degrade past that", stacklevel=2)
        self.n_threads = eng.n_threads
        self.n_ctx = eng.n_ctx
        self.n_batch = eng.n_batch
        self._n_vocab = self.spec.n_vocab
        self._arch = self.spec.arch
        self.seed = seed
        self._chat_args = (chat_format, chat_template)
        self._chat_format = None  # llminfer.text.chat.ChatFormat, made on first use
        self._seq = eng.new_sequence()  # the one sequence this front holds
        # The generation whose tokens the context holds, None after eval/reset:
        # a stream finds out this way that another call used the context while
        # it waited (on its own thread, since the lock is reentrant).
        self._owner = None
        self._last_logits = np.zeros(self.spec.n_vocab, dtype=np.float32)
        self._spare_logits = np.empty_like(self._last_logits)  # the next pass's (_forward)
        self._draft = None
        self._vision = None
        self._image_rows = None  # llminfer.vision.prompt.ImageRows, with mmproj
        self._held_images = []  # the ImageSpans the context holds
        try:
            if lora is not None:
                scales = {}
                for path, scale in _lora_args(lora):
                    scales[eng.add_lora(path)] = scale
                self._seq.lora = eng.lora_scales(scales)
            if mmproj is not None:
                from llminfer.vision.mmproj import load_for_model
                from llminfer.vision.prompt import ImageRows

                self._vision = load_for_model(mmproj, self.spec.n_embd_inp, self.model_path, self.n_threads)
                self._image_rows = ImageRows(self._vision, _IMAGES_KEPT, self.n_threads)
            if draft_model is not None:
                from llminfer.generation.speculative import DraftModel

                self._draft = DraftModel(draft_model, eng, n_ctx=self.n_ctx, n_threads=n_threads,
                                         n_batch=self.n_batch, kv_type=kv_type)
            self._spec_config = _spec_config(spec, self._draft, draft_max=draft_max)
            if draft_max is not None and self._spec_config is None:
                raise InvalidArgumentError("draft_max is given but speculative decoding is off: "
                                           "pass spec='ngram' or a draft_model")
        except Exception:
            self.close()
            raise

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, revision: str | None = None, cache_dir=None,
                        local_dir=None, token=None, **kwargs) -> "LLM":
        """Load a GGUF from a Hugging Face Hub repository (huggingface_hub's
        cache; `filename` may be a glob such as "*Q4_K_M.gguf"; a split model
        is joined). kwargs go to LLM()."""
        from llminfer.hub.hf import download

        return cls(download(repo_id, filename, revision=revision, cache_dir=cache_dir, local_dir=local_dir,
                            token=token), **kwargs)

    @property
    def engine(self) -> Engine:
        """The many-sequence engine under this LLM (llminfer.runtime.engine)."""
        self._check_open()
        return self._engine

    @property
    def tokens(self) -> list:
        """The tokens the context holds (a copy)."""
        return list(self._seq.tokens)

    @property
    def sequence(self):
        """The engine's Sequence that holds this LLM's context (its tokens,
        positions and KV block tables); llminfer.runtime.state reads and refills it.
        Change it only through the LLM's methods, or tell the LLM with
        context_replaced()."""
        self._check_open()
        return self._seq

    def context_replaced(self, last_logits) -> None:
        """Tell the LLM that its sequence was refilled from outside (a state
        loaded): last_logits (float32 [n_vocab]) are the logits after its
        last token, and no stream owns the context any longer (one that does
        recomputes its own tokens at its next step)."""
        self._last_logits[:] = last_logits
        self._owner = None

    @property
    def _native_seconds(self) -> float:
        return self._engine.native_seconds

    # ---- basic facts ----

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def tokenizer(self):
        """The model's llminfer.text.tokenizer.Tokenizer (built on first use)."""
        return self._engine.tokenizer

    @property
    def metadata(self) -> dict:
        return self._gguf.metadata

    @property
    def architecture(self) -> str:
        return self._arch

    def kv_cache_bytes(self) -> list:
        """Bytes of KV pool each layer holds (its blocks are touched as they are used)."""
        self._check_open()
        return self._engine.kv_cache_bytes()

    # ---- tokens ----

    def tokenize(self, text, add_bos: bool = True, special: bool = False) -> list:
        """Token ids of `text` (str, or UTF-8 bytes). add_bos prepends BOS when the
        vocabulary asks for it; special matches control tokens written in the text."""
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidArgumentError(f"text is not valid UTF-8: {e.reason} at byte {e.start}") from None
        if not isinstance(text, str):
            raise InvalidArgumentError(f"text must be str or bytes, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids, skip_special: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special=skip_special)

    # ---- evaluation ----

    def reset(self):
        """Empty the context."""
        with self._lock:
            self._check_open()
            self._engine.truncate(self._seq, 0)
            self._held_images = []
            self._owner = None

    @property
    def lora_adapters(self) -> list:
        """The LoRA adapters loaded, in id order: {"id", "path", "scale"}."""
        eng = self._engine
        scales = self._seq.lora
        return [{"id": i, "path": a.path, "scale": float(str(scales[i])) if scales is not None else 0.0}
                for i, a in enumerate(eng.loras)]

    def set_lora(self, scales) -> None:
        """The scale of each loaded LoRA adapter for what runs next: {id:
        scale}, a list of scales by id, or None (all off). The context's
        tokens were computed with the old scales, so a change empties it."""
        with self._lock:
            self._check_open()
            new = self._engine.lora_scales(scales)
            old = self._seq.lora
            if (old is None) != (new is None) or (old is not None and not np.array_equal(old, new)):
                self.reset()
                self._seq.lora = new

    def _check_open(self):
        if getattr(self, "_engine", None) is None:
            raise LLMInferError(f"this LLM ({self.model_path}) is closed; load the model again to use it")

    def _check_ids(self, ids) -> np.ndarray:
        return self._engine.check_ids(ids)

    def _forward(self, ids: np.ndarray, logits_all: bool) -> np.ndarray | None:
        """Append ids to the context; logits of every id ([n, n_vocab]) when
        logits_all, else those of the last one (in self._last_logits)."""
        self._check_open()
        n = len(ids)
        if len(self._seq.tokens) + n > self.n_ctx:
            raise ContextFullError(f"{len(self._seq.tokens)} tokens in the context plus {n} new ones exceed "
                                   f"n_ctx={self.n_ctx}")
        if n == 0:
            return np.empty((0, self.n_vocab), np.float32) if logits_all else None
        if not logits_all:
            # the C core writes the row into the spare buffer itself, which
            # then becomes _last_logits: no copy of a large vocabulary's row,
            # and a pass that fails leaves _last_logits as it was
            spare = self._spare_logits
            if n == 1:
                self._engine.step(self._seq, ids[0], spare, n_threads=self.n_threads)
            else:
                self._engine.decode([(self._seq, ids, spare)], n_threads=self.n_threads)
            self._spare_logits, self._last_logits = self._last_logits, spare
            return None
        (out,) = self._engine.decode([(self._seq, ids, "all")], n_threads=self.n_threads)
        self._last_logits[:] = out[-1]
        return out

    def eval(self, ids, logits_all: bool = True) -> np.ndarray:  # noqa: A003
        """Append ids to the context; return the logits at every one of them,
        float32 [len(ids), n_vocab], or with logits_all=False those of the
        last one only, [1, n_vocab] (one output row computed, not len(ids))."""
        with self._lock:
            self._check_open()
            arr = self._check_ids(ids)
            self._owner = None
            if arr.size == 0:
                return np.empty((0, self.n_vocab), dtype=np.float32)
            if not logits_all:
                self._forward(arr, logits_all=False)
                return self._last_logits[None, :].copy()
            return self._forward(arr, logits_all=True)

    @property
    def last_logits(self) -> np.ndarray:
        """A copy of the logits after the context's last token, float32
        [n_vocab] (zeros while the context is empty)."""
        with self._lock:
            return self._last_logits.copy()

    def truncate(self, n: int) -> None:
        """Keep the first n tokens of the context (their KV entries stay;
        the last logits are not recomputed: evaluate a token to get fresh ones)."""
        with self._lock:
            self._check_open()
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= len(self._seq.tokens):
                raise InvalidArgumentError(f"truncate takes 0..{len(self._seq.tokens)} tokens, got {n!r}")
            self._engine.truncate(self._seq, int(n))
            self._held_images = [s for s in self._held_images if s.start < n]
            self._owner = None

    def keep_prefix(self, ids) -> int:
        """Truncate the context to the longest prefix it shares with ids that
        can be reused (at least one token of ids is left to evaluate, since
        its logits are needed); returns how many tokens were kept."""
        with self._lock:
            self._check_open()
            n = self._prefix_to_keep(list(ids))
            self._keep(n)
            self._owner = None
            return n

    def _prefix_to_keep(self, ids, images=()) -> int:
        """How many of `ids` the context already holds (at least one is always
        re-run, since its logits are needed); up to the first image that is
        not the one the context holds at its place."""
        held = self._seq.tokens
        n = 0
        limit = min(len(held), len(ids) - 1)
        while n < limit and held[n] == ids[n]:
            n += 1
        # after a context shift the tokens are no longer at positions 0..n-1
        if n and self._seq.positions[n - 1] != n - 1:
            n = 0
        # sliding-window layers give back positions the text has moved past
        n = min(n, _images_agree(self._held_images, images, n))
        for span in images:  # an image's rows attend to each other both ways: all of them, or none kept
            if span.start < n < span.end:
                n = span.start
        if not self._engine.kv.can_truncate(self._seq, n):
            n = 0
        # a hybrid model's state comes back by running tokens again: not an image's rows
        return self._engine.keepable(self._seq, n)

    def _keep(self, n):
        self._engine.truncate(self._seq, n)
        self._held_images = [s for s in self._held_images if s.start < n]

    def _prefill(self, ids, keep, images=()):
        """Evaluate ids[keep:] (the context holds ids[:keep]); the positions
        of `images` from their rows. The last logits end in _last_logits."""
        cursor = keep
        for span in images:
            if span.end <= cursor:
                continue
            if span.start > cursor:
                self._forward(np.asarray(ids[cursor:span.start], dtype=np.int32), logits_all=False)
                cursor = span.start
            self._forward_rows(ids[cursor:span.end], span.rows[cursor - span.start:], span.grid,
                               cursor - span.start)
            cursor = span.end
        if cursor < len(ids):
            self._forward(np.asarray(ids[cursor:], dtype=np.int32), logits_all=False)
        self._held_images = [s for s in images if s.start < len(ids)]

    def _forward_rows(self, ids, rows, grid=None, first=0):
        if len(self._seq.tokens) + len(ids) > self.n_ctx:
            raise ContextFullError(f"{len(self._seq.tokens)} tokens in the context plus an image's {len(ids)} "
                                   f"exceed n_ctx={self.n_ctx}")
        spare = self._spare_logits
        self._engine.decode_rows(self._seq, np.asarray(ids, dtype=np.int32), rows, spare, n_threads=self.n_threads,
                                 causal=not self._vision.non_causal, grid=grid, first=first)
        self._spare_logits, self._last_logits = self._last_logits, spare

    # ---- generation ----

    def _token_stream(self, gen: Generator, prompt_ids, max_tokens, timings: Timings, context_shift: bool,
                      n_keep: int, spec=None, hooks: "_Hooks | None" = None, images=()) -> Iterator[int]:
        """The tokens of one generation, drawn with gen's sampler and grammar;
        the caller hands each to gen.emit before it asks for the next (which
        grows gen.history and advances the grammar while the next pass runs)."""
        t0 = time.perf_counter()
        owner = self._owner = object()
        keep = self._prefix_to_keep(prompt_ids, images)
        self._keep(keep)
        timings.cached_tokens = keep
        ids = self._check_ids(prompt_ids[keep:])
        # a grammar masks the logits; each mask is computed on a worker thread
        # during a forward pass (the first one during the prompt's)
        masked = (lambda lg: lg) if gen.constraint is None and gen.thinking is None else gen.mask  # noqa: E731
        if hooks is not None:
            masked = hooks.wrap(masked)
        self._prefill(prompt_ids, keep, images)
        mine = list(self._seq.tokens)  # what this generation's context holds
        sampler = gen.sampler
        spec = self._speculator(spec, sampler, prompt_ids)
        t1 = time.perf_counter()
        timings.prompt_tokens = len(ids)
        timings.prompt_seconds = t1 - t0
        history = gen.history  # the prompt and the tokens emitted so far
        if hooks is not None:
            hooks.see(history)  # the processors read it as it grows
        # tokens sampled and not yet yielded; all but the last are already in
        # the context (drafts the target accepted)
        queue = [sampler.sample(masked(self._last_logits), history)]
        for i in range(max_tokens):
            tok = queue.pop(0)
            if hooks is not None and hooks.stop(history):
                # llama-cpp-python's stopping criteria: the token drawn is
                # dropped and the generation ends as at an end-of-generation token
                eog = hooks.eog_id
                if eog is not None:
                    yield eog
                return
            if i == 0:
                timings.time_to_first_token = time.perf_counter() - t0
                t_gen = time.perf_counter()
                native0 = self._native_seconds
            timings.generated_tokens += 1
            yield tok
            if tok in self.tokenizer.eog_ids or i == max_tokens - 1:
                break
            if queue:
                continue
            if self._owner is not owner:
                # other calls used the context while this stream waited: put its
                # tokens back, reusing the prefix they share
                keep = self._prefix_to_keep(mine + [tok], images)
                self._keep(keep)
                self._owner = owner
                self._prefill(mine, keep, images)
            if len(self._seq.tokens) >= self.n_ctx:
                if not context_shift:
                    return  # the context is full: what was generated stands, finish_reason "length"
                self._shift_context(n_keep)
                mine = list(self._seq.tokens)
            if spec is None:
                self._forward(np.array([tok], dtype=np.int32), logits_all=False)
                mine.append(tok)
                queue.append(sampler.sample(masked(self._last_logits), history))
            else:
                # drafts fit in what is still wanted, in the context, and in
                # one KV block (the most a sliding window can roll back)
                room = min(max_tokens - i - 2, self.n_ctx - len(self._seq.tokens) - 1, self._engine.block_size)
                drafts = spec.propose(history, room)
                rows = self._forward(np.array([tok] + drafts, dtype=np.int32), logits_all=True)
                queue = spec.accept(rows, history)
                self._keep(len(self._seq.tokens) - (len(drafts) + 1 - len(queue)))
                mine.append(tok)
                mine.extend(queue[:-1])
                timings.spec_drafted = spec.stats.drafted
                timings.spec_accepted = spec.stats.accepted
                timings.spec_steps = spec.stats.draft_steps
            timings.generation_seconds = time.perf_counter() - t_gen
            timings.native_seconds = self._native_seconds - native0

    def _speculator(self, config, sampler, prompt_ids):
        """The Speculator of one generation (None when config is None),
        started on the prompt."""
        if config is None:
            return None
        from llminfer.generation.speculative import Speculator

        if self._draft is not None:
            self._draft.n_threads = self.n_threads
        s = Speculator(config, sampler, self._draft)
        s.start(list(prompt_ids))
        return s

    def _shift_context(self, n_keep):
        """Drop the older half of the tokens after the first n_keep. The blocks
        that hold only dropped tokens are given back and masked out; the
        tokens kept keep their keys (and positions), so nothing is recomputed.
        When that frees nothing (a block is larger than what would go), the
        kept tokens are recomputed instead."""
        n_keep = max(0, min(n_keep, self.n_ctx // 2))
        held = len(self._seq.tokens)
        rest = held - n_keep
        if rest >= 2 and self._engine.drop(self._seq, n_keep, n_keep + rest // 2) > 0:
            return
        toks = self._seq.tokens
        kept = toks[:n_keep] + toks[n_keep + rest // 2:]
        self._keep(0)
        self._forward(np.array(kept, dtype=np.int32), logits_all=False)

    def _check_run(self, prompt_ids, max_tokens, params: SamplingParams, stop, n_keep, context_shift=False) -> list:
        """Every check on a generation's arguments, made before anything runs,
        so that a stream raises at the call and the context is left as it was.
        Returns the stop strings as a list."""
        if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        if not isinstance(n_keep, (int, np.integer)) or isinstance(n_keep, bool) or n_keep < 0:
            raise InvalidArgumentError(f"n_keep must be a non-negative integer, got {n_keep!r}")
        stop = stop_list(stop)
        if context_shift and getattr(prompt_ids, "images", ()):
            raise InvalidArgumentError("context_shift is not supported with images in the context yet")
        params.validate(self.n_vocab)
        if len(prompt_ids) == 0:
            raise InvalidArgumentError("the prompt is empty (and the vocabulary adds no BOS)")
        if len(prompt_ids) >= self.n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt_ids)} tokens, which does not leave room "
                                   f"for generation in n_ctx={self.n_ctx}")
        return stop

    def _run(self, prompt_ids, max_tokens, params, stop, context_shift, n_keep,
             result: Completion, spec=None, grammar=None, hooks=None, reasoning=None, images=()) -> Iterator[str]:
        result.prompt_tokens = len(prompt_ids)
        result.finish_reason = "length"
        if max_tokens == 0:
            return
        with self._lock:
            self._check_open()  # a stream may be read after close()
            sampler = Sampler(params if params.seed is not None or self.seed is None
                              else params.replace(seed=self.seed), self.n_vocab, self.tokenizer)
            constraint = None if grammar is None else Constraint(grammar, self.tokenizer, self.n_vocab)
            gen = Generator(sampler, self.tokenizer, stop, constraint, prompt_ids,
                            None if result.logprobs is None else result.top_logprobs,
                            thinking=None if reasoning is None else reasoning.tracker())
        # The lock is held for each step of the stream, not across its yields:
        # a stream half read on one thread must not block every other call on
        # the object. A call that runs in between takes the context; the
        # stream's next step finds it gone and restores its own tokens.
        tokens = self._token_stream(gen, prompt_ids, max_tokens, result.timings, context_shift, n_keep, spec, hooks,
                                    images)
        reason = "length"
        try:
            while True:
                with self._lock:
                    self._check_open()  # a stream may be read after close()
                    tok = next(tokens, None)
                    if tok is None:
                        break
                    # the logits tok was drawn from are still the last ones
                    event, end = gen.emit(tok, self._last_logits if result.logprobs is not None else None)
                if event is not None and _record(result, event):
                    yield event.text
                if end is not None:
                    reason = end
                    break
        finally:
            with self._lock:
                tokens.close()
            text = _finish(result, gen, reason)
        if text:
            yield text

    def _prompt_ids(self, prompt) -> list:
        if isinstance(prompt, PromptIds):  # a chat prompt with images: ids and their ImageSpans
            self._check_ids(prompt)
            return prompt
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(t) for t in self._check_ids(prompt)]
        return self.tokenize(prompt, add_bos=True, special=True)

    def complete(self, prompt, max_tokens: int | None = 128, stop=None, stream: bool = False,
                 sampling: SamplingParams | None = None, context_shift: bool = False,
                 n_keep: int = 1, spec=None, logprobs: int | None = None, grammar=None, json_schema=None,
                 response_format=None, logits_processor=None, stopping_criteria=None, reasoning=None,
                 **sampling_kwargs):
        """Generate after `prompt` (text, or token ids). Returns a Completion; with
        stream=True an iterator of text pieces whose last step fills `.result`.
        A list of prompts (texts, or lists of ids) runs them together as one
        batch and returns a list of Completions; `sampling` may then be a list
        too, one SamplingParams per prompt. max_tokens=None: until the context
        is full. Reaching the end of the context ends the generation with
        finish_reason "length" (unless context_shift). logprobs=n records each
        token's log-probability and the n most likely alternatives
        (Completion.logprobs). spec ("ngram", "draft", "off" or a SpecConfig)
        overrides the LLM's speculative decoding for this call.
        Structured output (llminfer.text.structured): `grammar` (GBNF or Lark text,
        or a Grammar), `json_schema` (dict), or OpenAI's `response_format`
        ({"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}})
        constrain the tokens; a generation that ends with "stop" matches it.
        A constrained generation, or one with logprobs (each token's come from
        the pass that sampled it), runs without speculative decoding.
        Python callbacks, as llama-cpp-python takes them (one prompt only, no
        speculative decoding): logits_processor(input_ids, scores) -> scores
        (or a list of them, applied in order) edits the logits before the
        grammar mask and sampling; stopping_criteria(input_ids, logits) -> bool
        (or a list: any) ends the generation ("stop") before the token drawn
        from logits. input_ids is the prompt and the tokens so far; each call
        costs a numpy array of them and a copy of the [n_vocab] logits per token.
        reasoning: set by the chat calls for a thinking model (a
        llminfer.text.reasoning.Reasoning): a grammar then applies to the answer
        after the thinking, and the reasoning budget forces the closing tag."""
        self._check_open()
        check_logprobs(logprobs)
        grammar = grammar_from_args(grammar, json_schema, response_format)
        if grammar is not None and spec is not None and spec != "off":
            raise InvalidArgumentError("speculative decoding (spec=) cannot run under a grammar; "
                                       "pass spec='off' or no grammar")
        for name, v in (("stream", stream), ("context_shift", context_shift)):
            if not isinstance(v, bool):
                raise InvalidArgumentError(f"{name} must be True or False, got {v!r}")
        if sampling is not None and not isinstance(sampling, (SamplingParams, list, tuple)):
            raise InvalidArgumentError(f"sampling must be a SamplingParams (or a list of them), got "
                                       f"{type(sampling).__name__}")
        hooks = _Hooks.make(logits_processor, stopping_criteria, self.tokenizer)
        if hooks is not None and spec is not None and spec != "off":
            raise InvalidArgumentError("speculative decoding (spec=) cannot run with logits_processor or "
                                       "stopping_criteria; pass spec='off'")
        if _is_prompt_list(prompt):
            if hooks is not None:
                raise InvalidArgumentError("logits_processor and stopping_criteria take one prompt, not a list "
                                           "(nor n > 1 choices)")
            if stream:
                raise InvalidArgumentError("stream=True takes one prompt, not a list")
            if spec is not None and spec != "off":
                raise InvalidArgumentError("speculative decoding runs one prompt at a time, not a list")
            return self._complete_many(list(prompt), max_tokens, stop, sampling, sampling_kwargs, logprobs,
                                       grammar, reasoning)
        params = _sampling(sampling, sampling_kwargs)
        ids = self._prompt_ids(prompt)
        if max_tokens is None:
            max_tokens = max(self.n_ctx - len(ids) + 1, 0)  # the last token needs no room
        stop = self._check_run(ids, max_tokens, params, stop, n_keep, context_shift)
        config = self._spec_config if spec is None else _spec_config(spec, self._draft, self._spec_config)
        if logprobs is not None or grammar is not None or hooks is not None or \
                (reasoning is not None and reasoning.budget >= 0):
            config = None  # drafts are not masked by the grammar or the budget; logprobs come one pass a token
        result = Completion(text="", logprobs=None if logprobs is None else [], top_logprobs=logprobs or 0,
                            reasoning=reasoning)
        pieces = self._run(ids, max_tokens, params, stop, context_shift, n_keep, result, config, grammar, hooks,
                           reasoning, getattr(ids, "images", ()))
        if stream:
            return _Stream(pieces, result)
        for _ in pieces:
            pass
        return result

    def _complete_many(self, prompts, max_tokens, stop, sampling, sampling_kwargs, logprobs=None,
                       grammar=None, reasoning=None) -> list:
        """Every prompt in its own sequence of the engine, all decoded together:
        one forward pass per step for the whole batch, each sequence sampled
        with its own parameters and seed. The LLM's own context is untouched."""
        if isinstance(sampling, (list, tuple)):
            if len(sampling) != len(prompts):
                raise InvalidArgumentError(f"{len(sampling)} sampling parameter sets for {len(prompts)} prompts")
            params = [_sampling(p, sampling_kwargs) for p in sampling]
        else:
            params = [_sampling(sampling, sampling_kwargs)] * len(prompts)
        if any(getattr(p, "images", ()) for p in prompts):
            raise InvalidArgumentError("prompts with images run one at a time (not n > 1 nor a list) yet")
        ids = [self._prompt_ids(p) for p in prompts]
        if max_tokens is None:
            max_tokens = max((self.n_ctx - len(x) + 1 for x in ids), default=0)
        stops = [self._check_run(x, max_tokens, p, stop, 1) for x, p in zip(ids, params)]
        results = [Completion(text="", prompt_tokens=len(x), logprobs=None if logprobs is None else [],
                              top_logprobs=logprobs or 0, reasoning=reasoning) for x in ids]
        if max_tokens == 0 or not prompts:
            return results
        with self._lock:
            self._check_open()
            eng = self._engine
            seqs = []
            try:
                seqs = [eng.new_sequence() for _ in prompts]
                for s in seqs:
                    s.lora = self._seq.lora  # the LLM's adapters
                t0 = time.perf_counter()
                logits = eng.decode([(s, x) for s, x in zip(seqs, ids)], n_threads=self.n_threads)
                t1 = time.perf_counter()
                native0 = eng.native_seconds
                runs = [_SequenceRun(self, x, p if p.seed is not None or self.seed is None else
                                     p.replace(seed=self.seed), st, r, grammar, reasoning)
                        for x, p, st, r in zip(ids, params, stops, results)]
                active = list(range(len(prompts)))
                for step in range(max_tokens):
                    work, going = [], []
                    for i in active:
                        # the context's end ends a sequence too ("length")
                        full = len(ids[i]) + step >= self.n_ctx  # no room to evaluate this token
                        tok = runs[i].step(logits[i], last=step == max_tokens - 1 or full)
                        if tok is not None:
                            work.append((seqs[i], [tok]))
                            going.append(i)
                    active = going
                    if not work:
                        break
                    for i, lg in zip(going, eng.decode(work, n_threads=self.n_threads)):
                        logits[i] = lg
                t2 = time.perf_counter()
                for r in results:
                    r.timings.prompt_tokens = r.prompt_tokens
                    r.timings.prompt_seconds = t1 - t0
                    r.timings.generated_tokens = len(r.tokens) + (r.finish_reason == "stop")
                    r.timings.generation_seconds = t2 - t1
                    r.timings.native_seconds = eng.native_seconds - native0
            finally:
                for s in seqs:
                    eng.free(s)
        return results

    def generate(self, prompt, max_tokens: int = 128, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repeat_penalty: float | None = None, stop=None, seed: int | None = None,
                 stream: bool = False, **sampling_kwargs):
        """The completion text of `prompt`; with stream=True an iterator of text
        pieces. A list of prompts runs as one batch and gives a list of texts
        (`sampling=` may be a list with one SamplingParams per prompt). A sampling parameter left at None takes its value from
        `sampling=` (a SamplingParams) or else SamplingParams' default
        (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0,
        a fresh seed). Further sampling parameters (frequency_penalty,
        presence_penalty, penalty_last_n, logit_bias) and context_shift/n_keep
        pass through."""
        # Only the parameters the caller named: passing the defaults would
        # override the fields of a `sampling` object.
        named = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                     repeat_penalty=repeat_penalty, seed=seed)
        sampling_kwargs.update({k: v for k, v in named.items() if v is not None})
        out = self.complete(prompt, max_tokens=max_tokens, stop=stop, stream=stream, **sampling_kwargs)
        if isinstance(out, list):
            return [c.text for c in out]
        return out if stream else out.text

    def create_completion(self, prompt, max_tokens: int | None = 16, stream: bool = False, **kwargs):
        """An OpenAI-shaped text_completion dict (or, streaming, an iterator of chunks).
        Beyond complete()'s arguments: echo, suffix (fill-in-the-middle), n
        choices, logprobs (llminfer.generation.completions)."""
        return completions.create_completion(self, prompt, max_tokens=max_tokens, stream=stream, **kwargs)

    # ---- chat ----

    @property
    def chat_format(self):
        """The llminfer.text.chat.ChatFormat that renders this model's chat prompts
        (jinja2 is imported only when a chat is rendered)."""
        from llminfer.text.chat import chat_format_for

        if self._chat_format is None:
            fmt, template = self._chat_args
            self._chat_format = chat_format_for(self.metadata, chat_format=fmt, chat_template=template)
        return self._chat_format

    def _chat_prompt(self, messages, options: ChatOptions | None = None) -> list:
        return self._chat_render(messages, options)[0]

    def _chat_render(self, messages, options: ChatOptions | None = None):
        """(prompt ids, the Reasoning of a thinking model's reply or None)."""
        from llminfer.text.tools import prepare_messages  # content None, tool turns
        from llminfer.vision.prompt import has_images

        options = options if options is not None else ChatOptions.make()
        fmt = self.chat_format
        if has_images(messages):
            return self._chat_render_images(messages, options)
        text = fmt.render(prepare_messages(messages, "tools" in fmt.template), add_generation_prompt=True,
                          **options.template_kwargs)
        ids = self.tokenize(text, add_bos=not fmt.adds_bos, special=True)
        return ids, options.reasoning(text, fmt.template, self.tokenizer)

    def _chat_render_images(self, messages, options: ChatOptions):
        """_chat_render of messages with image parts: PromptIds whose images
        are the ImageSpans of the images' rows, laid out as mtmd does."""
        from llminfer.text.tools import prepare_messages
        from llminfer.vision.prompt import lay_out, split_images

        if self._vision is None:
            raise InvalidArgumentError("the messages hold images, and this model was loaded without its "
                                       "vision tower: LLM(model, mmproj=PATH)")
        fmt = self.chat_format
        msgs, sources = split_images(messages, allow_files=True)
        text = fmt.render(prepare_messages(msgs, "tools" in fmt.template), add_generation_prompt=True,
                          **options.template_kwargs)
        ids = lay_out(text, sources, self._vision,
                      lambda t, bos: self.tokenize(t, add_bos=bos, special=True), self._image_rows,
                      not fmt.adds_bos)
        big = [len(s.rows) for s in ids.images if len(s.rows) > self.n_batch]
        if big and self._vision.non_causal:
            raise InvalidArgumentError(f"an image of {big[0]} positions must run in one pass: n_batch={self.n_batch} "
                                       f"is too small")
        return ids, options.reasoning(text, fmt.template, self.tokenizer)

    def encode_image(self, image) -> np.ndarray:
        """An image's rows for the text model, float32 [n, n_embd] (bytes,
        a path, a binary file or a PIL image); needs mmproj=."""
        with self._lock:
            self._check_open()
            if self._vision is None:
                raise InvalidArgumentError("this model was loaded without mmproj=")
            return self._image_rows(image)[1].copy()

    def chat_prompt(self, messages, **options) -> list:
        """The token ids of the prompt a chat call evaluates for `messages`
        (options: chat_template_kwargs, enable_thinking, reasoning_budget)."""
        return self._chat_prompt(messages, ChatOptions.pop(options) if options else None)

    def chat_completion(self, messages, max_tokens: int = 512, stop=None, stream: bool = False,
                        **kwargs):
        """Complete an assistant turn; a Completion (or a stream of pieces).
        The text is the model's as written, thinking included; for a
        thinking model Completion.reasoning parts it from the answer.
        chat_template_kwargs (a dict) and enable_thinking go to the chat
        template; reasoning_budget (-1 unlimited, 0 no thinking, N) forces
        the end of the thinking after N tokens."""
        stops = list(self.chat_format.stop_texts) + stop_list(stop)
        ids, reasoning = self._chat_render(messages, ChatOptions.pop(kwargs))
        return self.complete(ids, max_tokens=max_tokens, stop=stops, stream=stream, reasoning=reasoning,
                             **kwargs)

    def chat(self, messages, max_tokens: int = 512, stream: bool = False, **kwargs):
        """The assistant's reply to `messages` ([{"role": ..., "content": ...}]),
        rendered with the model's chat template; with stream=True an iterator of pieces."""
        out = self.chat_completion(messages, max_tokens=max_tokens, stream=stream, **kwargs)
        return out if stream else out.text

    def create_chat_completion(self, messages, max_tokens: int | None = 512, stream: bool = False,
                               tools=None, tool_choice=None, **kwargs):
        """An OpenAI-shaped chat.completion dict (or, streaming, chat.completion.chunk dicts).
        logprobs=True (with top_logprobs=n) adds OpenAI's chat logprobs.
        tools / tool_choice ("auto", "none", "required" or {"type": "function",
        "function": {"name": ...}}): the model's tool calls come back parsed in
        message["tool_calls"] (llminfer.text.tools).
        A thinking model's reasoning (<think>...</think>) comes back apart, in
        message["reasoning_content"] and in stream deltas, unless
        reasoning_format="none" (the raw text in content). chat_template_kwargs
        (e.g. {"enable_thinking": False}) and enable_thinking go to the chat
        template; reasoning_budget: -1 unlimited, 0 no thinking, N: the end of
        the thinking is forced after N tokens. A grammar (response_format,
        json_schema, grammar) and tool calls apply to the answer after the
        thinking."""
        if (tools is not None or tool_choice is not None) and wants_chat_extras(kwargs):
            raise InvalidArgumentError("tools cannot be combined with logprobs or n > 1 yet")
        return completions.create_chat_completion(self, messages, max_tokens=max_tokens, stream=stream, tools=tools,
                                                  tool_choice=tool_choice, **kwargs)

    # ---- state ----

    def held_images(self) -> list:
        """The images the context holds (start, end, key), in order: what a
        saved state records beside the embedding rows' places."""
        return list(self._held_images)

    def save_state(self) -> bytes:
        """The context (tokens, their KV cache, the last logits) as bytes, for
        load_state (llminfer.runtime.state)."""
        from llminfer.runtime import state

        with self._lock:
            self._check_open()
            return state.save(self)

    def load_state(self, blob) -> None:
        """Restore a context save_state() gave; the logits that follow are
        bitwise those of the saved context. A state of another model, KV type
        or format raises InvalidArgumentError."""
        from llminfer.runtime import state

        with self._lock:
            self._check_open()
            self._held_images = [_HeldImage(a, b, key) for a, b, key in state.load(self, blob)]

    def save_session(self, path) -> None:
        """save_state()'s bytes to a file, a KV block at a time (no copy of
        the whole cache in memory), then renamed into place."""
        import os

        from llminfer.runtime import state

        tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
        try:
            with self._lock, open(tmp, "wb") as f:
                self._check_open()
                state.write(self, f)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    def load_session(self, path) -> None:
        """load_state() from a file save_session() wrote."""
        with open(path, "rb") as f:
            self.load_state(f.read())

    # ---- embeddings ----

    def embed(self, input, normalize: bool = True, truncate: bool = True, pooling: str | None = None):
        """Embedding vectors of input (a text or a list of texts): this model's
        final normed hidden states pooled as its GGUF declares (mean when it
        declares none), L2-normalized (llminfer.generation.embeddings). The context is untouched."""
        from llminfer.generation.embeddings import DecoderEmbedding

        return DecoderEmbedding(self).embed(input, normalize=normalize, truncate=truncate, pooling=pooling)

    def create_embedding(self, input, model: str | None = None, **kwargs) -> dict:
        """OpenAI's embeddings response for input (a text or a list of texts)."""
        from llminfer.generation.embeddings import DecoderEmbedding

        return DecoderEmbedding(self).create_embedding(input, model=model, **kwargs)

    def rank(self, query: str, documents) -> list:
        """The relevance score of each document to query, in the documents'
        order, for a decoder reranker (Qwen3-Reranker: a GGUF whose
        pooling_type is rank): P("yes") after the GGUF's rerank prompt, as
        llama.cpp computes it (llminfer.generation.rerank). The context is untouched."""
        from llminfer.generation.rerank import DecoderRanking

        return DecoderRanking(self).rank(query, documents)

    def create_rerank(self, query: str, documents, top_n: int | None = None, return_documents: bool = False,
                      model: str | None = None) -> dict:
        """The /v1/rerank response (Jina's and Cohere's shape) for a decoder reranker."""
        from llminfer.generation.rerank import DecoderRanking

        return DecoderRanking(self).create_rerank(query, documents, top_n=top_n, return_documents=return_documents,
                                                  model=model)

    # ---- lifetime ----

    def close(self):
        """Free the KV cache and unmap the file. The object is unusable afterwards."""
        with self._lock:
            eng = getattr(self, "_engine", None)
            if eng is not None:
                eng.close()
            draft = getattr(self, "_draft", None)
            if draft is not None:
                draft.close()
            self._draft = None
            vision = getattr(self, "_vision", None)
            if vision is not None:
                vision.close()
            self._vision = None
            self._engine = None
            self.spec = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "" if getattr(self, "_engine", None) is not None else ", closed"
        return f"LLM({str(self.model_path)!r}, arch={self._arch}, n_ctx={self.n_ctx}{state})"


_IMAGES_KEPT = 16  # images whose rows an LLM keeps (by content hash)


@dataclass(frozen=True)
class _HeldImage:
    """An image the context holds, as a restored state names it: its places
    and content key (what _images_agree and _keep read of an ImageSpan)."""

    start: int
    end: int
    key: str


def _images_agree(held, images, n) -> int:
    """n, or the start of the first image before n where the context's
    images and the prompt's differ."""
    a = {s.start: s.key for s in held if s.start < n}
    b = {s.start: s.key for s in images if s.start < n}
    for start in sorted(set(a) | set(b)):
        if a.get(start) != b.get(start):
            return start
    return n


def _spec_config(spec, draft, base=None, draft_max=None):
    """The SpecConfig that spec= asks for (None: off). spec: None (draft
    speculation when there is a draft model, else off), "ngram", "draft",
    "off", or a SpecConfig. base: the LLM's own, kept when the mode matches."""
    from llminfer.generation.speculative import SpecConfig, parse_mode

    if isinstance(spec, SpecConfig):
        parse_mode(spec.mode, draft)  # "draft" without a draft model fails here
        return spec
    mode = parse_mode(spec, draft)
    if mode is None:
        return None
    if base is not None and base.mode == mode:
        return base
    return SpecConfig(mode=mode) if draft_max is None else SpecConfig(mode=mode, draft_max=draft_max)


def _is_prompt_list(prompt) -> bool:
    """A list of prompts (texts or id lists), as opposed to one prompt of ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and \
        all(isinstance(p, (str, list, tuple, np.ndarray)) for p in prompt)


class _Hooks:
    """llama-cpp-python's Python callbacks on one generation: logits
    processors (input_ids, scores) -> scores and stopping criteria
    (input_ids, logits) -> bool, input_ids an np.intc array of the prompt and
    the tokens so far."""

    def __init__(self, processors, criteria, eog_id):
        self.processors = processors
        self.criteria = criteria
        self.eog_id = eog_id
        self._logits = None  # the model's logits the last token was drawn from
        self._history = []   # the generation's token list, read by the processors

    @staticmethod
    def _callables(name, value) -> list:
        if value is None:
            return []
        items = [value] if callable(value) and not isinstance(value, (list, tuple)) else value
        if not isinstance(items, (list, tuple)) or not all(callable(f) for f in items):
            raise InvalidArgumentError(f"{name} must be a callable or a list of callables, got {value!r}")
        return list(items)

    @classmethod
    def make(cls, logits_processor, stopping_criteria, tokenizer):
        procs = cls._callables("logits_processor", logits_processor)
        crit = cls._callables("stopping_criteria", stopping_criteria)
        if not procs and not crit:
            return None
        eog = tokenizer.eos_id if tokenizer.eos_id in tokenizer.eog_ids else min(tokenizer.eog_ids, default=None)
        return cls(procs, crit, eog)

    def wrap(self, masked):
        """masked(logits), after the processors have edited a copy of logits."""
        def apply(logits):
            scores = logits
            if self.processors:
                ids = np.asarray(self._history, dtype=np.intc)
                scores = logits.copy()
                for p in self.processors:
                    out = p(ids, scores)
                    scores = scores if out is None else out
                scores = np.asarray(scores, dtype=np.float32)
                if scores.shape != logits.shape:
                    raise InvalidArgumentError(f"a logits_processor returned shape {scores.shape}, "
                                               f"expected {logits.shape}")
            self._logits = logits  # what stopping criteria see: the model's own logits
            return masked(scores)
        return apply

    def see(self, history):
        self._history = history

    def stop(self, history) -> bool:
        if not self.criteria:
            return False
        ids = np.asarray(history, dtype=np.intc)
        return any(bool(c(ids, self._logits)) for c in self.criteria)


def _record(result: Completion, event) -> str:
    """Add a token's TokenEvent to the Completion it belongs to; returns its
    text (what a stream yields for it)."""
    result.tokens.append(event.token)
    if result.logprobs is not None:
        result.logprobs.append((event.logprob, event.top))
    result.text += event.text
    return event.text


def _finish(result: Completion, gen: Generator, reason: str) -> str:
    """End the Completion's generation for reason (Generator.finish): its
    finish_reason set, the text held back added; returns that text."""
    text, result.finish_reason = gen.finish(reason)
    result.text += text
    return text


class _SequenceRun:
    """One sequence of a batched generation: its Generator, and the
    Completion it fills."""

    def __init__(self, llm, prompt_ids, params, stops, result: Completion, grammar=None, reasoning=None):
        constraint = None if grammar is None else Constraint(grammar, llm.tokenizer, llm.n_vocab)
        self.gen = Generator(Sampler(params, llm.n_vocab, llm.tokenizer), llm.tokenizer, stops, constraint,
                             prompt_ids, None if result.logprobs is None else result.top_logprobs,
                             thinking=None if reasoning is None else reasoning.tracker())
        self.result = result
        result.finish_reason = "length"

    def step(self, logits, last: bool):
        """Sample the next token; returns it, or None when the sequence ends."""
        gen, r = self.gen, self.result
        tok = gen.next_token(logits)
        event, reason = gen.emit(tok, logits)
        if event is not None:
            _record(r, event)
        if reason is None and not last:
            return tok
        _finish(r, gen, reason or "length")
        return None


class _Stream:
    """An iterator of text pieces; `.result` is the Completion, complete once
    the iterator is exhausted."""

    def __init__(self, pieces, result: Completion):
        self._pieces = pieces
        self.result = result

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self):
        self._pieces.close()


# ---- one-off calls ----

_cache_lock = threading.Lock()
_cached: tuple | None = None  # (key, LLM)
_LOAD_ARGS = ("n_ctx", "n_threads", "n_batch", "kv_type", "chat_format", "chat_template")


def generate(model, prompt, **kwargs):
    """One-off generation: load `model` (kept between calls with the same model
    and load arguments) and return llm.generate(prompt, **kwargs)."""
    global _cached
    load = {k: kwargs.pop(k) for k in _LOAD_ARGS if k in kwargs}
    key = (str(hub.resolve(model)), tuple(sorted(load.items())))
    with _cache_lock:
        if _cached is None or _cached[0] != key:
            # Dropped, not closed: another thread may be generating with it,
            # or a stream it returned may not be read yet. It is freed when the
            # last of them lets go, here at once if none holds it.
            _cached = None
            _cached = (key, LLM(model, **load))
        llm = _cached[1]
    return llm.generate(prompt, **kwargs)


def _drop_cached():
    """At exit, while Python is whole: the kept model goes. Left to the
    interpreter's teardown, its files and maps were released after the
    modules they need (os, llminfer._core) were gone."""
    global _cached
    with _cache_lock:
        _cached = None


atexit.register(_drop_cached)
