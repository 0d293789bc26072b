"""llminfer.generation.sampling: turn a vector of logits into the next token.

    params = SamplingParams(temperature=0.7, top_k=40, seed=1)
    sampler = Sampler(params, n_vocab)
    token = sampler.sample(logits, history)       # logits: float32 [n_vocab]

The chain runs in llama.cpp's default order:

    logit bias -> penalties (repeat, frequency, presence) -> DRY -> top-k
    -> typical -> top-p -> min-p -> XTC -> temperature -> draw

and with mirostat on (1 or 2), as llama.cpp chains it:

    logit bias -> penalties -> DRY -> temperature -> mirostat (truncate, draw)

DRY, typical, XTC and mirostat follow the definitions of llama.cpp's
src/llama-sampler.cpp; they are off by default and run on the sorted kept
tokens (llminfer/generation/sampling_extra.py), away from the fast path below.

Each stage sees the logits that the one before it left. Top-p and min-p work
on the softmax of those logits at temperature 1, over the tokens still kept;
temperature only shapes the final draw. A temperature <= 0 is greedy: the
argmax after bias and penalties, ties going to the lowest id.

Where a stage must choose among equal logits (top-k's k-th place, top-p's
last token, greedy), the lowest ids win, so results never depend on how
numpy happens to order ties.

Speed matters at 262,144-token vocabularies, so nothing sorts or
partitions the whole vocabulary when it can be avoided: top-k takes a
threshold from a strided sample and partitions only the few logits above it
(_largest); top-p with top-k off finds its cut in C among the tokens heavy
enough to hold it (csrc/ops.c, li_top_p_cut); the draw inverts the CDF block
by block (_pick).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from llminfer import _core
from llminfer.errors import InvalidArgumentError, NumericalError, ShapeError, TokenError

__all__ = ["SamplingParams", "Sampler"]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _need_int(name, value, low=None):
    if not _is_int(value):
        raise InvalidArgumentError(f"{name} must be an integer, got {_shown(value)}")
    if low is not None and value < low:
        raise InvalidArgumentError(f"{name} must be >= {low}, got {_shown(value)}")


def _finite(value) -> bool:
    """Whether a real number is finite as a float: an integer of 400 digits
    is not (float() of it overflows)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _shown(value) -> str:
    """A value as a message quotes it, cut short (repr() of an integer of
    5,000 digits raises ValueError)."""
    if _is_int(value) and abs(value) >= 10 ** 30:
        return f"an integer of about {int(int(value).bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _need_finite(name, value):
    if not _is_real(value) or not _finite(value):
        raise InvalidArgumentError(f"{name} must be a finite number, got {_shown(value)}")


def _need_fraction(name, value):
    _need_finite(name, value)
    if not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(f"{name} must be in [0, 1], got {_shown(value)}")


@dataclass(frozen=True)
class SamplingParams:
    """Every setting of the sampling chain; one object passed around whole.

    Construction checks each value (InvalidArgumentError naming the field);
    validate(n_vocab) adds the checks that need the vocabulary size.
    `logit_bias` is copied into a plain {int: float} dict, so later changes
    to the caller's mapping do not reach the sampler.
    """

    temperature: float = 0.8      # <= 0: greedy
    top_k: int = 40               # <= 0: off
    top_p: float = 0.95           # 1.0: off
    min_p: float = 0.05           # 0.0: off
    repeat_penalty: float = 1.0   # 1.0: off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64      # 0: off, -1: whole history
    logit_bias: Mapping[int, float] | None = field(default=None, hash=False)  # -inf bans, +inf forces
    seed: int | None = None       # None: fresh entropy
    typical_p: float = 1.0        # 1.0: off (locally typical sampling)
    mirostat: int = 0             # 0: off, 1: mirostat, 2: mirostat 2.0 (replace top-k/p, min-p, typical, XTC)
    mirostat_tau: float = 5.0     # target surprise, bits
    mirostat_eta: float = 0.1     # learning rate of mu
    dry_multiplier: float = 0.0   # 0.0: off (DRY repetition penalty)
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1: whole history, 0: off
    dry_sequence_breakers: tuple = ("\n", ":", "\"", "*")
    xtc_probability: float = 0.0  # 0.0: off (exclude top choices)
    xtc_threshold: float = 0.1    # > 0.5: off

    def __post_init__(self):
        self._check_fields()
        # Store plain Python numbers, so numpy scalars and ints compare, hash
        # and print the same as the floats they stand for.
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("typical_p", "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base",
                     "xtc_probability", "xtc_threshold"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("top_k", "penalty_last_n", "mirostat", "dry_allowed_length", "dry_penalty_last_n"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        if self.logit_bias is not None:
            # OpenAI's JSON sends the token ids as strings: {"50256": -100}
            object.__setattr__(self, "logit_bias", {int(t): float(b) for t, b in self.logit_bias.items()})

    def _check_fields(self):
        _need_finite("temperature", self.temperature)
        _need_int("top_k", self.top_k)
        _need_fraction("top_p", self.top_p)
        _need_fraction("min_p", self.min_p)
        _need_finite("repeat_penalty", self.repeat_penalty)
        if self.repeat_penalty <= 0:
            raise InvalidArgumentError(f"repeat_penalty must be > 0, got {_shown(self.repeat_penalty)}")
        _need_finite("frequency_penalty", self.frequency_penalty)
        _need_finite("presence_penalty", self.presence_penalty)
        _need_int("penalty_last_n", self.penalty_last_n, low=-1)
        if self.seed is not None:
            _need_int("seed", self.seed, low=0)
        _need_fraction("typical_p", self.typical_p)
        _need_int("mirostat", self.mirostat, low=0)
        if self.mirostat > 2:
            raise InvalidArgumentError(f"mirostat must be 0 (off), 1 or 2, got {_shown(self.mirostat)}")
        _need_finite("mirostat_tau", self.mirostat_tau)
        _need_finite("mirostat_eta", self.mirostat_eta)
        _need_finite("dry_multiplier", self.dry_multiplier)
        if self.dry_multiplier < 0:
            raise InvalidArgumentError(f"dry_multiplier must be >= 0, got {_shown(self.dry_multiplier)}")
        _need_finite("dry_base", self.dry_base)
        _need_int("dry_allowed_length", self.dry_allowed_length, low=0)
        _need_int("dry_penalty_last_n", self.dry_penalty_last_n, low=-1)
        if isinstance(self.dry_sequence_breakers, str) or not all(
                isinstance(b, str) and b for b in self.dry_sequence_breakers):
            raise InvalidArgumentError(f"dry_sequence_breakers must be a list of non-empty strings, "
                                       f"got {self.dry_sequence_breakers!r}")
        _need_fraction("xtc_probability", self.xtc_probability)
        _need_fraction("xtc_threshold", self.xtc_threshold)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise InvalidArgumentError(
                    f"logit_bias must be a mapping of token id to bias, got {type(self.logit_bias).__name__}")
            for token, bias in self.logit_bias.items():
                if isinstance(token, str) and token.strip().isdigit():
                    try:
                        token = int(token)
                    except ValueError:  # past int()'s limit of 4300 digits
                        token = -1
                if not _is_int(token) or token < 0:
                    raise InvalidArgumentError(f"logit_bias keys must be token ids >= 0, got {_shown(token)}")
                if _is_int(bias) and not _finite(bias):
                    raise InvalidArgumentError(f"logit_bias[{_shown(token)}] must be a number a float can hold "
                                               f"(or +-inf), got {_shown(bias)}")
                if not _is_real(bias) or math.isnan(bias):
                    raise InvalidArgumentError(f"logit_bias[{_shown(token)}] must be a number, got {_shown(bias)}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def dry_on(self) -> bool:
        return self.dry_multiplier > 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

    @property
    def extra_on(self) -> bool:
        """Whether a stage of llminfer.generation.sampling_extra runs (after bias, penalties and DRY)."""
        return self.typical_p < 1.0 or self.mirostat != 0 or (
            self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5)

    @property
    def penalties_on(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0)

    def validate(self, n_vocab: int | None = None) -> SamplingParams:
        """Check every field, and bias ids against n_vocab when it is given; returns self."""
        self._check_fields()
        if n_vocab is not None:
            _need_int("n_vocab", n_vocab, low=1)
            for token in self.logit_bias or ():
                if token >= n_vocab:
                    raise InvalidArgumentError(
                        f"logit_bias names token {_shown(token)}, outside the vocabulary of {n_vocab}")
        return self

    def replace(self, **changes) -> SamplingParams:
        """A copy with some fields changed, checked like a new one."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidArgumentError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes).validate()

    @classmethod
    def greedy(cls) -> SamplingParams:
        """Always the most likely token (after bias and penalties)."""
        return cls(temperature=0.0)


# Top-k: a strided sample of about _SAMPLE_SIZE logits gives a threshold that,
# with high probability, a few hundred logits reach; the k-th largest is then
# found among those. Over 262k logits that takes ~0.1 ms where np.partition
# over all of them takes ~1.5 ms.
_SAMPLE_SIZE = 4096
_SAMPLE_MARGIN = 4   # extra sample points above the threshold; lowers the odds of a fallback

# With top-k off, a kept set larger than n_vocab / _DENSE is handled as
# weights over the whole vocabulary (zero where dropped) instead of by ids.
_DENSE = 8

_BLOCK = 1024        # the draw inverts the CDF per block of this many tokens

# _largest goes to C up to this k: its heap's insertions grow with k (at 1024
# over 49152 logits it took 360 us against the numpy way's 50)
_C_TOP_K = 256


def _largest(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values of x (1-D, no NaN), in no particular order.
    Of several values equal to the k-th largest, the lowest ids are kept."""
    n = x.size
    if k >= n:
        return np.arange(n)
    if _in_c(x, k):
        # one pass in C (csrc/ops.c): a vocabulary's logits right after the
        # forward pass wrote them, 10 us for 49152 against 21 for the
        # numpy way below, whose several passes cost more on cold caches
        return _core.top_k(x, k)
    ids, xs, floor = None, x, None   # xs = x[ids] holds every value >= the k-th largest
    stride = n // _SAMPLE_SIZE
    if stride >= 8:
        sample = x[::stride]
        j = -(-k // stride) + _SAMPLE_MARGIN   # sample points at or above the threshold
        if j < sample.size:
            t = np.partition(sample, sample.size - j)[sample.size - j]
            at_least_t = x >= t
            n_ge = np.count_nonzero(at_least_t)
            if n_ge >= k:   # so the k-th largest is >= t
                floor = t
                if n_ge <= n // 4:
                    ids = np.flatnonzero(at_least_t)
                    xs = x[ids]
    if floor is not None and np.count_nonzero(xs > floor) < k:
        kth = floor   # fewer than k above t and at least k at or above: t is the k-th
    else:
        kth = np.partition(xs, xs.size - k)[xs.size - k]
    strict = np.flatnonzero(xs > kth)
    tied = np.flatnonzero(xs == kth)[:k - strict.size]
    sel = np.concatenate((strict, tied))
    return sel if ids is None else ids[sel]


def _in_c(x: np.ndarray, k: int) -> bool:
    """Whether _largest(x, k) goes to the C top-k."""
    return k < x.size and k <= _C_TOP_K and x.dtype == np.float32 and x.flags.c_contiguous


def _top_sorted(x: np.ndarray, k: int):
    """(ids, values as float64) of the k largest of x, by value descending,
    equal values by id ascending: _largest then _descending, where the C
    top-k gives them in that order already."""
    ids = _largest(x, k)
    if _in_c(x, k):
        return ids, x[ids].astype(np.float64)
    return _descending(ids, x[ids].astype(np.float64))


def _descending(ids: np.ndarray, z: np.ndarray):
    """ids and z reordered by z descending, equal z by id ascending."""
    order = np.lexsort((ids, -z))
    return ids[order], z[order]


def _last_positive(w: np.ndarray) -> int:
    return int(np.flatnonzero(w)[-1])


def _pick(w: np.ndarray, u: float) -> int:
    """The index i where u * sum(w) falls in the cumulative sum of w: i is
    drawn with probability w[i] / sum(w) when u is uniform on [0, 1).

    Large w go in two steps (block sums, then one block) so that no cumsum
    runs over the whole vocabulary; a value that rounding pushes past the end
    goes to the last index with weight."""
    if w.size <= 4 * _BLOCK:
        cdf = np.cumsum(w)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return i if i < w.size else _last_positive(w)
    starts = np.arange(0, w.size, _BLOCK)
    block_sums = np.add.reduceat(w, starts)
    block_cdf = np.cumsum(block_sums)
    r = u * block_cdf[-1]
    b = int(np.searchsorted(block_cdf, r, side="right"))
    if b >= starts.size:
        b = _last_positive(block_sums)
    if b > 0:
        r -= block_cdf[b - 1]
    block = w[starts[b]:starts[b] + _BLOCK]
    i = int(np.searchsorted(np.cumsum(block), r, side="right"))
    return int(starts[b]) + (i if i < block.size else _last_positive(block))


class Sampler:
    """Runs the chain of `params` over logits of one vocabulary size.

    Holds the random stream (numpy Generator over PCG64): the same seed and
    the same sequence of logits and histories give the same tokens. Every
    non-greedy sample() takes exactly one number from the stream (two
    when XTC is on: its coin, then the draw).

    tokenizer: needed only by DRY, whose sequence breakers are text.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, tokenizer=None):
        if not isinstance(params, SamplingParams):
            raise InvalidArgumentError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate(n_vocab)
        self.params = params
        self.n_vocab = int(n_vocab)
        bias = params.logit_bias or {}
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._bans = np.isneginf(self._bias)
        self._breakers = None
        self._cut_scratch = None   # li_top_p_cut's, allocated at its first use
        self._dense = None         # float64 [n_vocab]: the weights when the chain keeps most tokens
        if params.dry_on:
            from llminfer.generation.sampling_extra import dry_breaker_tokens

            self._breakers = dry_breaker_tokens(tokenizer, params.dry_sequence_breakers)
        self.reset()

    def reset(self, seed: int | None = None):
        """Restart the random stream from `seed`, or from params.seed when None
        (fresh entropy when that is None too)."""
        if seed is None:
            seed = self.params.seed
        else:
            _need_int("seed", seed, low=0)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self.mirostat_mu = 2.0 * self.params.mirostat_tau  # mirostat's running surprise bound

    def sample(self, logits: np.ndarray, history: Sequence[int] | np.ndarray = ()) -> int:
        """The next token id. `history` is every token so far (prompt and
        generated); the penalties read its last penalty_last_n."""
        if self.params.mirostat and not self.params.is_greedy:
            from llminfer.generation.sampling_extra import mirostat_step

            work, top = self._adjusted(logits, history)
            self._check_top(work, top, logits)
            tok, self.mirostat_mu = mirostat_step(self.params, work, self.mirostat_mu, self._rng.random())
            return tok
        ids, w = self._kept(logits, history)
        if self.params.is_greedy:
            return int(ids[0])
        i = _pick(w, self._rng.random())
        return i if ids is None else int(ids[i])

    def probabilities(self, logits: np.ndarray, history: Sequence[int] | np.ndarray = ()) -> np.ndarray:
        """The distribution sample() draws from: float64 [n_vocab], zero outside
        the kept tokens (one-hot when greedy). Takes nothing from the random stream."""
        ids, w = self._kept(logits, history)
        if ids is None:
            return w / w.sum()   # a new array: w is the sampler's own buffer
        out = np.zeros(self.n_vocab, dtype=np.float64)
        out[ids] = w / w.sum()
        return out

    def uniform(self) -> float:
        """The next number of the random stream, uniform on [0, 1)
        (speculative sampling's acceptance test draws it)."""
        return float(self._rng.random())

    def draw(self, weights: np.ndarray) -> int:
        """An index drawn with probability weights[i] / sum(weights), taking one
        number from the random stream (speculative sampling draws from a
        residual distribution this way). weights: float64 [n], >= 0, not all 0."""
        return _pick(weights, self._rng.random())

    # -- the chain --------------------------------------------------------

    def _kept(self, logits, history):
        """(ids, weights): the tokens the chain keeps and their unnormalised
        final probabilities, float64, the largest 1. ids is None when the
        weights cover the whole vocabulary (zero where dropped): then they
        are the sampler's own buffer, good until its next call."""
        p = self.params
        work, top = self._adjusted(logits, history)
        self._check_top(work, top, logits)
        if top == np.inf:   # forced tokens (+inf bias): only they remain, equally likely
            work = np.where(work == np.inf, np.float32(0), np.float32(-np.inf))
            top = 0.0
        if p.is_greedy:
            return np.array([int(np.argmax(work))]), np.ones(1)
        if p.extra_on:
            from llminfer.generation.sampling_extra import kept_extended

            return kept_extended(p, work, self._rng)

        if 0 < p.top_k < work.size:
            ids, z = _top_sorted(work, p.top_k)
            n_finite = np.count_nonzero(z > -np.inf)   # sorted: -inf ones are last
            ids, z = ids[:n_finite], z[:n_finite]
            if p.top_p < 1.0:
                e = np.exp(z - top)
                cut = int(np.searchsorted(np.cumsum(e), p.top_p * e.sum(), side="left")) + 1
                ids, z = ids[:cut], z[:cut]
            if p.min_p > 0.0:
                # p_i >= min_p * p_max  <=>  z_i >= z_max + log(min_p): the
                # normalisation cancels, so min-p reads the logits directly.
                n_keep = np.count_nonzero(z >= top + math.log(p.min_p))
                ids, z = ids[:n_keep], z[:n_keep]
            z -= top
        else:
            ids, z = self._without_top_k(work, top)   # less top already

        # Every stage keeps the top token, so `top` is still the largest z.
        # In place: at vocabulary size each temporary costs page faults.
        if p.temperature != 1.0:   # (OpenAI's default is 1: a pass saved)
            z *= 1.0 / p.temperature
        return ids, np.exp(z, out=z)

    def _check_top(self, work, top, logits):
        if top == -np.inf:
            if self._bans.any() and logits.max() > -np.inf:
                raise InvalidArgumentError("logit_bias bans every token")
            raise InvalidArgumentError("every logit is -inf: no token can be sampled")

    def _without_top_k(self, work, top):
        """(ids or None, logits as float64) of what top-p and min-p keep of
        the whole vocabulary.

        Both keep a run of tokens from the top, so the result is the shorter
        run: the tokens at or above a floor value, except that top-p may stop
        partway through tokens equal to it."""
        p = self.params
        floor = top + math.log(p.min_p) if p.min_p > 0.0 else -np.inf
        n_tied = None   # how many tokens equal to floor stay (lowest ids first); None: all
        if p.top_p < 1.0:
            floor, n_tied = self._top_p_floor(work, top, floor)
        keep = work >= floor if floor > -np.inf else work > -np.inf
        if n_tied is not None:
            tied = np.flatnonzero(work == floor)
            keep[tied[n_tied:]] = False
        n_keep = np.count_nonzero(keep)
        if n_keep * _DENSE < work.size:
            ids = np.flatnonzero(keep)
            return ids, work[ids].astype(np.float64) - top
        # Into the sampler's own buffer (a fresh one of 262144 float64 took
        # its page faults at every token), cast and shifted in one pass, and
        # masked only where something is dropped: OpenAI's defaults
        # (temperature only) keep every token. Gemma 3's sample(), top-k off
        # (bench/sampling.py): ~460 -> ~345 us at temperature 0.7, ~325 at 1.
        if self._dense is None:
            self._dense = np.empty(self.n_vocab, dtype=np.float64)
        z = self._dense
        np.subtract(work, np.float64(top), out=z)
        if n_keep < work.size:
            np.putmask(z, ~keep, -np.inf)
        return None, z

    def _top_p_floor(self, work, top, min_p_floor):
        """(floor, n_tied) of top-p followed by min-p, for _without_top_k,
        without sorting the vocabulary: the cut is found in C (csrc/ops.c,
        li_top_p_cut) among the tokens whose weight may hold it. A whole
        sample() on real logits (bench/sampling.py, 24 positions of a text),
        against the numpy band search this replaced: top-p 0.95 with top-k
        off, SmolLM2's 49152 ~320 -> ~135 us, Gemma 3's 262144 ~780 -> ~435;
        with min-p 0.05 as well, ~310 -> ~70 and ~710 -> ~340."""
        e = np.exp(work - np.float32(top))   # float32 weights; -inf gives 0
        target = self.params.top_p * e.sum(dtype=np.float64)
        if self._cut_scratch is None:
            self._cut_scratch = np.empty(3 * work.size, dtype=np.float32)
        cut = _core.top_p_cut(np.ascontiguousarray(work), e, target, np.float32(min_p_floor), self._cut_scratch)
        # None: top-p reaches below min-p's floor, which then cuts it back
        return (min_p_floor, None) if cut is None else (np.float32(cut[0]), cut[1])

    def _adjusted(self, logits, history):
        """(logits after bias and penalties, their max). The array is the
        caller's own when neither applies, else a copy; the caller's array is
        never written."""
        if not isinstance(logits, np.ndarray):
            raise InvalidArgumentError(f"logits must be a numpy array, got {type(logits).__name__}")
        if logits.dtype != np.float32:
            raise InvalidArgumentError(f"logits must be float32, got {logits.dtype}")
        if logits.shape != (self.n_vocab,):
            raise ShapeError(f"logits must have shape ({self.n_vocab},), got {logits.shape}")
        top = logits.max()
        if np.isnan(top):   # max propagates NaN: one pass finds any
            first = int(np.flatnonzero(np.isnan(logits))[0])
            raise NumericalError(f"logits contain NaN (first at token id {first}): the model's "
                                 f"computation produced it, not the sampling parameters")

        window = self._window(history) if self.params.penalties_on else None
        dry = None
        if self._breakers is not None:
            from llminfer.generation.sampling_extra import dry_penalties

            dry = dry_penalties(self.params, self._history_ids(history), self._breakers)
        if not self._bias_ids.size and (window is None or not window.size) and not dry:
            return logits, float(top)
        work = logits.copy()
        if self._bias_ids.size:
            # A ban sets -inf rather than adding it, so it wins even over a
            # +inf logit (where adding would give NaN).
            biased = np.full(self._bias.size, -np.inf, dtype=np.float32)
            np.add(work[self._bias_ids], self._bias, out=biased, where=~self._bans)
            work[self._bias_ids] = biased
        if window is not None and window.size:
            self._penalize(work, window)
        if dry:
            ids = np.fromiter(dry.keys(), np.int64, len(dry))
            work[ids] -= np.fromiter(dry.values(), np.float32, len(dry))
        return work, float(work.max())

    def _history_ids(self, history) -> np.ndarray:
        h = history if isinstance(history, np.ndarray) else np.asarray(history, dtype=np.int64)
        if h.ndim != 1 or (h.size and not np.issubdtype(h.dtype, np.integer)):
            raise ShapeError(f"history must be 1-D integer token ids, got shape {h.shape} of {h.dtype}")
        return h

    def _window(self, history) -> np.ndarray:
        """The last penalty_last_n tokens of history, as int64."""
        h = history if isinstance(history, np.ndarray) else np.asarray(history)
        if h.ndim != 1:
            raise ShapeError(f"history must be 1-D token ids, got shape {h.shape}")
        if not h.size:
            return h.astype(np.int64)
        if not np.issubdtype(h.dtype, np.integer):
            raise InvalidArgumentError(f"history must hold integer token ids, got {h.dtype}")
        last_n = self.params.penalty_last_n
        w = h if last_n < 0 else h[-last_n:]
        lo, hi = int(w.min()), int(w.max())
        if lo < 0 or hi >= self.n_vocab:
            bad = lo if lo < 0 else hi
            raise TokenError(f"history holds token {bad}, outside the vocabulary of {self.n_vocab}")
        return w.astype(np.int64, copy=False)

    def _penalize(self, work, window):
        """Repeat, frequency and presence penalties on the tokens in window, in place.

        Repeat divides a positive logit by the penalty and multiplies a
        non-positive one (so it always lowers it); then count * frequency and,
        once per token present, presence are subtracted."""
        p = self.params
        ids, counts = np.unique(window, return_counts=True)
        z = work[ids].astype(np.float64)
        if p.repeat_penalty != 1.0:
            z = np.where(z <= 0.0, z * p.repeat_penalty, z / p.repeat_penalty)
        z -= counts * p.frequency_penalty + p.presence_penalty
        work[ids] = z
