"""The engine's sequences over the paged KV cache: fork, truncate, free,
context shift, block accounting and a pool that runs out; and LLM.generate
on a list of prompts."""

import os
import sys

import numpy as np
import pytest

from llminfer import LLM, SamplingParams, _core
from llminfer.runtime.engine import Engine
from llminfer.errors import ContextFullError, InvalidArgumentError, KVCacheFullError, TokenError
from llminfer.core.gguf_file import GGUFFile

from reference import ReferenceModel
from tiny_models import TinyConfig, write_model


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("eng") / "llama.gguf", TinyConfig(arch="llama", qtype="Q8_0"))


@pytest.fixture
def eng(path):
    e = Engine(path, n_ctx=256, kv_pool_tokens=512, n_threads=1, block_size=8)
    yield e
    e.close()


def toks(seed, n):
    return np.random.default_rng(seed).integers(0, 268, n).astype(np.int32)


def used(e):
    return e.kv_usage()["full-attention"]["used"]


def test_blocks_follow_the_tokens(eng):
    s = eng.new_sequence()
    eng.decode([(s, toks(0, 20), None)])
    assert used(eng) == 3 and len(s) == 20 and s.next_pos == 20
    eng.decode([(s, toks(1, 4), None)])
    assert used(eng) == 3
    eng.decode([(s, toks(2, 1), None)])
    assert used(eng) == 4
    eng.truncate(s, 9)
    assert used(eng) == 2 and s.tokens == list(toks(0, 20)[:9])
    eng.free(s)
    assert used(eng) == 0
    assert eng.kv_usage()["full-attention"]["free"] == eng.kv_usage()["full-attention"]["blocks"]


def test_truncate_then_continue_equals_a_fresh_run(eng):
    a = toks(3, 30)
    s = eng.new_sequence()
    eng.decode([(s, a, None)])
    eng.truncate(s, 13)  # back into the middle of a block
    got = eng.decode([(s, toks(4, 10), "all")])[0]
    fresh = eng.new_sequence()
    want = eng.decode([(fresh, np.concatenate([a[:13], toks(4, 10)]), "all")])[0][13:]
    assert np.array_equal(got, want)


def test_fork_shares_full_blocks_and_copies_the_partial_one(eng):
    parent = eng.new_sequence()
    eng.decode([(parent, toks(5, 20), None)])  # blocks 0, 1 full, 2 holds 4 positions
    child = eng.fork(parent)
    assert used(eng) == 3 and child.tables[0] == parent.tables[0]
    c_logits = eng.decode([(child, toks(6, 3), "all")])[0]
    # the child wrote into the shared partial block: it got its own copy
    assert used(eng) == 4
    assert child.tables[0][:2] == parent.tables[0][:2] and child.tables[0][2] != parent.tables[0][2]
    # the parent's own continuation is unaffected by the child's write
    p_logits = eng.decode([(parent, toks(7, 3), "all")])[0]
    fresh = eng.new_sequence()
    want_p = eng.decode([(fresh, np.concatenate([toks(5, 20), toks(7, 3)]), "all")])[0][20:]
    want_c = eng.decode([(eng.new_sequence(), np.concatenate([toks(5, 20), toks(6, 3)]), "all")])[0][20:]
    assert np.array_equal(p_logits, want_p) and np.array_equal(c_logits, want_c)
    eng.free(parent)
    eng.free(child)
    eng.free(fresh)


def test_pool_running_out_names_the_pool(path):
    e = Engine(path, n_ctx=256, kv_pool_tokens=64, n_threads=1, block_size=8)
    try:
        a, b = e.new_sequence(), e.new_sequence()
        e.decode([(a, toks(8, 60), None)])
        with pytest.raises(KVCacheFullError, match="full-attention KV pool is out of blocks"):
            e.decode([(b, toks(9, 60), None)])
        e.free(a)
        e.free(b)
        e.decode([(e.new_sequence(), toks(9, 60), None)])  # usable again once freed
    finally:
        e.close()


def test_an_n_batch_past_the_pool_is_cut_to_it(path):
    """n_batch sizes the pass's scratch; no pass holds more tokens than the
    KV pool, so a larger one (1e9 asked for 1e9 tokens of scratch, and raised
    OutOfMemoryError) is cut to kv_pool_tokens, and a whole-context prompt
    gives the logits it gives in passes of 16 tokens."""
    e = Engine(path, n_ctx=64, kv_pool_tokens=96, n_batch=10**9, n_threads=1, block_size=8)
    ref = Engine(path, n_ctx=64, kv_pool_tokens=96, n_batch=16, n_threads=1, block_size=8)
    try:
        assert e.n_batch == 96
        ids = toks(3, 64)
        got = e.decode([(e.new_sequence(), ids, "all")])[0]
        np.testing.assert_array_equal(got, ref.decode([(ref.new_sequence(), ids, "all")])[0])
    finally:
        e.close()
        ref.close()


def test_context_shift_drops_blocks_without_recomputing(eng, path):
    """Dropping whole blocks from the middle masks their positions: the
    following tokens see exactly the reference's attention over the tokens
    kept, at their original positions."""
    s = eng.new_sequence()
    a = toks(10, 40)
    eng.decode([(s, a, None)])
    dropped = eng.drop(s, 4, 30)  # blocks 1, 2 (positions 8..23) go
    assert dropped == 16 and len(s) == 24 and used(eng) == 3
    assert s.positions == list(range(8)) + list(range(24, 40))
    nxt = toks(11, 3)
    got = eng.decode([(s, nxt, "all")])[0]
    kept = np.concatenate([a[:8], a[24:], nxt])
    pos = np.concatenate([np.arange(8), np.arange(24, 43)])
    ref = ReferenceModel(path).logits(kept, positions=pos)[-3:]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 3e-2


def test_same_sequence_twice_in_one_call_is_refused(eng):
    s = eng.new_sequence()
    with pytest.raises(InvalidArgumentError, match="twice"):
        eng.decode([(s, [1]), (s, [2])])


def test_generate_on_a_list_of_prompts(path):
    """Each prompt of a batch gets the text it gets alone, with its own
    sampling parameters and seed."""
    llm = LLM(path, n_ctx=256, n_threads=2)
    prompts = ["the cat", "a dog and", "in the", "on an island the"]
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.9, seed=4),
              SamplingParams(temperature=0.7, top_k=5, seed=9), SamplingParams(temperature=0)]
    batch = llm.complete(prompts, max_tokens=12, sampling=params)
    for p, sp, c in zip(prompts, params, batch):
        single = LLM(path, n_ctx=256, n_threads=1).complete(p, max_tokens=12, sampling=sp)
        assert (c.tokens, c.text, c.finish_reason) == (single.tokens, single.text, single.finish_reason)
    assert llm.generate(prompts[:2], max_tokens=5, temperature=0) == \
        [llm.generate(p, max_tokens=5, temperature=0) for p in prompts[:2]]
    assert llm.engine.kv_usage()["full-attention"]["used"] <= 2  # the batch's sequences were freed
    with pytest.raises(InvalidArgumentError):
        llm.complete(prompts, stream=True)


def _pages_present(address, size):
    """How many of the pages of [address, address + size) this process has
    mapped (/proc/self/pagemap's present bit)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, end = address // page, (address + size) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((end - first) * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
@pytest.mark.parametrize("through", ["file", "mapping"])
def test_embedding_lookups_leave_the_mapping_unmapped(smollm2_path, monkeypatch, through):
    """With the file mapped and the head repacked, each token's embedding row
    is read from the file with pread ("file"), or, where the engine has no
    file offset for it, through the mapping, after which the pages a fault on
    it mapped (the kernel's fault-around and large folios: the 2 MiB-aligned
    window around it) are handed back ("mapping"). Either way a long prompt
    leaves the embedding all but unmapped, and the logits are those of a copy
    in memory (mmap=False), which keeps its pages."""
    if through == "mapping":
        monkeypatch.setattr(GGUFFile, "file_offset", lambda self, array: None)
    out = {}
    for mapped in (True, False):
        eng = Engine(smollm2_path, n_ctx=512, n_batch=128, n_threads=2, mmap=mapped)
        try:
            if mapped and not eng.repacked_bytes:
                pytest.skip("no repacked kernels on this CPU: the tied head reads the embedding itself")
            emb = eng.spec.tok_embd.data
            # The 2 MiB-aligned windows that hold the table's first and last
            # bytes also hold the tensors beside it (blk.0.attn_norm follows
            # it), read through the mapping every pass: a fault there maps the
            # large folio around it, table pages included (seen: the last 99
            # pages, with the file fresh from its download). The lookups take
            # rows from between those windows, and the pages are counted there.
            window, row = 2 << 20, emb.nbytes // 49152  # SmolLM2: 49152 rows
            lo = -emb.ctypes.data % window or window
            hi = (emb.ctypes.data + emb.nbytes) // window * window - emb.ctypes.data - window
            assert hi - lo >= 4 * window  # room for the lookups in between
            if mapped:  # the same tokens for the copy
                toks = np.random.default_rng(3).choice(np.arange(-(-lo // row), hi // row), 300, replace=False)
                toks = toks.astype(np.int32)
            seq = eng.new_sequence()
            out[mapped] = np.concatenate([eng.decode([(seq, toks[i:i + 100], "last")])[0] for i in range(0, 300, 100)])
            present = _pages_present(emb.ctypes.data + lo, hi - lo)
            total = (hi - lo) // os.sysconf("SC_PAGE_SIZE")
            if mapped:
                # 300 lookups that kept their pages would leave about half mapped (16 pages
                # each); from a cold page cache a few pages can stay (seen: 4 of 7344)
                assert present <= 16, f"{present} of the embedding's {total} pages between its ends still mapped"
            else:
                assert present >= total - 2  # a copy in memory: every page present
        finally:
            eng.close()
    assert np.array_equal(out[True], out[False])


def test_step_on_a_sliding_window_model_is_decode(tmp_path):
    """Engine.step hands the C core both block tables of a model with a
    sliding-window group and gives its blocks back as the window moves on:
    the bits, tokens and tables decode gives, far past the window of 8."""
    path = write_model(tmp_path / "gemma3.gguf", TinyConfig(arch="gemma3", sliding_window=8, seed=1))
    a = Engine(path, n_ctx=64, kv_pool_tokens=128, n_threads=2, block_size=4)
    b = Engine(path, n_ctx=64, kv_pool_tokens=128, n_threads=2, block_size=4)
    try:
        sa, sb = a.new_sequence(), b.new_sequence()
        buf = np.full(a.n_vocab, np.nan, np.float32)
        for i, t in enumerate(toks(5, 40)):
            a.step(sa, int(t), buf)
            (ref,) = b.decode([(sb, np.array([t], np.int32), "last")])
            assert np.array_equal(buf, ref), i
        assert sa.tokens == sb.tokens and sa.positions == sb.positions
        assert sa.tables == sb.tables and sa.swa_floor == sb.swa_floor > 0
        assert -1 in sa.tables[1]  # blocks behind the window were given back
        assert a.kv.usage() == b.kv.usage()
    finally:
        a.close()
        b.close()


def test_embedding_file_outside_the_file_is_refused(smollm2_path):
    eng = Engine(smollm2_path, n_ctx=64, n_threads=1)
    try:
        fd = eng.gguf.descriptor()
        size = os.fstat(fd).st_size
        for offset in (-1, size - 16):
            with pytest.raises(InvalidArgumentError, match="does not lie within the file"):
                eng.desc.embedding_file(fd, offset)
    finally:
        eng.close()


def test_gguf_file_offset_is_the_tensors_own(smollm2_path):
    g = GGUFFile(smollm2_path)
    try:
        info = g.tensors["token_embd.weight"]
        assert g.file_offset(g.tensor_bytes("token_embd.weight")) == info.offset
        assert g.file_offset(np.zeros(16, np.uint8)) is None  # not the map's bytes
    finally:
        g.close()
    g = GGUFFile(smollm2_path, mmap=False)
    try:
        assert g.file_offset(g.tensor_bytes("token_embd.weight")) is None  # a copy: no file behind it
    finally:
        g.close()


def test_repacking_is_skipped_when_the_copy_does_not_fit(monkeypatch, tmp_path):
    """The repacked copy is anonymous memory where the mapped file can be
    paged out: with less memory available than the copy needs, the engine
    keeps the file's rows (same logits) and says so."""
    from llminfer.runtime import engine as engine_mod

    path = write_model(tmp_path / "q8.gguf", TinyConfig(qtype="Q8_0"))
    toks = np.arange(1, 20, dtype=np.int32)

    def logits(eng):
        try:
            return eng.decode([(eng.new_sequence(), toks, "all")])[0]
        finally:
            eng.close()

    if "Q8_0" not in _core.repacked_types():
        pytest.skip("this kernel level repacks nothing")
    eng = Engine(path, n_ctx=64, n_threads=1, repack=False)
    need = eng.desc.repack_size(0, True)
    eng.close()
    eng = Engine(path, n_ctx=64, n_threads=1)
    assert need >= eng.repacked_bytes > 0
    assert eng.desc.repack_size(0, True) == 0  # all of it repacked now
    packed = logits(eng)
    monkeypatch.setattr(engine_mod, "available_memory", lambda: need + engine_mod.REPACK_HEADROOM - 1)
    with pytest.warns(engine_mod.RepackWarning, match=r"not repacking the weights: the repacked copy needs"):
        eng = Engine(path, n_ctx=64, n_threads=1)
    assert eng.repacked_bytes == 0
    assert np.array_equal(logits(eng), packed)


def test_tokenizer_built_on_first_use(path):
    """An engine fed token ids never builds the vocabulary's tables (tens of
    MiB for a large vocabulary); the first use builds the same tokenizer that
    from_metadata does, once."""
    from llminfer.text.tokenizer import Tokenizer

    e = Engine(path, n_ctx=64, n_threads=1)
    s = e.new_sequence()
    e.decode([(s, toks(0, 5), "last")])
    assert e._tokenizer is None
    tok = e.tokenizer
    assert tok is e.tokenizer
    ref = Tokenizer.from_metadata(e.gguf.metadata)
    text = "Hello, world: lazy tokenizers 123"
    assert tok.encode(text) == ref.encode(text) and tok.eog_ids == ref.eog_ids


def test_unrunnable_tokenizer_fails_at_load(tmp_path):
    """Building later must not move a tokenizer error from load to the first request."""
    from llminfer.errors import TokenizerError

    bad = write_model(tmp_path / "bad.gguf", TinyConfig(pre="superbpe"))
    with pytest.raises(TokenizerError, match="pre-tokenizer 'superbpe'"):
        Engine(bad, n_ctx=64)


def test_kept_logits_buffer_is_bounded_and_never_shared(path):
    """The logits output the engine keeps between passes holds at most
    _KEEP_LOGITS floats (a larger pass gets its own array), and what a call
    returns is the caller's: a later pass does not write into it."""
    a = Engine(path, n_ctx=256, kv_pool_tokens=512, n_threads=1, block_size=8)
    b = Engine(path, n_ctx=256, kv_pool_tokens=512, n_threads=1, block_size=8)
    try:
        a._KEEP_LOGITS = 2 * a.n_vocab
        sa, sb = a.new_sequence(), b.new_sequence()
        ids = toks(7, 6)
        (big,) = a.decode([(sa, ids, "all")])  # 6 rows: past the bound
        assert a._logits.size <= a._KEEP_LOGITS
        (first,) = a.decode([(sa, toks(8, 1))])  # one row: kept
        kept = first.copy()
        a.decode([(sa, toks(9, 1))])
        assert np.array_equal(first, kept)
        (ref_big,) = b.decode([(sb, ids, "all")])
        (ref_first,) = b.decode([(sb, toks(8, 1))])
        assert np.array_equal(big, ref_big) and np.array_equal(first, ref_first)
    finally:
        a.close()
        b.close()


def test_logits_into_a_callers_buffer(path):
    """A float32 array as an item's logits receives the last row in place
    (alone in its pass, or beside other items whose rows are copied), and is
    the entry returned; the values are those of "last". A buffer of the
    wrong type, shape or layout is refused before anything runs."""
    a = Engine(path, n_ctx=256, kv_pool_tokens=512, n_threads=2, block_size=8)
    b = Engine(path, n_ctx=256, kv_pool_tokens=512, n_threads=2, block_size=8)
    try:
        sa, sb, other = a.new_sequence(), b.new_sequence(), a.new_sequence()
        buf = np.full(a.n_vocab, np.nan, np.float32)
        for step, ids in enumerate([toks(3, 5), toks(4, 1), toks(5, 1)]):
            work = [(sa, ids, buf)] + ([(other, toks(6 + step, 2), "all")] if step == 2 else [])
            got = a.decode(work)
            assert got[0] is buf
            (ref,) = b.decode([(sb, ids, "last")])
            assert np.array_equal(buf, ref), step
        s = a.new_sequence()
        for bad in (np.zeros(a.n_vocab, np.float64), np.zeros(a.n_vocab + 1, np.float32),
                    np.zeros(2 * a.n_vocab, np.float32)[::2]):
            with pytest.raises(InvalidArgumentError, match="logits buffer"):
                a.decode([(s, toks(1, 2), bad)])
        ro = np.zeros(a.n_vocab, np.float32)
        ro.flags.writeable = False
        with pytest.raises(InvalidArgumentError, match="logits buffer"):
            a.decode([(s, toks(1, 2), ro)])
        assert s.tokens == []
    finally:
        a.close()
        b.close()


def test_logits_as_views_of_the_engines_output(path):
    """"view" gives the last row as a read-only view of the pass's output
    (beside items of other kinds), with the values of "last"; past the
    bound that frees a large buffer, a batch of views keeps its buffer. A
    call whose tokens take more than one pass gets copies, which a later
    pass does not change."""
    a = Engine(path, n_ctx=256, kv_pool_tokens=1024, n_threads=2, block_size=8, n_batch=16)
    b = Engine(path, n_ctx=256, kv_pool_tokens=1024, n_threads=2, block_size=8, n_batch=16)
    try:
        a._KEEP_LOGITS = 2 * a.n_vocab
        sa = [a.new_sequence() for _ in range(4)]
        sb = [b.new_sequence() for _ in range(4)]
        for step in range(3):
            ids = [toks(10 * step + i, 3 if step == 0 else 1) for i in range(4)]
            got = a.decode([(s, x, "view") for s, x in zip(sa[:3], ids)] + [(sa[3], ids[3], "all")])
            want = [b.decode([(s, x, "last")])[0] for s, x in zip(sb, ids)]
            for g, w in zip(got[:3], want):
                assert not g.flags.writeable and g.base is not None
                assert np.array_equal(g, w), step
            assert np.array_equal(got[3][-1], want[3])
            assert a._logits.size >= 6 * a.n_vocab  # kept past _KEEP_LOGITS: the batch has views
        # 2 x 10 tokens, n_batch 16: two passes, so copies
        ids = [toks(40, 10), toks(41, 10)]
        got = a.decode([(s, x, "view") for s, x in zip(sa[:2], ids)])
        kept = [g.copy() for g in got]
        assert all(g.flags.writeable for g in got)
        a.decode([(s, toks(42 + i, 1), "view") for i, s in enumerate(sa[:2])])
        assert all(np.array_equal(g, k) for g, k in zip(got, kept))
        want = [b.decode([(s, x, "last")])[0] for s, x in zip(sb[:2], ids)]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        with pytest.raises(InvalidArgumentError, match="'view'"):
            a.decode([(a.new_sequence(), toks(1, 2), "views")])
    finally:
        a.close()
        b.close()


def test_step_is_decode_of_one_token(path):
    """Engine.step (a generation step without decode's lists) gives the bits
    decode gives for the same token, commits the same sequence, and refuses a
    bad token, buffer or thread count, or a full context, with nothing
    committed."""
    a = Engine(path, n_ctx=16, kv_pool_tokens=64, n_threads=2, block_size=4)
    b = Engine(path, n_ctx=16, kv_pool_tokens=64, n_threads=2, block_size=4)
    try:
        sa, sb = a.new_sequence(), b.new_sequence()
        a.decode([(sa, toks(3, 5), None)])
        b.decode([(sb, toks(3, 5), None)])
        buf = np.full(a.n_vocab, np.nan, np.float32)
        for i, t in enumerate(toks(4, 11)):  # across block boundaries, up to n_ctx
            assert a.step(sa, int(t), buf) is buf
            (ref,) = b.decode([(sb, np.array([t], np.int32), "last")])
            assert np.array_equal(buf, ref), i
        assert sa.tokens == sb.tokens and sa.positions == sb.positions and len(sa.tokens) == a.n_ctx
        with pytest.raises(ContextFullError):
            a.step(sa, 1, buf)
        s = a.new_sequence()
        for bad in (-1, a.n_vocab):
            with pytest.raises(TokenError, match="outside the vocabulary"):
                a.step(s, bad, buf)
        for bad in (1.5, "3", None):
            with pytest.raises(InvalidArgumentError, match="token id must be an integer"):
                a.step(s, bad, buf)
        ro = np.zeros(a.n_vocab, np.float32)
        ro.flags.writeable = False
        for bad in (np.zeros(a.n_vocab, np.float64), np.zeros(a.n_vocab + 1, np.float32),
                    np.zeros(2 * a.n_vocab, np.float32)[::2], ro):
            with pytest.raises(InvalidArgumentError, match="logits buffer"):
                a.step(s, 1, bad)
        with pytest.raises(InvalidArgumentError, match="logits must be a float32 array"):
            a.step(s, 1, [0.0] * a.n_vocab)
        with pytest.raises(InvalidArgumentError, match="n_threads"):
            a.step(s, 1, buf, n_threads=0)
        assert s.tokens == [] and s.next_pos == 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("side", ["below", "above"])
def test_a_decode_steps_ids_are_checked(eng, side):
    """A step's few int32 ids take Engine.check_ids' plain-Python path (the
    C core checks them again): one outside the vocabulary is refused with
    its id named, and nothing is committed."""
    bad = -1 if side == "below" else eng.n_vocab
    s = eng.new_sequence()
    with pytest.raises(TokenError, match=f"token id {bad} is outside the vocabulary"):
        eng.decode([(s, np.array([1, bad], np.int32))])
    assert s.tokens == []


def test_tuning_is_the_engines_own(path):
    """An engine takes the process's prefetch kind when it is created;
    select_prefetch afterwards changes only engines created later, and one
    engine's tuning set at creation or between calls leaves another's alone
    (a draft model's engine and its target's each keep theirs)."""
    from llminfer.core import system
    before = system.current_prefetch()
    other = [k for k in system.STREAM_HINTS if k != before][0]
    a = Engine(path, n_ctx=64, n_threads=1)
    try:
        assert a.tuning == system.Tuning(before, "probe")
        system.select_prefetch(other)
        b = Engine(path, n_ctx=64, n_threads=1, tuning={"placement": "near"})
        c = Engine(path, n_ctx=64, n_threads=1, tuning=system.Tuning(prefetch=before, placement="apart"))
    finally:
        system.select_prefetch(before)
    try:
        assert a.tuning == system.Tuning(before, "probe")
        assert b.tuning == system.Tuning(other, "near")
        assert c.tuning == system.Tuning(before, "apart")
        a.tuning = {"prefetch": other}
        assert a.tuning == system.Tuning(other, "probe") and b.tuning.placement == "near"
    finally:
        for e in (a, b, c):
            e.close()


def test_bad_tuning_is_refused_and_changes_nothing(path):
    with pytest.raises(InvalidArgumentError, match="unknown prefetch kind 'l3'"):
        Engine(path, n_ctx=64, tuning={"prefetch": "l3"})
    with pytest.raises(InvalidArgumentError, match="unknown tuning fields"):
        Engine(path, n_ctx=64, tuning={"prefetch": "l2", "lead": 4096})
    with pytest.raises(InvalidArgumentError, match="tuning must be"):
        Engine(path, n_ctx=64, tuning="l2")
    e = Engine(path, n_ctx=64, n_threads=1)
    try:
        was = e.tuning
        with pytest.raises(InvalidArgumentError, match="unknown placement 'far'; known: probe, near, apart"):
            e.tuning = {"placement": "far"}
        assert e.tuning == was
    finally:
        e.close()


def test_tuning_changes_no_logit(smollm2_path):
    """Every prefetch kind and placement gives a 2-thread decode the same
    logits bit for bit (prompt, then tokens one at a time, through the
    repacked kernels where the level has them), and so does switching
    between them mid-sequence."""
    from llminfer.core import system
    ids = np.random.default_rng(5).integers(0, 49152, 24).astype(np.int32)
    e = Engine(smollm2_path, n_ctx=128, n_threads=2)
    try:
        def run(tunings):
            s = e.new_sequence()
            out = [e.decode([(s, ids[:8], "last")])[0]]
            for i, t in zip(range(8, 24), tunings):
                e.tuning = t
                out.append(e.decode([(s, ids[i:i + 1], "last")])[0])
            e.free(s)
            return np.stack(out)
        kinds = [system.Tuning(p, pl) for p in system.STREAM_HINTS for pl in system.PLACEMENTS]
        want = run([kinds[0]] * 16)
        for t in kinds[1:]:
            assert np.array_equal(run([t] * 16), want), t
        assert np.array_equal(run([kinds[i % len(kinds)] for i in range(16)]), want)
    finally:
        e.close()
