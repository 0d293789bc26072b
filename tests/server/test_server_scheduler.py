"""The server's scheduler and prefix cache, without HTTP, on a tiny random
model: every request's tokens are what it gets alone, whatever the batch,
the prompt chunking, preemption or the prefix cache do; cancelled and
finished requests give their blocks back."""

import threading

import numpy as np
import pytest

from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, TokenError
from llminfer.runtime.kv_cache import FULL
from llminfer.generation.sampling import SamplingParams
from llminfer.server.metrics import Metrics
from llminfer.server.prefix_cache import PrefixCache
from llminfer.server.scheduler import FinishEvent, Request, Scheduler, TokenEvent

from tiny_models import TinyConfig, write_model


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("sched") / "llama.gguf", TinyConfig(arch="llama", qtype="Q8_0"))


class Harness:
    """A scheduler on its own engine, collecting each request's events."""

    def __init__(self, path, n_ctx=128, pool=None, block_size=8, **kw):
        self.engine = Engine(path, n_ctx=n_ctx, kv_pool_tokens=pool or 4 * n_ctx, n_threads=1,
                             block_size=block_size, n_batch=kw.get("max_batch_tokens", 256))
        self.metrics = Metrics("tiny")
        self.sched = Scheduler(self.engine, self.deliver, metrics=self.metrics, **kw)
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.tokens, self.texts, self.finish = {}, {}, {}

    def deliver(self, events):
        with self.lock:
            for req, ev in events:
                self.texts.setdefault(req.rid, []).append(ev.text)
                if isinstance(ev, TokenEvent):
                    self.tokens.setdefault(req.rid, []).append(ev.token)
                else:
                    assert req.rid not in self.finish, "two FinishEvents for one request"
                    self.finish[req.rid] = ev
            self.done.notify_all()

    def submit(self, reqs):
        for r in reqs:
            assert self.sched.submit(r)

    def wait(self, reqs, timeout=120):
        with self.lock:
            assert self.done.wait_for(lambda: all(r.rid in self.finish for r in reqs), timeout)
        return [(self.tokens.get(r.rid, []), self.finish[r.rid]) for r in reqs]

    def run(self, reqs):
        self.submit(reqs)
        return self.wait(reqs)

    def used_by_requests(self):
        """Blocks held by anything but the prefix cache."""
        pool = self.engine.kv.pools[FULL]
        cached = self.sched.cache.evictable() if self.sched.cache is not None else 0
        return pool.used_blocks - cached

    def __enter__(self):
        self.sched.start()
        return self

    def __exit__(self, *exc):
        self.sched.stop()
        self.engine.close()


def prompts(n, length=20, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 266, length).tolist() for _ in range(n)]


def greedy(p, max_tokens=24, **kw):
    return Request(list(p), SamplingParams(temperature=0.0), max_tokens, ignore_eos=True, **kw)


def seeded(p, seed, max_tokens=24):
    return Request(list(p), SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed),
                   max_tokens, ignore_eos=True)


def make_requests(ps):
    return [greedy(p) if i % 2 == 0 else seeded(p, i) for i, p in enumerate(ps)]


def alone(path, ps):
    """Each request run by itself on a fresh scheduler with no prefix cache."""
    out = []
    with Harness(path, prefix_caching=False) as h:
        for r in make_requests(ps):
            out.append(h.run([r])[0][0])
    return out


def test_batched_requests_get_what_they_get_alone(path):
    ps = prompts(10, seed=1)
    want = alone(path, ps)
    with Harness(path, max_batch_tokens=64) as h:
        got = h.run(make_requests(ps))
        assert [t for t, _ in got] == want
        assert all(f.reason == "length" and f.completion_tokens == 24 for _, f in got)
        assert h.used_by_requests() == 0
        assert h.sched.stats["running"] == 0


def test_chunked_prefill_gives_the_same_tokens(path):
    ps = prompts(3, length=70, seed=2)
    want = alone(path, ps)
    with Harness(path, max_batch_tokens=5) as h:  # prompts of 70 in chunks of at most 5
        got = h.run(make_requests(ps))
        assert [t for t, _ in got] == want
        assert h.sched.steps > 70 // 5


def test_a_full_pool_preempts_and_recomputes(path):
    ps = prompts(6, length=20, seed=3)
    want = alone(path, ps)
    # 64 positions (10 blocks of 8 with slack) for 6 requests of up to 44 tokens each
    with Harness(path, n_ctx=64, pool=64, prefix_caching=False) as h:
        got = h.run(make_requests(ps))
        assert [t for t, _ in got] == want
        assert h.metrics.preemptions > 0
        assert h.engine.kv.pools[FULL].used_blocks == 0


def test_preemption_with_the_prefix_cache(path):
    ps = prompts(6, length=20, seed=4)
    want = alone(path, ps)
    with Harness(path, n_ctx=64, pool=64) as h:
        got = h.run(make_requests(ps))
        assert [t for t, _ in got] == want
        assert h.metrics.preemptions > 0
        assert h.used_by_requests() == 0


def test_prefix_cache_reuses_a_shared_prefix(path):
    system = prompts(1, length=40, seed=5)[0]
    tails = prompts(3, length=6, seed=6)
    ps = [system + t for t in tails]
    want = alone(path, ps)
    with Harness(path) as h:
        first = h.run([make_requests(ps)[0]])[0]
        assert first[1].cached_tokens == 0
        rest = h.run(make_requests(ps)[1:])
        assert [t for t, _ in [first] + rest] == want
        # 40 shared tokens: 5 blocks of 8, all found
        assert [f.cached_tokens for _, f in rest] == [40, 40]
        assert h.sched.cache.hits >= 80


def test_prompt_wholly_cached_still_computes_its_last_token(path):
    p = prompts(1, length=32, seed=7)[0]  # exactly 4 blocks
    with Harness(path) as h:
        a = h.run([greedy(p)])[0]
        b = h.run([greedy(p)])[0]
        assert a[0] == b[0]
        assert b[1].cached_tokens == 24  # the last block is recomputed for its logits


def test_cancel_gives_blocks_back_at_once(path):
    with Harness(path) as h:
        r = greedy(prompts(1, seed=8)[0], max_tokens=100)
        h.submit([r])
        with h.lock:
            assert h.done.wait_for(lambda: len(h.tokens.get(r.rid, [])) >= 3, 60)
            # the engine thread waits on this lock to deliver its next step, so
            # the request cannot run on to its 100 tokens before the cancel
            # (a tiny model's step is well under a millisecond)
            assert h.used_by_requests() > 0
            h.sched.cancel(r)
        tokens, fin = h.wait([r])[0]
        assert fin.reason == "abort" and len(tokens) < 100
        assert h.used_by_requests() == 0 and h.sched.stats["running"] == 0


def test_bad_parameters_fail_one_request_only(path):
    ps = prompts(3, seed=9)
    bad = Request(ps[0], SamplingParams(temperature=0.5, logit_bias={t: float("-inf") for t in range(268)}), 8)
    good = [greedy(p) for p in ps[1:]]
    with Harness(path) as h:
        got = h.run([bad] + good)
        assert got[0][1].reason == "error" and "bans every token" in str(got[0][1].error)
        assert all(f.reason == "length" for _, f in got[1:])
        assert h.used_by_requests() == 0


def test_stop_strings_and_eos(path):
    """A stop string ends the request without its text; without ignore_eos an
    end-of-generation token ends it with reason stop."""
    p = prompts(1, seed=10)[0]
    with Harness(path) as h:
        r = greedy(p, max_tokens=30)
        h.run([r])
        full = "".join(h.texts[r.rid])
        assert len(full) > 14
        stop = full[10:13]
        r = greedy(p, max_tokens=30)
        r.stops = ["never there", stop]
        (toks, fin), = h.run([r])
        assert fin.reason == "stop" and len(toks) < 30
        assert "".join(h.texts[r.rid]) == full[:full.index(stop)]
        # eos: force it with a logit bias after the prompt
        eos = h.engine.tokenizer.eos_id
        r = Request(p, SamplingParams(temperature=0.0, logit_bias={eos: float("inf")}), 10)
        (toks3, fin3), = h.run([r])
        assert fin3.reason == "stop" and toks3 == [] and fin3.completion_tokens == 0


def test_requests_that_could_never_run_are_refused_at_submit(path):
    with Harness(path, n_ctx=64) as h:
        for prompt, max_tokens, err in (([], 4, InvalidArgumentError), ([1] * 64, 4, InvalidArgumentError),
                                        ([1, 268], 4, TokenError), ([1, -1], 4, TokenError),
                                        ([1, 2], 0, InvalidArgumentError)):
            with pytest.raises(err):
                h.sched.submit(Request(prompt, SamplingParams(), max_tokens))
        assert h.sched._in_flight == 0
        (toks, fin), = h.run([greedy([1, 2, 3], max_tokens=3)])
        assert len(toks) == 3 and fin.reason == "length"


def test_queue_bound(path):
    with Harness(path, max_running=1, max_waiting=1) as h:
        reqs = [greedy(p, max_tokens=60) for p in prompts(3, seed=11)]
        assert h.sched.submit(reqs[0]) and h.sched.submit(reqs[1])
        assert not h.sched.submit(reqs[2])
        h.wait(reqs[:2])
        assert h.sched.submit(reqs[2])
        h.wait(reqs[2:])


def test_prefix_cache_evicts_leaves_least_recently_used_first(path):
    eng = Engine(path, n_ctx=64, kv_pool_tokens=64, n_threads=1, block_size=8)
    try:
        cache = PrefixCache(eng.kv)
        a, b = eng.new_sequence(), eng.new_sequence()
        ta, tb = prompts(2, length=24, seed=12)
        eng.decode([(a, ta, None), (b, tb, None)])
        ka = cache.insert(a, [])
        kb = cache.insert(b, [])
        assert len(ka) == len(kb) == 3 and len(cache) == 6
        assert cache.evict(10) == 0  # both still held by their sequences
        eng.free(a)
        eng.free(b)
        keys, blocks = cache.match(ta + [1])  # a is now the most recently used
        assert keys == ka
        assert cache.evict(1) == 1
        assert kb[2] not in cache.entries and ka[2] in cache.entries  # b's leaf went first
        assert cache.evict(10) == 5 and len(cache) == 0
        assert eng.kv_usage()["full-attention"]["used"] == 0
    finally:
        eng.close()


def test_finished_event_once_and_metrics_count(path):
    ps = prompts(4, seed=13)
    with Harness(path) as h:
        got = h.run([greedy(p, max_tokens=5) for p in ps])
        assert all(isinstance(f, FinishEvent) for _, f in got)
        assert h.metrics.generation_tokens == 20
        assert h.metrics.ttft.count == 4 and h.metrics.itl.count == 16
        assert h.metrics.finished["length"] == 4


def test_sliding_window_model_batches_and_preempts(tmp_path):
    """gemma3's sliding-window layers give blocks back as a text moves on:
    no prefix cache there, but batching and preemption still give each
    request its solo tokens."""
    path = write_model(tmp_path / "gemma3.gguf", TinyConfig(arch="gemma3", qtype="Q8_0", sliding_window=16))
    ps = prompts(5, length=20, seed=14)
    want = alone(path, ps)
    with Harness(path, n_ctx=64, pool=64) as h:
        assert h.sched.cache is None
        got = h.run(make_requests(ps))
        assert [t for t, _ in got] == want
        assert h.metrics.preemptions > 0
        assert all(p.used_blocks == 0 for p in h.engine.kv.pools)


def test_calls_run_on_the_engine_thread_one_a_step(path):
    """Scheduler.call: fn(engine) runs on the engine thread, one call per
    step while requests run (they go on between calls and get what they get
    alone), its blocks come from the pool with the prefix cache giving back
    what it must, and an exception reaches its future only."""
    ps = prompts(2, length=20, seed=7)
    want = alone(path, ps)
    # 24 blocks of 8 and the pool's slack: the first run's 10 left in the
    # prefix cache, the two requests' 6-12 as they grow, and a 90-token call
    # (12): the cache must give some back (without it: KVCacheFullError)
    with Harness(path, n_ctx=128, pool=192) as h:
        h.run([greedy(prompts(1, length=80, seed=8)[0], max_tokens=4)])
        assert h.sched.cache.evictable() == 10
        seen = []

        def probe(eng):
            seen.append((threading.current_thread().name, h.sched.steps))
            seq = eng.new_sequence()
            try:
                return eng.hidden_states(seq, list(range(1, 91)), "last")
            finally:
                eng.free(seq)

        reqs = make_requests(ps)
        h.submit(reqs)
        futs = [h.sched.call(probe, blocks=12) for _ in range(4)]
        bad = h.sched.call(lambda eng: 1 / 0)
        outs = [f.result(60) for f in futs]
        with pytest.raises(ZeroDivisionError):
            bad.result(60)
        assert [t for t, _ in h.wait(reqs)] == want
        assert {name for name, _ in seen} == {"llminfer-engine"}
        steps = [s for _, s in seen]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)  # never two calls in one step
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])
        assert h.used_by_requests() == 0
