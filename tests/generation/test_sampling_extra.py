"""DRY, typical, XTC and mirostat against plain numpy/Python versions of
their definitions (llama.cpp's src/llama-sampler.cpp), written here without
the shortcuts the implementation takes (Z-algorithm, sorted candidates)."""

import math

import numpy as np
import pytest

from llminfer.errors import InvalidArgumentError
from llminfer.generation.sampling import Sampler, SamplingParams
from llminfer.generation.sampling_extra import dry_penalties

OFF = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def logits(n, seed, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


# ---- typical ----

def typical_reference(z, p):
    prob = softmax(z.astype(np.float64))
    h = -np.sum(prob * np.log(prob))
    # by |surprise - entropy|, equal distances in order of decreasing probability
    order = sorted(range(z.size), key=lambda i: (abs(-math.log(prob[i]) - h), -z[i], i))
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += prob[i]
        if mass > p:
            break
    out = np.zeros(z.size)
    out[kept] = prob[kept]
    return out / out.sum()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("typical_p", [0.2, 0.5, 0.9])
def test_typical_matches_definition(seed, typical_p):
    z = logits(300, seed)
    s = Sampler(SamplingParams(typical_p=typical_p, **OFF), z.size)
    np.testing.assert_allclose(s.probabilities(z), typical_reference(z, typical_p), atol=1e-9)


# ---- XTC ----

def xtc_reference(z, threshold):
    prob = softmax(z.astype(np.float64))
    top = [i for i in range(z.size) if prob[i] >= threshold]
    if len(top) >= 2:  # all but the least likely of those above the threshold go
        least = min(top, key=lambda i: (prob[i], -i))
        prob = prob.copy()
        prob[[i for i in top if i != least]] = 0.0
    return prob / prob.sum()


@pytest.mark.parametrize("seed", range(6))
def test_xtc_matches_definition(seed):
    z = logits(50, seed, scale=2.0)
    z[:3] += 3.0  # a few clear favourites
    s = Sampler(SamplingParams(xtc_probability=1.0, xtc_threshold=0.1, **OFF), z.size)
    np.testing.assert_allclose(s.probabilities(z), xtc_reference(z, 0.1), atol=1e-9)


def test_xtc_off_above_half_and_at_probability_zero():
    z = logits(50, 1)
    plain = Sampler(SamplingParams(**OFF), z.size).probabilities(z)
    for kw in (dict(xtc_probability=1.0, xtc_threshold=0.6), dict(xtc_probability=0.0)):
        np.testing.assert_allclose(Sampler(SamplingParams(**kw, **OFF), z.size).probabilities(z), plain)


# ---- mirostat ----

def mirostat_reference(version, z, mu, u, tau, eta, temperature, n_vocab):
    prob = softmax(z.astype(np.float64) / temperature)
    order = sorted(range(z.size), key=lambda i: (-prob[i], i))
    ps = [prob[i] for i in order]
    if version == 1:
        num = den = 0.0
        for i in range(min(99, len(ps) - 1)):
            t = math.log((i + 2) / (i + 1))
            num += t * math.log(ps[i] / ps[i + 1])
            den += t * t
        s_hat = num / den
        eps = s_hat - 1
        k = (eps * 2 ** mu / (1 - n_vocab ** (-eps))) ** (1 / s_hat)
        keep = min(max(int(k), 1), len(ps))
    else:
        keep = len(ps)
        for i, q in enumerate(ps):
            if -math.log2(q) > mu:
                keep = i
                break
        keep = max(keep, 1)
    total = sum(ps[:keep])
    acc = 0.0
    for j in range(keep):
        acc += ps[j] / total
        if u * 1.0 < acc:
            break
    surprise = -math.log2(ps[j] / total)
    return order[j], mu - eta * (surprise - tau)


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_matches_definition(version):
    n = 400
    p = SamplingParams(mirostat=version, mirostat_tau=4.0, mirostat_eta=0.2, temperature=0.9, seed=7)
    s = Sampler(p, n)
    rng = np.random.Generator(np.random.PCG64(7))  # the sampler's stream, replayed
    mu = 8.0
    for step in range(30):
        z = logits(n, 100 + step)
        tok = s.sample(z)
        ref_tok, mu = mirostat_reference(version, z, mu, rng.random(), 4.0, 0.2, 0.9, n)
        assert tok == ref_tok
        assert s.mirostat_mu == pytest.approx(mu, rel=1e-9)


# ---- DRY ----

def dry_reference(history, multiplier, base, allowed, last_n, breakers):
    """For each token t: the longest n such that the last n tokens of the
    window occur earlier followed by t, capped at the distance back to the
    last breaker; penalised when n >= allowed."""
    w = list(history if last_n < 0 else history[-last_n:])
    L = len(w)
    if L <= allowed:
        return {}
    limit = L
    for i in range(L):
        if w[L - 1 - i] in breakers:
            limit = i
            break
    if limit < allowed:
        return {}
    best = {}
    for j in range(L - 1):  # an earlier occurrence ends at j, followed by w[j + 1]
        n = 0
        while n <= j and w[j - n] == w[L - 1 - n] and n < L - 1 - j:
            n += 1
        n = min(n, limit)
        if n >= allowed:
            t = w[j + 1]
            best[t] = max(best.get(t, 0), n)
    return {t: multiplier * base ** (n - allowed) for t, n in best.items() if t not in breakers}


@pytest.mark.parametrize("seed", range(20))
def test_dry_matches_definition(seed):
    rng = np.random.default_rng(seed)
    motif = list(rng.integers(0, 8, size=rng.integers(2, 6)))
    history = []
    while len(history) < 60:  # repetitions of a motif with noise between
        history += motif if rng.random() < 0.6 else list(rng.integers(0, 8, size=3))
    history = np.array(history, dtype=np.int64)
    breakers = frozenset({7}) if seed % 2 else frozenset()
    last_n = [-1, 16, 40][seed % 3]
    p = SamplingParams(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=last_n)
    got = dry_penalties(p, history, breakers)
    want = dry_reference(history.tolist(), 0.8, 1.75, 2, last_n, breakers)
    assert got.keys() == want.keys()
    for t in want:
        assert got[t] == pytest.approx(want[t])


class _Vocab:
    """A tokenizer stand-in: token i's text is chr(ord('a') + i), token 9 is a newline."""
    n_vocab = 10

    def token_bytes(self, t, skip_special=True):
        return b"\n" if t == 9 else bytes([97 + t])


def test_dry_lowers_the_logit_that_would_extend_a_repeat():
    hist = [1, 2, 3, 4, 1, 2, 3]  # next: 4 would repeat "1 2 3 4"
    z = np.zeros(10, np.float32)
    s = Sampler(SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2, temperature=0.0), 10,
                _Vocab())
    work, _ = s._adjusted(z, hist)
    assert work[4] == pytest.approx(-2.0)  # n = 3 -> 1 * 2 ** (3 - 2)
    assert np.count_nonzero(work) == 1
    # a newline (a breaker) after the motif stops it from counting
    work, _ = s._adjusted(z, [1, 2, 3, 4, 9, 1, 2, 3])
    assert work[4] == pytest.approx(-2.0)
    # ...but one inside it cuts the repeat to what follows the breaker: "2 3", n = 2
    work, _ = s._adjusted(z, [1, 2, 3, 4, 1, 9, 2, 3])
    assert work[4] == pytest.approx(-1.0) and np.count_nonzero(work) == 1
    work, _ = s._adjusted(z, [1, 2, 3, 4, 1, 2, 9, 3])
    assert not work.any()


def test_dry_needs_a_tokenizer_for_its_breakers():
    with pytest.raises(InvalidArgumentError, match="tokenizer"):
        Sampler(SamplingParams(dry_multiplier=1.0), 10)
    Sampler(SamplingParams(dry_multiplier=1.0, dry_sequence_breakers=()), 10)


# ---- parameters ----

def test_logit_bias_takes_string_ids():
    p = SamplingParams(logit_bias={"3": 5.0, 4: -1.0})
    assert p.logit_bias == {3: 5.0, 4: -1.0}
    with pytest.raises(InvalidArgumentError):
        SamplingParams(logit_bias={"x": 1.0})


@pytest.mark.parametrize("name, value", [("typical_p", 1.5), ("mirostat", 3), ("dry_multiplier", -1.0),
                                         ("xtc_threshold", 2.0), ("dry_sequence_breakers", "\n")])
def test_bad_extra_parameters_raise(name, value):
    with pytest.raises(InvalidArgumentError, match=name):
        SamplingParams(**{name: value})
