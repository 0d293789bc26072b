"""Tests of llminfer.generation.sampling: each stage of the chain against a plain numpy
computation of its definition, the whole chain against a slow reference,
seeded reproducibility, the draw's statistics, and parameter checks."""

import math
from collections import Counter

import numpy as np
import pytest

from llminfer import _core

from llminfer.generation import sampling
from llminfer.errors import InvalidArgumentError, LLMInferError, NumericalError, ShapeError, TokenError
from llminfer.generation.sampling import Sampler, SamplingParams

# Keeps only what a stage under test does: no filtering, temperature 1.
PLAIN = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)


def softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def f32(values):
    return np.asarray(values, dtype=np.float32)


def probs(params, logits, history=()):
    return Sampler(params, len(logits)).probabilities(f32(logits), history)


# -- a slow reference of the whole chain, straight from the definitions -----

# A cut this close to a boundary could go either way by rounding: the sampler
# may weigh tokens in float32 (relative error ~1e-7) where this uses float64.
AMBIGUOUS = 5e-7


def reference(logits, p, history=()):
    """The chain's distribution by full sorts in float64; None when top-p or
    min-p has a value within AMBIGUOUS of its boundary."""
    n = logits.size
    z = logits.astype(np.float64)
    for token, bias in (p.logit_bias or {}).items():
        z[token] = -np.inf if bias == -np.inf else z[token] + bias
    if p.penalty_last_n != 0:
        window = list(history) if p.penalty_last_n < 0 else list(history)[-p.penalty_last_n:]
        for token, count in Counter(window).items():
            z[token] = z[token] * p.repeat_penalty if z[token] <= 0 else z[token] / p.repeat_penalty
            z[token] -= count * p.frequency_penalty + p.presence_penalty
    if np.isposinf(z).any():
        z = np.where(np.isposinf(z), 0.0, -np.inf)
    out = np.zeros(n)
    if p.temperature <= 0:
        out[int(np.argmax(z))] = 1.0
        return out
    ids = np.lexsort((np.arange(n), -z))   # logit descending, ties by id
    ids = ids[np.isfinite(z[ids])]
    if p.top_k > 0:
        ids = ids[:p.top_k]
    if p.top_p < 1.0:
        cum = np.cumsum(softmax(z[ids]))
        if np.any(np.abs(cum[:-1] - p.top_p) < AMBIGUOUS):
            return None
        ids = ids[:int(np.argmax(cum >= p.top_p)) + 1 if cum[-1] >= p.top_p else ids.size]
    if p.min_p > 0.0:
        q = softmax(z[ids])
        ratio = q / q.max()
        if np.any(np.abs(ratio - p.min_p) < AMBIGUOUS):
            return None
        ids = ids[ratio >= p.min_p]
    out[ids] = softmax(z[ids] / p.temperature)
    return out


def logit_cases(n, rng):
    masked = rng.standard_normal(n) * 2
    masked[rng.random(n) < 0.3] = -np.inf
    return {
        "gauss1": rng.standard_normal(n),
        "gauss3": rng.standard_normal(n) * 3,
        "integers (ties)": rng.integers(-4, 4, n).astype(np.float64),
        "all equal": np.zeros(n),
        "ramp": np.linspace(-15.0, 5.0, n),
        "some -inf": masked,
        "peaked": np.concatenate(([12.0, 11.5, 9.0], rng.standard_normal(n - 3))),
    }


def check_against_reference(n, grid, seed, min_checked=0.9):
    rng = np.random.default_rng(seed)
    checked = skipped = 0
    for name, values in logit_cases(n, rng).items():
        logits = f32(values)
        for params in grid:
            want = reference(logits, params)
            if want is None:
                skipped += 1
                continue
            got = Sampler(params, n).probabilities(logits)
            assert np.array_equal(got > 0, want > 0), (name, params)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12, err_msg=f"{name} {params}")
            checked += 1
    # A reference that calls everything ambiguous would test nothing.
    assert checked >= min_checked * (checked + skipped)


def full_grid(n):
    return [SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp, seed=0)
            for k in (0, 1, 3, 40, n // 3, n + 5)
            for tp in (1.0, 0.0, 0.5, 0.9, 0.99)
            for mp in (0.0, 0.05, 0.5)
            for t in (0.7, 1.5)]


def test_chain_matches_reference_small_vocab():
    check_against_reference(60, full_grid(60), seed=1)


def test_chain_matches_reference_with_large_vocab_paths(monkeypatch):
    # Shrink the size thresholds so a 3000-token vocabulary takes every path
    # a 262k one does: the sampled top-k threshold, the dense weights and
    # the blocked draw.
    monkeypatch.setattr(sampling, "_SAMPLE_SIZE", 64)
    monkeypatch.setattr(sampling, "_BLOCK", 16)
    check_against_reference(3000, full_grid(3000), seed=2)


def test_chain_matches_reference_at_real_size():
    n = 65536
    grid = [SamplingParams(temperature=1.0, top_k=k, top_p=tp, min_p=mp, seed=0)
            for k in (0, 40) for tp in (1.0, 0.9) for mp in (0.0, 0.05)]
    # Flat cases put ~1e-5 of mass on each token, so more cuts are ambiguous.
    check_against_reference(n, grid, seed=3, min_checked=0.75)


def test_reference_agrees_with_penalties_and_bias():
    rng = np.random.default_rng(4)
    n = 50
    logits = f32(rng.standard_normal(n) * 2)
    history = rng.integers(0, n, 30)
    for last_n in (0, 5, -1):
        p = SamplingParams(temperature=0.9, top_k=20, top_p=0.8, min_p=0.02, repeat_penalty=1.3,
                           frequency_penalty=0.2, presence_penalty=0.4, penalty_last_n=last_n,
                           logit_bias={3: 2.5, 7: -np.inf, 11: -1.0}, seed=0)
        want = reference(logits, p, history)
        assert want is not None
        np.testing.assert_allclose(Sampler(p, n).probabilities(logits, history), want, rtol=1e-5, atol=1e-12)


# -- each stage against its definition -----------------------------------

def test_top_k_1_is_argmax():
    rng = np.random.default_rng(5)
    for _ in range(20):
        logits = f32(rng.standard_normal(500))
        sampler = Sampler(SamplingParams(top_k=1, seed=int(rng.integers(1 << 30))), 500)
        best = int(np.argmax(logits))
        assert sampler.sample(logits) == best
        assert sampler.probabilities(logits)[best] == 1.0


def test_top_k_keeps_the_k_largest_with_softmax_over_them():
    rng = np.random.default_rng(6)
    logits = f32(rng.standard_normal(300))
    got = probs(PLAIN.replace(top_k=7), logits)
    largest = np.argsort(logits)[-7:]
    want = np.zeros(300)
    want[largest] = softmax(logits[largest])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_top_k_breaks_ties_by_lowest_id():
    logits = [0.0, 1.0, 1.0, 2.0, 1.0, 1.0]
    got = probs(PLAIN.replace(top_k=3), logits)
    assert list(np.flatnonzero(got)) == [1, 2, 3]


def test_top_p_keeps_exactly_the_minimal_prefix():
    p = np.array([0.05, 0.4, 0.1, 0.3, 0.15])   # descending: ids 1, 3, 4, 2, 0
    logits = np.log(p)
    for top_p, kept in [(0.0, [1]), (0.3, [1]), (0.45, [1, 3]), (0.69, [1, 3]),
                        (0.75, [1, 3, 4]), (0.9, [1, 2, 3, 4]), (0.97, [0, 1, 2, 3, 4])]:
        got = probs(PLAIN.replace(top_p=top_p), logits)
        assert sorted(np.flatnonzero(got)) == kept, top_p
        np.testing.assert_allclose(got[kept], p[kept] / p[kept].sum(), rtol=1e-6)


def test_top_p_random_against_definition():
    rng = np.random.default_rng(7)
    for _ in range(30):
        logits = f32(rng.standard_normal(200) * 2)
        q = softmax(logits)
        order = np.argsort(-q, kind="stable")
        cum = np.cumsum(q[order])
        # a top_p between two cumulative sums, so rounding cannot move the cut
        i = int(rng.integers(0, 150))
        top_p = (cum[i] + cum[i + 1]) / 2
        got = probs(PLAIN.replace(top_p=top_p), logits)
        assert set(np.flatnonzero(got)) == set(order[:i + 2].tolist())


def test_min_p_keeps_tokens_at_or_above_its_share_of_the_top():
    ratios = np.array([1.0, 0.2, 0.06, 0.04, 0.5, 0.01])   # p_i / p_max
    logits = np.log(ratios)
    got = probs(PLAIN.replace(min_p=0.05), logits)
    kept = np.flatnonzero(ratios >= 0.05)
    assert list(np.flatnonzero(got)) == list(kept)
    np.testing.assert_allclose(got[kept], ratios[kept] / ratios[kept].sum(), rtol=1e-6)


def test_min_p_random_against_definition():
    rng = np.random.default_rng(8)
    for min_p in (0.01, 0.1, 0.3, 0.9):
        logits = f32(rng.standard_normal(400) * 2)
        q = softmax(logits)
        want = np.flatnonzero(q >= min_p * q.max())
        assert list(np.flatnonzero(probs(PLAIN.replace(min_p=min_p), logits))) == list(want)


@pytest.mark.parametrize("temperature", [0.25, 1.0, 2.5])
def test_temperature_matches_softmax_of_scaled_logits(temperature):
    rng = np.random.default_rng(9)
    logits = f32(rng.standard_normal(1000) * 3)
    got = probs(PLAIN.replace(temperature=temperature), logits)
    np.testing.assert_allclose(got, softmax(logits.astype(np.float64) / temperature), rtol=1e-10, atol=1e-300)


def test_temperature_applies_after_the_filters():
    # top-p reads temperature-1 probabilities: a high temperature must not
    # widen the kept set, only flatten it.
    p = np.array([0.6, 0.3, 0.1])
    got = probs(PLAIN.replace(top_p=0.85, temperature=5.0), np.log(p))
    assert list(np.flatnonzero(got)) == [0, 1]
    np.testing.assert_allclose(got[:2], softmax(np.log(p[:2]) / 5.0), rtol=1e-6)


def test_penalties_match_the_formulas():
    logits = np.array([2.0, -1.0, 0.0, 3.0, 0.5, -2.0])
    history = [0, 1, 1, 2, 4, 4, 4]
    rep, freq, pres = 1.5, 0.25, 0.5
    params = PLAIN.replace(repeat_penalty=rep, frequency_penalty=freq, presence_penalty=pres, penalty_last_n=-1)
    want = logits.copy()
    for token, count in Counter(history).items():
        z = want[token]
        want[token] = (z / rep if z > 0 else z * rep) - count * freq - pres
    # token 3 never appears: untouched; 0 (positive) divided; 1 and 2 (<= 0) multiplied
    np.testing.assert_allclose(probs(params, logits, history), softmax(want), rtol=1e-6)


def test_penalty_window_reads_only_the_last_n_tokens():
    logits = np.zeros(5)
    history = [0, 0, 0, 1, 2]
    for last_n, penalised in [(2, {1, 2}), (3, {0, 1, 2}), (-1, {0, 1, 2}), (0, set())]:
        params = PLAIN.replace(presence_penalty=1.0, penalty_last_n=last_n)
        got = probs(params, logits, history)
        want = softmax([-1.0 if t in penalised else 0.0 for t in range(5)])
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_frequency_penalty_counts_within_the_window():
    logits = np.zeros(3)
    history = [0, 0, 0, 0, 1, 0]
    got = probs(PLAIN.replace(frequency_penalty=0.5, penalty_last_n=3), logits, history)
    np.testing.assert_allclose(got, softmax([-1.0, -0.5, 0.0]), rtol=1e-6)   # window [0, 1, 0]


def test_greedy_is_argmax_after_bias_and_penalties():
    logits = f32([1.0, 5.0, 4.0, 4.5])
    greedy = SamplingParams.greedy()
    assert Sampler(greedy, 4).sample(logits) == 1
    assert Sampler(greedy.replace(logit_bias={1: -2.0}), 4).sample(logits) == 3
    assert Sampler(greedy.replace(repeat_penalty=2.0), 4).sample(logits, [1, 3]) == 2
    assert Sampler(greedy, 4).sample(f32([3.0, 7.0, 7.0, 7.0])) == 1   # ties: lowest id


def test_logit_bias_bans_and_forces():
    logits = f32([0.0, 3.0, 1.0, 2.0])
    banned = probs(PLAIN.replace(logit_bias={1: -np.inf}), logits)
    assert banned[1] == 0.0
    np.testing.assert_allclose(banned[[0, 2, 3]], softmax(logits[[0, 2, 3]]), rtol=1e-6)

    forced = SamplingParams(seed=3, logit_bias={0: np.inf})
    sampler = Sampler(forced, 4)
    assert {sampler.sample(logits) for _ in range(50)} == {0}
    # two forced tokens share the mass evenly, whatever their logits
    np.testing.assert_allclose(probs(PLAIN.replace(logit_bias={0: np.inf, 2: np.inf}), logits), [0.5, 0, 0.5, 0])
    # an added bias moves the logit by exactly that much
    np.testing.assert_allclose(probs(PLAIN.replace(logit_bias={2: 1.5}), logits),
                               softmax(logits + np.array([0, 0, 1.5, 0])), rtol=1e-6)


def test_banning_every_token_is_an_error():
    params = SamplingParams(logit_bias={0: -np.inf, 1: -np.inf, 2: -np.inf})
    with pytest.raises(InvalidArgumentError, match="logit_bias bans every token"):
        Sampler(params, 3).sample(f32([1.0, 2.0, 3.0]))


def test_ban_beats_a_forced_logit():
    logits = f32([np.inf, 0.0, 1.0])
    got = probs(PLAIN.replace(logit_bias={0: -np.inf}), logits)
    np.testing.assert_allclose(got, [0.0, *softmax([0.0, 1.0])], rtol=1e-6)


def test_caller_logits_are_not_modified():
    rng = np.random.default_rng(10)
    logits = f32(rng.standard_normal(100))
    before = logits.copy()
    params = SamplingParams(seed=1, repeat_penalty=1.3, frequency_penalty=0.1, presence_penalty=0.2,
                            logit_bias={5: -np.inf, 6: 3.0})
    sampler = Sampler(params, 100)
    sampler.sample(logits, [1, 2, 3, 5, 6])
    sampler.probabilities(logits, [1, 2, 3])
    assert np.array_equal(logits, before)


# -- the random stream ---------------------------------------------------

def _sequence(sampler, rng_logits, steps=60, n=50):
    out = []
    for _ in range(steps):
        logits = f32(rng_logits.standard_normal(n))
        out.append(sampler.sample(logits, out))
    return out


def test_same_seed_same_tokens():
    params = SamplingParams(temperature=1.2, seed=1234, repeat_penalty=1.1)
    a = _sequence(Sampler(params, 50), np.random.default_rng(11))
    b = _sequence(Sampler(params, 50), np.random.default_rng(11))
    assert a == b
    assert len(set(a)) > 5   # really sampling, not stuck on one token


def test_different_seeds_differ():
    a = _sequence(Sampler(SamplingParams(temperature=1.5, seed=1), 50), np.random.default_rng(12))
    b = _sequence(Sampler(SamplingParams(temperature=1.5, seed=2), 50), np.random.default_rng(12))
    assert a != b


def test_reset_restarts_the_stream():
    sampler = Sampler(SamplingParams(temperature=1.5, seed=7), 50)
    first = _sequence(sampler, np.random.default_rng(13))
    sampler.reset()
    assert _sequence(sampler, np.random.default_rng(13)) == first
    sampler.reset(seed=8)
    other = Sampler(SamplingParams(temperature=1.5, seed=8), 50)
    assert _sequence(sampler, np.random.default_rng(13)) == _sequence(other, np.random.default_rng(13))


def test_probabilities_leaves_the_stream_alone():
    logits = f32(np.random.default_rng(14).standard_normal(50))
    a = Sampler(SamplingParams(temperature=1.5, seed=5), 50)
    b = Sampler(SamplingParams(temperature=1.5, seed=5), 50)
    b.probabilities(logits)
    assert [a.sample(logits) for _ in range(20)] == [b.sample(logits) for _ in range(20)]


def test_no_seed_still_samples():
    sampler = Sampler(SamplingParams(seed=None), 10)
    assert 0 <= sampler.sample(f32(np.arange(10))) < 10


# -- the draw --------------------------------------------------------------

def test_draws_follow_probabilities_chi_square():
    # Pearson's chi-square over the kept tokens. Bound: 35 with 7 degrees of
    # freedom is beyond the 0.99999 quantile (~33.1); a wrong draw (off by one
    # token, or ignoring temperature) gives thousands.
    logits = f32([2.0, 1.5, 1.0, 0.9, 0.5, 0.0, -0.5, -1.0, -6.0, -9.0])
    sampler = Sampler(SamplingParams(temperature=1.3, top_k=8, top_p=1.0, min_p=0.0, seed=2024), 10)
    p = sampler.probabilities(logits)
    draws = 40_000
    counts = np.bincount([sampler.sample(logits) for _ in range(draws)], minlength=10)
    kept = p > 0
    assert counts[~kept].sum() == 0
    expected = p[kept] * draws
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    assert kept.sum() == 8
    assert chi2 < 35.0, chi2


def test_blocked_draw_inverts_the_cdf_exactly():
    # Integer weights keep every partial sum exact, so the two-level draw must
    # pick the very index that a plain cumsum does, at every u.
    rng = np.random.default_rng(15)
    w = rng.integers(0, 5, 20_000).astype(np.float64)
    w[:500] = 0.0
    w[5000:8000] = 0.0
    w[-2500:] = 0.0   # zero runs at both ends and whole zero blocks between
    cdf = np.cumsum(w)
    for u in np.concatenate((rng.random(2000), [0.0, 1.0 - 2 ** -53])):
        want = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        want = want if want < w.size else int(np.flatnonzero(w)[-1])
        got = sampling._pick(w, float(u))
        assert got == want
        assert w[got] > 0


# -- parameters ------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "hot"),
    ("top_k", 2.5), ("top_k", True),
    ("top_p", 1.5), ("top_p", -0.1), ("top_p", float("nan")),
    ("min_p", 2.0), ("min_p", -1e-9),
    ("repeat_penalty", 0.0), ("repeat_penalty", -1.0), ("repeat_penalty", float("inf")),
    ("frequency_penalty", float("nan")), ("presence_penalty", float("inf")),
    ("penalty_last_n", -2), ("penalty_last_n", 3.0),
    ("seed", -1), ("seed", 1.5),
    ("logit_bias", [1, 2]), ("logit_bias", {-1: 1.0}), ("logit_bias", {"a": 1.0}),
    ("logit_bias", {1: float("nan")}),
])
def test_bad_parameters_raise_naming_the_parameter(name, value):
    with pytest.raises(InvalidArgumentError, match=name):
        SamplingParams(**{name: value})
    with pytest.raises(InvalidArgumentError, match=name):
        SamplingParams().replace(**{name: value})


HUGE = 10 ** 400  # a JSON number: no float holds it (float() raises OverflowError)
FLOAT_FIELDS = ["temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty",
                "typical_p", "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base", "xtc_probability",
                "xtc_threshold"]


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [HUGE, -HUGE, 10 ** 5000], ids=["huge", "-huge", "5000-digits"])
def test_an_integer_past_a_float_is_refused_naming_the_field(name, value):
    """Never an OverflowError (or repr()'s ValueError past 4300 digits)."""
    with pytest.raises(InvalidArgumentError, match=name):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("bias", [{1: HUGE}, {1: -HUGE}, {1: 10 ** 5000}, {"9" * 5000: 1.0}, {-HUGE: 1.0}],
                         ids=["huge", "-huge", "5000-digits", "5000-digit-id", "-huge-id"])
def test_a_huge_logit_bias_is_refused(bias):
    with pytest.raises(InvalidArgumentError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("name", ["mirostat", "penalty_last_n", "dry_allowed_length", "seed"])
def test_huge_integer_fields_are_refused_or_work(name):
    """Integers of any size: refused by name (mirostat; negatives) or used as
    the whole history / a seed, never a crash."""
    for value in (10 ** 5000, -10 ** 5000):
        try:
            p = SamplingParams(**{name: value}, repeat_penalty=1.1, dry_multiplier=0.5, dry_sequence_breakers=())
        except InvalidArgumentError as e:
            assert name in str(e)
            continue
        Sampler(p, 32).sample(np.linspace(-1, 1, 32).astype(np.float32), [1, 2, 3, 1, 2, 3])


def test_error_message_shows_the_value():
    with pytest.raises(InvalidArgumentError, match="1.5"):
        SamplingParams(top_p=1.5)


def test_replace_rejects_unknown_names():
    with pytest.raises(InvalidArgumentError, match="top_q"):
        SamplingParams().replace(top_q=0.5)


def test_replace_and_validate_return_params():
    p = SamplingParams().replace(top_k=5, temperature=1)
    assert (p.top_k, p.temperature, type(p.temperature)) == (5, 1.0, float)
    assert p.validate(100) is p
    assert SamplingParams.greedy().temperature <= 0


def test_validate_checks_bias_ids_against_the_vocabulary():
    p = SamplingParams(logit_bias={10: 1.0})
    p.validate(11)
    with pytest.raises(InvalidArgumentError, match="logit_bias"):
        p.validate(10)
    with pytest.raises(InvalidArgumentError, match="logit_bias"):
        Sampler(p, 10)
    with pytest.raises(InvalidArgumentError, match="n_vocab"):
        p.validate(0)


def test_params_are_values():
    bias = {1: 2.0}
    p = SamplingParams(logit_bias=bias)
    bias[1] = -np.inf   # the caller's dict is copied, not shared
    assert p.logit_bias == {1: 2.0}
    assert p == SamplingParams(logit_bias={1: 2})
    assert hash(SamplingParams(top_k=np.int64(3))) == hash(SamplingParams(top_k=3))
    with pytest.raises(AttributeError):
        p.top_k = 3


def test_bad_logits_raise():
    sampler = Sampler(SamplingParams(seed=0), 4)
    with pytest.raises(InvalidArgumentError, match="float32"):
        sampler.sample(np.zeros(4, dtype=np.float64))
    with pytest.raises(ShapeError, match=r"\(4,\)"):
        sampler.sample(np.zeros(5, dtype=np.float32))
    with pytest.raises(ShapeError):
        sampler.sample(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(NumericalError, match=r"NaN \(first at token id 1\): the model's computation") as e:
        sampler.sample(f32([0.0, np.nan, 1.0, 2.0]))
    assert not isinstance(e.value, InvalidArgumentError)  # the model's fault, not the caller's
    with pytest.raises(InvalidArgumentError, match="numpy array"):
        sampler.sample([0.0, 1.0, 2.0, 3.0])
    with pytest.raises(InvalidArgumentError, match="-inf"):
        sampler.sample(f32([-np.inf] * 4))


def test_bad_history_raises():
    sampler = Sampler(SamplingParams(seed=0, repeat_penalty=1.1), 4)
    logits = f32([0.0, 1.0, 2.0, 3.0])
    with pytest.raises(TokenError, match="4"):
        sampler.sample(logits, [1, 4])
    with pytest.raises(TokenError):
        sampler.sample(logits, [-1])
    with pytest.raises(ShapeError):
        sampler.sample(logits, [[1, 2]])
    with pytest.raises(InvalidArgumentError, match="integer"):
        sampler.sample(logits, [0.5])


def test_errors_share_the_package_base():
    for cls in (InvalidArgumentError, ShapeError, TokenError):
        assert issubclass(cls, LLMInferError)


def test_sampler_checks_its_arguments():
    with pytest.raises(InvalidArgumentError, match="params"):
        Sampler({"top_k": 1}, 10)
    with pytest.raises(InvalidArgumentError, match="n_vocab"):
        Sampler(SamplingParams(), 0)
    with pytest.raises(InvalidArgumentError, match="seed"):
        Sampler(SamplingParams(), 10).reset(seed=-5)


def test_large_vocab_default_params_sample_in_the_kept_set():
    # Default settings at the size they are tuned for: every draw is a token
    # that probabilities() gives weight, and top-k's 40 bound holds.
    n = 262_144
    rng = np.random.default_rng(16)
    logits = f32(rng.standard_normal(n) * 3)
    sampler = Sampler(SamplingParams(seed=9), n)
    p = sampler.probabilities(logits)
    assert 1 <= np.count_nonzero(p) <= 40
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-12)
    largest = set(np.argsort(logits)[-40:].tolist())
    assert set(np.flatnonzero(p).tolist()) <= largest
    for _ in range(20):
        assert p[sampler.sample(logits)] > 0


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 100, 49152])
def test_the_c_top_k_keeps_the_k_largest_lowest_ids_first_among_ties(n):
    """_core.top_k (csrc/ops.c), which _largest uses up to _C_TOP_K, against
    a lexsort: the k largest values, and of those equal to the k-th, the
    lowest ids, in the lexsort's order (value descending, id ascending);
    with ties everywhere (rounded values), -inf, and every k near the block
    edges of its scan. _top_sorted gives that order whichever way it goes."""
    from llminfer import _core
    from llminfer.generation.sampling import _C_TOP_K, _largest, _top_sorted

    rng = np.random.default_rng(n)
    for x in ((rng.standard_normal(n) * 3).astype(np.float32), np.round(rng.standard_normal(n)).astype(np.float32),
              np.where(rng.random(n) < 0.5, -np.inf, rng.standard_normal(n)).astype(np.float32)):
        order = np.lexsort((np.arange(n), -x.astype(np.float64)))
        for k in sorted({1, 2, 5, 31, 32, 33, 40, 256, n - 1, n} & set(range(1, n + 1))):
            want = order[:k].tolist()
            assert _core.top_k(x, k).tolist() == want, (n, k)
            if k < n:
                assert set(_largest(x, k).tolist()) == set(want)
                assert _top_sorted(x, k)[0].tolist() == want
                assert _top_sorted(x.astype(np.float64), k)[0].tolist() == want  # the numpy way
    assert _C_TOP_K >= 40  # the default top_k goes through it
    with pytest.raises(InvalidArgumentError):
        _core.top_k(np.zeros(4, np.float32), 5)


# -- top-p's cut in C (li_top_p_cut), against a full sort ---------------------

def cut_by_sort(x, e, target, floor_x):
    """(v, r) or None as li_top_p_cut defines them, by a full sort; "ambiguous"
    when the running weight passes within rounding of target."""
    order = np.lexsort((np.arange(x.size), -x))
    order = order[(x[order] >= floor_x) & (e[order] > 0)]
    cum = np.cumsum(e[order].astype(np.float64))
    if cum.size == 0 or cum[-1] < target:
        return None
    if np.any(np.abs(cum - target) <= 1e-9 * max(target, 1e-300)) and target > 0:
        return "ambiguous"
    c = int(np.searchsorted(cum, target, side="left"))
    v = x[order[c]]
    return v, int(np.count_nonzero(x[order[:c + 1]] == v))


def cut_cases(rng):
    n = 70000
    yield "gauss3", rng.standard_normal(n) * 3
    yield "peaked", np.concatenate(([9.0, 8.5], rng.standard_normal(n - 2)))
    # weights between 2^-20 and 2^-10 of the top hold the cut (the second pass)
    yield "mid tail", np.concatenate(([0.0], np.full(n - 1, -9.0) + rng.random(n - 1) * 0.01))
    # weights under 2^-20 hold it: only the pass over every token finds it
    yield "deep tail", np.concatenate(([0.0], np.full(n - 1, -14.0) + rng.random(n - 1) * 0.01))
    yield "integers (ties)", rng.integers(-6, 2, n).astype(np.float64)
    masked = rng.standard_normal(n) * 2
    masked[rng.random(n) < 0.4] = -np.inf
    yield "some -inf", masked
    yield "all equal", np.zeros(n)
    yield "short", rng.standard_normal(50)


def test_top_p_cut_matches_a_full_sort():
    rng = np.random.default_rng(20)
    checked = 0
    for name, values in cut_cases(rng):
        x = f32(values)
        e = np.exp(x - x.max())
        total = e.sum(dtype=np.float64)
        scratch = np.empty(3 * x.size, dtype=np.float32)
        for top_p in (0.0, 0.3, 0.9, 0.95, 0.999):
            for floor_x in (-np.inf, float(x.max()) - 3.0, float(x.max()) - 10.0):
                target = top_p * total
                want = cut_by_sort(x, e, target, np.float32(floor_x))
                if want == "ambiguous":
                    continue
                got = _core.top_p_cut(x, e, target, np.float32(floor_x), scratch)
                assert got == want, (name, top_p, floor_x)
                checked += 1
    assert checked >= 100


def test_top_p_cut_refuses_bad_buffers():
    x = f32(np.zeros(10))
    e = np.ones(10, dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="scratch"):
        _core.top_p_cut(x, e, 1.0, -np.inf, np.empty(29, dtype=np.float32))
    with pytest.raises(InvalidArgumentError, match="weights"):
        _core.top_p_cut(x, e[:9], 1.0, -np.inf, np.empty(30, dtype=np.float32))
    with pytest.raises(InvalidArgumentError):
        _core.top_p_cut(x, e, float("nan"), -np.inf, np.empty(30, dtype=np.float32))


def test_top_p_of_strided_logits_equals_a_copy():
    rng = np.random.default_rng(21)
    wide = f32(rng.standard_normal(2 * 5000) * 3)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=0)
    view = wide[::2]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(Sampler(p, 5000).probabilities(view), Sampler(p, 5000).probabilities(view.copy()))
