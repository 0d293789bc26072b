"""Hybrid models above the C core: the state pool's slots and checkpoints in
the engine (llminfer.runtime.kv_cache, llminfer.runtime.engine), and what truncates through
them (truncate, a rejected draft, a chat that goes on, a context shift), on
tiny qwen35 and lfm2 files. Every comparison is bitwise against a
recompute from scratch: going back in time must give what never having
gone forward gives."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from llminfer import LLM
from llminfer.runtime.engine import Engine
from llminfer.errors import KVCacheFullError
from llminfer.generation.speculative import SpecConfig

from tiny_models import HybridConfig, write_hybrid

ARCHS = ["qwen35", "lfm2"]
TOKENS = np.random.default_rng(11).integers(0, 266, 90).astype(np.int32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_engine")
    return {a: write_hybrid(root / f"{a}.gguf", HybridConfig(arch=a, qtype="Q8_0")) for a in ARCHS}


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, files):
    e = Engine(files[request.param], n_ctx=256, n_batch=64, n_threads=2, block_size=16, n_seq_max=6)
    yield e
    e.close()


def fresh(e, toks):
    s = e.new_sequence()
    out = e.decode([(s, toks, "all")])[0]
    e.free(s)
    return out


@pytest.mark.parametrize("back_to", [37, 32, 5, 0])
def test_truncate_then_go_on_is_a_fresh_run(engine, back_to):
    """back to a point between checkpoints, onto one (a block boundary), before the first, to nothing"""
    want = fresh(engine, TOKENS[:70])
    s = engine.new_sequence()
    engine.decode([(s, TOKENS[:20], None)])
    for t in TOKENS[20:50]:  # one at a time: checkpoints at the block boundaries 32 and 48
        engine.decode([(s, [t], None)])
    engine.truncate(s, back_to)
    got = engine.decode([(s, TOKENS[back_to:70], "all")])[0]
    assert np.array_equal(got, want[back_to:])
    assert s.state_len == len(s.tokens) == 70
    engine.free(s)


def test_a_fork_goes_on_as_its_own_text(engine):
    want_a, want_b = fresh(engine, TOKENS[:60]), fresh(engine, np.concatenate([TOKENS[:25], TOKENS[60:90]]))
    a = engine.new_sequence()
    engine.decode([(a, TOKENS[:25], None)])
    b = engine.fork(a)
    # both go on in one batch, each with its own tokens
    got_a, got_b = engine.decode([(a, TOKENS[25:60], "all"), (b, TOKENS[60:90], "all")])
    assert np.array_equal(got_a, want_a[25:])
    assert np.array_equal(got_b, want_b[25:])
    engine.free(a)
    engine.free(b)


def test_the_state_pool_running_out_is_named(files):
    with Engine(files["qwen35"], n_ctx=128, n_threads=1, n_seq_max=2, state_checkpoints=1) as e:
        a, b = e.new_sequence(), e.new_sequence()
        e.decode([(a, TOKENS[:40], None), (b, TOKENS[:40], None)])  # each takes a checkpoint slot
        c = e.new_sequence()  # a checkpoint gives its slot up for a live sequence
        d = e.new_sequence()
        with pytest.raises(KVCacheFullError, match="recurrent-state pool is out of slots"):
            e.new_sequence()
        usage = e.kv_usage()["recurrent-state"]
        assert usage["slots"] == 4 and usage["used"] == 4 and usage["slot_bytes"] == e.state_slot_bytes > 0
        for s in (a, b, c, d):
            e.free(s)
        assert e.kv_usage()["recurrent-state"]["used"] == 0


def test_state_pool_memory_is_reported(files):
    with Engine(files["qwen35"], n_ctx=128, n_threads=1, n_seq_max=3, state_checkpoints=2) as e:
        # qwen35 tiny: per recurrent layer, the conv window of (2 * 2 * 64 + 4 * 64) channels x 3, and
        # 4 heads of 64 x 64
        per_layer = (2 * 2 * 64 + 4 * 64) * 3 + 4 * 64 * 64
        n_recurrent = sum(1 for L in e.spec.layers if L.recurrent)
        assert e.state_slot_bytes == 4 * per_layer * n_recurrent
        assert e.kv_usage()["recurrent-state"]["slots"] == 9


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_decoding_on_a_hybrid_model_is_plain_greedy(files, arch):
    """n-gram drafts rejected and accepted: each rejection goes back through a checkpoint"""
    cfg = SpecConfig(mode="ngram", draft_max=6, adaptive=False)
    rng = np.random.default_rng(5)
    with LLM(files[arch], n_ctx=256, n_threads=1, spec=cfg) as llm, LLM(files[arch], n_ctx=256, n_threads=1) as cold:
        drafted = accepted = 0
        for _ in range(4):
            unit = rng.integers(0, 266, int(rng.integers(3, 7))).tolist()
            prompt = unit * 4 + unit[:2]
            a = llm.complete(prompt, max_tokens=30, temperature=0, spec="off")
            b = llm.complete(prompt, max_tokens=30, temperature=0)
            assert a.tokens == b.tokens
            drafted += b.timings.spec_drafted
            accepted += b.timings.spec_accepted
            # the state the rejections left: one more token's logits are a recompute's, bit for bit
            held = list(llm.tokens)
            assert np.array_equal(llm.eval([7])[-1], cold.eval(held + [7])[-1])
            cold.reset()
        assert drafted > 0 and accepted < drafted  # rejections happened


@pytest.mark.parametrize("arch", ARCHS)
def test_a_conversation_that_goes_on_reuses_and_rewinds_the_state(files, arch):
    """the second prompt shares all but the end of the first's text: the LLM
    keeps the common prefix (a rewind of its state) and gives what a fresh
    LLM gives"""
    p1 = TOKENS[:30].tolist()
    with LLM(files[arch], n_ctx=256, n_threads=2) as llm:
        first = llm.complete(p1, max_tokens=12, temperature=0)
        p2 = p1 + first.tokens[:5] + TOKENS[30:40].tolist()
        second = llm.complete(p2, max_tokens=12, temperature=0, logprobs=3)
    with LLM(files[arch], n_ctx=256, n_threads=1) as cold:
        again = cold.complete(p2, max_tokens=12, temperature=0, logprobs=3)
    assert again.tokens == second.tokens and again.logprobs == second.logprobs


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_generation_is_each_prompt_alone(files, arch):
    prompts = [TOKENS[i:i + 10 + 3 * i].tolist() for i in range(4)]
    with LLM(files[arch], n_ctx=256, n_threads=2) as llm:
        together = llm.generate(prompts, max_tokens=10, temperature=0)
        alone = [llm.generate(p, max_tokens=10, temperature=0) for p in prompts]
    assert together == alone and all(together)


def test_a_context_shift_recomputes_what_it_keeps(files):
    """a recurrent state cannot drop tokens: the shift recomputes the kept
    ones, and generation goes on past n_ctx"""
    with LLM(files["lfm2"], n_ctx=48, n_threads=1) as llm:
        out = llm.complete(TOKENS[:40].tolist(), max_tokens=30, temperature=0, context_shift=True)
        assert len(out.tokens) == 30


# ---- the server: continuous batching and the prefix cache on a hybrid model ----

@pytest.mark.parametrize("arch", ARCHS)
def test_a_prefix_cache_hit_gives_the_cold_text(files, arch):
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
    httpx = pytest.importorskip("httpx", reason="the server tests speak through httpx")
    from llminfer.server import ServeArgs
    from servers import ServerThread, metrics

    shared = TOKENS[:53].tolist()  # the cache keeps the state after the prompts' last full block
    prompts = [shared + TOKENS[53 + i:58 + i].tolist() for i in range(3)]
    cold = []
    for p in prompts:  # each alone, in a server without a prefix cache
        s = ServerThread(ServeArgs(model=files[arch], n_ctx=256, n_threads=1, prefix_caching=False))
        try:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": p, "max_tokens": 12, "temperature": 0,
                                                            "logprobs": 3}, timeout=120).json()
            cold.append((r["choices"][0]["text"], r["choices"][0]["logprobs"]))
        finally:
            s.stop()
    s = ServerThread(ServeArgs(model=files[arch], n_ctx=256, n_threads=2))
    try:
        def ask(p):
            return httpx.post(s.url + "/v1/completions", json={"prompt": p, "max_tokens": 12, "temperature": 0,
                                                               "logprobs": 3}, timeout=120).json()
        first = ask(prompts[0])
        with ThreadPoolExecutor(2) as pool:  # the other two together, batched, each hitting the cache
            later = list(pool.map(ask, prompts[1:]))
        warm = [first] + later
        # the same text and the same log-probabilities to the last bit (the tiny models' greedy tokens
        # hardly depend on their recurrent layers; their probabilities do)
        assert [(r["choices"][0]["text"], r["choices"][0]["logprobs"]) for r in warm] == cold
        bs = s.scheduler.kv.block_size
        edge = (len(prompts[1]) - 1) // bs * bs  # the prompts' last full block, inside the shared part
        assert 0 < edge <= len(shared)
        assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in later] == [edge, edge]
        m = metrics(s.url)
        assert m[("llminfer:prefix_cache_hits_total", frozenset())] >= 2 * edge
        assert 0 <= m[("llminfer:state_cache_usage_perc", frozenset())] <= 1
    finally:
        s.stop()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_saved_state_carries_the_recurrent_state(files, arch, tmp_path):
    with LLM(files[arch], n_ctx=256, n_threads=1) as llm:
        llm.eval(TOKENS[:45].tolist())
        llm.truncate(38)  # saved after a rewind: the state is brought back to the 38 tokens first
        blob = llm.save_state()
        llm.save_session(tmp_path / "s.llmstate")
        want = llm.eval([9, 10])
    for restore in ("bytes", "file"):
        with LLM(files[arch], n_ctx=256, n_threads=2) as other:
            if restore == "bytes":
                other.load_state(blob)
            else:
                other.load_session(tmp_path / "s.llmstate")
            assert np.array_equal(other.eval([9, 10]), want), restore
    with LLM(files[arch], n_ctx=256, n_threads=1) as other:
        cut = blob[:-8]  # the recurrent state's end missing
        with pytest.raises(Exception, match="payload has"):
            other.load_state(cut)


@pytest.mark.parametrize("arch", ARCHS)
def test_embeddings_and_the_llama_surface_run_on_a_hybrid_model(files, arch):
    from llminfer.compat.llama import Llama

    with LLM(files[arch], n_ctx=256, n_threads=2) as llm:
        texts = ["one two three", "four five"]
        together = llm.embed(texts)
        alone = [llm.embed(t) for t in texts]
        assert np.array_equal(np.asarray(together), np.asarray(alone))
    llama = Llama(model_path=files[arch], n_ctx=256, n_threads=1, verbose=False)
    try:
        out = llama.create_completion("one two", max_tokens=6, temperature=0, logprobs=2)
        again = llama.create_completion("one two", max_tokens=6, temperature=0, logprobs=2)
        assert out["choices"][0]["text"] == again["choices"][0]["text"]
        assert out["choices"][0]["logprobs"] == again["choices"][0]["logprobs"]
    finally:
        llama.close()
