"""The samplers beyond the default chain: DRY, locally typical, XTC, mirostat.

Each follows its definition in llama.cpp's src/llama-sampler.cpp (facts, not
code, carried over); llminfer.generation.sampling calls them only when their parameter
turns them on, so the default chain keeps its fast path. They work on the
tokens still kept, sorted by logit (descending, equal logits by id), as
llama.cpp's candidate arrays are.

- DRY ("don't repeat yourself"): a token that would extend a repetition of
  n >= allowed_length tokens already in the text loses
  multiplier * base ** (n - allowed_length) from its logit. The repetition is
  the longest suffix of the text that also occurs earlier, followed there by
  the token; it does not reach back past the last sequence breaker.
- Typical: keep the tokens whose surprise (-log p) is closest to the
  distribution's entropy, in that order, until their mass exceeds typical_p.
- XTC ("exclude top choices"): with probability xtc_probability, drop every
  token at or above xtc_threshold except the least likely of them.
- Mirostat 1 and 2: truncate so that the surprise of the draw tracks tau,
  adjusting the bound mu after every draw by eta times the error.
"""

from __future__ import annotations

import math

import numpy as np

from llminfer.errors import InvalidArgumentError

_FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: DRY's exponent is clamped below it
_MIROSTAT_M = 100            # mirostat 1 estimates the Zipf exponent from this many top tokens


def _sorted_finite(work: np.ndarray):
    """(ids, logits as float64) of the finite logits, descending, ties by id."""
    ids = np.flatnonzero(work > -np.inf)
    z = work[ids].astype(np.float64)
    order = np.lexsort((ids, -z))
    return ids[order], z[order]


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


# ---- typical ----

def typical_keep(z: np.ndarray, typical_p: float) -> np.ndarray:
    """Indices into z (sorted descending) that locally typical sampling keeps,
    in z's order."""
    if typical_p >= 1.0 or z.size < 2:
        return np.arange(z.size)
    p = _softmax(z)
    logp = np.log(np.maximum(p, np.finfo(np.float64).tiny))
    entropy = -np.sum(p * logp)
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cum = np.cumsum(p[order])
    over = np.flatnonzero(cum > typical_p)
    last = int(over[0]) + 1 if over.size else order.size
    return np.sort(order[:last])


# ---- XTC ----

def xtc_drop(z: np.ndarray, probability: float, threshold: float, u: float) -> int:
    """How many of the leading tokens of z (sorted descending) XTC drops, u
    being a uniform draw on [0, 1)."""
    if probability <= 0.0 or threshold > 0.5 or z.size < 2 or u > probability:
        return 0
    p = _softmax(z)
    above = np.flatnonzero(p < threshold)
    last_above = (int(above[0]) if above.size else p.size) - 1  # p is descending
    return last_above if last_above > 0 else 0


# ---- the extended chain ----

def kept_extended(p, work: np.ndarray, rng):
    """(ids, weights) of top-k -> typical -> top-p -> min-p -> XTC ->
    temperature over bias- and penalty-adjusted logits, as Sampler._kept
    returns them. XTC takes one number from rng when it is on."""
    ids, z = _sorted_finite(work)
    if 0 < p.top_k < ids.size:
        ids, z = ids[:p.top_k], z[:p.top_k]
    if p.typical_p < 1.0:
        keep = typical_keep(z, p.typical_p)
        ids, z = ids[keep], z[keep]
    if p.top_p < 1.0:
        e = np.exp(z - z[0])
        cut = int(np.searchsorted(np.cumsum(e), p.top_p * e.sum(), side="left")) + 1
        ids, z = ids[:cut], z[:cut]
    if p.min_p > 0.0:
        n = int(np.count_nonzero(z >= z[0] + math.log(p.min_p)))
        ids, z = ids[:n], z[:n]
    if p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5:
        drop = xtc_drop(z, p.xtc_probability, p.xtc_threshold, rng.random())
        ids, z = ids[drop:], z[drop:]
    z = (z - z[0]) / p.temperature
    return ids, np.exp(z)


# ---- mirostat ----

def mirostat_step(p, work: np.ndarray, mu: float, u: float):
    """(token, new mu): one mirostat draw (p.mirostat 1 or 2) over adjusted
    logits, temperature applied first, u uniform on [0, 1)."""
    ids, z = _sorted_finite(work)
    z = z / p.temperature
    prob = _softmax(z)
    n = prob.size
    if p.mirostat == 1:
        m = min(_MIROSTAT_M - 1, n - 1)
        if m > 0:
            i = np.arange(m, dtype=np.float64)
            t = np.log((i + 2) / (i + 1))
            b = np.log(prob[:m] / prob[1:m + 1])
            s_hat = float(np.dot(t, b) / np.dot(t, t))
            eps = s_hat - 1.0
            with np.errstate(all="ignore"):
                k = (eps * 2.0 ** mu / (1.0 - float(work.size) ** (-eps))) ** (1.0 / s_hat)
            k = int(k) if math.isfinite(k) else n
            keep = min(max(k, 1), n)
        else:
            keep = n
    else:
        surprise = -np.log2(np.maximum(prob, np.finfo(np.float64).tiny))
        over = np.flatnonzero(surprise > mu)
        keep = max(int(over[0]) if over.size else n, 1)
    q = prob[:keep] / prob[:keep].sum()
    cdf = np.cumsum(q)
    j = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), keep - 1)
    observed = -math.log2(q[j])
    return int(ids[j]), mu - p.mirostat_eta * (observed - p.mirostat_tau)


# ---- DRY ----

def dry_breaker_tokens(tokenizer, breakers) -> frozenset:
    """Token ids that break a repetition for DRY: those whose text contains a
    breaker string. (llama.cpp also matches a breaker spread over several
    tokens; the default breakers are single characters, where the two agree.)"""
    breakers = tuple(breakers)
    if not breakers:
        return frozenset()
    if tokenizer is None:
        raise InvalidArgumentError("DRY's sequence breakers are text: the Sampler needs the tokenizer "
                                   "(Sampler(params, n_vocab, tokenizer=...)), or pass dry_sequence_breakers=()")
    cache = tokenizer.__dict__.setdefault("_dry_breakers", {})
    if breakers not in cache:
        found = set()
        for t in range(tokenizer.n_vocab):
            text = tokenizer.token_bytes(t, skip_special=False).decode("utf-8", errors="ignore")
            if any(b in text for b in breakers):
                found.add(t)
        cache[breakers] = frozenset(found)
    return cache[breakers]


def _z_function(r: np.ndarray) -> list:
    """z[k] = length of the longest common prefix of r and r[k:] (z[0] = 0)."""
    n = len(r)
    r = r.tolist()
    z = [0] * n
    lo = hi = 0
    for k in range(1, n):
        if k < hi:
            z[k] = min(hi - k, z[k - lo])
        while k + z[k] < n and r[z[k]] == r[k + z[k]]:
            z[k] += 1
        if k + z[k] > hi:
            lo, hi = k, k + z[k]
    return z


def dry_penalties(p, history: np.ndarray, breakers: frozenset) -> dict:
    """{token: amount to subtract from its logit} for DRY over history."""
    n = history.size if p.dry_penalty_last_n < 0 else min(history.size, p.dry_penalty_last_n)
    allowed = p.dry_allowed_length
    if n <= allowed:
        return {}
    r = history[history.size - n:][::-1]  # r[i]: the i-th token from the end
    rep_limit = n
    for i, t in enumerate(r.tolist()):
        if t in breakers:
            rep_limit = i
            break
    if rep_limit < allowed:
        return {}
    z = _z_function(r)
    longest: dict = {}
    for k in range(1, n):
        length = min(z[k], rep_limit)
        if length >= allowed:
            t = int(r[k - 1])  # the token that followed the earlier occurrence
            if longest.get(t, -1) < length:
                longest[t] = length
    max_exp = int(_FLOAT_MAX_LOG / math.log(p.dry_base)) if p.dry_base > 1.000001 else 0
    out = {}
    for t, length in longest.items():
        if t in breakers:
            continue
        e = length - allowed
        if max_exp > 0:
            e = min(e, max_exp)
        out[t] = p.dry_multiplier * p.dry_base ** e
    return out
