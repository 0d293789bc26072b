"""KVCache bookkeeping for prefix caching: adopting another sequence's full
blocks, and counting the blocks a write would take. The bookkeeping alone
(no model) and, through an Engine, that a sequence built on adopted blocks
computes what a fresh one does."""

import numpy as np
import pytest

from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, KVCacheFullError
from llminfer.runtime.kv_cache import FULL, KVCache

from tiny_models import TinyConfig, write_model


def make_cache(n_blocks=16, bs=4):
    copies = []
    kv = KVCache((n_blocks, 0), bs, (True, False), 0, lambda g, src, dst: copies.append((g, src, dst)))
    return kv, copies


def fill(kv, s, tokens):
    kv.reserve(s, len(tokens))
    kv.commit(s, tokens)


def test_adopt_shares_blocks_and_copies_before_writing():
    kv, copies = make_cache()
    a = kv.new_sequence()
    fill(kv, a, list(range(10)))  # blocks: 4 + 4 + 2
    blocks = a.tables[FULL][:2]
    b = kv.new_sequence()
    kv.adopt(b, a.tokens[:8], blocks)
    assert b.tokens == list(range(8)) and b.next_pos == 8 and b.positions == list(range(8))
    assert [int(kv.pools[FULL].refs[x]) for x in blocks] == [2, 2]
    # b writes after its blocks: a fresh block, nothing copied
    assert kv.blocks_needed(b, 1) == [1, 0]
    fill(kv, b, [99])
    assert copies == [] and b.tables[FULL][:2] == blocks
    # going back into a shared block and writing there copies it first
    kv.truncate(b, 6)
    assert kv.blocks_needed(b, 1) == [1, 0]
    fill(kv, b, [7])
    assert copies == [(FULL, blocks[1], b.tables[FULL][1])] and b.tables[FULL][1] != blocks[1]
    used = kv.pools[FULL].used_blocks
    kv.free(b)
    assert kv.pools[FULL].used_blocks == used - 1  # its copy; the block it still shares stays with a
    kv.free(a)
    assert kv.pools[FULL].used_blocks == 0


def test_blocks_needed_matches_reserve():
    kv, _ = make_cache(n_blocks=32)
    rng = np.random.default_rng(0)
    seqs = [kv.new_sequence() for _ in range(4)]
    for step in range(40):
        s = seqs[rng.integers(len(seqs))]
        n = int(rng.integers(1, 7))
        if rng.random() < 0.2 and len(s):
            kv.truncate(s, int(rng.integers(0, len(s))))
        if rng.random() < 0.2 and len(s):
            seqs.append(kv.fork(s))
        want = kv.blocks_needed(s, n)[FULL]
        free = kv.pools[FULL].free_blocks
        if want > free:
            break
        fill(kv, s, rng.integers(0, 100, n).tolist())
        assert free - kv.pools[FULL].free_blocks == want, step


def test_adopt_refuses_what_it_cannot_hold():
    kv, _ = make_cache()
    a = kv.new_sequence()
    fill(kv, a, list(range(8)))
    b = kv.new_sequence()
    with pytest.raises(InvalidArgumentError, match="hold 8 tokens"):
        kv.adopt(b, [1, 2, 3], a.tables[FULL])
    with pytest.raises(InvalidArgumentError, match="not a live block"):
        kv.adopt(b, list(range(4)), [15])
    with pytest.raises(InvalidArgumentError, match="not empty"):
        kv.adopt(a, list(range(4)), a.tables[FULL][:1])
    swa = KVCache((8, 8), 4, (True, True), 8, None)
    with pytest.raises(InvalidArgumentError, match="sliding-window"):
        swa.adopt(swa.new_sequence(), [], [])


def test_reserve_is_all_or_nothing():
    """A pool without room for all the blocks a write needs takes none of them."""
    kv, _ = make_cache(n_blocks=4)
    a = kv.new_sequence()
    fill(kv, a, list(range(10)))  # 3 blocks
    b = kv.new_sequence()
    with pytest.raises(KVCacheFullError, match="out of blocks: 8 more positions of sequence 1 need 2 blocks of 4 positions and 1 are free"):
        kv.reserve(b, 8)  # 2 blocks
    assert kv.pools[FULL].free_blocks == 1 and b.tables[FULL] == []
    # copy-on-write counts too: a fork writing into the shared last block
    c = kv.fork(a)
    with pytest.raises(KVCacheFullError):
        kv.reserve(c, 7)  # a copy of block 2 and a new block 3
    assert kv.pools[FULL].free_blocks == 1 and c.tables[FULL] == a.tables[FULL]


@pytest.mark.parametrize("committed", [0, 5])
def test_free_gives_back_blocks_reserved_for_a_pass_that_failed(committed):
    """A pass that fails after reserve() leaves blocks that hold no token;
    free (and truncate) give them back all the same."""
    kv, _ = make_cache(n_blocks=8)
    s = kv.new_sequence()
    fill(kv, s, list(range(committed)))
    kv.reserve(s, 12)  # the pass then fails: nothing committed
    assert kv.pools[FULL].used_blocks > 0
    kv.truncate(s, committed)
    assert kv.pools[FULL].used_blocks == -(-committed // 4)
    kv.reserve(s, 12)
    kv.free(s)
    assert kv.pools[FULL].used_blocks == 0 and s.tables[FULL] == [] and len(s) == 0


def test_failed_batches_and_embeddings_leave_the_pool_as_they_found_it(path):
    """LLM.generate over more prompts than the pool holds, and embed() on a
    busy context, raise KVCacheFullError and hold no block afterwards."""
    from llminfer import LLM

    with LLM(path, n_ctx=96, kv_pool_tokens=96, n_threads=1) as llm:  # 3 + 2 blocks of 32
        used = lambda: llm.engine.kv_usage()["full-attention"]["used"]  # noqa: E731
        ids = lambda n, i=0: [(7 * k + i) % 200 + 10 for k in range(n)]  # noqa: E731
        prompts = [ids(40, i) for i in range(6)]  # 6 sequences of 2 blocks > 5
        with pytest.raises(KVCacheFullError):
            llm.generate(prompts, max_tokens=4, temperature=0)
        assert used() == 0
        llm.generate(prompts[:2], max_tokens=4, temperature=0)  # the pool works again
        assert used() == 0
        llm.generate(ids(80), max_tokens=8, temperature=0)  # the context holds 3 blocks
        busy = used()
        assert busy > 0
        for _ in range(3):
            with pytest.raises(KVCacheFullError):
                llm.embed(llm.detokenize(ids(50, 1)))  # 83 tokens: 3 blocks
            assert used() == busy


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("kv") / "llama.gguf", TinyConfig(arch="llama", qtype="Q8_0"))


def test_sequence_on_adopted_blocks_computes_what_a_fresh_one_does(path):
    eng = Engine(path, n_ctx=128, kv_pool_tokens=256, n_threads=1, block_size=8)
    try:
        ids = np.random.default_rng(1).integers(0, 268, 40).astype(np.int32)
        a = eng.new_sequence()
        eng.decode([(a, ids[:24], None)])
        b = eng.new_sequence()
        eng.kv.adopt(b, a.tokens[:16], a.tables[FULL][:2])
        got = eng.decode([(b, ids[16:], "all")])[0]
        fresh = eng.new_sequence()
        want = eng.decode([(fresh, ids, "all")])[0][16:]
        assert np.array_equal(got, want)
        for s in (a, b, fresh):
            eng.free(s)
        assert eng.kv_usage()["full-attention"]["used"] == 0
    finally:
        eng.close()
