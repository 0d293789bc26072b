"""LoRA adapters (llminfer.runtime.lora, csrc/lora.c): a random low-rank adapter
written in the test for a tiny llama, as llama.cpp's convert_lora_to_gguf.py
writes one, against the numpy reference forward (tests/support/reference.py) with
W + scale * alpha / rank * B @ A merged into its weights; scale 0 is the base
model bit for bit; sequences with different adapters batched together each
get their logits alone, bit for bit; the server's per-request "lora" and
/lora-adapters over real HTTP with the openai client; bad adapter files are
LoRAAdapterError; and llama.cpp's logits with the same adapter (peer)."""

import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from llminfer import LLM
from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, LoRAAdapterError
from lora_files import effective, random_pairs, write_adapter
from reference import ReferenceModel
from tiny_models import TinyConfig, write_model

ALPHA = 8.0
TOKS = np.array([5, 9, 17, 33, 2, 8, 100, 7, 64, 12, 3], np.int32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama in F32 (so the reference's float64 is the only
    difference), with an output head of its own, and two adapters for it:
    every projection, the head and the token embedding at rank 4, and the
    attention's alone at rank 2 in F16."""
    d = tmp_path_factory.mktemp("lora")
    path = write_model(d / "tiny.gguf", TinyConfig(qtype="F32", embd_qtype="F32", tie_output=False,
                                                          pre="default"))  # a pre-tokenizer llama.cpp knows
    pairs = random_pairs(path, rank=4, seed=1, output=True, embd=True)
    ad = write_adapter(d / "ad.gguf", "llama", pairs, alpha=ALPHA)
    pairs2 = random_pairs(path, rank=2, seed=2, weights=("attn_q", "attn_k", "attn_v", "attn_output"))
    pairs2 = {k: (a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32))
              for k, (a, b) in pairs2.items()}
    ad2 = write_adapter(d / "ad2.gguf", "llama", pairs2, alpha=0.0, dtype="F16")
    return {"dir": d, "model": path, "ad": ad, "pairs": pairs, "ad2": ad2, "pairs2": pairs2}


@pytest.fixture(scope="module")
def engine(tiny):
    eng = Engine(tiny["model"], n_ctx=256, n_threads=2, lora=[tiny["ad"], tiny["ad2"]])
    yield eng
    eng.close()


def run(eng, scales, toks=TOKS):
    s = eng.new_sequence()
    try:
        eng.set_lora(s, scales)
        return eng.decode([(s, toks, "all")])[0]
    finally:
        eng.free(s)


def reference(tiny, deltas, toks=TOKS):
    ref = ReferenceModel(tiny["model"])
    for d in deltas:
        for name, m in d.items():
            ref.t[name] = ref.t[name] + m
    return ref.logits(list(toks))


def test_logits_match_numpy_with_the_adapter_merged(tiny):
    """llminfer with the adapters on against the numpy forward with W + s B A
    merged: as close as the base model is to it (float32 against float64,
    an F32 KV cache)."""
    with Engine(tiny["model"], n_ctx=256, n_threads=2, kv_type="f32", lora=[tiny["ad"], tiny["ad2"]]) as engine:
        _against_numpy(tiny, engine)


def _against_numpy(tiny, engine):
    base_err = np.abs(run(engine, None) - reference(tiny, [])).max()
    for scales, deltas in [({0: 0.7}, [effective(tiny["pairs"], ALPHA, 0.7)]),
                           ({1: 1.5}, [effective(tiny["pairs2"], 0.0, 1.5)]),
                           ({0: -0.4, 1: 0.9}, [effective(tiny["pairs"], ALPHA, -0.4),
                                                effective(tiny["pairs2"], 0.0, 0.9)])]:
        ours = run(engine, scales)
        want = reference(tiny, deltas)
        moved = np.abs(want - reference(tiny, [])).max()
        err = np.abs(ours - want).max()
        print(f"lora {scales}: max |llminfer - numpy| {err:.2e} (base model {base_err:.2e}); the adapter moves "
              f"logits by up to {moved:.3f} of a largest {np.abs(want).max():.1f}")
        assert moved > 0.1  # the adapter matters
        assert err < max(3 * base_err, 1e-4)


ARCH_CASES = {
    # arch: (the weights an adapter covers, {a weight llminfer refuses to adapt: why})
    "qwen2": (("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"),
              {"token_embd.weight": "shares the token embedding"}),  # tied: llama.cpp cannot run it either
    "gemma3": (("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), {}),
    "qwen3moe": (("attn_q", "attn_k", "attn_v", "attn_output"),
                 {"blk.0.ffn_gate_exps.weight": "does not apply LoRA"}),
    "phi3": (("attn_output", "ffn_down"), {"blk.0.attn_qkv.weight": "does not apply LoRA",
                                           "blk.1.ffn_up.weight": "not used as stored"}),
}


@pytest.mark.parametrize("arch", sorted(ARCH_CASES))
def test_other_architectures_match_numpy(tiny, arch):
    """Biases (qwen2), post-norms and soft-caps (gemma3), experts beside
    adapted attention (qwen3moe), fused projections (phi3): against the
    numpy forward with the deltas merged, and what is not adapted refused."""
    from llminfer.core.gguf_file import GGUFFile

    weights, refused = ARCH_CASES[arch]
    path = write_model(tiny["dir"] / f"{arch}.gguf", TinyConfig(arch=arch, qtype="F32", embd_qtype="F32",
                                                                 pre="default"))
    pairs = random_pairs(path, rank=4, seed=7, weights=weights)
    assert len(pairs) == 2 * len(weights)  # both layers
    ad = write_adapter(tiny["dir"] / f"{arch}-ad.gguf", arch, pairs, alpha=4.0)
    with Engine(path, n_ctx=256, n_threads=2, kv_type="f32", lora=[ad]) as eng:
        ref = ReferenceModel(path)
        base_err = np.abs(run(eng, None) - ref.logits(list(TOKS))).max()
        for name, m in effective(pairs, 4.0, 0.8).items():
            ref.t[name] = ref.t[name] + m
        want = ref.logits(list(TOKS))
        ours = run(eng, {0: 0.8})
        err = np.abs(ours - want).max()
        print(f"{arch}: max |llminfer - numpy| {err:.2e} (base {base_err:.2e}), largest {np.abs(want).max():.1f}")
        assert np.abs(want - ReferenceModel(path).logits(list(TOKS))).max() > 0.05
        assert err < max(3 * base_err, 1e-4)
        with GGUFFile(path) as f:
            shapes = {n: f.tensors[n].shape for n in refused}
        for name, why in refused.items():
            rows, k = shapes[name][-2:]
            a = np.zeros((4, k), np.float32)
            b = np.zeros((rows, 4), np.float32)
            bad = write_adapter(tiny["dir"] / f"{arch}-bad.gguf", arch, {name: (a, b)})
            with pytest.raises(LoRAAdapterError, match=why):
                eng.add_lora(bad)


@pytest.mark.parametrize("arch, refused", [("qwen35", "blk.0.ssm_out.weight"), ("lfm2", "blk.0.shortconv.out_proj.weight")])
def test_hybrid_models_adapt_their_attention_layers(tiny, arch, refused):
    """qwen35 (gated attention: attn_q yields queries and gates) and lfm2:
    their attention and feed-forward projections against the numpy forward
    with the deltas merged, two sequences batched each bitwise alone, and a
    recurrent layer's weight refused."""
    from reference_hybrid import HybridReference
    from tiny_models import HybridConfig, write_hybrid

    from llminfer.core.gguf_file import GGUFFile

    path = write_hybrid(tiny["dir"] / f"{arch}.gguf", HybridConfig(arch=arch, qtype="F32", embd_qtype="F32"))
    pairs = random_pairs(path, rank=4, seed=11)
    assert any(".attn_q." in n for n in pairs) and any(".ffn_down." in n for n in pairs)
    ad = write_adapter(tiny["dir"] / f"{arch}-ad.gguf", arch, pairs, alpha=4.0)
    toks = TOKS[:8]
    with Engine(path, n_ctx=256, n_threads=2, kv_type="f32", lora=[ad]) as eng:
        ref = HybridReference(path)
        base = ref.logits(list(toks))
        base_err = np.abs(run(eng, None, toks) - base).max()
        for name, m in effective(pairs, 4.0, 0.8).items():
            ref.t[name] = ref.t[name] + m
        want = ref.logits(list(toks))
        ours = run(eng, {0: 0.8}, toks)
        err = np.abs(ours - want).max()
        print(f"{arch}: max |llminfer - numpy| {err:.2e} (base {base_err:.2e}), the adapter moves "
              f"{np.abs(want - base).max():.3f}")
        assert np.abs(want - base).max() > 0.05
        assert err < max(3 * base_err, 1e-4)
        a, b = eng.new_sequence(), eng.new_sequence()
        try:
            eng.set_lora(a, {0: 0.8})
            la, lb = eng.decode([(a, toks, "all"), (b, toks[:5], "all")])
            assert np.array_equal(la, ours)
            assert np.array_equal(lb, run(eng, None, toks[:5]))
        finally:
            eng.free(a)
            eng.free(b)
        with GGUFFile(path) as f:
            rows, k = f.tensors[refused].shape[-2:]
        bad = write_adapter(tiny["dir"] / f"{arch}-bad.gguf", arch,
                            {refused: (np.zeros((4, k), np.float32), np.zeros((rows, 4), np.float32))})
        with pytest.raises(LoRAAdapterError, match="does not apply LoRA"):
            eng.add_lora(bad)


def test_scale_zero_is_the_base_model_bitwise(engine):
    base = run(engine, None)
    assert np.array_equal(run(engine, {0: 0.0, 1: 0.0}), base)
    assert np.array_equal(run(engine, [0.0, 0.0]), base)
    assert not np.array_equal(run(engine, {0: 1e-3}), base)


def test_batched_sequences_with_different_adapters_are_each_alone_bitwise(engine):
    sets = [None, {0: 0.7}, {1: 1.5}, {0: -0.4, 1: 0.9}, {0: 0.7}]
    alone = [run(engine, s, TOKS[:6 + i]) for i, s in enumerate(sets)]
    for n_threads in (1, 2):
        seqs = [engine.new_sequence() for _ in sets]
        try:
            for s, sc in zip(seqs, sets):
                engine.set_lora(s, sc)
            out = engine.decode([(s, TOKS[:6 + i], "all") for i, s in enumerate(seqs)], n_threads=n_threads)
            for i in range(len(sets)):
                assert np.array_equal(out[i], alone[i]), (i, sets[i], n_threads)
            # then a generation step each, batched, and one alone through step()
            nxt = engine.decode([(s, [40 + i]) for i, s in enumerate(seqs)], n_threads=n_threads)
            one = np.empty(engine.n_vocab, np.float32)
            for i, s in enumerate(seqs):
                alone_seq = engine.new_sequence()
                engine.set_lora(alone_seq, sets[i])
                engine.decode([(alone_seq, TOKS[:6 + i], None)])
                engine.step(alone_seq, 40 + i, one)
                engine.free(alone_seq)
                assert np.array_equal(nxt[i], one), (i, sets[i])
        finally:
            for s in seqs:
                engine.free(s)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_long_batches_of_quantized_models_are_invariant(tiny, qtype):
    """A quantized model (the repacked kernels, the prompt's GEMM), three
    prompts of 70 tokens with different adapters in one pass of 210 rows:
    the feed-forward's chunks of 128 rows cut the second one, whose rows
    keep their own scales; each equals its prompt run alone."""
    path = write_model(tiny["dir"] / f"{qtype}.gguf", TinyConfig(qtype=qtype, tie_output=False))
    pairs = random_pairs(path, rank=8, seed=5, output=True)
    ad = write_adapter(tiny["dir"] / f"{qtype}-ad.gguf", "llama", pairs, alpha=16.0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 200, 70).astype(np.int32) for _ in range(3)]
    sets = [{0: 0.9}, None, {0: -0.6}]
    with Engine(path, n_ctx=256, n_threads=2, n_batch=256, lora=[ad]) as eng:
        alone = [run(eng, sc, p) for sc, p in zip(sets, prompts)]
        assert not np.array_equal(run(eng, {0: 0.9}, prompts[1]), alone[1])
        for n_threads in (1, 2):
            seqs = [eng.new_sequence() for _ in sets]
            try:
                for s, sc in zip(seqs, sets):
                    eng.set_lora(s, sc)
                out = eng.decode([(s, p, "all") for s, p in zip(seqs, prompts)], n_threads=n_threads)
                for i in range(3):
                    assert np.array_equal(out[i], alone[i]), (qtype, i, n_threads)
            finally:
                for s in seqs:
                    eng.free(s)


def test_llm_and_llama_take_adapters(tiny):
    from llminfer.compat.llama import Llama

    eng_want = Engine(tiny["model"], n_ctx=256, n_threads=1, lora=[tiny["ad"]])
    try:
        want = run(eng_want, {0: 0.5})
        base = run(eng_want, None)
    finally:
        eng_want.close()
    with LLM(tiny["model"], n_ctx=256, n_threads=1, lora=[(tiny["ad"], 0.5)]) as llm:
        assert llm.lora_adapters == [{"id": 0, "path": tiny["ad"], "scale": 0.5}]
        assert np.array_equal(llm.eval(TOKS), want)
        llm.set_lora(None)  # a change of scales empties the context
        assert llm.tokens == []
        assert np.array_equal(llm.eval(TOKS), base)
    lm = Llama(model_path=tiny["model"], n_ctx=256, n_threads=1, lora_path=tiny["ad"], lora_scale=0.5,
               verbose=False)
    try:
        lm.eval(TOKS.tolist())
        assert np.array_equal(lm.scores[len(TOKS) - 1], want[-1])
    finally:
        lm.close()
    with pytest.raises(InvalidArgumentError):
        LLM(tiny["model"], n_ctx=64, lora=[(tiny["ad"], float("nan"))])


# ---- bad files ----

def _bad(tiny, name, **kw):
    pairs = kw.pop("pairs", tiny["pairs"])
    return write_adapter(tiny["dir"] / name, kw.pop("arch", "llama"), pairs, **kw)


@pytest.mark.parametrize("case, match", [
    ("arch", "architecture 'qwen2'"),
    ("model", "not a LoRA adapter"),
    ("type", "adapter.type"),
    ("half", "has no .*lora_b"),
    ("unknown", "names no weight"),
    ("shape", "do not fit"),
    ("embd", "do not fit an embedding"),
    ("suffix", "neither a .lora_a"),
    ("garbage", "not a GGUF LoRA adapter"),
])
def test_bad_adapters_are_refused_by_name(tiny, case, match):
    p = tiny["pairs"]
    name = "blk.0.attn_q.weight"
    a, b = p[name]
    if case == "arch":
        path = _bad(tiny, "arch.gguf", arch="qwen2")
    elif case == "model":
        path = tiny["model"]
    elif case == "type":
        path = _bad(tiny, "type.gguf", adapter_type="control_vector")
    elif case == "half":
        path = _bad(tiny, "half.gguf", drop=(name + ".lora_b",))
    elif case == "unknown":
        path = _bad(tiny, "unknown.gguf", pairs={"blk.9.attn_q.weight": (a, b)})
    elif case == "shape":
        path = _bad(tiny, "shape.gguf", pairs={name: (a[:, :128].copy(), b)})
    elif case == "embd":
        path = _bad(tiny, "embd.gguf", pairs={"token_embd.weight": (a, b)})
    elif case == "suffix":
        path = _bad(tiny, "suffix.gguf", pairs={}, extra={"blk.0.attn_q.weight.lora_c": a})
    else:
        path = tiny["dir"] / "garbage.gguf"
        Path(path).write_bytes(b"not a gguf file at all" * 4)
    eng = Engine(tiny["model"], n_ctx=64, n_threads=1)
    try:
        with pytest.raises(LoRAAdapterError, match=match):
            eng.add_lora(path)
        assert eng.loras == []
        assert np.isfinite(run(eng, None)).all()  # the engine goes on without it
    finally:
        eng.close()


def test_quantized_adapters_load(tiny):
    """Q8_0 and BF16 halves are read as llama.cpp reads them (dequantized)."""
    import gguf

    pairs = random_pairs(tiny["model"], rank=32, seed=3)  # Q8_0 rows are blocks of 32: B's rank too
    for dtype in ("Q8_0", "BF16"):
        path = _bad(tiny, f"{dtype}.gguf", dtype=dtype, pairs=pairs)
        eng = Engine(tiny["model"], n_ctx=64, n_threads=1, lora=[path])
        try:
            qt = getattr(gguf.GGMLQuantizationType, dtype)
            deq = {n: (gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt),
                       gguf.quants.dequantize(gguf.quants.quantize(b, qt), qt)) for n, (a, b) in pairs.items()}
            a0 = eng.loras[0].layers[0]["wq"][0]
            assert np.array_equal(a0, deq["blk.0.attn_q.weight"][0].astype(np.float32))
            assert not np.array_equal(run(eng, {0: 0.5}), run(eng, None))
        finally:
            eng.close()


# ---- the server ----

@pytest.fixture(scope="module")
def served(tiny):
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
    pytest.importorskip("openai", reason="the server tests use the openai client")
    from llminfer.server import ServeArgs
    from servers import ServerThread

    s = ServerThread(ServeArgs(model=tiny["model"], n_ctx=256, kv_pool_tokens=4096, n_threads=1,
                               max_batch_tokens=128, lora=[(tiny["ad"], 0.0), (tiny["ad2"], 0.0)]))
    yield s
    s.stop()


# long enough for full KV blocks, which the prefix cache keeps: a request
# with other scales must not adopt them
PROMPT = "the cat sat on the mat and the dog sat on the log. " * 3


def _want(tiny, scales):
    """greedy text and token logprobs offline, through LLM with the same adapters"""
    with LLM(tiny["model"], n_ctx=256, n_threads=1, lora=[(tiny["ad"], 0.0), (tiny["ad2"], 0.0)]) as llm:
        llm.set_lora(scales)
        c = llm.complete(PROMPT, max_tokens=8, temperature=0, logprobs=0)
        return c.text, [lp for lp, _ in c.logprobs]


def test_server_applies_a_requests_lora(tiny, served):
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    cases = [None, [{"id": 0, "scale": 0.8}], [{"id": 1, "scale": 2.0}, {"id": 0, "scale": -0.5}]]
    wants = [_want(tiny, None), _want(tiny, {0: 0.8}), _want(tiny, {1: 2.0, 0: -0.5})]
    assert wants[0][1] != wants[1][1] != wants[2][1]

    def ask(lora):
        extra = {"lora": lora} if lora is not None else None
        r = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0,
                                      extra_body=extra)
        return r.choices[0].text, r.choices[0].logprobs.token_logprobs

    for lora, want in zip(cases, wants):  # one at a time
        text, lps = ask(lora)
        assert text == want[0]
        np.testing.assert_allclose(lps, want[1], rtol=0, atol=1e-6)
    got = [None] * 6  # together: the scheduler batches them
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, ask(cases[i % 3]))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(6):
        assert got[i][0] == wants[i % 3][0]
        np.testing.assert_allclose(got[i][1], wants[i % 3][1], rtol=0, atol=1e-6)
    with pytest.raises(openai.BadRequestError, match="no LoRA adapter with id 5"):
        ask([{"id": 5, "scale": 1.0}])
    with pytest.raises(openai.BadRequestError, match="finite"):
        client.completions.create(model="x", prompt=PROMPT, max_tokens=2, extra_body={"lora": [{"id": 0,
                                                                                               "scale": "a"}]})


def test_server_lora_adapters_routes(tiny, served):
    import httpx
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    got = httpx.get(served.url + "/lora-adapters").json()
    assert [(a["id"], a["path"], a["scale"]) for a in got] == [(0, tiny["ad"], 0.0), (1, tiny["ad2"], 0.0)]
    try:
        r = httpx.post(served.url + "/lora-adapters", json=[{"id": 0, "scale": 0.8}])
        assert r.status_code == 200 and r.json() == {"success": True}
        assert [a["scale"] for a in httpx.get(served.url + "/lora-adapters").json()] == [0.8, 0.0]
        # a request without its own list runs with the global scales now
        c = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0)
        want = _want(tiny, {0: 0.8})
        assert c.choices[0].text == want[0]
        np.testing.assert_allclose(c.choices[0].logprobs.token_logprobs, want[1], rtol=0, atol=1e-6)
        assert httpx.post(served.url + "/lora-adapters", json={"id": 0}).status_code == 400
        assert httpx.post(served.url + "/lora-adapters", json=[{"id": 9, "scale": 1}]).status_code == 400
    finally:
        httpx.post(served.url + "/lora-adapters", json=[])
    assert [a["scale"] for a in httpx.get(served.url + "/lora-adapters").json()] == [0.0, 0.0]


# ---- llama.cpp ----

@pytest.mark.peer
def test_logits_match_llama_cpp_with_the_same_adapter(peer_python, tiny, engine, tmp_path):
    """llama.cpp (llama-cpp-python's Llama(lora_path=, lora_scale=)) with the
    same adapter file: the largest difference is float32 rounding, as the
    base model's is."""
    script = Path(__file__).resolve().parents[2] / "bench" / "peer_logits.py"
    ids = tmp_path / "ids.npy"
    np.save(ids, TOKS)

    def peer(extra):
        out = tmp_path / "out.npy"
        r = subprocess.run([peer_python, str(script), tiny["model"], str(ids), str(out), *extra],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return np.load(out)

    base_err = np.abs(run(engine, None) - peer([])).max()
    want = peer(["--lora", tiny["ad"], "--lora-scale", "0.7"])
    ours = run(engine, {0: 0.7})
    err = np.abs(ours - want).max()
    print(f"llama.cpp with the adapter at 0.7: max |llminfer - llama.cpp| {err:.2e} of a largest "
          f"{np.abs(want).max():.1f} (base model: {base_err:.2e}); the adapter moves logits by up to "
          f"{np.abs(want - peer([])).max():.3f}")
    assert np.abs(want - peer([])).max() > 0.1
    assert err < max(3 * base_err, 3e-3 * np.abs(want).max())
    assert np.array_equal(ours.argmax(-1), want.argmax(-1))



def test_serve_lora_argument():
    from llminfer.server.args import ServeArgs

    assert ServeArgs.parse_lora("a.gguf:0.5") == ("a.gguf", 0.5)
    assert ServeArgs.parse_lora("a.gguf") == ("a.gguf", 1.0)
    assert ServeArgs.parse_lora("dir:v2/a.gguf") == ("dir:v2/a.gguf", 1.0)
    assert ServeArgs.parse_lora("a.gguf:-1e-1") == ("a.gguf", -0.1)
    with pytest.raises(InvalidArgumentError):
        ServeArgs.parse_lora("a.gguf:nan")


def test_cli_run_takes_lora(tiny, capsys):
    """`llminfer run --lora FILE:SCALE` is LLM(lora=[(FILE, SCALE)]); a bad
    adapter is a one-line error naming it."""
    from llminfer.cli import commands as cli

    with LLM(tiny["model"], n_ctx=128, n_threads=1, lora=[(tiny["ad"], 0.9)]) as llm:
        want = llm.generate(PROMPT, max_tokens=8, temperature=0)
    with LLM(tiny["model"], n_ctx=128, n_threads=1) as llm:
        base = llm.generate(PROMPT, max_tokens=8, temperature=0)
    argv = ["run", "-m", tiny["model"], "-t", "1", "-p", PROMPT, "-n", "8", "--temp", "0", "-c", "128", "--raw"]
    assert cli.main(argv + ["--lora", f"{tiny['ad']}:0.9"]) == 0
    out, _ = capsys.readouterr()
    assert out == want + "\n"
    assert want != base
    assert cli.main(argv + ["--lora", tiny["model"]]) != 0
    _, err = capsys.readouterr()
    assert "not a LoRA adapter" in err and "Traceback" not in err
