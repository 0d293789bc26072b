"""Continuous batching: one engine thread runs every request's tokens in
shared forward passes.

    sched = Scheduler(engine, deliver, max_batch_tokens=256)
    sched.start()
    sched.submit(Request(prompt_ids, params, max_tokens=64))
    ...                                   # deliver([(request, event), ...]) after each step
    sched.cancel(request)                 # from any thread; its blocks go back at the next step

Each step takes, up to a budget of tokens:
  1. the next token of every running request that is generating (oldest first);
  2. chunks of the prompts of running requests still reading theirs
     (chunked prefill: a long prompt takes several steps and never holds up
     the streams already generating by more than the budget);
  3. new requests from the queue, in order of arrival, while the KV pool has
     the blocks for their whole prompt.
All of it goes to Engine.decode as one batch; then every request whose
pending tokens are all in the cache samples its next token.

A request whose next token needs a block the pool does not have preempts
the youngest running request (possibly itself): its blocks go back, and it
returns to the head of the queue to be recomputed, prompt and tokens so far,
when blocks free up. Its sampler and text carry on where they were, and the
engine's logits do not depend on batching or chunking, so the request's
output is what it would have been alone.

With a PrefixCache, full blocks are kept after their request ends and a new
request adopts the longest cached prefix of its prompt.

The engine thread owns the engine, the KV cache and every Request's state;
other threads only submit, cancel and read `stats`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from llminfer.errors import InvalidArgumentError, LLMInferError
from llminfer.runtime.kv_cache import FULL, SWA
from llminfer.generation.generator import Generator, TokenEvent
from llminfer.generation.sampling import Sampler, SamplingParams
from llminfer.server.metrics import Metrics
from llminfer.server.prefix_cache import PrefixCache, root_key
from llminfer.text.structured import Constraint

_ids = itertools.count()
log = logging.getLogger("llminfer.server")


@dataclass
class FinishEvent:
    """The end of a request: reason "stop", "length", "abort" or "error"
    (then `error` holds the exception); `text` is what was held back."""

    reason: str
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: BaseException | None = None


@dataclass(eq=False)
class Request:
    """One generation. prompt: token ids. stops: stop strings. logprobs:
    None, or how many top alternatives to report with each token (0: only
    the token's own). `out` is free for the caller (the HTTP layer's queue)."""

    prompt: list
    params: SamplingParams
    max_tokens: int
    stops: list = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    grammar: object = None  # a llminfer.text.structured.Grammar the output follows
    reasoning: object = None  # a thinking model's llminfer.text.reasoning.Reasoning (the grammar follows the thinking)
    out: object = None
    non_causal: bool = False  # the prompt's image rows attend to each other both ways (Gemma 3)
    lora: object = None  # the LoRA scales it runs with (float32 [n_lora], Engine.lora_scales), None: none
    rid: int = field(default_factory=lambda: next(_ids))
    # --- engine-thread state ---
    arrival: float = field(default_factory=time.monotonic)
    output: list = field(default_factory=list)
    seq: object = None
    keys: list = field(default_factory=list)  # prefix-cache chain of seq's full blocks
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache, at first admission
    first_token_time: float | None = None
    last_token_time: float | None = None
    submitted: bool = False
    cancelled: bool = False
    done: bool = False

    def tokens(self) -> list:
        """What the sequence must hold: the prompt and every token sampled so far."""
        return self.prompt + self.output

    def pending(self) -> int:
        """Tokens not yet in the KV cache."""
        return len(self.prompt) + len(self.output) - (len(self.seq.tokens) if self.seq is not None else 0)


def _images(req) -> tuple:
    """The ImageSpans of req's prompt (llminfer.vision.prompt.PromptIds)."""
    return getattr(req.prompt, "images", ())


def _span_at(req, start: int, n: int):
    """The first image of req whose positions meet [start, start + n), or None."""
    for span in _images(req):
        if span.end > start and span.start < start + n:
            return span
    return None


def _generator(req: Request, n_vocab: int, tokenizer) -> Generator:
    """A request's sampler, grammar, stop strings and text (made at first
    admission; it lives across preemptions, which recompute the context)."""
    # the grammar's mask for the next token is computed on a worker thread
    # while the forward pass runs (llminfer.text.structured)
    constraint = Constraint(req.grammar, tokenizer, n_vocab) if req.grammar is not None else None
    return Generator(Sampler(req.params, n_vocab), tokenizer, req.stops, constraint, req.prompt, req.logprobs,
                     req.ignore_eos, thinking=None if req.reasoning is None else req.reasoning.tracker())


class Scheduler:
    """Runs requests on an Engine in one thread (see the module's doc).

    deliver(events): called from the engine thread after each step with a
    list of (request, TokenEvent | FinishEvent); it must not block.
    max_batch_tokens: most tokens per step. max_running: most requests in
    the running batch. max_waiting: how many more may wait; submit() refuses
    a request past max_running + max_waiting in flight."""

    def __init__(self, engine, deliver, max_batch_tokens: int = 256, max_running: int = 64,
                 max_waiting: int = 256, prefix_caching: bool = True, metrics: Metrics | None = None):
        if max_batch_tokens < 1 or max_running < 1 or max_waiting < 0:
            raise InvalidArgumentError("max_batch_tokens and max_running must be >= 1, max_waiting >= 0")
        self.engine = engine
        self.kv = engine.kv
        self.deliver = deliver
        self.max_batch_tokens = max_batch_tokens
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.metrics = metrics
        # sliding-window layers give blocks back as a text moves on: no prefix cache for them
        self.cache = PrefixCache(self.kv) if prefix_caching and SWA not in self.kv.groups else None
        self.tokenizer = engine.tokenizer
        self.eog = engine.tokenizer.eog_ids
        self._cond = threading.Condition()
        self._inbox: deque = deque()
        self._cancels: deque = deque()
        self._calls: deque = deque()  # (fn, Future, blocks): work run on the engine thread between steps
        self._stop = False
        self._thread = None
        self._in_flight = 0  # submitted and not finished
        self.waiting: deque = deque()
        self.running: list = []  # in order of arrival
        self._runs: dict = {}
        self.steps = 0
        self.stats = self._stats()

    # ---- other threads ----

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="llminfer-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0):
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop

    def submit(self, req: Request) -> bool:
        """Queue a request; False when the queue is full (the caller answers 429).
        A request that could never run raises here, before it can reach a
        batch it would fail with the others in it."""
        n_ctx = self.engine.n_ctx
        if not req.prompt or len(req.prompt) >= n_ctx:
            raise InvalidArgumentError(f"a prompt must have 1 to {n_ctx - 1} tokens, got {len(req.prompt)}")
        if not isinstance(req.max_tokens, int) or req.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be a positive integer, got {req.max_tokens!r}")
        images = _images(req)
        req.prompt = [int(t) for t in self.engine.check_ids(req.prompt)]
        if images:  # the image rows' positions (llminfer.vision.prompt.PromptIds)
            from llminfer.vision.prompt import PromptIds

            req.prompt = PromptIds(req.prompt)
            req.prompt.images = images
        with self._cond:
            if self._in_flight >= self.max_waiting + self.max_running:
                return False
            self._in_flight += 1
            req.submitted = True
            self._inbox.append(req)
            self._cond.notify()
        return True

    def call(self, fn, blocks: int = 0) -> Future:
        """Run fn(engine) on the engine thread between two steps (one call a
        step, in order), where it owns the engine and the KV pool: it may
        hold up to `blocks` blocks at a time (the prefix cache gives back
        what it must), and frees them before it returns. A Future of its
        result."""
        fut = Future()
        with self._cond:
            if self._stop:
                raise InvalidArgumentError("the engine is not running")
            self._calls.append((fn, fut, blocks))
            self._cond.notify()
        return fut

    def cancel(self, req: Request):
        """Stop a request (its client went away); its blocks go back before the next step."""
        with self._cond:
            if not req.submitted or req.done:
                return
            req.cancelled = True
            self._cancels.append(req)
            self._cond.notify()

    # ---- the engine thread ----

    def _loop(self):
        while True:
            with self._cond:
                while not (self._stop or self._inbox or self._cancels or self._calls or self.running
                           or self.waiting):
                    self._cond.wait()
                if self._stop:
                    break
                arrivals = list(self._inbox)
                self._inbox.clear()
                cancels = list(self._cancels)
                self._cancels.clear()
                # one call a step, so that a long run of them (an embeddings
                # request of many inputs) does not stall the streams
                call = self._calls.popleft() if self._calls else None
            if call is not None:
                self._call(*call)
            events = []
            try:
                self.waiting.extend(arrivals)
                for r in cancels:
                    self._finish(r, "abort", events)
                self._step(events)
            except Exception as e:  # noqa: BLE001 - the engine thread must outlive any one request
                log.exception("engine step failed; failing the requests in flight")
                try:
                    self._fail_all(e, events)
                except Exception:  # noqa: BLE001
                    log.exception("could not fail the requests in flight")
            try:
                self.stats = self._stats()
                if events:
                    self.deliver(events)
            except Exception:  # noqa: BLE001
                log.exception("could not deliver a step's events")
        for _, fut, _ in self._calls:
            if fut.set_running_or_notify_cancel():  # (one its caller cancelled is done already)
                fut.set_exception(InvalidArgumentError("the engine stopped"))
        events = []
        for r in list(self.running) + list(self.waiting) + list(self._inbox):
            self._finish(r, "abort", events)
        if self.cache is not None:
            self.cache.clear()
        if events:
            self.deliver(events)

    def _call(self, fn, fut, blocks):
        if not fut.set_running_or_notify_cancel():
            return
        try:
            self._make_room(blocks)
            fut.set_result(fn(self.engine))
        except BaseException as e:  # noqa: BLE001 - the caller's to answer
            fut.set_exception(e)

    def _stats(self) -> dict:
        pool = self.kv.pools[FULL] if FULL in self.kv.groups else self.kv.pools[SWA]
        cached_only = self.cache.evictable() if self.cache is not None else 0
        states = self.kv.states
        return {
            "state_slots": states.n_slots if states is not None else 0,
            "state_used_slots": states.used_slots if states is not None else 0,
            "state_slot_bytes": states.slot_bytes if states is not None else 0,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_blocks": pool.n_blocks,
            "kv_used_blocks": pool.used_blocks - cached_only,
            "kv_usage": (pool.used_blocks - cached_only) / pool.n_blocks if pool.n_blocks else 0.0,
            "prefix_blocks": len(self.cache) if self.cache is not None else 0,
            "prefix_queries": self.cache.queries if self.cache is not None else 0,
            "prefix_hits": self.cache.hits if self.cache is not None else 0,
            "steps": self.steps,
        }

    # free blocks per group, counting those the prefix cache would give back
    def _available(self, planned) -> list:
        out = [0, 0]
        for g in self.kv.groups:
            out[g] = self.kv.pools[g].free_blocks - planned[g]
        if self.cache is not None:
            out[FULL] += self.cache.evictable()
        return out

    @staticmethod
    def _fits(need, avail) -> bool:
        return need[FULL] <= avail[FULL] and need[SWA] <= avail[SWA]

    def _step(self, events):
        budget = self.max_batch_tokens
        planned = [0, 0]
        work = {}  # request -> tokens to compute this step

        def plan(req, n) -> bool:
            need = self.kv.blocks_needed(req.seq, n)
            if (need[FULL] or need[SWA]) and not self._fits(need, self._available(planned)):
                return False
            planned[FULL] += need[FULL]
            planned[SWA] += need[SWA]
            work[req] = n
            return True

        # 1 and 2: running requests, generating ones first, oldest first
        order = sorted(self.running, key=lambda r: r.pending() > 1)
        for req in order:
            if budget == 0:
                break
            if req not in self.running:
                continue  # preempted below by an older request
            n = self._chunk(req, min(req.pending(), budget))
            if n == 0:
                continue  # an image's rows wait for a step with room for all of them
            while not plan(req, n):
                victim = self._youngest(exclude=work)
                if victim is None:
                    victim = req
                self._preempt(victim)
                if victim is req:
                    break
            else:
                budget -= n
        # 3: admit from the queue while the pool has room for a whole prompt
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            if not self._admit(req, budget, planned, work, events):
                break
            budget -= work.get(req, 0)
        if not work:
            if self.waiting and not self.running:
                # nothing runs and the head of the queue does not fit: it never will
                req = self.waiting.popleft()
                self._finish(req, "error", events, InvalidArgumentError(
                    f"a prompt of {len(req.prompt)} tokens does not fit in the KV pool "
                    f"({self.kv.pools[FULL].n_blocks} blocks of {self.kv.block_size})"))
            return
        self._make_room(planned[FULL])
        self._run(work, events)

    def _chunk(self, req, n: int) -> int:
        """n tokens of req for this step, or fewer so that a hybrid model's
        prompt pass ends on its last full block (that block's recurrent
        state is what the prefix cache keeps of the prompt), and so that a
        chunk of a prompt with images is all tokens or all one image's rows."""
        span = _span_at(req, len(req.seq.tokens), n)
        if span is not None:
            start = len(req.seq.tokens)
            if span.start > start:
                return span.start - start
            # rows that attend to each other both ways run in one pass: all of them, or wait for a step
            # with the room (the server refuses an image larger than a pass)
            return 0 if req.non_causal and span.end - start > n else min(n, span.end - start)
        if self.cache is None or not self.cache.hybrid:
            return n
        start, bs = len(req.seq.tokens), self.kv.block_size
        edge = (len(req.prompt) - 1) // bs * bs  # a match leaves a token after it
        return edge - start if start < edge < start + n else n

    def _make_room(self, blocks: int):
        """Free blocks for `blocks` of the full-attention pool, giving back
        cached blocks nobody holds as needed (the cache exists only for
        models whose layers are all full-attention)."""
        if self.cache is not None:
            short = blocks - self.kv.pools[FULL].free_blocks
            if short > 0:
                self.cache.evict(short)

    def _youngest(self, exclude):
        for r in reversed(self.running):
            if r not in exclude:
                return r
        return None

    def _admit(self, req, budget, planned, work, events) -> bool:
        """Take req, the head of the queue, into the running batch if the pool
        has room for its whole prompt; False (req stays queued) if not."""
        eng = self.engine
        if req.rid not in self._runs:
            try:
                self._runs[req.rid] = _generator(req, eng.n_vocab, self.tokenizer)
            except LLMInferError as e:
                self._finish(req, "error", events, e)  # takes it off the queue
                return True
        if req.seq is None:
            req.seq = eng.kv.new_sequence()
            req.seq.lora = req.lora
            req.keys = []
            if self.cache is not None and not _images(req):  # an image's positions hold placeholder ids
                keys, blocks = self.cache.match(req.tokens(), root_key(req.lora))
                if blocks:
                    toks = req.tokens()[:len(blocks) * self.kv.block_size]
                    if self.cache.hybrid:
                        eng.kv.adopt_with_state(req.seq, toks, blocks, self.cache.state_for(keys[-1]))
                    else:
                        eng.kv.adopt(req.seq, toks, blocks)
                    req.keys = keys
            if req.cached_tokens is None:
                req.cached_tokens = len(req.seq.tokens)
        total = self.kv.blocks_needed(req.seq, req.pending() + 1)
        n = self._chunk(req, min(req.pending(), budget))
        avail = self._available(planned)
        if not self._fits(total, avail):
            # wait for blocks; what was adopted goes back (and stays cached)
            self.kv.free(req.seq)
            req.seq = None
            return False
        need = self.kv.blocks_needed(req.seq, n)
        planned[FULL] += need[FULL]
        planned[SWA] += need[SWA]
        work[req] = n
        if self.cache is not None:
            self.cache.count(len(req.prompt) + len(req.output), len(req.seq.tokens))
        self.waiting.popleft()
        self.running.append(req)
        self.running.sort(key=lambda r: r.arrival)
        return True

    def _preempt(self, req):
        """Give back req's blocks and queue it again at the head, to be recomputed."""
        self.running.remove(req)
        if req.seq is not None:
            self.kv.free(req.seq)
            req.seq = None
        req.keys = []
        self.waiting.appendleft(req)
        if self.metrics is not None:
            self.metrics.on_preemption()

    def _image_rows(self, work, events) -> dict:
        """The chunks of `work` that are an image's rows, each run in a pass
        of its own (a batch is all tokens or all rows): {request: logits or
        None}; a request whose pass fails is finished and left out."""
        out = {}
        for req, n in list(work.items()):
            start = len(req.seq.tokens)
            span = _span_at(req, start, n)
            if span is None or span.start > start:
                continue
            last = n == req.pending()
            try:
                lg = np.empty(self.engine.n_vocab, np.float32) if last else None
                self.engine.decode_rows(req.seq, np.asarray(req.tokens()[start:start + n], dtype=np.int32),
                                        span.rows[start - span.start:start - span.start + n], lg,
                                        causal=not req.non_causal, grid=span.grid, first=start - span.start)
                out[req] = lg
            except Exception as e:  # noqa: BLE001 - this request fails; the server goes on
                log.exception("an image's pass failed")
                del work[req]
                self._finish(req, "error", events, e)
        return out

    def _run(self, work, events):
        rows = self._image_rows(work, events) if any(_images(r) for r in work) else {}
        items = []
        for req, n in work.items():
            if req in rows:
                continue
            start = len(req.seq.tokens)
            ids = np.asarray(req.tokens()[start:start + n], dtype=np.int32)
            # a view of the engine's output, read before the next step: a
            # copy into a fresh array for each request at each step took
            # ~40% of the engine thread's Python (Gemma 3, 32 requests)
            items.append((req.seq, ids, "view" if n == req.pending() else None))
        try:
            logits = self.engine.decode(items) if items else []
        except Exception as e:  # noqa: BLE001 - the step's requests fail; the server goes on
            log.exception("a forward pass of %d requests failed", len(work))
            for req in list(work):
                if req not in rows:
                    self._finish(req, "error", events, e)
            work = {r: n for r, n in work.items() if r in rows}
            logits = []
        self.steps += 1
        now = time.monotonic()
        generated = 0
        logits = iter(logits)
        for req in list(work):
            lg = rows[req] if req in rows else next(logits)
            if self.cache is not None and not _images(req):
                req.keys = self.cache.insert(req.seq, req.keys)
            if lg is None:
                continue  # a prompt chunk; more to come
            try:
                generated += self._sample(req, lg, now, events)
            except Exception as e:  # noqa: BLE001 - bad parameters end this request only
                self._finish(req, "error", events, e)
        if self.metrics is not None and generated:
            self.metrics.on_tokens(generated, now)

    def _sample(self, req, logits, now, events) -> int:
        gen = self._runs[req.rid]
        tok = gen.next_token(logits)
        if self.metrics is not None:
            if req.first_token_time is None:
                self.metrics.on_first_token(now - req.arrival)
            else:
                self.metrics.on_inter_token(now - req.last_token_time)
        if req.first_token_time is None:
            req.first_token_time = now
        req.last_token_time = now
        event, reason = gen.emit(tok, logits)
        if event is not None:
            req.output.append(tok)
            events.append((req, event))
        if reason is None and (len(req.output) >= req.max_tokens or len(req.seq.tokens) + 1 > self.engine.n_ctx):
            reason = "length"
        if reason is not None:
            self._finish(req, reason, events)
        return 1

    def _finish(self, req, reason, events, error=None):
        """End req: its blocks go back at once, a FinishEvent goes out."""
        if req.done:
            return
        req.done = True
        with self._cond:
            self._in_flight -= 1
        if req in self.running:
            self.running.remove(req)
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        if req.seq is not None:
            self.kv.free(req.seq)
            req.seq = None
        gen = self._runs.pop(req.rid, None)
        text = ""
        if gen is not None:
            text, reason = gen.finish(reason)
        events.append((req, FinishEvent(reason, text, len(req.prompt), len(req.output), req.cached_tokens or 0,
                                        error)))
        if self.metrics is not None:
            self.metrics.on_finished(reason, len(req.prompt), time.monotonic() - req.arrival)

    def _fail_all(self, exc, events):
        """A fault outside any one request: fail every request in flight, so
        their blocks go back and their clients hear of it."""
        for r in list(self.running) + list(self.waiting):
            try:
                self._finish(r, "error", events, exc)
            except Exception:  # noqa: BLE001 - the others still go
                log.exception("could not end request %d", r.rid)
                r.done = True
                for q in (self.running, self.waiting):
                    if r in q:
                        q.remove(r)
