"""Speculative decoding (llminfer/generation/speculative.py).

Exactness is the point: greedy output, and seeded output with point-mass
(n-gram) drafts, must be the tokens of plain decoding one for one, which the
engine's batch invariance makes possible (a verification row's logits are
bitwise those of a one-token pass: checked directly on SmolLM2 and Gemma 3).
Sampling with a draft model changes the tokens of a seed but not their
distribution: a chi-square test against the exact distribution of a short
continuation, enumerated from the target's own probabilities, and the same
test shown to reject two wrong acceptance rules.
"""

import math

import gguf
import numpy as np
import pytest

from llminfer import LLM, SamplingParams

from llminfer.generation import speculative
from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, VocabularyMismatchError
from llminfer.generation.sampling import Sampler
from llminfer.generation.speculative import NGramIndex, SpecConfig, Speculator, _Ledger

from tiny_models import TinyConfig, write_model


def _sharpen_output(name, data, qtype):
    if name == "output.weight":
        return (gguf.quants.dequantize(data, qtype) * 3.0).astype(np.float32), gguf.GGMLQuantizationType.F32
    return data, qtype


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny models with one vocabulary: two llamas with different weights (a
    target and a draft that disagrees with it often) and a gemma3 with
    sliding-window layers (window 8), so rollbacks meet a window that slides."""
    root = tmp_path_factory.mktemp("spec")
    return {
        "llama": write_model(root / "llama.gguf", TinyConfig(tie_output=False)),
        "draft": write_model(root / "draft.gguf", TinyConfig(tie_output=False, seed=3, n_layer=1)),
        # the target's weights with a sharper output head: a draft whose q
        # overlaps p but differs from it, so that accepting and correcting
        # both matter (the chi-square test)
        "sharp": write_model(root / "sharp.gguf", TinyConfig(tie_output=False), tensor_hook=_sharpen_output),
        "gemma3": write_model(root / "gemma3.gguf", TinyConfig(arch="gemma3", sliding_window=8, seed=1,
                                                               tie_output=False)),
        # the same weights at 4 bits: a draft that mostly agrees
        "llama_q4": write_model(root / "llama_q4.gguf", TinyConfig(tie_output=False, qtype="Q4_0")),
        "gemma3_q4": write_model(root / "gemma3_q4.gguf", TinyConfig(arch="gemma3", sliding_window=8, seed=1,
                                                                     tie_output=False, qtype="Q4_0")),
    }


ALWAYS = SpecConfig(mode="ngram", draft_max=8, adaptive=False)


def prompts(n, seed=0):
    """Token prompts that repeat themselves, so n-gram drafts fire."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        unit = rng.integers(0, 266, int(rng.integers(3, 9))).tolist()
        out.append([266] + unit * int(rng.integers(2, 5)) + unit[:2])  # stops inside a repeat
    return out


# ---------------------------------------------------------------- pieces

def test_ngram_index_drafts_what_followed_before():
    idx = NGramIndex()
    text = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert idx.draft(text, 4) == [8, 9, 1, 2]
    assert idx.draft(text, 2) == [8, 9]
    assert idx.draft(text, 0) == []


def test_ngram_index_thresholds():
    idx = NGramIndex()
    # a 1-gram seen once is not enough (llama.cpp's lax threshold: 2 occurrences)
    assert idx.draft([4, 5, 4], 3) == []
    # seen twice with one follower: drafted
    assert idx.draft([4, 5, 4, 5, 4], 1) == [5]
    # followers split 1:1:1 (33%) after a 1-gram: under 66%, nothing
    idx = NGramIndex()
    assert idx.draft([4, 1, 4, 2, 4, 3, 4], 1) == []
    # a 3-gram seen once outranks the ambiguous 1-gram
    idx = NGramIndex()
    assert idx.draft([7, 8, 4, 9, 4, 1, 4, 2, 7, 8, 4], 1) == [9]
    # ties go to the most recent follower
    idx = NGramIndex(2, 2)
    assert idx.draft([3, 4, 1, 3, 4, 2, 3, 4], 1) == [2]


def test_ngram_index_counts_incrementally():
    a, b = NGramIndex(), NGramIndex()
    text = np.random.default_rng(0).integers(0, 5, 300).tolist()
    for n in range(1, len(text) + 1):
        a.extend(text[:n])
    b.extend(text)
    assert a.counts == b.counts and a.latest == b.latest


def test_ledger_pauses_drafts_that_do_not_pay_and_backs_off():
    led = _Ledger()
    assert not led.may_draft()  # no plain step measured yet
    led.record(1.0, 1, drafted=False)
    assert led.may_draft()
    # drafting steps that take 1.3 plain steps and yield 1 token: a loss
    pauses = []
    for _ in range(4):
        while led.may_draft():
            led.record(1.3, 1, drafted=True)
        pauses.append(led.pause)
        while not led.may_draft():
            led.record(1.0, 1, drafted=False)
    assert pauses == [16, 32, 64, 128]
    # steps that yield 3 tokens for 1.5 plain steps pay: drafting stays on,
    # but for a plain step every REMEASURE steps, and pauses start short again
    for _ in range(200):
        if led.may_draft():
            led.record(1.5, 3, drafted=True)
        else:
            assert led.pause == 0 and led.since_plain == led.REMEASURE
            led.record(1.0, 1, drafted=False)
    assert led.next_pause == led.PAUSE_MIN


def test_ledger_remeasures_the_plain_step():
    led = _Ledger()
    led.record(1.0, 1, drafted=False)
    n = 0
    while led.may_draft():
        led.record(1.0, 4, drafted=True)
        n += 1
    assert n == led.REMEASURE


def test_config_is_checked():
    for bad in (dict(mode="tree"), dict(draft_max=0), dict(draft_max=33), dict(ngram_min=0),
                dict(ngram_min=3, ngram_max=2), dict(p_min=1.5), dict(adaptive=1)):
        with pytest.raises(InvalidArgumentError):
            SpecConfig(**bad)
    sampler = Sampler(SamplingParams(), 10)
    with pytest.raises(InvalidArgumentError, match="draft model"):
        Speculator(SpecConfig(mode="draft"), sampler)


def test_accept_needs_propose_and_matching_rows():
    s = Speculator(ALWAYS, Sampler(SamplingParams.greedy(), 4))
    with pytest.raises(InvalidArgumentError, match="propose"):
        s.accept(np.zeros((1, 4), np.float32), [1])
    s.start([1, 2, 1, 2])
    drafts = s.propose([1, 2, 1, 2, 1], 4)
    assert drafts
    with pytest.raises(InvalidArgumentError, match="rows"):
        s.accept(np.zeros((len(drafts) + 2, 4), np.float32), [1, 2, 1, 2, 1])


# ---------------------------------------------------------------- exactness, greedy

def _plain_and_spec(llm, prompt, n, **kw):
    a = llm.complete(prompt, max_tokens=n, spec="off", **kw)
    b = llm.complete(prompt, max_tokens=n, **kw)
    return a, b


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_ngram_output_is_plain_output(models, arch):
    with LLM(models[arch], n_ctx=256, n_threads=1, spec=ALWAYS) as llm:
        drafted = accepted = 0
        for p in prompts(16, seed=1):
            a, b = _plain_and_spec(llm, p, 40, temperature=0)
            assert a.tokens == b.tokens and a.text == b.text
            assert a.timings.spec_drafted == 0
            drafted += b.timings.spec_drafted
            accepted += b.timings.spec_accepted
        assert drafted > 0 and accepted > 0  # both verdicts were exercised
        assert accepted < drafted


@pytest.mark.parametrize("arch,draft", [("llama", "draft"), ("llama", "llama_q4"), ("gemma3", "gemma3_q4")])
def test_greedy_draft_model_output_is_plain_output(models, arch, draft):
    cfg = SpecConfig(mode="draft", draft_max=6, p_min=0.0, adaptive=False)
    with LLM(models[arch], n_ctx=256, n_threads=1, draft_model=models[draft], spec=cfg) as llm:
        drafted = accepted = 0
        for p in prompts(10, seed=2):
            a, b = _plain_and_spec(llm, p, 32, temperature=0)
            assert a.tokens == b.tokens
            drafted += b.timings.spec_drafted
            accepted += b.timings.spec_accepted
        assert drafted > 0 and 0 < accepted < drafted


def test_adaptive_ngram_output_is_plain_output(models):
    # the default: cost control and adaptive draft length on
    with LLM(models["llama"], n_ctx=256, n_threads=1, spec="ngram") as llm:
        for p in prompts(6, seed=3):
            a, b = _plain_and_spec(llm, p, 48, temperature=0)
            assert a.tokens == b.tokens


def test_spec_near_the_end_of_the_context_and_with_context_shift(models):
    with LLM(models["gemma3"], n_ctx=64, n_threads=1, spec=ALWAYS) as llm:
        p = prompts(1, seed=4)[0]
        a, b = _plain_and_spec(llm, p, 64 - len(p), temperature=0)
        assert a.tokens == b.tokens and len(a.tokens) == 64 - len(p)
        a, b = _plain_and_spec(llm, p, 150, temperature=0, context_shift=True)
        assert a.tokens == b.tokens and len(a.tokens) == 150


def test_stop_strings_and_eog_with_spec(models):
    with LLM(models["llama"], n_ctx=256, n_threads=1, spec=ALWAYS) as llm:
        for p in prompts(6, seed=5):
            full = llm.complete(p, max_tokens=30, temperature=0, spec="off").text
            if len(full) < 6:
                continue
            stop = full[3:5]
            a, b = _plain_and_spec(llm, p, 30, temperature=0, stop=stop)
            assert a.text == b.text and a.finish_reason == b.finish_reason == "stop"


# ---------------------------------------------------------------- exactness, sampling

SETTINGS = [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.5, top_k=0, top_p=0.9, min_p=0.0),
    dict(temperature=0.5, top_k=5, repeat_penalty=1.1, frequency_penalty=0.05, presence_penalty=0.05),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, logit_bias={3: 2.0, 7: -math.inf}),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_seeded_ngram_sampling_is_plain_sampling(models, settings):
    """Point-mass drafts checked by the sampler itself take the same random
    numbers as plain decoding: the same seed gives the same tokens."""
    with LLM(models["llama"], n_ctx=256, n_threads=1, spec=ALWAYS) as llm:
        drafted = 0
        for i, p in enumerate(prompts(6, seed=6)):
            a, b = _plain_and_spec(llm, p, 100, seed=100 + i, **settings)
            assert a.tokens == b.tokens
            drafted += b.timings.spec_drafted
        assert drafted > 0


def test_greedy_draft_model_with_sampling_params_is_plain(models):
    # temperature 0 with penalties and bias: the draft is a point mass again
    cfg = SpecConfig(mode="draft", draft_max=4, p_min=0.0, adaptive=False)
    with LLM(models["llama"], n_ctx=256, n_threads=1, draft_model=models["draft"], spec=cfg) as llm:
        for p in prompts(5, seed=7):
            a, b = _plain_and_spec(llm, p, 30, temperature=0, repeat_penalty=1.5, logit_bias={9: 1.0})
            assert a.tokens == b.tokens


def chi2_sf(x, dof):
    """P(X > x) for X chi-square with dof degrees of freedom: the regularized
    upper incomplete gamma Q(dof/2, x/2), by its series below a + 1 and its
    continued fraction (Lentz) above (Numerical Recipes 6.2)."""
    a, x = dof / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    front = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while term > total * 1e-16:
            n += 1
            term *= x / n
            total += term
        return 1.0 - front * total
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = d if abs(d) > tiny else tiny
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return front * h


def test_chi2_sf_against_table_values():
    # 95th and 99.9th percentiles from the standard chi-square table
    for x, dof, p in ((3.841, 1, 0.05), (18.307, 10, 0.05), (10.828, 1, 0.001), (29.588, 10, 0.001),
                      (101.879, 80, 0.05)):
        assert abs(chi2_sf(x, dof) - p) < 2e-4 * max(1, p * 100)


# Sampling of the chi-square test: few candidates per step (top_k 3), and a
# repeat penalty over the whole history, so that the target's p at a drafted
# position depends on the drafts before it (a p computed without them would
# be caught too). EOS is banned so that every draw has CHI_LEN tokens.
CHI_PARAMS = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, repeat_penalty=1.6,
                            penalty_last_n=-1, logit_bias={267: -math.inf})
CHI_LEN = 4          # tokens per draw: the first from the prompt, three from one draft-and-verify step
CHI_DRAWS = 2000
CHI_ALPHA = 1e-3     # seeds are fixed, so the test is deterministic; a correct rule passes at this level


def exact_distribution(path, prompt, params, length):
    """{continuation: probability} of `length` tokens sampled plainly from the
    model, enumerated from Sampler.probabilities at every prefix."""
    eng = Engine(path, n_ctx=64, n_threads=1)
    sampler = Sampler(params, eng.n_vocab)
    out = {}
    try:
        def walk(prefix, prob):
            if len(prefix) == length:
                out[tuple(prefix)] = prob
                return
            seq = eng.new_sequence()
            logits = eng.decode([(seq, prompt + prefix)])[0]
            eng.free(seq)
            p = sampler.probabilities(logits, prompt + prefix)
            for t in np.flatnonzero(p):
                walk(prefix + [int(t)], prob * p[t])
        walk([], 1.0)
    finally:
        eng.close()
    return out


def chi_square_p(models, monkeypatch, rule=None):
    """The p-value of CHI_DRAWS speculative draws against the exact distribution."""
    prompt = [266, 40, 41, 42, 43]
    exact = exact_distribution(models["llama"], prompt, CHI_PARAMS, CHI_LEN)
    if rule is not None:
        monkeypatch.setattr(speculative, "_accept_ratio", rule)
    cfg = SpecConfig(mode="draft", draft_max=CHI_LEN - 1, p_min=0.0, adaptive=False)
    counts = {}
    with LLM(models["llama"], n_ctx=64, n_threads=1, draft_model=models["sharp"], spec=cfg) as llm:
        drafted = accepted = 0
        for s in range(CHI_DRAWS):
            c = llm.complete(prompt, max_tokens=CHI_LEN, sampling=CHI_PARAMS.replace(seed=s))
            key = tuple(c.tokens)
            counts[key] = counts.get(key, 0) + 1
            drafted += c.timings.spec_drafted
            accepted += c.timings.spec_accepted
    assert set(counts) <= set(exact)
    assert drafted >= (CHI_LEN - 2) * CHI_DRAWS and 0.3 * drafted < accepted < 0.9 * drafted
    # cells expected below 5 go into one, as the test's approximation needs
    stat, small_obs, small_exp, cells = 0.0, 0, 0.0, 0
    for key, prob in exact.items():
        e, o = prob * CHI_DRAWS, counts.get(key, 0)
        if e < 5:
            small_obs += o
            small_exp += e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if small_exp > 0:
        stat += (small_obs - small_exp) ** 2 / small_exp
        cells += 1
    return chi2_sf(stat, cells - 1)


def test_draft_model_sampling_keeps_the_distribution(models, monkeypatch):
    assert chi_square_p(models, monkeypatch) > CHI_ALPHA


def _resample_from_p(sampler, p, q, d):
    # a common mistake: on rejection draw from p instead of norm(max(0, p - q))
    if sampler.uniform() * q[d] < p[d]:
        return d
    return sampler.draw(p)


def _accept_by_p(sampler, p, q, d):
    # another: accept with p(d), ignoring how likely the draft made d
    if sampler.uniform() < p[d]:
        return d
    return sampler.draw(np.maximum(p - q, 0.0) if (p > q).any() else p)


@pytest.mark.parametrize("rule", [_resample_from_p, _accept_by_p])
def test_chi_square_rejects_a_wrong_acceptance_rule(models, monkeypatch, rule):
    """The test above has the power to fail: each wrong rule, with the same
    seeds and draws, is rejected at the same level. (When written: p = 0.88
    for the correct rule, 1e-20 for _resample_from_p, 1e-125 for _accept_by_p,
    with about 72% of drafts accepted.)"""
    assert chi_square_p(models, monkeypatch, rule) < CHI_ALPHA


# ---------------------------------------------------------------- the API

def test_vocabulary_mismatch_is_refused(models, gemma3_path):
    with pytest.raises(VocabularyMismatchError, match="vocabular"):
        LLM(models["llama"], n_ctx=64, draft_model=gemma3_path)


def test_spec_arguments_are_checked(models):
    with pytest.raises(InvalidArgumentError, match="draft model"):
        LLM(models["llama"], n_ctx=64, spec="draft")
    with pytest.raises(InvalidArgumentError, match="spec"):
        LLM(models["llama"], n_ctx=64, spec="fast")
    with pytest.raises(InvalidArgumentError, match="draft_max"):
        LLM(models["llama"], n_ctx=64, draft_max=4)
    with pytest.raises(InvalidArgumentError, match="draft_max"):
        LLM(models["llama"], n_ctx=64, spec="ngram", draft_max=64)
    with LLM(models["llama"], n_ctx=64, n_threads=1) as llm:
        with pytest.raises(InvalidArgumentError, match="one prompt"):
            llm.complete(["a b", "c d"], max_tokens=2, spec="ngram")
        with pytest.raises(InvalidArgumentError, match="draft model"):
            llm.complete("a b", max_tokens=2, spec="draft")
        with pytest.raises(InvalidArgumentError):
            llm.generate("a b", max_tokens=2, spec="nope")


def test_every_entry_point_speculates(models):
    with LLM(models["llama"], n_ctx=256, n_threads=1) as llm:
        # a prompt on which drafts fire (which ones do depends on the random
        # model's continuation matching an n-gram seen before)
        for p in prompts(16, seed=8):
            s = llm.complete(p, max_tokens=40, temperature=0, stream=True, spec=ALWAYS)
            "".join(s)
            if s.result.timings.spec_drafted > 0:
                break
        else:
            raise AssertionError("no prompt made n-gram drafts fire")
        plain = llm.generate(p, max_tokens=40, temperature=0)
        assert llm.generate(p, max_tokens=40, temperature=0, spec="ngram") == plain
        assert "".join(llm.generate(p, max_tokens=40, temperature=0, stream=True, spec="ngram")) == plain
        s = llm.complete(p, max_tokens=40, temperature=0, stream=True, spec=ALWAYS)
        assert "".join(s) == plain
        t = s.result.timings
        assert t.spec_drafted > 0 and t.acceptance_rate == t.spec_accepted / t.spec_drafted
        d = t.as_dict()
        assert d["spec_drafted"] == t.spec_drafted and d["acceptance_rate"] == t.acceptance_rate
        out = llm.create_completion(p, max_tokens=40, temperature=0, spec=ALWAYS)
        assert out["choices"][0]["text"] == plain
        text = "".join(ch["choices"][0]["text"]
                       for ch in llm.create_completion(p, max_tokens=40, temperature=0, spec=ALWAYS, stream=True))
        assert text == plain
        # batched generation runs without speculation, and spec="off" switches it off
        assert llm.generate([p], max_tokens=40, temperature=0) == [plain]


def test_chat_speculates(smollm2_path):
    msgs = [{"role": "user", "content": "Repeat exactly: one two three four, one two three four, "
                                        "one two three four."}]
    with LLM(smollm2_path, n_ctx=512, n_threads=1, spec="ngram") as llm:
        a = llm.chat_completion(msgs, max_tokens=32, temperature=0, spec="off")
        b = llm.chat_completion(msgs, max_tokens=32, temperature=0)
        assert a.text == b.text
        assert llm.chat(msgs, max_tokens=32, temperature=0) == a.text


# ---------------------------------------------------------------- real models

TEXTS = [
    "def area(width, height):\n    return width * height\n\ndef area(width, height):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "Once upon a time, in a land far away, there lived",
    "Q: What is the capital of France?\nA: Paris.\nQ: What is the capital of Italy?\nA:",
    "<html>\n  <body>\n    <p>Hello</p>\n    <p>",
]


@pytest.fixture(params=["smollm2", "gemma3"])
def real_model(request, smollm2_path, gemma3_path):
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}[request.param]


def test_verify_rows_are_one_token_logits_bitwise(real_model):
    """What exactness rests on: the logits of a batch of k + 1 verification
    rows equal, bit for bit, those of k + 1 one-token passes."""
    eng = Engine(real_model, n_ctx=256, n_threads=2)
    try:
        for text in TEXTS:
            ids = eng.tokenizer.encode(text, add_bos=True)
            one = eng.new_sequence()
            last = eng.decode([(one, ids)])[0]
            toks, rows = [], []
            for _ in range(9):
                toks.append(int(np.argmax(last)))
                last = eng.decode([(one, [toks[-1]])])[0]
                rows.append(last)
            batch = eng.new_sequence()
            eng.decode([(batch, ids, None)])
            got = eng.decode([(batch, toks, "all")])[0]
            assert np.array_equal(got, np.stack(rows))
            # and after a rollback of the last 5, the same again
            eng.truncate(batch, len(batch.tokens) - 5)
            got = eng.decode([(batch, toks[-5:], "all")])[0]
            assert np.array_equal(got, np.stack(rows[-5:]))
            eng.free(one)
            eng.free(batch)
    finally:
        eng.close()


def test_real_models_greedy_spec_is_plain(real_model):
    ngram = SpecConfig(mode="ngram", draft_max=4, adaptive=False)
    with LLM(real_model, n_ctx=256, n_threads=2, spec=ngram) as llm:
        plain, drafted = [], 0
        for text in TEXTS:
            a, b = _plain_and_spec(llm, text, 20, temperature=0)
            assert a.tokens == b.tokens
            plain.append(a.tokens)
            drafted += b.timings.spec_drafted
        assert drafted > 0
    # the model drafting for itself: every draft is accepted
    selfdraft = SpecConfig(mode="draft", draft_max=4, p_min=0.0, adaptive=False)
    with LLM(real_model, n_ctx=256, n_threads=2, draft_model=real_model, spec=selfdraft) as llm:
        for text, want in list(zip(TEXTS, plain))[:3]:
            b = llm.complete(text, max_tokens=20, temperature=0)
            assert b.tokens == want
            assert b.timings.spec_accepted == b.timings.spec_drafted > 0


def test_cli_spec_flags(models, capsys):
    from llminfer.cli.commands import main

    p = "the cat sat on the mat, the cat sat on the mat, the cat"
    base = ["run", "-m", models["llama"], "-p", p, "-n", "24", "--temp", "0", "-t", "1", "-c", "128"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--spec", "ngram", "--draft-max", "4"]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    assert main(base + ["--draft-model", models["llama_q4"]]) == 0
    out = capsys.readouterr()
    assert out.out == plain  # (the tiny draft is rarely sure enough, p_min 0.75, to draft)
    assert main(base + ["--draft-max", "4"]) == 1
    assert "--draft-max" in capsys.readouterr().err
    assert main(base + ["--spec", "draft"]) == 1
    assert "draft model" in capsys.readouterr().err
