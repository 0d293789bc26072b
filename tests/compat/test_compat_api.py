"""llminfer.Llama beyond the README: the parts of llama-cpp-python's API that
its tutorials use (issue 54): embed, LlamaGrammar, set_cache, the token-level
generate/sample/eval/scores, Python callbacks, LlamaState, the openai types,
n_gpu_layers without a GPU, the named chat formats, and from_pretrained
without a network. Each is checked against llminfer's own LLM where the
two must agree."""

import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from llminfer import LLM, Llama
from llminfer.errors import GrammarError, InvalidArgumentError

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llama(smollm2_path):
    return Llama(model_path=str(smollm2_path), n_ctx=256, verbose=False, seed=0)


@pytest.fixture(scope="module")
def plain(smollm2_path):
    return LLM(smollm2_path, n_ctx=256)


def greedy_ids(plain, prompt, n):
    return plain.complete(prompt, max_tokens=n, temperature=0).tokens


# ---- embed ----

def test_embed_matches_llm(llama, plain):
    texts = ["Hello, world!", "Goodbye, world!"]
    one = llama.embed(texts[0])
    np.testing.assert_allclose(one, plain.embed(texts[0], normalize=False), rtol=1e-6)
    many, count = llama.embed(texts, return_count=True)
    np.testing.assert_allclose(many, plain.embed(texts, normalize=False), rtol=1e-6)
    assert count == sum(len(plain.tokenize(t)) for t in texts)
    unit = llama.embed(texts[0], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit), 1.0, rtol=1e-5)


# ---- LlamaGrammar ----

def test_llama_grammar_import_paths_and_use(llama, tmp_path):
    from llminfer import LlamaGrammar as top
    from llminfer.compat.llama_grammar import LlamaGrammar

    assert top is LlamaGrammar
    gbnf = 'root ::= "yes" | "no"'
    path = tmp_path / "yn.gbnf"
    path.write_text(gbnf)
    for g in (LlamaGrammar.from_string(gbnf), LlamaGrammar.from_file(path)):
        assert g._grammar == gbnf
        text = llama("Is it raining? ", grammar=g, max_tokens=5, temperature=0.8)["choices"][0]["text"]
        assert text in ("yes", "no")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    g = LlamaGrammar.from_json_schema(json.dumps(schema))
    reply = llama.create_chat_completion([{"role": "user", "content": "Name a city as JSON."}], grammar=g,
                                         max_tokens=48, temperature=0)
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert list(json.loads(reply["choices"][0]["message"]["content"])) == ["city"]
    with pytest.raises(GrammarError):
        LlamaGrammar.from_string("root ::= (")
    with pytest.raises(GrammarError):
        LlamaGrammar.from_file(tmp_path / "missing.gbnf")


# ---- JSON schema: llama.cpp's closed objects ----

def _accepts(grammar, plain, text):
    """Whether llguidance's matcher for grammar accepts text whole."""
    from llminfer.text.structured import Constraint

    c = Constraint(grammar, plain.tokenizer, plain.n_vocab)
    try:
        for t in plain.tokenize(text, add_bos=False):
            if not c.matcher.consume_token(t):
                return False
        return c.matcher.is_accepting()
    finally:
        c.close()


def test_json_schema_objects_with_properties_are_closed(plain):
    from llminfer.text.structured import Grammar

    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    g = Grammar.from_json_schema(schema)
    assert _accepts(g, plain, '{"name": "Ann"}')
    assert not _accepts(g, plain, '{"name": "Ann", "age": 3}')   # no keys beyond the properties
    assert not _accepts(g, plain, '{}')                          # required is honoured
    # nested objects too; additionalProperties given explicitly is respected
    nested = {"type": "object", "properties": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
    assert not _accepts(Grammar.from_json_schema(nested), plain, '{"p": {"x": 1, "y": 2}}')
    opened = dict(schema, additionalProperties=True)
    assert _accepts(Grammar.from_json_schema(opened), plain, '{"name": "Ann", "age": 3}')
    # the README's example: whatever is generated has no other key than name
    for seed in range(3):
        text = plain.generate("A user record:", json_schema={"type": "object", "properties": {
            "name": {"type": "string"}}}, max_tokens=40, seed=seed)
        try:
            obj = json.loads(text)
        except ValueError:
            continue  # cut by max_tokens
        assert set(obj) <= {"name"}


# ---- set_cache ----

@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_set_cache_reuses_the_state(smollm2_path, tmp_path, kind, capsys):
    from llminfer.compat.llama_cache import LlamaDiskCache, LlamaRAMCache

    cache = LlamaRAMCache() if kind == "ram" else LlamaDiskCache(cache_dir=str(tmp_path / "c"))
    llm = Llama(model_path=str(smollm2_path), n_ctx=256, verbose=True)
    llm.set_cache(cache)
    capsys.readouterr()
    prompt = "Once upon a time, in a land far away, there lived a"
    first = llm(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert len(cache) == 1
    llm("Something else entirely: the sea", max_tokens=4, temperature=0)  # the context moves on
    loads = []
    real = llm.load_state
    llm.load_state = lambda s: (loads.append(s.n_tokens), real(s))
    again = llm(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert again == first
    assert loads and loads[0] > len(llm.tokenize(prompt.encode())) - 1   # the cached prompt came back
    assert "cache hit" in capsys.readouterr().err
    # a chat call goes through the cache too
    msgs = [{"role": "user", "content": "Hi there"}]
    a = llm.create_chat_completion(msgs, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]
    llm("Unrelated", max_tokens=2, temperature=0)
    b = llm.create_chat_completion(msgs, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]
    assert a == b
    with pytest.raises(InvalidArgumentError):
        llm.set_cache(object())


def test_ram_cache_capacity_evicts_oldest():
    from llminfer.compat.llama_cache import LlamaRAMCache, LlamaState

    def state(n):
        return LlamaState(np.zeros(4, np.intc), np.zeros((1, 2), np.float32), 1, b"x" * n, n, None)

    c = LlamaRAMCache(capacity_bytes=100)
    c[[1, 2, 3]] = state(60)
    c[[4, 5]] = state(60)
    assert len(c) == 1 and [4, 5, 6] in c and [1, 2] not in c
    assert c[[4, 9]].llama_state_size == 60   # longest shared prefix
    with pytest.raises(KeyError):
        c[[7]]


# ---- token-level API ----

def test_generate_matches_llm_greedy(llama, plain):
    want = greedy_ids(plain, PROMPT, 10)
    toks = llama.tokenize(PROMPT.encode())
    got = []
    for t in llama.generate(toks, temp=0, top_k=40, top_p=0.95, repeat_penalty=1.0):
        got.append(t)
        if len(got) == len(want):
            break
    assert got == want
    # reset=True reuses the prefix the context holds; the output is the same
    got2 = []
    for t in llama.generate(toks, temp=0, reset=True):
        got2.append(t)
        if len(got2) == 3:
            break
    assert got2 == want[:3]


def test_eval_scores_layout_and_sample(smollm2_path, plain):
    llm = Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False, logits_all=True)
    ids = llm.tokenize(PROMPT.encode())
    llm.eval(ids)
    assert llm.scores.shape == (64, llm.n_vocab()) and llm.scores.dtype == np.float32
    assert llm.input_ids.shape == (64,) and list(llm.input_ids[:llm.n_tokens]) == ids
    plain.reset()
    rows = plain.eval(ids)
    np.testing.assert_array_equal(llm.scores[:len(ids)], rows)
    assert llm.sample(temp=0) == int(np.argmax(rows[-1]))
    # without logits_all the last row is there all the same
    one = Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False)
    one.eval(ids)
    np.testing.assert_array_equal(one.scores[len(ids) - 1], rows[-1])
    with pytest.raises(InvalidArgumentError):
        Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False).sample()


# ---- Python callbacks ----

def test_logits_processor_and_stopping_criteria(llama, plain):
    from llminfer import LogitsProcessorList, StoppingCriteriaList

    want = greedy_ids(plain, PROMPT, 8)
    n_prompt = len(plain.tokenize(PROMPT))
    seen = []

    def ban_first(input_ids, scores):
        seen.append(len(input_ids))
        scores[want[0]] = -np.inf
        return scores

    out = llama(PROMPT, max_tokens=4, temperature=0, logits_processor=LogitsProcessorList([ban_first]))
    text = out["choices"][0]["text"]
    assert not text.startswith(plain.detokenize([want[0]]))
    assert seen[:4] == [n_prompt, n_prompt + 1, n_prompt + 2, n_prompt + 3]   # the ids so far, each step

    def after_three(input_ids, logits):
        assert logits.shape == (plain.n_vocab,)
        return len(input_ids) >= n_prompt + 3

    out = llama(PROMPT, max_tokens=8, temperature=0, stopping_criteria=StoppingCriteriaList([after_three]))
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 3
    assert out["choices"][0]["text"] == plain.detokenize(want[:3])
    # chat and generate take them too
    reply = llama.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0,
                                         stopping_criteria=[lambda ids, lg: True])
    assert reply["choices"][0]["message"]["content"] == "" and reply["choices"][0]["finish_reason"] == "stop"
    got = list(llama.generate(llama.tokenize(PROMPT.encode()), temp=0,
                              stopping_criteria=StoppingCriteriaList([after_three])))
    assert got == want[:3]
    with pytest.raises(InvalidArgumentError):
        plain.complete([PROMPT, PROMPT], max_tokens=2, logits_processor=ban_first)


# ---- state ----

def test_save_state_is_a_llama_state(llama, plain):
    from llminfer import LlamaState

    llama.reset()
    llama.eval(llama.tokenize(PROMPT.encode()))
    state = llama.save_state()
    assert isinstance(state, LlamaState)
    assert state.n_tokens == llama.n_tokens and state.llama_state_size == len(state.llama_state)
    assert state.input_ids.shape == (llama.n_ctx(),) and state.scores.shape[1] == llama.n_vocab()
    assert state.seed == 0
    nxt = llama.sample(temp=0)
    llama.reset()
    llama.load_state(state)
    assert llama.n_tokens == state.n_tokens and llama.sample(temp=0) == nxt
    with pytest.raises(InvalidArgumentError):
        llama.load_state(object())


# ---- openai types ----

def test_chat_completion_openai_v1(llama):
    pytest.importorskip("openai")
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    msgs = [{"role": "user", "content": "Hi"}]
    out = llama.create_chat_completion_openai_v1(messages=msgs, max_tokens=4, temperature=0)
    assert isinstance(out, ChatCompletion) and isinstance(out.choices[0].message.content, str)
    chunks = list(llama.create_chat_completion_openai_v1(messages=msgs, max_tokens=4, temperature=0, stream=True))
    assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)


# ---- n_gpu_layers without a GPU ----

def test_n_gpu_layers_runs_on_the_cpu_without_a_gpu(smollm2_path, monkeypatch):
    from llminfer.compat import llama as compat
    from llminfer.core import gpu
    from llminfer.errors import GPUUnavailableError

    if gpu.info()["available"]:
        pytest.skip("this machine has a GPU: n_gpu_layers uses it")
    monkeypatch.setattr(compat, "_gpu_warned", False)
    with pytest.warns(RuntimeWarning, match="n_gpu_layers=-1 runs on the CPU"):
        llm = Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False, n_gpu_layers=-1)
    assert llm("Hi", max_tokens=2)["object"] == "text_completion"
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per process
        Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False, n_gpu_layers=20)
    with pytest.raises(GPUUnavailableError):
        Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False, n_gpu_layers=-1, require_gpu=True)
    with pytest.raises(GPUUnavailableError):
        LLM(smollm2_path, n_ctx=64, n_gpu_layers=-1)   # llminfer's own API asks for the GPU explicitly


# ---- chat formats ----

# Prompts as llama-cpp-python's llama_chat_format.py writes them, worked out
# by hand from its source (format functions and _format_* helpers) for the
# conversation CONV.
CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}]
LCP_PROMPTS = {
    # _format_llama2: system template + " ", then the first user turn after the system, seps " " / "</s>"
    "llama-2": "[INST] <<SYS>>\nBe brief.\n<</SYS>> Hi [/INST]Hello! </s><s>[INST]Why?  [/INST]",
    "vicuna": ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
               "helpful, detailed, and polite answers to the user's questions. USER: Hi ASSISTANT: Hello!</s>"
               "USER: Why? ASSISTANT:"),
    "alpaca": "Be brief.\n\n### Instruction: Hi\n\n### Response: Hello!</s>### Instruction: Why?\n\n",
    "zephyr": "<|system|>\nBe brief.</s>\n<|user|>\n\nHi</s>\n<|assistant|>\n\nHello!</s>\n<|user|>\n\nWhy?</s>\n"
              "<|assistant|>\n\n",
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
              "Hello!<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n",
    "mistral-instruct": "[INST] Hi [/INST]Hello!</s>[INST] Why? [/INST]",
    "gemma": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
             "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n",
    "saiga": "<s>system\nBe brief.</s><s>user\nHi</s><s>user\nWhy?</s><s>bot",
    "openchat": "Be brief.<|end_of_turn|><|end_of_turn|>\nGPT4 Correct User: \nHi<|end_of_turn|>\n"
                "<|end_of_turn|>GPT4 Correct Assistant: \nHello!<|end_of_turn|>\nGPT4 Correct User: \nWhy?"
                "<|end_of_turn|>\n<|end_of_turn|>GPT4 Correct Assistant: \n",
}


@pytest.mark.parametrize("name", sorted(LCP_PROMPTS))
def test_chat_format_prompt_is_llama_cpp_pythons(name):
    from llminfer.text.chat import ChatFormat
    from llminfer.compat.llama_chat_format import template_for

    template, _ = template_for(name)
    assert ChatFormat(name, template).render(CONV) == LCP_PROMPTS[name]


def test_every_llama_cpp_python_format_name(smollm2_path):
    from llminfer.compat.llama_chat_format import FORMAT_NAMES

    names = {"llama-2", "llama-3", "alpaca", "qwen", "vicuna", "oasst_llama", "baichuan-2", "baichuan", "openbuddy",
             "redpajama-incite", "snoozy", "phind", "intel", "open-orca", "mistrallite", "zephyr", "pygmalion",
             "chatml", "mistral-instruct", "chatglm3", "openchat", "saiga", "gemma"}
    assert names <= set(FORMAT_NAMES)
    llm = Llama(model_path=str(smollm2_path), n_ctx=256, verbose=False, chat_format="redpajama-incite")
    reply = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert reply["object"] == "chat.completion"
    for handler in ("functionary", "functionary-v2", "llava-1-5"):
        with pytest.raises(InvalidArgumentError, match="chat handler"):
            Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False, chat_format=handler)


# ---- from_pretrained without a network ----

def _closed_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_from_pretrained_unreachable_hub_fails_fast(tmp_path):
    pytest.importorskip("huggingface_hub")
    code = ("import sys\nfrom llminfer import Llama\nfrom llminfer.errors import HubUnreachableError\n"
            "try:\n    Llama.from_pretrained('ORG/REPO-GGUF', '*Q4_K_M.gguf', verbose=False)\n"
            "except HubUnreachableError as e:\n    print('HubUnreachableError', e)\n")
    # the test's own sys.path, not the checkout's root: a source folder there
    # (no compiled core when the package is installed) would shadow the package
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)  # not the checkout, whose source folder would shadow the package
    elapsed = time.monotonic() - t0
    assert out.stdout.startswith("HubUnreachableError"), out.stdout + out.stderr
    assert "HF_HUB_OFFLINE=1" in out.stdout and "local" in out.stdout
    assert elapsed < 15, "a hang guard: huggingface_hub alone retries for about 25 s"


def test_unreachable_hub_uses_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    from llminfer.hub import hf

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    repo = tmp_path / "models--ORG--REPO"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "m.gguf").write_bytes(b"GGUF")
    assert hf.download("ORG/REPO", "m.gguf", cache_dir=str(tmp_path)) == snap / "m.gguf"
