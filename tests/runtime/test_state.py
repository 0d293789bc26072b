"""save_state/load_state and save_session/load_session (llminfer/runtime/state.py):
the logits after a restore are bitwise those of the saved context, and a
state of another model, KV type or format is refused by name."""

import json

import numpy as np
import pytest

from llminfer import LLM
from llminfer.errors import InvalidArgumentError

from tiny_models import TinyConfig, write_model

PROMPT = "the cat sat on the mat and the dog ran around the garden"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    return {
        "llama": write_model(root / "llama.gguf", TinyConfig(tie_output=False)),
        "other": write_model(root / "other.gguf", TinyConfig(tie_output=False, seed=5)),
        "gemma3": write_model(root / "gemma3.gguf", TinyConfig(arch="gemma3", sliding_window=8, seed=1)),
    }


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_restored_context_gives_bitwise_equal_logits(files, arch):
    a = LLM(files[arch], n_ctx=128, n_threads=1)
    ids = a.tokenize(PROMPT * 2)  # past gemma3's window of 8: its sliding-window blocks are partly given back
    a.eval(ids)
    blob = a.save_state()
    nxt = a.eval([5, 6, 7])
    gen = a.complete(ids + [5, 6, 7], max_tokens=6, temperature=0).tokens

    b = LLM(files[arch], n_ctx=128, n_threads=1)
    b.eval(b.tokenize("something else entirely"))  # a context to be replaced
    b.load_state(blob)
    assert b.tokens == ids
    np.testing.assert_array_equal(b.eval([5, 6, 7]), nxt)
    assert b.complete(ids + [5, 6, 7], max_tokens=6, temperature=0).tokens == gen
    # and into the same object, over what came after the save
    a.load_state(blob)
    np.testing.assert_array_equal(a.eval([5, 6, 7]), nxt)


def test_generation_goes_on_from_a_restored_state(files):
    a = LLM(files["llama"], n_ctx=128, n_threads=1)
    ids = a.tokenize(PROMPT)
    first = a.complete(ids, max_tokens=8, temperature=0)
    a.reset()
    a.eval(ids)
    blob = a.save_state()
    b = LLM(files["llama"], n_ctx=128, n_threads=1)
    b.load_state(blob)
    again = b.complete(ids, max_tokens=8, temperature=0)
    assert again.tokens == first.tokens and again.timings.cached_tokens == len(ids) - 1


def test_session_file_round_trip(files, tmp_path):
    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    a.eval(a.tokenize(PROMPT))
    a.save_session(tmp_path / "s.llmstate")
    want = a.eval([3])
    b = LLM(files["llama"], n_ctx=64, n_threads=1)
    b.load_session(tmp_path / "s.llmstate")
    np.testing.assert_array_equal(b.eval([3]), want)


def test_empty_context_round_trips(files):
    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    blob = a.save_state()
    a.eval([1, 2, 3])
    a.load_state(blob)
    assert a.tokens == []


def test_state_of_another_model_or_kv_type_is_refused(files):
    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    a.eval([1, 2, 3])
    blob = a.save_state()
    other = LLM(files["other"], n_ctx=64, n_threads=1)
    with pytest.raises(InvalidArgumentError, match="model"):
        other.load_state(blob)
    f32 = LLM(files["llama"], n_ctx=64, n_threads=1, kv_type="f32")
    with pytest.raises(InvalidArgumentError, match="KV cache type"):
        f32.load_state(blob)
    small = LLM(files["llama"], n_ctx=2, n_threads=1)
    with pytest.raises(InvalidArgumentError, match="n_ctx"):
        small.load_state(blob)


@pytest.mark.parametrize("mangle", [lambda b: b"not a state", lambda b: b[:7] + b"\x09" + b[8:],
                                    lambda b: b[:-10], lambda b: b[:12] + b"[" + b[13:], lambda b: b[:20]])
def test_corrupt_states_raise_and_leave_the_pool_whole(files, mangle):
    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    a.eval(a.tokenize(PROMPT))
    blob = a.save_state()
    b = LLM(files["llama"], n_ctx=64, n_threads=1)
    with pytest.raises(InvalidArgumentError):
        b.load_state(mangle(blob))
    assert b.engine.kv_usage()["full-attention"]["used"] == 0
    b.load_state(blob)  # still usable
    assert b.tokens == a.tokens


def test_block_io_is_bounds_checked(files):
    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    ctx = a.engine.ctx
    size = ctx.block_bytes(0)
    assert size > 0 and ctx.block_bytes(1) == 0  # a llama model has no sliding-window group
    for bad in (-1, a.engine.n_blocks[0]):
        with pytest.raises(Exception, match="outside"):
            ctx.read_block(0, bad)
    with pytest.raises(Exception, match="bytes"):
        ctx.write_block(0, 0, b"\x00" * (size - 1))


def test_a_state_is_made_without_a_second_copy_of_the_cache(files, tmp_path):
    """save_state builds its bytes in place and save_session writes a block
    at a time: what Python allocates on the way stays under half the cache's
    bytes beyond the result (joining a list of block copies took twice)."""
    import tracemalloc

    a = LLM(files["llama"], n_ctx=512, n_threads=1, kv_type="f32")
    a.eval([3 + i % 200 for i in range(400)])
    ctx = a.engine.ctx
    cache = ctx.block_bytes(0) * sum(1 for b in a._seq.tables[0] if b >= 0)
    tracemalloc.start()
    try:
        blob = a.save_state()
        _, peak = tracemalloc.get_traced_memory()
        assert len(blob) > cache and peak - len(blob) < cache // 2
        del blob
        tracemalloc.reset_peak()
        a.save_session(tmp_path / "s.llmstate")
        _, peak = tracemalloc.get_traced_memory()
        assert peak < cache // 2
    finally:
        tracemalloc.stop()
    b = LLM(files["llama"], n_ctx=512, n_threads=1, kv_type="f32")
    b.load_session(tmp_path / "s.llmstate")
    np.testing.assert_array_equal(b.eval([3]), a.eval([3]))


def test_a_session_that_cannot_be_saved_leaves_no_file(files, tmp_path):
    from llminfer.errors import LLMInferError

    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    a.eval([1, 2, 3])
    a.close()
    with pytest.raises(LLMInferError, match="closed"):
        a.save_session(tmp_path / "s.llmstate")
    assert list(tmp_path.iterdir()) == []


def _states_after(files, arch, n_ctx, max_tokens, **kw):
    a = LLM(files[arch], n_ctx=n_ctx, n_threads=1)
    no_end = {t: float("-inf") for t in a.tokenizer.eog_ids}  # generate all max_tokens
    a.complete(a.tokenize(PROMPT), max_tokens=max_tokens, temperature=0, logit_bias=no_end, **kw)
    return a, a.save_state()


@pytest.mark.parametrize("arch, n_ctx, shift", [("gemma3", 256, False), ("llama", 128, True), ("gemma3", 128, True)])
def test_states_the_engine_makes_past_a_window_or_a_shift_load(files, arch, n_ctx, shift):
    """The layouts a long generation leaves, gemma3's sliding-window blocks
    given back (swa_floor > 0) and a context shift's dropped blocks (gaps in
    the positions), pass the loader's layout checks and restore exactly."""
    a, blob = _states_after(files, arch, n_ctx, 300 if shift else 120, context_shift=shift)
    seq = a._seq
    if shift:
        assert seq.next_pos > len(seq.tokens) and -1 in seq.tables[0]
    if arch == "gemma3":
        assert seq.swa_floor > 0
    b = LLM(files[arch], n_ctx=n_ctx, n_threads=1)
    b.load_state(blob)
    assert (b._seq.positions, b._seq.next_pos, b._seq.swa_floor) == (seq.positions, seq.next_pos, seq.swa_floor)
    np.testing.assert_array_equal(b.eval([5]), a.eval([5]))


def _edit_header(blob, **changes):
    import json
    import struct

    from llminfer.runtime.state import MAGIC

    (n,) = struct.unpack_from("<I", blob, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(blob[start:start + n])
    for key, change in changes.items():
        header[key] = change(header.get(key))
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + blob[start + n:]


def _claim_dropped_block(groups):
    table = groups["0"]["table"]
    table[table.index(-1)] = 0
    return groups


@pytest.mark.parametrize("change, why", [
    (dict(next_pos=lambda p: p + 40), "next_pos"),      # the pass would read rows no token wrote
    (dict(next_pos=lambda p: "x"), "next_pos"),
    (dict(positions=lambda ps: ps[:2][::-1] + ps[2:]), "positions"),
    (dict(positions=lambda ps: [p + 1 for p in ps], next_pos=lambda p: p + 1), "some of its positions"),
    (dict(swa_floor=lambda f: f + 3), "swa_floor"),
    (dict(groups=_claim_dropped_block), "table disagrees"),
    (dict(rows=lambda _: [[5, 3]]), "embedding rows"),           # an image's places, backwards
    (dict(rows=lambda _: [[0, 10_000]]), "embedding rows"),      # past the tokens
    (dict(rows=lambda _: [[0, 8], [4, 12]]), "embedding rows"),  # overlapping
    (dict(images=lambda _: [[0, 4, "k"]]), "images"),            # an image with no rows
])
def test_a_header_whose_tables_and_positions_disagree_is_refused(files, change, why):
    a, blob = _states_after(files, "llama", 128, 200, context_shift=True)
    b = LLM(files["llama"], n_ctx=128, n_threads=1)
    with pytest.raises(InvalidArgumentError, match=f"corrupt.*{why}"):
        b.load_state(_edit_header(blob, **change))
    assert b.engine.kv_usage()["full-attention"]["used"] == 0
    b.load_state(blob)
    np.testing.assert_array_equal(b.eval([5]), a.eval([5]))


def test_a_state_that_is_not_bytes_is_refused(files):
    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    for bad in ("LLMIKV", None, [1, 2]):
        with pytest.raises(InvalidArgumentError, match="must be bytes"):
            a.load_state(bad)
    a.eval([1, 2, 3])
    blob = a.save_state()
    a.load_state(np.frombuffer(blob, np.uint8))  # another buffer of the same bytes loads
    assert a.tokens == [1, 2, 3]


def _with_header(blob, header: bytes):
    import struct

    from llminfer.runtime.state import MAGIC

    (n,) = struct.unpack_from("<I", blob, len(MAGIC))
    return MAGIC + struct.pack("<I", len(header)) + header + blob[len(MAGIC) + 4 + n:]


# hostile headers: not an object, wrong types, sizes that would make numpy
# allocate gigabytes before the header is found wanting
HOSTILE_HEADERS = [
    lambda h: b"[1, 2, 3]",
    lambda h: b'"a string"',
    lambda h: b"null",
    lambda h: b"[" * 50000 + b"]" * 50000,
    lambda h: json.dumps({**h, "next_pos": 1 << 40, "positions": [0, (1 << 40) - 1],
                          "tokens": h["tokens"][:2]}).encode(),                      # 256 GiB of bincount
    lambda h: json.dumps({**h, "next_pos": 300_000_000, "positions": [0, 299_999_999],
                          "tokens": h["tokens"][:2]}).encode(),                      # 1.2 GB from 300 bytes
    lambda h: json.dumps({**h, "next_pos": 10 ** 30}).encode(),                    # past int64
    lambda h: json.dumps({**h, "positions": [10 ** 30] * len(h["positions"])}).encode(),
    lambda h: json.dumps({**h, "tokens": "abc"}).encode(),
    lambda h: json.dumps({**h, "tokens": [True] * len(h["tokens"])}).encode(),
    lambda h: json.dumps({**h, "groups": {"x": h["groups"]["0"]}}).encode(),
    lambda h: json.dumps({**h, "groups": []}).encode(),
    lambda h: json.dumps({**h, "groups": {"0": {**h["groups"]["0"], "block_bytes": 10 ** 30}}}).encode(),
    lambda h: json.dumps({**h, "groups": {"0": {**h["groups"]["0"], "table": [10 ** 30]}}}).encode(),
    lambda h: json.dumps({**h, "swa_floor": float("inf")}).encode(),
    lambda h: json.dumps({k: v for k, v in h.items() if k != "positions"}).encode(),
]


@pytest.mark.parametrize("make", HOSTILE_HEADERS, ids=[str(i) for i in range(len(HOSTILE_HEADERS))])
def test_a_hostile_header_is_refused_before_anything_is_allocated(files, make):
    """Each header is refused with InvalidArgumentError (never AttributeError,
    RecursionError, OverflowError or MemoryError), with next to no memory
    allocated on the way, and the context is untouched."""
    import struct
    import tracemalloc

    from llminfer.runtime.state import MAGIC

    a = LLM(files["llama"], n_ctx=64, n_threads=1)
    a.eval(a.tokenize(PROMPT))
    blob = a.save_state()
    (n,) = struct.unpack_from("<I", blob, len(MAGIC))
    header = json.loads(blob[len(MAGIC) + 4:len(MAGIC) + 4 + n])
    bad = _with_header(blob, make(header))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgumentError):
            a.load_state(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * len(bad) + (1 << 20), peak
    assert a.tokens == a.tokenize(PROMPT)  # refused before the context was reset
