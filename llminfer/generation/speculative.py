"""Speculative decoding: several tokens per forward pass, the output unchanged.

Decode on a CPU is bound by the weights it reads, and a pass over k + 1
tokens reads them once. So a cheap guess of the next k tokens (a *draft*) is
checked in one pass of the model (the *target*): the pass gives the target's
logits after the pending token and after each drafted one, the drafts are
accepted from the left while the target agrees, and the first disagreement
is replaced by the target's own choice. Each pass yields between 1 and k + 1
tokens; the rejected positions are rolled back out of the KV cache
(KVCache.truncate).

Two drafters:

- "ngram": prompt lookup (llama.cpp's lookup decoding). The prompt and the
  text so far are indexed by n-grams (n = 1..4); the next token is drafted
  when the last n tokens were seen before and one follower dominates them
  (llama.cpp's "lax" thresholds: at least 2, 2, 1, 1 occurrences and 66, 50,
  50, 50 percent for n = 1..4; the longest n-gram that passes wins). Free,
  and strong when the output repeats its input: code edits, quotes.
- "draft": a smaller model with the same vocabulary (DraftModel), run one
  token at a time in its own engine; it stops drafting when its most likely
  token has less than p_min probability.

Exactness. The engine is batch-invariant: the logits of a row of the
verification pass are bit for bit those a one-token pass would give. So:

- Drafts that are a point mass (n-gram drafts; a draft model with greedy
  sampling) are checked by sampling each row with the caller's Sampler,
  exactly as plain decoding would, and accepting while the sample equals the
  draft. That is the speculative-sampling rule for a point-mass q (accept
  with p(d), on rejection draw from p without d, renormalised), and it takes
  the same random numbers in the same order as plain decoding: greedy or
  seeded, the tokens are those of non-speculative generation, one for one.
- A draft model that samples draws d from its own distribution q (the same
  SamplingParams applied to its logits) and the target accepts with
  probability min(1, p(d) / q(d)), else draws from norm(max(0, p - q)), where
  p is the target's distribution after the whole sampler chain (bias,
  penalties over the history including the drafts before, top-k, top-p,
  min-p, temperature: Sampler.probabilities). The output distribution is
  that of plain sampling (Leviathan et al. 2023; Chen et al. 2023); the
  tokens of a given seed differ.

Cost control. Every step is timed. Steps without drafts give the cost of a
plain step; a step with drafts gains (tokens it yields) - (its time / a plain
step's time) tokens. When the running mean gain of drafting steps drops
below zero, drafting pauses for 16 steps, then 32, ... up to 512 while it
keeps failing, so text that does not repeat (a story) pays for a few probes
only. The draft length adapts too: it doubles (up to draft_max) after a
fully accepted draft, drops to one past the accepted count after a
rejection, and to 2 when drafting pauses (so that probes are cheap).

Interface for a scheduler. One Speculator per sequence; per step:

    drafts = spec.propose(history, limit)      # list of draft ids, maybe []
    rows = <decode [pending] + drafts, logits "all"> -> float32 [1 + len(drafts), n_vocab]
    out = spec.accept(rows, history)           # the tokens this step yields
    <truncate the sequence by len(drafts) - (len(out) - 1)>

`history` is every token so far (prompt and generated) ending with the
pending token (sampled, not yet fed to the target); `limit` caps the drafts
(tokens still wanted, room in the context, and at most the KV block size, so
that a rollback never reaches past the sliding-window slack). out[:-1] are
accepted drafts (already in the KV cache), out[-1] is the new pending token.
Call accept exactly once after each propose. A scheduler batches the verify
rows of many sequences into one Engine.decode call; the wall time between
propose and accept is what the cost control sees (pass `seconds=` to accept
to give it the sequence's share instead). `start(history)` indexes the
prompt (and prefills a draft model) once, before the first propose.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, VocabularyMismatchError
from llminfer.generation.sampling import Sampler

MODES = ("ngram", "draft")

# llama.cpp's lax thresholds of its context cache (common/ngram-cache.cpp),
# for n = 1, 2, 3, 4: fewest occurrences of the n-gram, and the smallest
# share (percent) of them the drafted follower must have.
NGRAM_MIN_COUNT = (2, 2, 1, 1)
NGRAM_MIN_PERCENT = (66, 50, 50, 50)
NGRAM_MAX = len(NGRAM_MIN_COUNT)


def _check_int(name, v, lo, hi):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not lo <= v <= hi:
        raise InvalidArgumentError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return int(v)


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate. mode: "ngram" or "draft". draft_max: most tokens
    drafted per pass (at most 32, the KV block size). ngram_min/ngram_max:
    n-gram lengths the lookup tries (1..4). p_min: a draft model stops
    drafting when its most likely next token is less likely than this.
    adaptive: the cost control and adaptive draft length (off: always draft
    up to draft_max, as tests of exactness want)."""

    mode: str = "ngram"
    draft_max: int = 16
    ngram_min: int = 1
    ngram_max: int = NGRAM_MAX
    p_min: float = 0.75
    adaptive: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise InvalidArgumentError(f"speculative mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _check_int("draft_max", self.draft_max, 1, 32)
        _check_int("ngram_min", self.ngram_min, 1, NGRAM_MAX)
        _check_int("ngram_max", self.ngram_max, self.ngram_min, NGRAM_MAX)
        if not isinstance(self.p_min, (int, float)) or isinstance(self.p_min, bool) or not 0.0 <= self.p_min <= 1.0:
            raise InvalidArgumentError(f"p_min must be a number in [0, 1], got {self.p_min!r}")
        if not isinstance(self.adaptive, bool):
            raise InvalidArgumentError(f"adaptive must be True or False, got {self.adaptive!r}")


@dataclass
class SpecStats:
    """Counts of one generation: tokens drafted, drafts accepted, passes that
    carried drafts, and steps run without drafting while paused."""

    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0
    paused_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


# ---- drafters ----

class NGramIndex:
    """Followers of every n-gram (n_min..n_max) of a token list, counted as
    the list grows."""

    def __init__(self, n_min: int = 1, n_max: int = NGRAM_MAX):
        self.n_min, self.n_max = n_min, n_max
        # per n: n-gram tuple -> {follower: count}, and n-gram -> latest follower
        self.counts = {n: {} for n in range(n_min, n_max + 1)}
        self.latest = {n: {} for n in range(n_min, n_max + 1)}
        self.n_indexed = 0  # tokens of the history already counted

    def extend(self, history):
        """Count the followers of the tokens history[n_indexed:]."""
        for j in range(self.n_indexed, len(history)):
            t = history[j]
            for n in range(self.n_min, min(self.n_max, j) + 1):
                key = tuple(history[j - n:j])
                table = self.counts[n].get(key)
                if table is None:
                    self.counts[n][key] = {t: 1}
                else:
                    table[t] = table.get(t, 0) + 1
                self.latest[n][key] = t
        self.n_indexed = len(history)

    def follower(self, tail) -> int | None:
        """The drafted follower of the token list `tail` (its last n_max
        tokens matter), or None when no n-gram passes the thresholds."""
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            key = tuple(tail[-n:])
            table = self.counts[n].get(key)
            if table is None:
                continue
            total = sum(table.values())
            best = max(table.values())
            if total < NGRAM_MIN_COUNT[n - 1] or 100 * best < NGRAM_MIN_PERCENT[n - 1] * total:
                continue
            recent = self.latest[n][key]
            return recent if table[recent] == best else max(table, key=table.get)
        return None

    def draft(self, history, limit: int) -> list:
        """Up to `limit` tokens to follow history, each looked up after the ones before."""
        self.extend(history)
        tail = list(history[-self.n_max:])
        out = []
        while len(out) < limit:
            t = self.follower(tail)
            if t is None:
                break
            out.append(t)
            tail = tail[1:] + [t] if len(tail) >= self.n_max else tail + [t]
        return out


def _same_vocabulary(target: Engine, draft: Engine):
    """Raise VocabularyMismatchError unless both models have the same tokens."""
    a = target.gguf.metadata.get("tokenizer.ggml.tokens")
    b = draft.gguf.metadata.get("tokenizer.ggml.tokens")
    where = f"the draft model {draft.model_path} and the model {target.model_path}"
    if target.n_vocab != draft.n_vocab:
        raise VocabularyMismatchError(f"{where} have different vocabularies: {draft.n_vocab} and "
                                      f"{target.n_vocab} logits; a draft model must share the model's vocabulary")
    if a is None or b is None or len(a) != len(b):
        raise VocabularyMismatchError(f"{where} have different vocabularies "
                                      f"({'no token list' if a is None or b is None else f'{len(b)} and {len(a)} tokens'})")
    if a == b:  # two StringArrays compare their bytes at once
        return
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            raise VocabularyMismatchError(f"{where} have different vocabularies: token {i} is {y!r} in the "
                                          f"draft and {x!r} in the model")


class DraftModel:
    """A smaller model with the target's vocabulary, in its own engine with one
    sequence that follows the text being generated.

    model: a .gguf path or known name; target: the target's Engine (its
    vocabulary is checked against this one's, VocabularyMismatchError
    otherwise). The rest as Engine's."""

    def __init__(self, model, target: Engine, n_ctx: int, n_threads: int | None = None, n_batch: int = 512,
                 kv_type: str = "f16"):
        self.engine = Engine(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, kv_type=kv_type)
        try:
            _same_vocabulary(target, self.engine)
        except Exception:
            self.engine.close()
            raise
        self.model_path = self.engine.model_path
        self.seq = self.engine.new_sequence()
        self.user = None  # the Speculator that last moved the sequence
        self.n_threads = self.engine.n_threads  # the LLM sets its own

    def _keep_common(self, history, user, most: int) -> int:
        """Truncate the sequence to the prefix it shares with history (at most
        `most` tokens); returns its length."""
        held = self.seq.tokens
        n = len(held)
        if user is self.user and n <= most and (not n or held[n - 1] == history[n - 1]):
            return n  # it only ever moves forward along this user's text
        m = min(n, most)
        diff = np.flatnonzero(np.asarray(held[:m], dtype=np.int64) != np.asarray(history[:m], dtype=np.int64))
        n = int(diff[0]) if diff.size else m
        if n and (self.seq.positions[n - 1] != n - 1 or not self.engine.kv.can_truncate(self.seq, n)):
            n = 0
        self.engine.truncate(self.seq, n)
        self.user = user
        return n

    def fits(self, n_tokens: int) -> bool:
        return n_tokens <= self.engine.n_ctx

    def prefill(self, history, user):
        """Make the sequence hold `history` (no logits)."""
        n = self._keep_common(history, user, len(history))
        self.engine.decode([(self.seq, history[n:], None)], n_threads=self.n_threads)

    def sync(self, history, user) -> np.ndarray:
        """Make the sequence hold `history` and return the logits after it."""
        n = self._keep_common(history, user, len(history) - 1)
        return self.engine.decode([(self.seq, history[n:])], n_threads=self.n_threads)[0]

    def feed(self, token) -> np.ndarray:
        return self.engine.decode([(self.seq, [token])], n_threads=self.n_threads)[0]

    def rollback(self, n: int):
        if n < len(self.seq.tokens):
            self.engine.truncate(self.seq, n)

    def close(self):
        self.engine.close()


def _max_prob(logits: np.ndarray) -> float:
    """The largest softmax probability of logits (temperature 1)."""
    top = float(logits.max())
    return 1.0 / float(np.exp(logits - top, dtype=np.float32).sum(dtype=np.float64))


# ---- the cost control ----

class _Ledger:
    """Whether drafting pays, from the wall time of the steps (see the module
    docstring). record() is called once per step."""

    PLAIN_KEPT = 8        # plain steps whose median is the baseline
    REMEASURE = 64        # drafting steps before a plain step measures the baseline again
    MIN_STEPS = 4         # drafting steps before the gain is judged
    ALPHA = 0.25          # weight of the newest step in the running gain
    PAUSE_MIN, PAUSE_MAX = 16, 512

    def __init__(self):
        self.plain = deque(maxlen=self.PLAIN_KEPT)
        self.since_plain = 0
        self.gain = 0.0       # running mean of tokens gained per drafting step
        self.n_spec = 0       # drafting steps since drafting last resumed
        self.pause = 0        # steps left before drafting resumes
        self.next_pause = self.PAUSE_MIN

    def may_draft(self) -> bool:
        return self.pause == 0 and len(self.plain) > 0 and self.since_plain < self.REMEASURE

    def record(self, seconds: float, n_tokens: int, drafted: bool):
        if self.pause > 0:
            self.pause -= 1
        if not drafted:
            self.plain.append(seconds)
            self.since_plain = 0
            return
        self.since_plain += 1
        g = n_tokens - seconds / max(statistics.median(self.plain), 1e-9)
        self.gain = g if self.n_spec == 0 else self.gain + self.ALPHA * (g - self.gain)
        self.n_spec += 1
        if self.n_spec >= self.MIN_STEPS and self.gain < 0:
            self.pause = self.next_pause
            self.next_pause = min(2 * self.next_pause, self.PAUSE_MAX)
            self.n_spec = 0
        elif self.n_spec >= 4 * self.MIN_STEPS:
            self.next_pause = self.PAUSE_MIN  # it pays: a later bad patch starts short pauses again


# ---- one sequence ----

class Speculator:
    """Speculative decoding state of one sequence: the drafter, the draft
    length, the cost control and the counts (SpecStats).

    sampler: the sequence's Sampler (its parameters are the target
    distribution; its random stream is the one plain decoding would use).
    draft: a DraftModel, for mode "draft"."""

    def __init__(self, config: SpecConfig, sampler: Sampler, draft: DraftModel | None = None,
                 _accept_rule=None):
        if not isinstance(config, SpecConfig):
            raise InvalidArgumentError(f"config must be a SpecConfig, got {type(config).__name__}")
        if config.mode == "draft" and draft is None:
            raise InvalidArgumentError("speculative mode 'draft' needs a draft model (LLM(..., draft_model=...))")
        self.config = config
        self.sampler = sampler
        self.draft = draft if config.mode == "draft" else None
        self.ngrams = NGramIndex(config.ngram_min, config.ngram_max) if config.mode == "ngram" else None
        self.stats = SpecStats()
        self.cap = min(4, config.draft_max) if config.adaptive else config.draft_max
        self.ledger = _Ledger()
        self._draft_sampler = None
        if self.draft is not None:
            p = sampler.params
            seed = None if p.seed is None else int(np.random.SeedSequence([p.seed, 0x5EC]).generate_state(1)[0])
            self._draft_sampler = Sampler(p.replace(seed=seed), sampler.n_vocab)
        self._accept_rule = _accept_rule or _accept_ratio  # tests put a wrong rule here to see it caught
        self._step = None  # (drafts, qs, len(history), start time) between propose and accept
        self._draft_off = False

    @property
    def point_mass(self) -> bool:
        """Whether drafts are point masses (checked by plain sampling)."""
        return self.draft is None or self.sampler.params.is_greedy

    def start(self, history):
        """Index the prompt (and prefill the draft model); before the first propose."""
        if self.ngrams is not None:
            self.ngrams.extend(history)
        elif self.draft.fits(len(history) + self.config.draft_max + 1):
            self.draft.prefill(list(history), self)
        else:
            self._draft_off = True

    def propose(self, history, limit: int) -> list:
        """Draft ids to verify after history's last (pending) token; [] for a plain step."""
        t0 = time.perf_counter()
        limit = min(limit, self.cap)
        drafts, qs = [], None
        if limit <= 0 or (self.config.adaptive and not self.ledger.may_draft()):
            if self.ngrams is not None:
                self.ngrams.extend(history)
            if limit > 0 and self.ledger.pause > 0:
                self.stats.paused_steps += 1
        elif self.ngrams is not None:
            drafts = self.ngrams.draft(history, limit)
        elif not self._draft_off:
            drafts, qs = self._draft_from_model(history, limit)
        self._step = (drafts, qs, len(history), t0)
        return drafts

    def _draft_from_model(self, history, limit):
        d = self.draft
        if not d.fits(len(history) + limit):
            self._draft_off = True  # past the draft's context (after a context shift): plain from here
            return [], None
        logits = d.sync(history, self)
        hist = list(history)
        drafts, qs = [], [] if not self.point_mass else None
        ds = self._draft_sampler
        while True:
            if _max_prob(logits) < self.config.p_min:
                break
            if qs is None:
                t = ds.sample(logits, hist)
            else:
                q = ds.probabilities(logits, hist)
                t = ds.draw(q)
                qs.append(q)
            drafts.append(t)
            hist.append(t)
            if len(drafts) == limit:
                break
            logits = d.feed(t)
        return drafts, qs

    def accept(self, rows: np.ndarray, history, seconds: float | None = None) -> list:
        """The tokens this step yields, given the target's logits `rows`
        (float32 [1 + len(drafts), n_vocab]) after the pending token and
        after each draft: the accepted drafts, then one token of the target's."""
        if self._step is None:
            raise InvalidArgumentError("accept() without a propose() before it")
        drafts, qs, n_hist, t0 = self._step
        self._step = None
        if rows.shape[0] != len(drafts) + 1:
            raise InvalidArgumentError(f"accept() needs {len(drafts) + 1} rows of logits (the pending token "
                                       f"and {len(drafts)} drafts), got {rows.shape[0]}")
        hist = list(history)
        out = []
        if qs is None:
            for i in range(len(drafts) + 1):
                t = self.sampler.sample(rows[i], hist)
                out.append(t)
                if i == len(drafts) or t != drafts[i]:
                    break
                hist.append(t)
        else:
            out = self._accept_sampled(rows, drafts, qs, hist)
        m = len(out) - 1  # drafts accepted
        if self.draft is not None:
            # the draft holds history and drafts[:-1]; keep what was accepted
            self.draft.rollback(n_hist + min(m, max(len(drafts) - 1, 0)))
        if drafts:
            self.stats.drafted += len(drafts)
            self.stats.accepted += m
            self.stats.draft_steps += 1
            if self.config.adaptive:
                full = m == len(drafts)
                self.cap = min(2 * self.cap, self.config.draft_max) if full else max(1, m + 1)
        if self.config.adaptive:
            dt = seconds if seconds is not None else time.perf_counter() - t0
            self.ledger.record(dt, len(out), bool(drafts))
            if self.ledger.pause > 0:
                self.cap = min(2, self.config.draft_max)  # the probe after a pause stays cheap
        return out

    def _accept_sampled(self, rows, drafts, qs, hist) -> list:
        """Speculative sampling over drafts drawn from the draft model's qs."""
        out = []
        for i, d in enumerate(drafts):
            p = self.sampler.probabilities(rows[i], hist)
            tok = self._accept_rule(self.sampler, p, qs[i], d)
            out.append(tok)
            if tok != d:
                return out
            hist.append(d)
        out.append(self.sampler.sample(rows[len(drafts)], hist))
        return out


def _accept_ratio(sampler: Sampler, p: np.ndarray, q: np.ndarray, d: int) -> int:
    """The speculative-sampling rule: keep d with probability min(1, p(d)/q(d)),
    else draw from norm(max(0, p - q)). Returns the token kept or drawn."""
    if sampler.uniform() * q[d] < p[d]:
        return d
    residual = np.maximum(p - q, 0.0)
    if not residual.any():  # p == q up to rounding: nothing to correct
        residual = p
    return sampler.draw(residual)


def parse_mode(spec, draft_model) -> str | None:
    """The speculative mode an LLM argument asks for: spec "ngram", "draft",
    "off"/None; with a draft model and spec None, "draft"."""
    if spec is None:
        return "draft" if draft_model is not None else None
    if spec == "off":
        return None
    if spec not in MODES:
        raise InvalidArgumentError(f"spec must be one of ngram, draft, off or None, got {spec!r}")
    if spec == "draft" and draft_model is None:
        raise InvalidArgumentError("spec='draft' needs a draft model: LLM(model, draft_model=...)")
    return spec

