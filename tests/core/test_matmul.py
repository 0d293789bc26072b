"""Matrix products x @ W.T for every weight type and kernel level, against
float64 numpy on the dequantized weights, and each SIMD level against the
scalar reference.

Tolerances. The weights are exact (we multiply by their dequantized values),
so the error comes from the activations and from float32 sums:
- Q-types quantize each activation block of 32 (Q4_0..Q8_0, IQ4_NL, MXFP4)
  or 256 (K-quants, IQ4_XS and the other i-quants, TQ1_0, TQ2_0)
  to int8 with scale absmax/127, an error of at most half a step, absmax/254,
  per element, spread about evenly. A row's error is then a sum of
  independent terms of variance (w_i * h_i)^2 / 3 (h_i that half step); we
  allow SIGMAS standard deviations of it.
- F32, F16 and BF16 weights take float activations: only float32 summation,
  FLOAT_REL of sum |w_i x_i|.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import llminfer
from kernel_cases import (ALL_TYPES, FLOAT_TYPES, QUANT_32, QUANT_TYPES, at_level, isa, random_weight,
                          type_id)
from llminfer import _core
from llminfer.core import ops, system
from llminfer.errors import InvalidArgumentError, ShapeError, UnsupportedTypeError
from kernel_cases import tolerance

__all__ = ["isa"]

LEVELS_REL = 1e-5        # two levels, same integer products, different float order


def k_cases(t):
    bs = ops.block_sizes(t)[0]
    if bs == 1:
        return (1, 17, 256)
    if bs == 32:
        return (32, 160, 1024)  # one block, 5 blocks (a tail after groups of 4), many
    return (256, 768)


@pytest.mark.parametrize("t", ALL_TYPES, ids=type_id)
def test_matches_float64(isa, t):
    rng = np.random.default_rng(int(t))
    for k in k_cases(t):
        for rows in (1, 9):
            w = random_weight(rng, t, rows, k)
            wf = ops.dequantize(w, t, (rows, k))
            for n in (1, 3, 4, 5, 17):
                x = rng.standard_normal((n, k)).astype(np.float32)
                got = ops.matmul(w, t, (rows, k), x)
                want = x.astype(np.float64) @ wf.astype(np.float64).T
                err = np.abs(got - want)
                tol = tolerance(t, wf, x)
                worst = np.unravel_index(np.argmax(err / tol), err.shape)
                assert np.all(err <= tol), (
                    f"{t.name} at {isa}: k={k} rows={rows} n={n}: error {err[worst]:.3g} "
                    f"> tolerance {tol[worst]:.3g} at {worst}")


@pytest.mark.parametrize("t", ALL_TYPES, ids=type_id)
def test_levels_agree(t):
    """Every level computes the same integer products as the scalar reference;
    only the order of the float sums differs."""
    rng = np.random.default_rng(50 + int(t))
    k = 4 * ops.block_sizes(t)[0] if t not in FLOAT_TYPES else 300
    rows = 11
    w = random_weight(rng, t, rows, k)
    wf = ops.dequantize(w, t, (rows, k)).astype(np.float64)
    for n in (1, 2, 5):
        x = rng.standard_normal((n, k)).astype(np.float32)
        ref = at_level("scalar", ops.matmul, w, t, (rows, k), x)
        bound = LEVELS_REL * (np.abs(x.astype(np.float64)) @ np.abs(wf).T) + 1e-30
        for level in system.available_isas():
            got = at_level(level, ops.matmul, w, t, (rows, k), x)
            assert np.all(np.abs(got - ref) <= bound), f"{t.name} {level} n={n}"


# Batch invariance: a row's products must not depend on what else is in its
# batch. Batches of 1 take the decode kernels, 2-3 the small-batch dot
# kernels, 4 and more the prefill panels (in column groups of 4 or 8 and a
# remainder); 37 weight rows make panels and row groups with a short last one.
INVARIANCE_NS = (1, 2, 3, 4, 5, 7, 8, 16, 33)
INVARIANCE_ROWS = 37
INVARIANCE_POOL = 40


def invariance_k(t):
    """A few blocks: 5 of 32 (a tail after groups of 4), 2 super-blocks, or
    100 floats (a tail after vectors of 8 and 16)."""
    if t in FLOAT_TYPES:
        return 100
    return 5 * 32 if t in QUANT_32 else 2 * 256


@pytest.mark.parametrize("t", ALL_TYPES, ids=type_id)
def test_batch_invariance(isa, t):
    """Every row of every batch, at 1 and 2 threads, is bitwise the product of
    that row alone, wherever it sits in the batch."""
    rng = np.random.default_rng(70 + int(t))
    k, rows = invariance_k(t), INVARIANCE_ROWS
    w = random_weight(rng, t, rows, k)
    pool = rng.standard_normal((INVARIANCE_POOL, k)).astype(np.float32)
    alone = np.stack([ops.matmul(w, t, (rows, k), pool[i:i + 1], n_threads=1)[0]
                      for i in range(INVARIANCE_POOL)])
    for n in INVARIANCE_NS:
        for n_threads in (1, 2):
            pick = rng.choice(INVARIANCE_POOL, size=n, replace=False)
            got = ops.matmul(w, t, (rows, k), pool[pick], n_threads=n_threads)
            for j, i in enumerate(pick):
                assert np.array_equal(got[j], alone[i]), (
                    f"{t.name} at {isa}: pool row {i} at index {j} of a batch of {n}, "
                    f"{n_threads} threads: differs from its product alone in weight rows "
                    f"{np.flatnonzero(got[j] != alone[i]).tolist()}")


@pytest.mark.parametrize("t", [Q.Q4_0, Q.Q8_0, Q.MXFP4, Q.Q4_K, Q.Q6_K], ids=type_id)
def test_batch_invariance_across_cache_blocks(isa, t):
    """With long rows (k = 8192) the prefill driver takes a batch of 40 in
    several blocks of columns and 37 weight rows in several blocks of panels
    (gemm.c's cache blocking); every output is still bitwise the product of
    its row alone, at 1 and 2 threads."""
    rng = np.random.default_rng(170 + int(t))
    k, rows, n = 8192, INVARIANCE_ROWS, 40
    w = random_weight(rng, t, rows, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    alone = np.stack([ops.matmul(w, t, (rows, k), x[i:i + 1], n_threads=1)[0] for i in range(n)])
    for n_threads in (1, 2):
        got = ops.matmul(w, t, (rows, k), x, n_threads=n_threads)
        assert np.array_equal(got, alone), f"{t.name} at {isa}, {n_threads} threads"


@pytest.mark.parametrize("t", QUANT_TYPES, ids=type_id)
def test_levels_bitwise_equal_for_quantized_types(t):
    """scalar.c specifies the quantized products to the bit (exact integer
    block sums, then its fused multiply-adds in block order); every level
    repeats them."""
    rng = np.random.default_rng(90 + int(t))
    k, rows = invariance_k(t), INVARIANCE_ROWS
    w = random_weight(rng, t, rows, k)
    for n in (1, 3, 9):
        x = rng.standard_normal((n, k)).astype(np.float32)
        ref = at_level("scalar", ops.matmul, w, t, (rows, k), x)
        for level in system.available_isas():
            got = at_level(level, ops.matmul, w, t, (rows, k), x, n_threads=2)
            assert np.array_equal(got, ref), f"{t.name} {level} n={n}"


def assert_levels_equal_scalar(rng, w, t, rows, k, ns):
    """Each activation-row count of ns: the product at every level and at
    1 and 2 threads equals scalar.c's, bitwise."""
    for n in ns:
        x = rng.standard_normal((n, k)).astype(np.float32)
        ref = at_level("scalar", ops.matmul, w, t, (rows, k), x)
        for level in system.available_isas():
            for n_threads in (1, 2):
                got = at_level(level, ops.matmul, w, t, (rows, k), x, n_threads=n_threads)
                assert np.array_equal(got, ref), f"{t.name} {level} n={n} threads={n_threads}"


@pytest.mark.parametrize("t", QUANT_32, ids=type_id)
def test_long_rows_bitwise_equal_across_levels(t):
    """Rows longer than one pass of the decode kernels' buffers (x86_avx2*.c:
    256 blocks of 32 per pass) and ending in a partial quad of blocks: the
    passes' seams and the last blocks keep scalar.c's chain to the bit, for
    every count of rows of a call (7 rows: groups of 4 and a short one) and
    of activation rows."""
    rng = np.random.default_rng(110 + int(t))
    k, rows = (2 * 256 + 45) * 32, 7
    w = random_weight(rng, t, rows, k)
    assert_levels_equal_scalar(rng, w, t, rows, k, (1, 2, 4))


K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize("t", K_QUANTS, ids=type_id)
@pytest.mark.parametrize("n_blocks", [1, 3, 6, 130])
def test_k_quant_decode_runs_bitwise_equal_across_levels(t, n_blocks):
    """The K-quant decode kernels (x86_avx2.c: rows_k_decode) sum a call's
    rows as one run of super-blocks when a row has at most 128 of them (6: a
    run of 24 with no tail per row; 1 and 3: runs of 4 and 12, and 7 rows
    give a call of 3 with a tail), and go a row at a time past that (130):
    each row keeps scalar.c's bits at every level, alone or beside others."""
    rng = np.random.default_rng(130 + int(t) + n_blocks)
    k, rows = n_blocks * 256, 7
    w = random_weight(rng, t, rows, k)
    assert_levels_equal_scalar(rng, w, t, rows, k, (1, 2))


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_threads_split_rows(isa, n_threads):
    """Row shares that are not multiples of the kernels' row groups."""
    rng = np.random.default_rng(9)
    t = "Q4_0"
    w = random_weight(rng, ops.qtype_of(t), 23, 256)
    x = rng.standard_normal((6, 256)).astype(np.float32)
    one = ops.matmul(w, t, (23, 256), x, n_threads=1)
    assert np.array_equal(ops.matmul(w, t, (23, 256), x, n_threads=n_threads), one)


def test_vector_input_gives_vector():
    rng = np.random.default_rng(2)
    w = random_weight(rng, ops.qtype_of("Q8_0"), 4, 64)
    x = rng.standard_normal(64).astype(np.float32)
    y = ops.matmul(w, "Q8_0", (4, 64), x)
    assert y.shape == (4,)
    assert np.array_equal(y, ops.matmul(w, "Q8_0", (4, 64), x[None])[0])


def test_errors():
    w = np.zeros(4 * 2 * 18, np.uint8)  # Q4_0, (4, 64)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ShapeError, match="takes 144 bytes, got 143"):
        ops.matmul(w[:-1], "Q4_0", (4, 64), x)
    with pytest.raises(ShapeError, match="x has 32 columns, the weight has k=64"):
        ops.matmul(w, "Q4_0", (4, 64), np.ones((2, 32), np.float32))
    with pytest.raises(ShapeError, match="not a multiple of the Q4_0 block size 32"):
        ops.matmul(w, "Q4_0", (8, 36), np.ones((2, 36), np.float32))
    with pytest.raises(ShapeError, match=r"weight shape must be \(rows, k\)"):
        ops.matmul(w, "Q4_0", (2, 2, 64), x)
    with pytest.raises(ShapeError, match="dimension"):
        ops.matmul(w, "Q4_0", (4, 64), np.ones((1, 2, 64), np.float32))
    with pytest.raises(InvalidArgumentError, match="dtype float32"):
        ops.matmul(w, "Q4_0", (4, 64), x.astype(np.float64))
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        ops.matmul(w, "Q4_0", (4, 64), np.ones((64, 2), np.float32).T)
    with pytest.raises(UnsupportedTypeError, match="NVFP4"):
        ops.matmul(np.zeros(36, np.uint8), "NVFP4", (1, 64), np.ones((1, 64), np.float32))
    with pytest.raises(UnsupportedTypeError, match="unknown tensor type"):
        ops.matmul(w, 77, (4, 64), x)
    with pytest.raises(InvalidArgumentError, match="n_threads"):
        ops.matmul(w, "Q4_0", (4, 64), x, n_threads=0)


REPACK_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.MXFP4, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS)  # repack.h


@pytest.mark.parametrize("t", REPACK_TYPES, ids=type_id)
def test_repacked_weights_give_the_scalar_bits(t):
    """Weights repacked into interleaved groups of 16 rows (what a model does
    at load) give each row the scalar kernel's result to the bit: groups cut
    short (5, 37, 70 rows), decode's calls over 2, 3 and 4 groups side by
    side, every count of activation rows a kernel call takes and more,
    thread shares that split the groups unevenly."""
    if t.name not in ops.repacked_types():
        pytest.skip(f"the {system.current_isa()} level has no repacked kernel for {t.name}")
    rng = np.random.default_rng(300 + int(t))
    k = 3 * 32 if t in QUANT_32 else 3 * 256
    for rows in (5, 16, 37, 70):
        w = random_weight(rng, t, rows, k)
        x = rng.standard_normal((9, k)).astype(np.float32)
        for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 14):
            ref = at_level("scalar", ops.matmul, w, t, (rows, k), x[:n])
            for threads in (1, 2, 3):
                got = ops.matmul(w, t, (rows, k), x[:n], n_threads=threads, repacked=True)
                assert np.array_equal(got, ref), (
                    f"{t.name} rows={rows} n={n} threads={threads}: rows "
                    f"{np.flatnonzero((got != ref).any(axis=0)).tolist()} differ")


def test_repacked_refuses_what_it_cannot_do():
    rng = np.random.default_rng(5)
    w = random_weight(rng, Q.IQ4_NL, 4, 64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    with pytest.raises(UnsupportedTypeError, match="repacked kernel for IQ4_NL"):
        ops.matmul(w, "IQ4_NL", (4, 64), x, repacked=True)
    with pytest.raises(InvalidArgumentError, match="repacked"):
        ops.matmul(w, "IQ4_NL", (4, 64), x, repacked="yes")


def test_repacked_matrix_packs_once_and_follows_the_level():
    """_core.RepackedMatrix (the kernel benchmark's handle) multiplies the
    same bits on every call, and refuses once the level in use has no
    repacked kernel, instead of running code the CPU may lack."""
    from llminfer import _core
    if "Q4_0" not in ops.repacked_types():
        pytest.skip(f"the {system.current_isa()} level has no repacked kernels")
    rng = np.random.default_rng(8)
    w = random_weight(rng, Q.Q4_0, 40, 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    m = _core.RepackedMatrix(int(Q.Q4_0), w.reshape(-1), 40, 256, 2)
    ref = at_level("scalar", ops.matmul, w, Q.Q4_0, (40, 256), x)
    assert np.array_equal(m.matmul(x, 2), ref) and np.array_equal(m.matmul(x, 1), ref)
    with pytest.raises(UnsupportedTypeError):
        at_level("avx2", m.matmul, x, 1)
    with pytest.raises(ShapeError):
        m.matmul(np.ascontiguousarray(x[:, :128]), 1)


def test_joint_product_gives_each_product_its_own_bits():
    """Products shared by the team as one (li_x16_matmul_parts: a layer's
    q, k and v, gate and up, a MoE layer's experts) give each product what it
    gives alone, against the scalar level's plain product, whatever the team:
    mixed types and activation formats, row counts that end in part of a
    group, decode's one row beside rows enough to unpack groups (8+), and a
    product of no rows."""
    from llminfer import _core
    types = [t for t in (Q.Q4_K, Q.Q6_K, Q.Q4_0, Q.IQ4_XS, Q.Q8_0, Q.MXFP4) if t.name in ops.repacked_types()]
    if len(types) < 2:
        pytest.skip(f"the {system.current_isa()} level has fewer than two repacked types")
    rng = np.random.default_rng(11)
    shapes = [(100, 512, 1), (37, 512, 9), (64, 256, 3), (16, 256, 0), (200, 512, 1), (48, 256, 2)]
    mats, xs, refs = [], [], []
    for i, (rows, k, n) in enumerate(shapes):
        t = types[i % len(types)]
        w = random_weight(rng, t, rows, k)
        x = rng.standard_normal((n, k)).astype(np.float32)
        mats.append(_core.RepackedMatrix(int(t), w.reshape(-1), rows, k, 2))
        xs.append(x)
        refs.append(at_level("scalar", ops.matmul, w, t, (rows, k), x) if n else np.empty((0, rows), np.float32))
    for threads in (1, 2, 3):
        outs = _core.repacked_matmul_joint(list(zip(mats, xs)), threads)
        for (rows, k, n), out, ref in zip(shapes, outs, refs):
            assert out.shape == (n, rows) and np.array_equal(out, ref), (rows, k, n, threads)


def test_joint_product_refuses_bad_lists():
    from llminfer import _core
    if "Q4_0" not in ops.repacked_types():
        pytest.skip(f"the {system.current_isa()} level has no repacked kernels")
    rng = np.random.default_rng(12)
    m = _core.RepackedMatrix(int(Q.Q4_0), random_weight(rng, Q.Q4_0, 16, 64).reshape(-1), 16, 64, 1)
    x = np.ones((1, 64), np.float32)
    with pytest.raises(InvalidArgumentError, match="1 to 32"):
        _core.repacked_matmul_joint([], 1)
    with pytest.raises(InvalidArgumentError, match="1 to 32"):
        _core.repacked_matmul_joint([(m, x)] * 33, 1)
    with pytest.raises(InvalidArgumentError, match="RepackedMatrix"):
        _core.repacked_matmul_joint([(m, x), ("not a matrix", x)], 1)
    with pytest.raises(ShapeError, match="product 1"):
        _core.repacked_matmul_joint([(m, x), (m, np.ones((1, 32), np.float32))], 1)


# ---- sharing a repacked product's groups among the team (csrc/share.h) ----

def fixed_share(units, ith, nth):
    """common.h's li_split: thread ith's contiguous share of units."""
    per = -(-units // nth)
    lo = min(units, per * ith)
    return lo, min(units, lo + per)


@pytest.mark.parametrize("units,products,threads", [(0, 3, 2), (1, 4, 2), (3, 20, 4), (7, 9, 3), (64, 30, 2),
                                                    (1000, 12, 2), (1000, 12, 5), (65535, 2, 2)])
def test_share_hands_out_every_unit_once(units, products, threads):
    """Consecutive products with no barrier between them, as wq, wk and wv:
    every unit of every product is taken by exactly one thread, whether one
    thread is slow or none is, and whether owners take single units or
    (decode's groups) at least 4 at a time until their last few."""
    for chunk in (1, 4):
        for slow in (-1, 0, threads - 1):
            team, taken_by, times = _core.share_trace(units, products, threads, slow, 2000 if units < 5000 else 20,
                                                      chunk)
            assert team == threads
            assert times.shape == (products, units) and np.array_equal(times, np.ones_like(times)), (
                f"chunk {chunk}, slow thread {slow}: units taken {np.unique(times).tolist()} times")
            assert ((taken_by >= 0) & (taken_by < threads)).all()


@pytest.mark.parametrize("chunk", [1, 4])
def test_share_moves_work_from_a_slow_thread(chunk):
    """A thread that spins on every unit it takes ends up with fewer than its
    fixed share: the others take pieces from the back of its share."""
    units, products = 200, 40
    team, taken_by, _ = _core.share_trace(units, products, 2, 1, 200000, chunk)
    assert team == 2
    lo, hi = fixed_share(units, 1, 2)
    by_other = (taken_by[:, lo:hi] == 0).sum()
    assert by_other > 0, "thread 0 never took a unit of the slow thread's share"
    # the owner takes from the front and the others from the back: in each
    # product, thread 1's share is a run of its own units, then thread 0's
    share = taken_by[:, lo:hi]
    assert (np.diff(share, axis=1) <= 0).all()


def test_share_with_one_thread_is_in_order():
    team, taken_by, times = _core.share_trace(50, 3, 1)
    assert team == 1 and (taken_by == 0).all() and (times == 1).all()


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_team_barrier_orders_every_write(threads, tmp_path):
    """The team's barrier (li_share_sync, which the pass uses between its
    steps, and li_share_sync_ahead, before a product, whose waiters hint
    lines to L2 as they spin): after it, every thread reads what every other wrote before it,
    with no thread late, one thread late on some rounds by long enough that
    the others stop spinning and sleep, and with more threads than this
    machine's CPUs (waiters then yield almost at once); and when one of the
    team sits out a parallel region and comes back to the next, with its
    arrival as it left it (the rounds run in three regions, the second a
    thread short)."""
    # in a child process: a barrier that loses count hangs rather than fails
    code = ("import sys; from llminfer import _core\n"
            "for slow in (-1, 0, int(sys.argv[1]) - 1):\n"
            "    print(slow, *_core.share_barrier_check(int(sys.argv[1]), 3000, slow, 10_000_000, 300))\n")
    # from tmp_path, with the llminfer under test first on the path: from the
    # checkout, "-c" would import its sources, uncompiled where CI installed
    env = dict(os.environ, PYTHONPATH=str(Path(llminfer.__file__).resolve().parent.parent))
    try:
        r = subprocess.run([sys.executable, "-c", code, str(threads)], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a team of {threads} did not get through its barriers in 300 s")
    assert r.returncode == 0, r.stderr[-2000:]
    for line in r.stdout.splitlines():
        slow, team, stale = map(int, line.split())
        assert team == threads
        assert stale == 0, f"slow thread {slow}: {stale} slots read before their round's write"
    assert len(r.stdout.splitlines()) == 3


def test_team_barrier_refuses_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        _core.share_barrier_check(0, 10)
    with pytest.raises(InvalidArgumentError):
        _core.share_barrier_check(2, -1)
    with pytest.raises(InvalidArgumentError):
        _core.share_barrier_check(2, 10, slow_every=0)
    assert _core.share_barrier_check(1, 10) == (1, 0)


def test_share_refuses_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        _core.share_trace(65536, 1, 2)
    with pytest.raises(InvalidArgumentError):
        _core.share_trace(-1, 1, 2)
    with pytest.raises(InvalidArgumentError):
        _core.share_trace(10, 1, 0)
    with pytest.raises(InvalidArgumentError):
        _core.share_trace(10, 1, 2, chunk=0)


@pytest.fixture
def prefetch_restored():
    before = system.current_prefetch()
    yield
    system.select_prefetch(before)


@pytest.mark.parametrize("kind", system.STREAM_HINTS)
@pytest.mark.parametrize("t", REPACK_TYPES, ids=type_id)
def test_decode_stream_hints_change_no_bit(prefetch_restored, kind, t):
    """Decode's repacked kernels hint their weight stream into L1 (AMD) or L2
    (elsewhere), a branch in every block's hints: either way one and two
    activation rows get the scalar kernel's bits, on matrices long enough that
    the hints run a few KiB ahead of the loads and past the matrix's end."""
    if t.name not in ops.repacked_types():
        pytest.skip(f"the {system.current_isa()} level has no repacked kernel for {t.name}")
    system.select_prefetch(kind)
    assert system.current_prefetch() == kind
    rng = np.random.default_rng(700 + int(t))
    k = 32 * 32 if t in QUANT_32 else 4 * 256
    rows = 40
    w = random_weight(rng, t, rows, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    for n in (1, 2):
        ref = at_level("scalar", ops.matmul, w, t, (rows, k), x[:n])
        for threads in (1, 2):
            got = ops.matmul(w, t, (rows, k), x[:n], n_threads=threads, repacked=True)
            assert np.array_equal(got, ref), f"{t.name} {kind} n={n} threads={threads}"
