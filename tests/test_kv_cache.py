"""KVCache bookkeeping for prefix caching: adopting another sequence's full
blocks, and counting the blocks a write would take. The bookkeeping alone
(no model) and, through an Engine, that a sequence built on adopted blocks
computes what a fresh one does."""

import numpy as np
import pytest

from llminfer.engine import Engine
from llminfer.errors import InvalidArgumentError
from llminfer.kv_cache import FULL, KVCache

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
