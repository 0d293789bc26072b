"""The engine: one model, one paged KV cache, many sequences.

    eng = Engine("smollm2-135m-instruct", kv_pool_tokens=16384)
    a, b = eng.new_sequence(), eng.new_sequence()
    la, lb = eng.decode([(a, ids_a), (b, ids_b)])      # both prompts in one pass
    c = eng.fork(a)                                    # shares a's blocks
    eng.free(b)

`decode` takes work for several sequences and runs it as flat batches of
(token, position, sequence) through the C core, at most n_batch tokens a
pass, a long prompt spread over several passes. A sequence's logits are the
same, bit for bit, whatever else shares its batches and however its prompt
was split: the C core's arithmetic per row does not depend on the batch
(csrc/model.c), so scheduling is free to batch as it likes.

The engine does not sample. `generate_batch` runs several prompts to
completion together, one Sampler per sequence; llminfer.LLM is a
single-sequence front over an engine.
"""

from __future__ import annotations

import operator
import os
import threading
import time
import warnings
from functools import wraps

import numpy as np

from llminfer import _core, hub

from llminfer.core import gpu
from llminfer.errors import ContextFullError, InvalidArgumentError, LLMInferError, ShapeError, TokenError
from llminfer.core.gguf_file import GGUFFile
from llminfer.runtime.kv_cache import FULL, SWA, KVCache, Sequence, StatePool
from llminfer.models import build_spec
from llminfer.core.numerics import check_logits, locate_non_finite
from llminfer.core.system import PLACEMENTS, STREAM_HINTS, Tuning, available_memory, check_memory, check_threads
from llminfer.text.tokenizer import Tokenizer

# KV cache types: the GGML type numbers the C core takes
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}
MAX_POSITIONS = 2**31 - 1


def check_positive_int(name, v, allow_none=False):
    if v is None and allow_none:
        return None
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
        raise InvalidArgumentError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {v!r}")
    return int(v)


def _locked(method):
    @wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            if self.ctx is None:
                raise LLMInferError(f"this engine ({self.model_path}) is closed")
            return method(self, *args, **kwargs)
    return run


class RepackWarning(UserWarning):
    """The weights were left in the file's layout: not enough memory for the repacked copy."""


# memory left over after the repacked copy for everything else a process allocates
REPACK_HEADROOM = 256 << 20


def _is_view(want) -> bool:
    """Whether a decode item's logits request is "view" (it may be an array)."""
    return isinstance(want, str) and want == "view"


def _short_repr(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Engine:
    """A model loaded with a paged KV cache for many sequences.

    model: a .gguf path or a known model name (llminfer.hub). n_ctx: most
    tokens one sequence may hold. kv_pool_tokens: positions the KV pool holds
    for all sequences together (default n_ctx). n_batch: most tokens per
    forward pass (cut to kv_pool_tokens where larger). kv_type: "f16"
    (default), "f32", "q8_0" or "q4_0". block_size: positions per KV block.
    n_gpu_layers: layers run on the GPU (the first N; -1: all and the output
    head; 0: none), on device main_gpu (llminfer.core.gpu). repack: rewrite the
    weights at load into the layout the CPU's kernels read fastest, where it
    has such kernels (same results).

    Hybrid models (recurrent layers beside attention: qwen35, lfm2, ...):
    n_seq_max: most sequences alive at once, each holding a slot of the
    state pool; state_checkpoints: copies of its state a sequence keeps so
    that it can go back (truncate, a rejected draft) by running the tokens
    after the latest one again. The pool has n_seq_max * (1 +
    state_checkpoints) slots, its pages touched only as slots are used.

    lora: LoRA adapter files (llminfer.runtime.lora) to load, each a path; a
    sequence turns them on with set_lora (none is on until then)."""

    def __init__(self, model, n_ctx: int = 4096, kv_pool_tokens: int | None = None, n_batch: int = 512,
                 n_threads: int | None = None, kv_type: str = "f16", block_size: int = 32, mmap: bool = True,
                 n_gpu_layers: int = 0, main_gpu: int = 0, repack: bool = True, n_seq_max: int = 64,
                 state_checkpoints: int = 3, lora=None, tuning=None):
        n_ctx = check_positive_int("n_ctx", n_ctx)
        n_batch = check_positive_int("n_batch", n_batch)
        pool = check_positive_int("kv_pool_tokens", kv_pool_tokens, allow_none=True) or n_ctx
        for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("kv_pool_tokens", pool)):
            if v > MAX_POSITIONS:
                raise InvalidArgumentError(f"{name}={v} is more than the {MAX_POSITIONS} positions the engine indexes")
        # a pass writes a KV row per token, so none holds more tokens than the
        # pool: a larger n_batch would only size scratch no pass can use
        n_batch = min(n_batch, pool)
        n_threads = check_threads(n_threads)  # a team larger than the CPUs is capped, with a warning
        if not isinstance(kv_type, str) or kv_type not in KV_TYPES:
            raise InvalidArgumentError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        block_size = check_positive_int("block_size", block_size)
        n_seq_max = check_positive_int("n_seq_max", n_seq_max)
        tuning = Tuning.of(tuning)
        tuning.indices()  # an unknown kind is refused before the model is read
        if (not isinstance(state_checkpoints, int) or isinstance(state_checkpoints, bool)
                or not 0 <= state_checkpoints <= 64):
            raise InvalidArgumentError(f"state_checkpoints must be an integer from 0 to 64, got {state_checkpoints!r}")
        if n_seq_max * (1 + state_checkpoints) > 1 << 20:
            raise InvalidArgumentError(f"n_seq_max={n_seq_max} with {state_checkpoints} checkpoints each is more "
                                       f"than the {1 << 20} state slots a pool holds")
        if block_size & (block_size - 1) or block_size > 1024:
            raise InvalidArgumentError(f"block_size must be a power of two up to 1024, got {block_size}")
        self._lock = threading.RLock()  # calls on one engine run one at a time
        self.ctx = None
        self.model_path = hub.resolve(model)
        self.gguf = GGUFFile(self.model_path, mmap=mmap)
        try:
            self.spec = build_spec(self.gguf, n_ctx=n_ctx)
            # built on first use (a pass over token ids never needs it: the
            # vocabulary's tables are tens of MiB for 262k pieces); what can
            # be checked without building it is checked now
            self._tokenizer_plan = Tokenizer.plan(self.gguf.metadata)
            self._tokenizer = None
            self.n_threads = n_threads
            # a NaN block scale would give finite, wrong logits (csrc/finite.c)
            self.gguf.check_finite()
            self.desc = _core.ModelDesc(self.spec)
            # M-RoPE (qwen2vl): rows carry rope positions apart from their places
            self.mrope = bool(self.spec.rope_sect_t + self.spec.rope_sect_h + self.spec.rope_sect_w +
                              self.spec.rope_sect_e)
            self.desc.watch_faults(self.gguf.fault_token, self.gguf.path)  # a truncation during a pass
            groups = [_core.layer_kv_group(self.desc, i) for i in range(self.spec.n_layer)]
            used = [FULL in groups, SWA in groups]
            window = max((L.sliding_window for L in self.spec.layers), default=0)
            # two blocks of slack: after a context shift a sequence's tokens need not start a block
            n_full = -(-pool // block_size) + 2 if used[FULL] else 0
            # The sliding-window pool never holds more than the full pool plus
            # one partly filled block per sequence; it is mapped, not touched,
            # and hands out its lowest blocks first, so the memory a text uses
            # is what its window needs.
            n_swa = -(-pool // block_size) + 256 if used[SWA] else 0
            self.n_blocks = (n_full, n_swa)
            self.kv_pool_bytes = sum(self.n_blocks[g] * _core.kv_block_bytes(self.desc, KV_TYPES[kv_type], block_size, i)
                                     for i, g in enumerate(groups) if g in (FULL, SWA))  # a recurrent layer: none
            check_memory(self.kv_pool_bytes, f"a KV pool of {pool} positions ({kv_type}); "
                                             f"use a smaller n_ctx or kv_pool_tokens, or kv_type='q8_0'")
            n_gpu, gpu_head = gpu.plan(n_gpu_layers, self.spec.n_layer)
            backend = gpu.backend(main_gpu) if n_gpu else None
            # hybrid models: a slot of recurrent state per sequence and checkpoint
            self.state_slot_bytes = _core.state_slot_bytes(self.desc)
            n_slots = n_seq_max * (1 + state_checkpoints) if self.state_slot_bytes else 0
            self.ctx = _core.Context(self.desc, KV_TYPES[kv_type], block_size, self.n_blocks, n_batch,
                                     self.n_threads, backend, n_gpu, gpu_head, main_gpu, n_slots)
            self.n_gpu_layers = n_gpu  # layers on the GPU (the head too when all are)
            self.tuning = tuning
            # the CPU's weights in the kernels' interleaved layout (csrc/repack.h), the mapped
            # file's pages of the originals handed back; LLMINFER_REPACK=0 keeps the file's rows
            self.repacked_bytes = 0
            if repack and os.environ.get("LLMINFER_REPACK", "1") != "0":
                need = self.desc.repack_size(n_gpu, not gpu_head)
                avail = available_memory()
                if avail is not None and need + REPACK_HEADROOM > avail:
                    # the copy is anonymous memory where the mapped file can be paged
                    # out: a model that fits only as a mapping still runs
                    warnings.warn(f"{self.model_path}: not repacking the weights: the repacked copy needs "
                                  f"{need / 2**30:.2f} GiB and {avail / 2**30:.2f} GiB of memory is available; "
                                  "the file's rows are used as they are (same results, slower)",
                                  RepackWarning, stacklevel=2)
                else:
                    self.repacked_bytes = self.desc.repack(n_gpu, not gpu_head, self.n_threads, mmap)
                    # the embedding's lookups then pread their rows: no fault, no madvise a token
                    at = self.gguf.file_offset(self.spec.tok_embd.data)  # None unless mapped
                    if at is not None:
                        self.desc.embedding_file(self.gguf.descriptor(), at)
        except Exception:
            self.gguf.close()
            raise
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.kv_type = kv_type
        self.block_size = block_size
        self.n_vocab = self.spec.n_vocab
        states = StatePool(n_slots, self.state_slot_bytes) if n_slots else None
        self.kv = KVCache(self.n_blocks, block_size, used, window, self.ctx.copy_block, states, self.ctx)
        self.kv.max_checkpoints = state_checkpoints
        self.hybrid = states is not None
        self.native_seconds = 0.0  # running total of time inside the native forward pass
        self._width = self.n_vocab  # values per output row: n_vocab, or n_embd in hidden_states
        self._logits = np.empty(0, np.float32)  # _logits_buffer's array
        self._ranges = np.empty((0, 2), np.float32)  # each pass's logit ranges (_core.Context.logit_range)
        # step's batch of one: token, position, sequence 0, its logits wanted
        self._one = (np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), np.ones(1, np.int8))
        self.loras = []  # llminfer.runtime.lora.LoRAAdapter, in id order
        if lora:
            try:
                for path in lora:
                    self.add_lora(path)
            except BaseException:
                self.close()
                raise

    # ---- LoRA adapters ----

    @_locked
    def add_lora(self, path) -> int:
        """Load the LoRA adapter at `path` (a GGUF adapter for this model,
        llminfer.runtime.lora); returns its id. It is off for every sequence until
        set_lora turns it on."""
        from llminfer.runtime import lora

        if self.n_gpu_layers:
            raise InvalidArgumentError("LoRA adapters run on the CPU only: load the model with n_gpu_layers=0")
        adapter = lora.load_adapter(path, self.gguf, self.spec)
        self.ctx.set_loras([a.describe() for a in self.loras + [adapter]])
        self.loras.append(adapter)
        return len(self.loras) - 1

    def lora_scales(self, scales):
        """scales ({id: scale}, or a list of scales by id, or None) as the
        float32 array a sequence holds, None when every scale is 0."""
        from llminfer.runtime import lora

        if scales is None:
            return None
        out = np.zeros(len(self.loras), np.float32)
        items = scales.items() if isinstance(scales, dict) else enumerate(scales)
        for i, s in items:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.loras):
                raise InvalidArgumentError(f"no LoRA adapter with id {i!r} ({len(self.loras)} loaded)")
            out[i] = lora.check_scale(s, f"LoRA adapter {i}'s scale")
        return out if out.any() else None

    @_locked
    def set_lora(self, seq: Sequence, scales):
        """The LoRA adapters seq's next tokens run with: {id: scale}, a
        list of scales by id, or None (none). Tokens already in the cache keep
        the keys and values they were computed with."""
        seq.lora = self.lora_scales(scales)

    @property
    def tuning(self) -> Tuning:
        """This engine's host tuning (llminfer.core.system.Tuning): where decode
        hints the weights and where a 2-thread team runs; set it (a Tuning, a
        dict or None for the defaults) between calls. It changes no result."""
        hint, placement, _ = _core.get_tuning(self.ctx)
        return Tuning(STREAM_HINTS[hint], PLACEMENTS[placement])

    @tuning.setter
    def tuning(self, value):
        hint, placement = Tuning.of(value).indices()
        with self._lock:
            _core.set_tuning(self.ctx, hint, placement)

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, built the first time it is asked for."""
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = Tokenizer.from_metadata(self.gguf.metadata, self._tokenizer_plan)
        return self._tokenizer

    @_locked
    def hidden_states(self, seq: Sequence, ids, rows="all") -> np.ndarray:
        """Append ids to seq like decode, but return the final normed hidden
        states (what the output head reads) instead of logits: float32
        [len(ids), n_embd] for rows="all", [n_embd] for "last" (embeddings)."""
        _core.set_hidden_output(self.ctx, True)
        self._width = self.spec.n_embd
        try:
            return self.decode([(seq, ids, rows)])[0]
        finally:
            self._width = self.n_vocab
            _core.set_hidden_output(self.ctx, False)

    # ---- sequences ----

    @_locked
    def new_sequence(self) -> Sequence:
        return self.kv.new_sequence()

    @_locked
    def fork(self, seq: Sequence) -> Sequence:
        """A copy of seq that shares its KV blocks (copy-on-write)."""
        return self.kv.fork(seq)

    @_locked
    def free(self, seq: Sequence):
        self.kv.free(seq)

    @_locked
    def truncate(self, seq: Sequence, n: int):
        """Keep the first n tokens of seq. (A hybrid model's state is brought
        back to them by the next pass over seq: from its latest checkpoint
        at or before n, the tokens after it run again.)"""
        self.kv.truncate(seq, n)

    @_locked
    def checkpoint(self, seq: Sequence):
        """Keep a copy of a hybrid model's state of seq as it is now, to come
        back to (a speculative check, a prompt's end); nothing for other models."""
        if self.hybrid:
            self.kv.checkpoint(seq)

    @_locked
    def bring_state(self, seq: Sequence, n_threads: int | None = None):
        """Make a hybrid model's state of seq current (after a truncate it is
        brought back at the next pass; this does it now). Nothing for other models."""
        if self.hybrid and seq.state_len != len(seq.tokens):
            self._bring_state(seq, n_threads)

    def _bring_state(self, seq: Sequence, n_threads):
        """A hybrid model's state of seq brought back to its tokens after a
        truncate or a failed pass: the latest checkpoint at or before them,
        then the tokens after it again (their keys and values rewritten with
        the same values)."""
        have = self.kv.restore_point(seq)
        crossed = [a for a, b in seq.rows if a < len(seq.tokens) and b > have]
        if crossed:
            raise InvalidArgumentError(
                f"the recurrent state of a sequence of {len(seq.tokens)} tokens cannot be brought back: its "
                f"latest checkpoint is at {have} and the positions from {crossed[0]} on came from embedding rows "
                f"(an image's), which cannot run again as tokens; go back to {crossed[0]} or before "
                f"(Engine.keepable)")
        rest = np.asarray(seq.tokens[have:], dtype=np.int32)
        if len(rest) == 0:
            return
        self.kv.truncate(seq, have)
        seq.state_len = have
        self.decode([(seq, rest, None)], n_threads=n_threads)

    @_locked
    def drop(self, seq: Sequence, first: int, last: int) -> int:
        """Drop tokens [first, last) of seq, whole blocks only, without
        recomputing the rest (a context shift); returns how many went."""
        if self.mrope:  # as llama.cpp, which cannot shift an M-RoPE cache: the rope positions are not places
            return 0
        return self.kv.drop(seq, first, last)

    @_locked
    def kv_usage(self) -> dict:
        return self.kv.usage()

    @_locked
    def kv_cache_bytes(self) -> list:
        """Bytes of KV pool each layer holds."""
        return [self.ctx.kv_bytes(i) for i in range(self.spec.n_layer)]

    # ---- running ----

    def check_ids(self, ids) -> np.ndarray:
        if (type(ids) is np.ndarray and ids.dtype == np.int32 and ids.ndim == 1 and ids.size <= 16
                and ids.flags.c_contiguous):
            # a decode step's few ids, checked in plain Python: right after a
            # pass has streamed the weights through the caches, each numpy
            # reduction below cost tens of microseconds of a token
            for v in ids.tolist():
                if not 0 <= v < self.n_vocab:
                    raise self._outside_vocabulary(v)
            return ids
        # None, a number, text or bytes (whose iteration would give byte values) are no ids
        refused = ids is None or isinstance(ids, (str, bytes, bytearray, memoryview))
        try:
            arr = None if refused else np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        except (TypeError, ValueError):  # not iterable; rows of different lengths
            arr = None
        if arr is None or arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise InvalidArgumentError(f"token ids must be a flat sequence of integers, got "
                                       f"{type(ids).__name__} {_short_repr(ids)}")
        if arr.size and (arr.min() < 0 or arr.max() >= self.n_vocab):
            raise self._outside_vocabulary(int(arr[(arr < 0) | (arr >= self.n_vocab)][0]))
        return np.ascontiguousarray(arr, dtype=np.int32)

    def _outside_vocabulary(self, token_id: int) -> TokenError:
        return TokenError(f"token id {token_id} is outside the vocabulary [0, {self.n_vocab})")

    @_locked
    def decode(self, work, n_threads: int | None = None) -> list:
        """Append tokens to sequences and return their logits.

        work: a list of (seq, ids) or (seq, ids, logits) with logits "last"
        (default: the logits after the last id, float32 [n_vocab]), "all"
        ([len(ids), n_vocab]) or None; or a writable C-contiguous float32
        array [n_vocab] that receives the last logits (the entry returned is
        that array: a caller that keeps one buffer gets no allocation, and
        when the pass has that one row the C core writes it there in place);
        or "view": the last logits as a read-only view of the engine's own
        output, good until its next pass (no copy, no allocation: what a
        server's batch of many sequences wants; a call whose tokens take
        more than one pass gets copies instead).
        Returns one entry per item, in order. The tokens of all items run
        together, n_batch at a time."""
        items = []
        width = self._width
        for w in work:
            seq, ids = w[0], self.check_ids(w[1])
            want = w[2] if len(w) > 2 else "last"
            if isinstance(want, np.ndarray):
                self._check_buffer(want)
            elif want not in ("last", "all", "view", None):
                raise InvalidArgumentError(f"logits must be 'last', 'all', 'view', None or a float32 array, "
                                           f"got {want!r}")
            self._check_room(seq, len(ids))
            items.append((seq, ids, want))
        if len({id(s) for s, _, _ in items}) != len(items):
            raise InvalidArgumentError("a sequence appears twice in one decode call")
        if self.hybrid:
            for seq, ids, _ in items:
                if seq.state_len != len(seq.tokens):
                    self._bring_state(seq, n_threads)
                if len(ids) > 1:  # a prompt's chunk or a speculative check: a point to come back to
                    self.kv.checkpoint(seq)
        if sum(len(ids) for _, ids, _ in items) > self.n_batch:  # a later pass would overwrite a view
            items = [(seq, ids, "last" if _is_view(want) else want) for seq, ids, want in items]
        out = [want if isinstance(want, np.ndarray) else
               np.empty((len(ids), width), np.float32) if want == "all" else
               (np.empty(width, np.float32) if want == "last" and len(ids) else None)
               for _, ids, want in items]
        as_view = {i for i, (_, ids, want) in enumerate(items) if _is_view(want) and len(ids)}
        items = [(seq, ids, "last" if isinstance(want, np.ndarray) or _is_view(want) else want)
                 for seq, ids, want in items]
        nt = self.n_threads if n_threads is None else check_positive_int("n_threads", n_threads)
        # flat batches: each item's tokens in order, items one after another
        done = [0] * len(items)
        pending = [i for i, (_, ids, _) in enumerate(items) if len(ids)]
        while pending:
            budget = self.n_batch
            parts = []  # (item index, start, count)
            for i in pending:
                if budget == 0:
                    break
                n = min(budget, len(items[i][1]) - done[i])
                parts.append((i, done[i], n))
                budget -= n
            self._run(items, parts, out, nt, as_view)
            for i, start, n in parts:
                done[i] = start + n
            pending = [i for i in pending if done[i] < len(items[i][1])]
        return out

    @_locked
    def decode_rows(self, seq: Sequence, ids, rows: np.ndarray, logits: np.ndarray | None = None,
                    n_threads: int | None = None, causal: bool = True, grid=None, first: int = 0):
        """Append input embedding rows (float32 [n, n_embd]: an image's, say)
        to seq, n_batch at a time, in place of the token embeddings; the
        sequence records `ids` (n placeholder ids) as their tokens. logits: a
        float32 [width] buffer that receives the last row's logits, or None.
        Rows are not scaled as token embeddings are (Gemma's sqrt(n_embd)),
        as in llama.cpp. causal=False: each row sees all of them (llama.cpp's
        non-causal image batch, Gemma 3's; in a model whose spec says
        non_causal_swa_only, Gemma 4, in the sliding-window layers only), so
        they run in one pass, at most n_batch of them.
        grid (an M-RoPE model's image, qwen2vl): (nx, ny), the image's rows
        in rows of nx, of which these are rows first.. (an image may come in
        parts): row i takes rope positions (P, P + i // nx, P + i % nx, 0), P
        the rope position of the image's first place, and text after the
        image goes on from P + max(nx, ny) (mtmd's layout)."""
        ids = self.check_ids(ids)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n = len(ids)
        if rows.shape != (n, self.spec.n_embd_inp):
            raise ShapeError(f"embedding rows of shape {rows.shape}, expected ({n}, {self.spec.n_embd_inp})")
        if logits is not None:
            self._check_buffer(logits)
        self._check_room(seq, n)
        if not causal and n > self.n_batch:
            raise InvalidArgumentError(f"{n} rows attended to both ways must run in one pass, of at most "
                                       f"n_batch={self.n_batch}")
        nt = self.n_threads if n_threads is None else check_positive_int("n_threads", n_threads)
        rope, mark = self._image_rope(seq, n, grid, first) if self.mrope else (None, None)
        if self.hybrid:
            if seq.state_len != len(seq.tokens):
                self._bring_state(seq, nt)
            self.kv.checkpoint(seq)  # before the rows: a point to come back to that runs none of them again
        if not causal:
            _core.set_causal(self.ctx, _core.ATTN_NON_CAUSAL_SWA if self.spec.non_causal_swa_only
                             else _core.ATTN_NON_CAUSAL)
        start = len(seq.tokens)
        self._merge_rows(seq, start, start + n)  # before the passes: a failed one leaves its part marked too
        try:
            if mark is not None:  # recorded with the image's first rows, dropped by a truncate into it
                seq.rope_marks = [m for m in seq.rope_marks if m[0] <= seq.next_pos] + [mark]
            self._decode_rows(seq, ids, rows, logits, nt, rope)
        finally:
            if not causal:
                _core.set_causal(self.ctx, _core.ATTN_CAUSAL)
        if self.hybrid:
            self.kv.checkpoint(seq)  # after them: text after the image goes back to here, not across it
        return logits

    def _image_rope(self, seq, n, grid, first):
        """int32 [n, 4]: the rope positions of n rows at seq's next places,
        as text's without a grid, else rows first.. of an image of grid (nx,
        ny), whose mark (the shift of the text after it) is recorded with its
        first rows (the mark returned, or None)."""
        if grid is None:
            p = np.arange(seq.next_pos, seq.next_pos + n, dtype=np.int32) + seq.rope_shift(seq.next_pos)
            return np.ascontiguousarray(np.stack([p, p, p, 0 * p], axis=1), dtype=np.int32), None
        nx, ny = (int(v) for v in grid)
        first = int(first)
        if nx <= 0 or ny <= 0 or first < 0 or first + n > nx * ny:
            raise InvalidArgumentError(f"rows {first}..{first + n} of an image of {nx} x {ny}")
        start = seq.next_pos - first  # the image's first place
        if start < 0:
            raise InvalidArgumentError(f"rows from {first} of an image, in a sequence of {seq.next_pos} places")
        shift = seq.rope_shift(start)
        p0 = start + shift
        i = np.arange(first, first + n)
        out = np.empty((n, 4), np.int32)
        out[:, 0], out[:, 1], out[:, 2], out[:, 3] = p0, p0 + i // nx, p0 + i % nx, 0
        return out, ((start + nx * ny, shift + max(nx, ny) - nx * ny) if first == 0 else None)

    def _text_rope(self, seq, n):
        """int32 [n, 4] of n text tokens at seq's next places, or None when
        they are plain (no image before them)."""
        shift = seq.rope_shift(seq.next_pos)
        if not shift:
            return None
        p = np.arange(seq.next_pos, seq.next_pos + n, dtype=np.int32) + shift
        return np.stack([p, p, p, 0 * p], axis=1).astype(np.int32)

    @staticmethod
    def _merge_rows(seq, a, b):
        """Record [a, b) as positions from rows, one span with the one it continues."""
        if seq.rows and seq.rows[-1][1] == a:
            seq.rows[-1] = (seq.rows[-1][0], b)
        else:
            seq.rows.append((a, b))

    @_locked
    def keepable(self, seq: Sequence, n: int) -> int:
        """The most of seq's first n tokens a truncate can keep and the next
        pass go on from: a hybrid model's state is brought back from a
        checkpoint by running the tokens after it again, which cannot cross
        positions that came from embedding rows (kv_cache.KVCache.keepable)."""
        return self.kv.keepable(seq, n)

    def _decode_rows(self, seq, ids, rows, logits, nt, rope=None):
        n = len(ids)
        start = 0
        while start < n:
            m = min(self.n_batch, n - start)
            self.kv.reserve(seq, m)
            views = [self.kv.table_arrays(seq)]
            pos = np.arange(seq.next_pos, seq.next_pos + m, dtype=np.int32)  # (LoRA scales in the view)
            seq_idx = np.zeros(m, np.int32)
            want = np.zeros(m, np.int8)
            last = logits is not None and start + m == n
            if last:
                want[m - 1] = 1
            out = logits if last else np.empty(0, np.float32)
            seq.state_len = -1  # until the pass is committed: a failed one leaves the state to be brought back
            self.gguf.check_unchanged()
            t = time.perf_counter()
            self.ctx.decode(None, rows[start:start + m], pos, seq_idx, want, views, out, nt,
                            None if rope is None else np.ascontiguousarray(rope[start:start + m]))
            self.native_seconds += time.perf_counter() - t
            self.kv.commit(seq, ids[start:start + m])
            start += m
        if logits is not None:  # a NaN in an mmproj's weights shows here, not as a nonsense token
            check_logits(logits, f"the logits after {n} input rows (positions up to {seq.next_pos - 1})")

    # the most floats _logits_buffer keeps between passes (16 MiB)
    _KEEP_LOGITS = 4 << 20

    def _logits_buffer(self, size, keep=False):
        """The C core's logits output. Up to _KEEP_LOGITS floats it is kept
        between passes: a fresh array of a few hundred KB per token made glibc
        grow and trim its heap each time (brk calls, page faults, zeroed
        pages, and the trim's TLB shootdown interrupting the team on the other
        cores). A larger pass (a prompt's logits for every token) gets an
        array of its own, so it is not held after, unless `keep`: a batch
        of "view" rows (a server's sequences, one row each, every step: 32
        of Gemma 3's 262144 are 32 MiB) keeps its buffer. Callers get
        copies, or views of it."""
        if size > self._KEEP_LOGITS and not keep:
            return np.empty(size, np.float32)
        if self._logits.size < size:
            self._logits = np.empty(size, np.float32)
        return self._logits[:size]

    def _check_room(self, seq: Sequence, n: int):
        if len(seq.tokens) + n > self.n_ctx:
            raise ContextFullError(f"{len(seq.tokens)} tokens in the sequence plus {n} new "
                                   f"{'one' if n == 1 else 'ones'} exceed n_ctx={self.n_ctx}")

    def _native_pass(self, tokens, pos, seq_idx, want, views, logits, n_threads, rope=None):
        """The C core's pass, timed into native_seconds."""
        self.gguf.check_unchanged()  # a file truncated under its mapping would be a SIGBUS
        t = time.perf_counter()
        self.ctx.decode(tokens, None, pos, seq_idx, want, views, logits, n_threads, rope)
        self.native_seconds += time.perf_counter() - t

    def _check_buffer(self, a: np.ndarray):
        """A caller's logits buffer: what the C core may write one row into."""
        width = self._width
        if a.dtype != np.float32 or a.shape != (width,) or not a.flags.c_contiguous or not a.flags.writeable:
            raise InvalidArgumentError(f"a logits buffer must be a writable C-contiguous float32 array of "
                                       f"shape ({width},), got {a.dtype} {a.shape}")

    def _refuse_buffer(self, logits):
        """Raise InvalidArgumentError naming what makes `logits` no buffer for
        one row (the C core refused it, or would have)."""
        if not isinstance(logits, np.ndarray):
            raise InvalidArgumentError(f"logits must be a float32 array, got {type(logits).__name__}")
        self._check_buffer(logits)
        raise InvalidArgumentError(f"a logits buffer must be a writable C-contiguous float32 array of shape "
                                   f"({self._width},)")

    def _check_pass(self, logits, rows, tokens, pos, seq_idx, want, views, n_threads, rope=None):
        """Raise NumericalError if the pass's `rows` rows of logits hold a NaN
        or an infinity (or a row is all one value), naming the step and layer
        that first made one."""
        if len(self._ranges) < rows:
            self._ranges = np.empty((rows, 2), np.float32)
        ranges = self._ranges[:rows]
        # the C core's verdict first: the usual sound pass costs no numpy
        # call (each cost tens of microseconds on caches cold from the pass)
        sound = self.ctx.logit_range(ranges)
        if sound == 1:
            return

        def rerun():  # the same pass, for the probe; the cache stays as it is (llminfer.core.numerics)
            self.ctx.decode(tokens, None, pos, seq_idx, want, views, np.empty_like(logits), n_threads, rope)
        check_logits(logits.reshape(rows, self._width),
                     f"a batch of {len(tokens)} tokens (positions {int(pos.min())}..{int(pos.max())})",
                     locate=lambda **kw: locate_non_finite(self.ctx, rerun, tokens, pos, want, **kw),
                     ranges=ranges if sound == 0 else None)

    @_locked
    def step(self, seq: Sequence, token: int, logits: np.ndarray, n_threads: int | None = None) -> np.ndarray:
        """Append one token to seq and write the logits after it into `logits`
        (a writable C-contiguous float32 array [n_vocab], or [n_embd] with
        hidden states on), which is returned: decode([(seq, [token], logits)])
        for a generation step, without decode's lists and arrays. Right after
        a pass, on caches it left cold, each Python statement costs
        microseconds: decode's general path spent about 100 us of a 135M
        model's ~2.7 ms token outside the C core. Through Context.decode
        and logit_range this one still spent ~40 us of a 1.5 ms token (the
        block tables made arrays 4.6, os.fstat 9.4, the logits check 6.8,
        commit 5.1); through Context.step, file_stamp_is and commit_one, ~10
        (SmolLM2, 2 threads, medians over 2,400 steps)."""
        try:
            token = operator.index(token)  # an int or numpy integer, not a float or a string
        except TypeError:
            raise InvalidArgumentError(f"a token id must be an integer, got {token!r}") from None
        if not 0 <= token < self.n_vocab:
            raise self._outside_vocabulary(token)
        self._check_room(seq, 1)
        nt = self.n_threads if n_threads is None else check_positive_int("n_threads", n_threads)
        if self.hybrid and seq.state_len != len(seq.tokens):
            self._bring_state(seq, nt)
        self.kv.reserve(seq, 1)
        pos = seq.next_pos
        seq.state_len = -1  # until the pass is committed: a failed one leaves the state to be brought back
        self.gguf.check_unchanged()  # a file truncated under its mapping would be a SIGBUS
        groups, tables = self.kv.groups, seq.tables
        t = time.perf_counter()
        try:
            sound = self.ctx.step(token, pos, tables[FULL] if FULL in groups else None,
                                  tables[SWA] if SWA in groups else None, logits, self._width, nt, seq.slot,
                                  seq.lora, seq.rope_shift(pos) if seq.rope_marks else 0)
        except (TypeError, ValueError, BufferError) as e:  # Cython's: not a float32 C-contiguous writable array
            if isinstance(e, LLMInferError):
                raise
            self._refuse_buffer(logits)
            raise
        self.native_seconds += time.perf_counter() - t
        if sound == -2:  # not `width` long: nothing ran
            self._refuse_buffer(logits)
        if sound != 1:
            tokens, pos_a, seq_idx, want = self._one
            tokens[0] = token
            pos_a[0] = pos
            views = [self.kv.table_arrays(seq)]
            self._check_pass(logits, 1, tokens, pos_a, seq_idx, want, views, nt,
                             self._text_rope(seq, 1) if seq.rope_marks else None)
        self.kv.commit_one(seq, token)
        return logits

    def _run(self, items, parts, out, n_threads, as_view=()):
        """One pass of the C core over the tokens of `parts`; the items in
        `as_view` get their last row as a view of the pass's output."""
        views, view_of = [], {}
        for i, start, n in parts:
            seq = items[i][0]
            self.kv.reserve(seq, n)
            view_of[i] = len(views)
            views.append(self.kv.table_arrays(seq))
        for i, _, _ in parts:  # until the pass is committed: a failed one leaves the state to be brought back
            items[i][0].state_len = -1
        total = sum(n for _, _, n in parts)
        tokens = np.empty(total, np.int32)
        pos = np.empty(total, np.int32)
        seq_idx = np.empty(total, np.int32)
        want = np.zeros(total, np.int8)
        dest = []  # (item, row in its output or -1 for "last") per logits row
        # M-RoPE: rope positions where some sequence has an image behind it
        rope = (np.empty((total, 4), np.int32) if self.mrope and any(items[i][0].rope_marks for i, _, _ in parts)
                else None)
        r = 0
        for i, start, n in parts:
            seq, ids, kind = items[i]
            if rope is not None:
                p = np.arange(seq.next_pos, seq.next_pos + n, dtype=np.int32) + seq.rope_shift(seq.next_pos)
                rope[r:r + n, 0] = rope[r:r + n, 1] = rope[r:r + n, 2] = p
                rope[r:r + n, 3] = 0
            tokens[r:r + n] = ids[start:start + n]
            if n == 1:
                pos[r] = seq.next_pos
            else:
                pos[r:r + n] = np.arange(seq.next_pos, seq.next_pos + n, dtype=np.int32)
            seq_idx[r:r + n] = view_of[i]
            if kind == "all":
                want[r:r + n] = 1
                dest.extend((i, start + j) for j in range(n))
            elif kind == "last" and start + n == len(ids):
                want[r + n - 1] = 1
                dest.append((i, -1))
            r += n
        width = self._width
        # one row, the last of its item: written in place into the item's own
        # array (a whole row of a large vocabulary per token, copied no more)
        direct = len(dest) == 1 and dest[0][1] < 0 and dest[0][0] not in as_view
        logits = out[dest[0][0]] if direct else self._logits_buffer(len(dest) * width, keep=bool(as_view))
        self._native_pass(tokens, pos, seq_idx, want, views, logits, n_threads, rope)
        if len(dest):
            self._check_pass(logits, len(dest), tokens, pos, seq_idx, want, views, n_threads, rope)
        if not direct:
            rows = logits.reshape(len(dest), width)
            for k, (i, row) in enumerate(dest):
                if i in as_view:
                    out[i] = rows[k]
                    out[i].flags.writeable = False
                elif row < 0:
                    out[i][:] = rows[k]
                else:
                    out[i][row] = rows[k]
        for i, start, n in parts:
            seq, ids, _ = items[i]
            self.kv.commit(seq, ids[start:start + n])

    # ---- lifetime ----

    def close(self):
        with self._lock:
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _close(self):
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            ctx.close()
        self.ctx = None
        self.desc = None
        g = getattr(self, "gguf", None)
        if g is not None:
            g.close()
