"""llminfer.Llama, llama-cpp-python's class: its README's Python examples
(README of llama-cpp-python 0.3.36, the model path replaced by SmolLM2's and
`from llama_cpp import Llama` by `from llminfer import Llama`), its
constructor's arguments, and its return shapes, compared with the real
package where it is installed (marked peer)."""

import textwrap

import numpy as np
import pytest

from llminfer import Llama
from llminfer.errors import InvalidArgumentError


def run(code, path, **names):
    """Run a README example with its model path replaced by `path`."""
    code = textwrap.dedent(code).replace("MODEL", str(path))
    scope = dict(names)
    exec(compile(code, "<README example>", "exec"), scope)  # noqa: S102 (our own test text)
    return scope


# ---- the README's examples, in its order ----

def test_readme_high_level_completion(smollm2_path, capsys):
    s = run('''
        from llminfer import Llama

        llm = Llama(
              model_path="MODEL",
              # n_gpu_layers=-1, # Uncomment to use GPU acceleration
              # seed=1337, # Uncomment to set a specific seed
              # n_ctx=2048, # Uncomment to increase the context window
        )
        output = llm(
              "Q: Name the planets in the solar system? A: ", # Prompt
              max_tokens=32, # Generate up to 32 tokens, set to None to generate up to the end of the context window
              stop=["Q:", "\\n"], # Stop generating just before the model would generate a new question
              echo=True # Echo the prompt back in the output
        ) # Generate a completion, can also call create_completion
        print(output)
    ''', smollm2_path)
    out = s["output"]
    assert out["object"] == "text_completion"
    ch = out["choices"][0]
    assert ch["text"].startswith("Q: Name the planets in the solar system? A: ")
    assert "\n" not in ch["text"] and ch["finish_reason"] in ("stop", "length")
    assert set(out["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert "text_completion" in capsys.readouterr().out


def test_readme_chat_completion_with_chat_format(smollm2_path):
    s = run('''
        from llminfer import Llama
        llm = Llama(
              model_path="MODEL",
              chat_format="llama-2"
        )
        reply = llm.create_chat_completion(
              messages = [
                  {"role": "system", "content": "You are an assistant who perfectly describes images."},
                  {
                      "role": "user",
                      "content": "Describe this image in detail please."
                  }
              ]
        )
    ''', smollm2_path)
    reply = s["reply"]
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(reply["choices"][0]["message"]["content"], str)


def seeded(code):
    """A README example with seed=0 added to its Llama(...): the README leaves
    the seed random, and at temperature 0.7 an unlucky draw can run an
    unbounded JSON value to the end of the context (finish_reason "length",
    the JSON cut short, as llama-cpp-python does too); a fixed seed makes the
    test the same on every run."""
    head = 'Llama(model_path="MODEL", chat_format="chatml")'
    assert head in code
    return code.replace(head, 'Llama(model_path="MODEL", chat_format="chatml", seed=0)')


def test_readme_json_mode(smollm2_path):
    code = '''
        from llminfer import Llama
        llm = Llama(model_path="MODEL", chat_format="chatml")
        reply = llm.create_chat_completion(
            messages=[
                {
                    "role": "system",
                    "content": "You are a helpful assistant that outputs in JSON.",
                },
                {"role": "user", "content": "Who won the world series in 2020"},
            ],
            response_format={
                "type": "json_object",
            },
            temperature=0.7,
        )
    '''
    s = run(seeded(code), smollm2_path)
    assert s["reply"]["choices"][0]["finish_reason"] == "stop"
    import json
    json.loads(s["reply"]["choices"][0]["message"]["content"])


def test_readme_json_schema_mode(smollm2_path):
    code = '''
        from llminfer import Llama
        llm = Llama(model_path="MODEL", chat_format="chatml")
        reply = llm.create_chat_completion(
            messages=[
                {
                    "role": "system",
                    "content": "You are a helpful assistant that outputs in JSON.",
                },
                {"role": "user", "content": "Who won the world series in 2020"},
            ],
            response_format={
                "type": "json_object",
                "schema": {
                    "type": "object",
                    "properties": {"team_name": {"type": "string"}},
                    "required": ["team_name"],
                },
            },
            temperature=0.7,
        )
    '''
    s = run(seeded(code), smollm2_path)
    assert s["reply"]["choices"][0]["finish_reason"] == "stop"
    import json
    assert isinstance(json.loads(s["reply"]["choices"][0]["message"]["content"])["team_name"], str)


def test_readme_function_calling(smollm2_path):
    code = '''
        from llminfer import Llama
        llm = Llama(model_path="MODEL", chat_format="chatml-function-calling")
        reply = llm.create_chat_completion(
              messages = [
                {
                  "role": "system",
                  "content": "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, detailed, and polite answers to the user's questions. The assistant calls functions with appropriate input when necessary"

                },
                {
                  "role": "user",
                  "content": "Extract Jason is 25 years old"
                }
              ],
              tools=[{
                "type": "function",
                "function": {
                  "name": "UserDetail",
                  "parameters": {
                    "type": "object",
                    "title": "UserDetail",
                    "properties": {
                      "name": {
                        "title": "Name",
                        "type": "string"
                      },
                      "age": {
                        "title": "Age",
                        "type": "integer"
                      }
                    },
                    "required": [ "name", "age" ]
                  }
                }
              }],
              tool_choice={
                "type": "function",
                "function": {
                  "name": "UserDetail"
                }
              }
        )
    '''
    s = run(code, smollm2_path)
    call = s["reply"]["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "UserDetail"


def test_readme_embeddings(smollm2_path):
    code = '''
        import llminfer

        llm = llminfer.Llama(model_path="MODEL", embedding=True)

        embeddings = llm.create_embedding("Hello, world!")

        # or create multiple embeddings at once

        embeddings = llm.create_embedding(["Hello, world!", "Goodbye, world!"])
    '''
    s = run(code, smollm2_path)
    assert len(s["embeddings"]["data"]) == 2


def test_readme_context_window(smollm2_path):
    s = run('llm = Llama(model_path="MODEL", n_ctx=2048)', smollm2_path, Llama=Llama)
    assert s["llm"].n_ctx() == 2048


def test_readme_speculative_decoding(smollm2_path):
    s = run('''
        from llminfer import Llama
        from llminfer.compat.llama_speculative import LlamaPromptLookupDecoding

        llama = Llama(
            model_path="MODEL",
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) # num_pred_tokens is the number of tokens to predict 10 is the default and generally good for gpu, 2 performs better for cpu-only machines.
        )
    ''', smollm2_path)
    llama = s["llama"]
    prompt = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return"
    spec = llama(prompt, max_tokens=48, temperature=0)
    assert llama.llm._spec_config is not None and llama.llm._spec_config.draft_max == 10
    plain = llama.llm.complete(prompt, max_tokens=48, temperature=0, spec="off")
    assert spec["choices"][0]["text"] == plain.text  # speculation never changes greedy output


# Examples that need something this package does not provide, with the reason
# (the test checks that each fails the way the reason says, not silently).
def test_readme_examples_that_do_not_run_fail_clearly(smollm2_path):
    # chat_handler= (multi-modal llava/moondream): llminfer has no vision models
    with pytest.raises(InvalidArgumentError, match="chat_handler"):
        Llama(model_path=str(smollm2_path), chat_handler=object(), n_ctx=2048)
    # draft_model= takes only prompt lookup (a draft model file goes to llminfer.LLM)
    with pytest.raises(InvalidArgumentError, match="draft_model"):
        Llama(model_path=str(smollm2_path), draft_model=object())
    # the low-level ctypes API (llama_cpp.llama_backend_init ...) is llama.cpp's C API: not provided
    import llminfer
    assert not hasattr(llminfer, "llama_backend_init")


# ---- the constructor ----

def test_constructor_arguments(smollm2_path):
    llm = Llama(model_path=str(smollm2_path), n_ctx=0, n_threads=1, n_batch=64, n_gpu_layers=0, seed=-1,
                verbose=False, logits_all=True, embedding=False, use_mlock=True, n_ubatch=32)
    assert llm.n_ctx() == 8192  # the model's own
    assert llm.n_threads == 1 and llm.n_batch == 64
    from llminfer.core import gpu

    if not gpu.info()["available"]:  # a CPU-only build says what to install when the GPU is required
        from llminfer.errors import GPUUnavailableError

        with pytest.raises(GPUUnavailableError, match="GPU"):
            Llama(model_path=str(smollm2_path), verbose=False, n_gpu_layers=-1, require_gpu=True)
    with pytest.raises(InvalidArgumentError, match="no_such"):
        Llama(model_path=str(smollm2_path), verbose=False, no_such=1)
    with pytest.raises(InvalidArgumentError, match="chat_format"):
        Llama(model_path=str(smollm2_path), verbose=False, chat_format="vicuna-9000")


def test_verbose_reports_on_stderr(smollm2_path, capsys):
    Llama(model_path=str(smollm2_path), n_ctx=64)
    assert "n_ctx=64" in capsys.readouterr().err
    Llama(model_path=str(smollm2_path), n_ctx=64, verbose=False)
    assert capsys.readouterr().err == ""


def test_seed_fixes_the_output(smollm2_path):
    a = Llama(model_path=str(smollm2_path), n_ctx=128, seed=1337, verbose=False)
    b = Llama(model_path=str(smollm2_path), n_ctx=128, seed=1337, verbose=False)
    ta = a("Once upon a time", max_tokens=12, temperature=1.0)["choices"][0]["text"]
    assert ta == b("Once upon a time", max_tokens=12, temperature=1.0)["choices"][0]["text"]


# ---- tokens, eval, state ----

def test_tokens_and_facts(smollm2_path):
    llm = Llama(model_path=str(smollm2_path), n_ctx=128, verbose=False)
    ids = llm.tokenize(b"Hello, world!")
    assert isinstance(llm.detokenize(ids), bytes) and llm.detokenize(ids) == b"Hello, world!"
    assert llm.token_bos() == llm.llm.tokenizer.bos_id and llm.token_eos() == llm.llm.tokenizer.eos_id
    assert llm.n_vocab() == 49152 and llm.n_ctx() == 128
    assert llm.detokenize(llm.tokenize(b" world", add_bos=False), prev_tokens=llm.tokenize(b"Hello")) == b" world"


def test_eval_refuses_what_is_not_token_ids(tmp_path):
    """Llama.eval(None) raised a bare TypeError from list(None)."""
    from tiny_models import TinyConfig, write_model
    llm = Llama(model_path=write_model(tmp_path / "tiny.gguf", TinyConfig(n_layer=1)), n_ctx=64, verbose=False)
    for bad in (None, 3, "abc", [0.5]):
        with pytest.raises(InvalidArgumentError, match="token ids"):
            llm.eval(bad)
    llm.eval(iter([1, 2]))  # any iterable of ids still works
    assert llm.n_tokens == 2


def test_eval_and_scores(smollm2_path):
    llm = Llama(model_path=str(smollm2_path), n_ctx=128, verbose=False, logits_all=True)
    ids = llm.tokenize(b"The capital of France")
    llm.eval(ids)
    assert llm.n_tokens == len(ids) and list(llm.input_ids[:llm.n_tokens]) == ids
    assert llm.scores.shape == (128, llm.n_vocab())  # llama-cpp-python's [n_ctx, n_vocab]
    scores = llm.scores[:len(ids)].copy()
    llm.reset()
    assert llm.n_tokens == 0 and llm._scores.shape[0] == 0
    for t in ids:  # one at a time: the same logits, row by row
        llm.eval([t])
    np.testing.assert_array_equal(llm.scores[:len(ids)], scores)


def test_streaming_chat_shape(smollm2_path):
    llm = Llama(model_path=str(smollm2_path), n_ctx=256, verbose=False)
    chunks = list(llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
                                             temperature=0))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# ---- against llama-cpp-python ----

def _keys(x):
    """The shape of a result: nested keys and value types, not the values."""
    if isinstance(x, dict):
        return {k: _keys(v) for k, v in x.items() if k not in ("id", "created")}
    if isinstance(x, list):
        return [_keys(x[0])] if x else []
    return "number" if isinstance(x, (int, float, np.floating)) and not isinstance(x, bool) else type(x).__name__


@pytest.mark.peer
def test_shapes_match_llama_cpp_python(smollm2_path):
    import llama_cpp

    peer = llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=256, verbose=False)
    ours = Llama(model_path=str(smollm2_path), n_ctx=256, verbose=False)
    for call in (lambda m: m("The capital of France is", max_tokens=4, temperature=0),
                 lambda m: m.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4,
                                                    temperature=0)):
        a, b = call(peer), call(ours)
        a["choices"][0].pop("logprobs"), b["choices"][0].pop("logprobs")
        a["choices"][0].get("message", {}).pop("refusal", None)
        assert _keys(a) == _keys(b)
        assert a["choices"][0].get("text") == b["choices"][0].get("text")
    assert peer.tokenize(b"Hello world") == ours.tokenize(b"Hello world")
    ids = peer.tokenize(b"Hello world")
    assert peer.detokenize(ids) == ours.detokenize(ids)
    assert (peer.token_bos(), peer.token_eos(), peer.n_vocab(), peer.n_ctx()) == \
        (ours.token_bos(), ours.token_eos(), ours.n_vocab(), ours.n_ctx())
