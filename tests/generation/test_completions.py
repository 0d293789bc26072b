"""OpenAI completion options (llminfer/generation/completions.py): logprobs against a
numpy log-softmax of the model's logits, echo, n choices, fill-in-the-middle
on a tiny GGUF that declares FIM tokens."""

import numpy as np
import pytest

from llminfer import LLM
from llminfer.errors import InvalidArgumentError

from tiny_models import TinyConfig, vocab, write_model

PROMPT = "the cat sat on the mat"
SAMPLE = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def _fim_ids():
    tokens, _ = vocab()
    return {k: tokens.index(c) for k, c in (("pre", "x"), ("suf", "y"), ("mid", "z"))}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("completions")
    fim = _fim_ids()
    path = write_model(root / "fim.gguf", TinyConfig(tie_output=False), extra_uint32={
        "tokenizer.ggml.fim_pre_token_id": fim["pre"], "tokenizer.ggml.fim_suf_token_id": fim["suf"],
        "tokenizer.ggml.fim_mid_token_id": fim["mid"]})
    m = LLM(path, n_ctx=96, n_threads=1)
    m.plain = LLM(write_model(root / "plain.gguf", TinyConfig(tie_output=False)), n_ctx=96, n_threads=1)
    yield m
    m.plain.close()
    m.close()


def log_softmax(z):
    z = z.astype(np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def test_logprobs_are_the_models_log_softmax(llm):
    out = llm.create_completion(PROMPT, max_tokens=6, logprobs=3, seed=4, **SAMPLE)
    ch = out["choices"][0]
    ids = llm.tokenize(PROMPT)
    c = llm.complete(PROMPT, max_tokens=6, logprobs=3, seed=4, **SAMPLE)  # the same run, with its token ids
    gen = c.tokens
    assert c.text == ch["text"]
    lp = ch["logprobs"]
    assert lp["token_logprobs"] == [x for x, _ in c.logprobs]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == out["usage"]["completion_tokens"] == 6
    # the logits each token was drawn from: evaluate prompt + tokens afresh
    llm.reset()
    rows = llm.eval(ids + gen)[len(ids) - 1:]
    for i, t in enumerate(gen[:len(lp["tokens"])]):
        want = log_softmax(rows[i])
        assert lp["token_logprobs"][i] == pytest.approx(want[t], abs=1e-4)
        top = sorted(range(want.size), key=lambda j: -want[j])[:3]
        assert [j for j, _ in c.logprobs[i][1]] == top
        assert [v for _, v in c.logprobs[i][1]] == pytest.approx([want[j] for j in top], abs=1e-4)
        # the legacy dict keys alternatives by text (byte tokens may share one), the chosen one included
        listed = lp["top_logprobs"][i]
        assert lp["tokens"][i] in listed and set(listed.values()) <= {v for _, v in c.logprobs[i][1]} | {
            lp["token_logprobs"][i]}
    assert lp["text_offset"][0] == len(PROMPT)
    assert "".join(lp["tokens"]) == ch["text"]


def test_echo_gives_the_prompt_and_its_logprobs(llm):
    out = llm.create_completion(PROMPT, max_tokens=3, echo=True, logprobs=1, temperature=0)
    ch = out["choices"][0]
    plain = llm.create_completion(PROMPT, max_tokens=3, temperature=0)["choices"][0]["text"]
    assert ch["text"] == PROMPT + plain
    ids = llm.tokenize(PROMPT)
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    llm.reset()
    rows = llm.eval(ids)
    for i in range(1, len(ids)):
        assert lp["token_logprobs"][i] == pytest.approx(log_softmax(rows[i - 1])[ids[i]], abs=1e-4)
    assert lp["text_offset"] == sorted(lp["text_offset"])


def test_n_choices_are_separate_seeded_runs(llm):
    out = llm.create_completion(PROMPT, max_tokens=5, n=3, seed=10, **SAMPLE)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for i, c in enumerate(out["choices"]):
        alone = llm.create_completion(PROMPT, max_tokens=5, seed=10 + i, **SAMPLE)["choices"][0]
        assert c["text"] == alone["text"]
    assert out["usage"]["completion_tokens"] == 15
    chat = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, n=2, seed=1, **SAMPLE)
    assert len(chat["choices"]) == 2


def test_streamed_logprobs_match_the_whole_result(llm):
    whole = llm.create_completion(PROMPT, max_tokens=6, logprobs=2, seed=5, **SAMPLE)["choices"][0]
    chunks = list(llm.create_completion(PROMPT, max_tokens=6, logprobs=2, seed=5, stream=True, **SAMPLE))
    got = [x for c in chunks[:-1] for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert got == pytest.approx(whole["logprobs"]["token_logprobs"])
    offsets = [x for c in chunks[:-1] for x in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == whole["logprobs"]["text_offset"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]


def test_chat_logprobs_shape(llm):
    msgs = [{"role": "user", "content": "hi"}]
    out = llm.create_chat_completion(msgs, max_tokens=4, logprobs=True, top_logprobs=2, temperature=0)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(item["bytes"]).decode("utf-8", "replace") == item["token"]
        assert len(item["top_logprobs"]) == 2
        # greedy: the chosen token is the most likely one
        assert item["top_logprobs"][0]["logprob"] == pytest.approx(item["logprob"])
    with pytest.raises(InvalidArgumentError, match="top_logprobs"):
        llm.create_chat_completion(msgs, top_logprobs=2)


def test_suffix_lays_out_prefix_suffix_middle(llm):
    fim = _fim_ids()
    out = llm.create_completion("the cat", suffix=" the mat", max_tokens=5, temperature=0)
    tok = llm.tokenizer
    ids = ([tok.bos_id, fim["pre"]] + llm.tokenize("the cat", add_bos=False) + [fim["suf"]]
           + llm.tokenize(" the mat", add_bos=False) + [fim["mid"]])
    assert out["choices"][0]["text"] == llm.complete(ids, max_tokens=5, temperature=0).text
    assert out["usage"]["prompt_tokens"] == len(ids)
    with pytest.raises(InvalidArgumentError, match="fill-in-the-middle"):
        llm.plain.create_completion("the cat", suffix=" the mat", max_tokens=2)


@pytest.mark.parametrize("kw", [dict(n=0), dict(logprobs=-1), dict(logprobs=99), dict(echo="yes"),
                                dict(n=2, stream=True), dict(best_of=3),
                                dict(n=10 ** 400), dict(logprobs=10 ** 5000), dict(temperature=10 ** 400)],
                         ids=lambda kw: ",".join(f"{k}={v if not isinstance(v, int) or v < 10 ** 9 else 'huge'}"
                                                 for k, v in kw.items()))
def test_bad_options_raise(llm, kw):
    with pytest.raises(InvalidArgumentError):
        llm.create_completion(PROMPT, max_tokens=2, **kw)


def test_ids_are_fresh_and_shaped_as_openai_s(llm):
    """One way to make an id (completions.new_id), for the library, the
    server and tool calls: a uuid's hex, never an object's address (which
    Python reuses, so two responses could share an id)."""
    import re

    ids = [llm.create_completion("Hi", max_tokens=1)["id"] for _ in range(3)]
    ids += [llm.create_completion("Hi", max_tokens=1, logprobs=1)["id"]]
    assert len(set(ids)) == 4 and all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids)
    msgs = [{"role": "user", "content": "Hi"}]
    chat = [llm.create_chat_completion(msgs, max_tokens=1)["id"], llm.create_chat_completion(msgs, max_tokens=1)["id"]]
    assert len(set(chat)) == 2 and all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) for i in chat)
