"""llminfer.generation.generator.Generator, the per-token tail every front drives: with
SmolLM2's real tokenizer and greedy sampling steered by one-hot logits, the
text it assembles (UTF-8 split over tokens, stop strings held back and cut),
its finish reasons and its log-probabilities; then that the batch path and
the single-sequence path, which both drive it, give the same completions."""

import numpy as np
import pytest

from llminfer import LLM
from llminfer.generation.generator import Generator, StopMatcher, log_softmax, stop_list, token_logprobs
from llminfer.errors import InvalidArgumentError
from llminfer.generation.sampling import Sampler, SamplingParams


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(smollm2_path, n_ctx=256, n_threads=1) as m:
        yield m


def one_hot(n_vocab, tok, rng=None):
    logits = (rng.normal(size=n_vocab) if rng is not None else np.zeros(n_vocab)).astype(np.float32)
    logits[tok] = 30.0
    return logits


def run(llm, tokens, stops=(), logprobs=None, ignore_eos=False):
    """Drive a Generator through tokens (each the argmax of its logits):
    (output text, finish reason, events)."""
    gen = Generator(Sampler(SamplingParams(temperature=0), llm.n_vocab), llm.tokenizer, stops,
                    history=[1, 2, 3], logprobs=logprobs, ignore_eos=ignore_eos)
    rng = np.random.default_rng(0)
    text, events, reason = "", [], None
    for t in tokens:
        logits = one_hot(llm.n_vocab, t, rng)
        tok = gen.next_token(logits)
        assert tok == t
        event, reason = gen.emit(tok, logits)
        if event is not None:
            events.append((event, logits))
            text += event.text
        if reason is not None:
            break
    tail, reason = gen.finish(reason or "length")
    return text + tail, reason, events


def byte_token(llm, b: int) -> int:
    return next(i for i in range(llm.n_vocab) if llm.tokenizer.token_bytes(i) == bytes([b]))


def test_a_character_split_over_tokens_comes_out_whole(llm):
    ids = llm.tokenize("caf", add_bos=False) + [byte_token(llm, 0xC3), byte_token(llm, 0xA9)]
    text, reason, events = run(llm, ids)
    assert text == "café" and reason == "length"
    assert events[-2][0].text == "" and events[-1][0].text.endswith("é")  # nothing half a character


def test_a_stop_string_is_held_back_then_cut(llm):
    ids = llm.tokenize("Hello world. The end", add_bos=False)
    text, reason, events = run(llm, ids, stops=["world."])
    assert text == "Hello " and reason == "stop"
    # a prefix of the stop string that goes elsewhere comes out at the end
    text, reason, _ = run(llm, ids, stops=["The ends"])
    assert text == "Hello world. The end" and reason == "length"


def test_an_end_of_generation_token_ends_the_sequence_unless_ignored(llm):
    eos = min(llm.tokenizer.eog_ids)
    ids = llm.tokenize("Yes", add_bos=False)
    text, reason, events = run(llm, ids + [eos] + ids)
    assert text == "Yes" and reason == "stop" and len(events) == len(ids)
    _, reason, events = run(llm, ids + [eos] + ids, ignore_eos=True)
    assert reason == "length" and len(events) == 2 * len(ids) + 1


def test_logprobs_are_the_logits_log_softmax(llm):
    ids = llm.tokenize("one two", add_bos=False)
    _, _, events = run(llm, ids, logprobs=3)
    for event, logits in events:
        want = log_softmax(logits)
        assert event.logprob == pytest.approx(want[event.token], abs=1e-12)
        assert [t for t, _ in event.top] == list(np.argsort(-want, kind="stable")[:3])
        assert (event.logprob, event.top) == token_logprobs(logits, event.token, 3)


def test_stop_helpers():
    assert stop_list(None) == [] and stop_list("x") == ["x"] and stop_list(("a", "b")) == ["a", "b"]
    with pytest.raises(InvalidArgumentError):
        stop_list([1])
    m = StopMatcher(["abc"])
    assert m.push("xa") == ("x", False) and m.push("b") == ("", False) and m.push("d") == ("abd", False)
    assert m.push("zab") == ("z", False) and m.push("c!") == ("", True)


def test_the_batch_and_the_single_path_give_the_same_completions(llm):
    """Both drive a Generator; the batch path is LLM.complete over a list."""
    prompts = ["The capital of France is", "1, 2, 3,", "Once upon a time"]
    kw = dict(max_tokens=24, temperature=0.8, seed=5, stop=[" the", "\n\n"], logprobs=2)
    batch = llm.complete(prompts, **kw)
    for p, b in zip(prompts, batch):
        one = llm.complete(p, **kw)
        assert (one.text, one.tokens, one.finish_reason) == (b.text, b.tokens, b.finish_reason)
        assert one.logprobs == b.logprobs
