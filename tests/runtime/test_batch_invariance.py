"""Batch invariance: a sequence's logits are bitwise the same whatever else is
in its batch, however its prompt is split into passes, whether its prefix
came from a fork, wherever its blocks lie in the pool, and at any thread
count; for every weight type at every kernel level this machine has."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llminfer
from llminfer.runtime.engine import Engine

from tiny_models import WEIGHT_TYPES as TYPES
from tiny_models import ARCHS, TinyConfig, write_model

N_PROMPT = 40


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("inv")
    cache = {}

    def get(qtype, arch="llama"):
        if (qtype, arch) not in cache:
            cfg = TinyConfig(arch=arch, qtype=qtype, sliding_window=8 if arch == "gemma3" else 0)
            cache[qtype, arch] = write_model(root / f"{arch}_{qtype}.gguf", cfg)
        return cache[qtype, arch]

    return get


def toks(seed, n):
    return np.random.default_rng(seed).integers(0, 268, n).astype(np.int32)


def engine(path, threads=2, n_batch=64):
    return Engine(path, n_ctx=256, kv_pool_tokens=4096, n_batch=n_batch, n_threads=threads, block_size=8)


def alone(path, prompt, threads=2):
    eng = engine(path, threads)
    try:
        return eng.decode([(eng.new_sequence(), prompt, "all")])[0]
    finally:
        eng.close()


def ways(path, prompt, threads):
    """The target prompt's logits computed in every other way, by name."""
    out = {}
    eng = engine(path, threads)
    try:
        for k in (1, 3, 15):
            s = eng.new_sequence()
            others = [(eng.new_sequence(), toks(100 + k + j, 5 + 7 * j), "all" if j % 2 else "last")
                      for j in range(k)]
            res = eng.decode([others[0], (s, prompt, "all")] + others[1:])
            out[f"with {k} others"] = res[1]
            for seq in [s] + [o[0] for o in others]:
                eng.free(seq)
        s = eng.new_sequence()
        out["chunks of 7"] = np.concatenate([eng.decode([(s, prompt[i:i + 7], "all")])[0]
                                             for i in range(0, len(prompt), 7)])
        # one token at a time, interleaved with another sequence decoding too,
        # so the two sequences' blocks alternate in the pool
        s, other = eng.new_sequence(), eng.new_sequence()
        rows = []
        for i in range(len(prompt)):
            r = eng.decode([(other, toks(7 + i, 1), None), (s, prompt[i:i + 1], "all")])
            rows.append(r[1])
        out["one at a time, interleaved"] = np.concatenate(rows)
        # the first 20 from a parent, the rest in a fork (a shared partial block
        # is copied on write)
        parent = eng.new_sequence()
        head = eng.decode([(parent, prompt[:20], "all")])[0]
        child = eng.fork(parent)
        eng.decode([(parent, toks(99, 3), None)])  # the parent moves on in its own blocks
        tail = eng.decode([(child, prompt[20:], "all")])[0]
        out["forked at 20"] = np.concatenate([head, tail])
    finally:
        eng.close()
    # passes of 5 tokens: a prompt spread over many forward passes with others
    eng = engine(path, threads, n_batch=5)
    try:
        s = eng.new_sequence()
        res = eng.decode([(eng.new_sequence(), toks(5, 9), "all"), (s, prompt, "all")])
        out["passes of 5"] = res[1]
    finally:
        eng.close()
    return out


# Two threads of a pass confined to one CPU once the engine (and the OpenMP
# pool, by its repacking) has started with two: a waiter at the team's
# barrier (li_share_sync) cannot see the other arrive while it spins, so it
# spins out and sleeps on the futex at nearly every step.
_ONE_CPU = """
import os, sys
import numpy as np
from llminfer.runtime.engine import Engine
path, out = sys.argv[1], sys.argv[2]
eng = Engine(path, n_ctx=256, kv_pool_tokens=4096, n_batch=64, n_threads=2, block_size=8)
cpu = min(os.sched_getaffinity(0))
for tid in os.listdir("/proc/self/task"):  # every thread's mask: the pool's too
    os.sched_setaffinity(int(tid), {cpu})
prompt = np.random.default_rng(1).integers(0, 268, 40).astype(np.int32)
s = eng.new_sequence()
rows = [eng.decode([(s, prompt, "all")])[0]]
buf = np.empty(eng.n_vocab, np.float32)
for t in (5, 17, 250):
    rows.append(eng.step(s, t, buf)[None].copy())
np.save(out, np.concatenate(rows))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_two_threads_on_one_cpu_give_the_same_bits(models, tmp_path):
    """The team's barrier when its waiters sleep: a prompt and three decode
    steps by two threads that share one CPU give one thread's logits."""
    path = models("Q4_K")
    out = tmp_path / "logits.npy"
    # from tmp_path, with the llminfer under test first on the path: from the
    # checkout, "-c" would import its sources, uncompiled where CI installed
    env = dict(os.environ, PYTHONPATH=str(Path(llminfer.__file__).resolve().parent.parent))
    r = subprocess.run([sys.executable, "-c", _ONE_CPU, str(path), str(out)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    eng = engine(path, threads=1)
    try:
        s = eng.new_sequence()
        prompt = toks(1, N_PROMPT)
        ref = [eng.decode([(s, prompt, "all")])[0]]
        for t in (5, 17, 250):
            ref.append(eng.decode([(s, np.array([t], np.int32), "all")])[0])
    finally:
        eng.close()
    assert np.array_equal(np.load(out), np.concatenate(ref))


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_steps_do_not_depend_on_the_thread_count(models, arch):
    """Generation one token at a time, as Engine.step runs it, in every
    architecture (post-norms, sliding windows, experts, q/k norms, no
    pre-norms): one thread and two give the same bits at every step."""
    path = models("Q4_K", arch)
    got = {}
    for threads in (1, 2):
        eng = Engine(path, n_ctx=64, n_threads=threads, block_size=8)
        try:
            s, buf = eng.new_sequence(), np.empty(eng.n_vocab, np.float32)
            got[threads] = np.array([eng.step(s, int(t), buf).copy() for t in toks(3, 20)])
        finally:
            eng.close()
    assert np.array_equal(got[1], got[2]), f"differs by {np.abs(got[1] - got[2]).max()}"


@pytest.mark.parametrize("qtype", TYPES)
def test_logits_do_not_depend_on_the_batch(models, qtype, isa):
    path = models(qtype)
    prompt = toks(1, N_PROMPT)
    ref = alone(path, prompt)
    for threads in (1, 2):
        got = {"alone": alone(path, prompt, threads)} | ways(path, prompt, threads)
        for name, logits in got.items():
            assert np.array_equal(logits, ref), f"{name}, {threads} thread(s): differs by {np.abs(logits - ref).max()}"


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_sliding_window_and_quantized_cache_keep_invariance(models, kv_type):
    path = models("Q4_K", arch="gemma3")
    prompt = toks(2, N_PROMPT)
    a = Engine(path, n_ctx=256, n_threads=2, block_size=4, kv_type=kv_type)
    b = Engine(path, n_ctx=256, n_threads=1, block_size=4, kv_type=kv_type, n_batch=3)
    try:
        whole = a.decode([(a.new_sequence(), prompt, "all")])[0]
        s = b.new_sequence()
        parts = np.concatenate([b.decode([(s, prompt[i:i + 1], "all")])[0] for i in range(N_PROMPT)])
        assert np.array_equal(parts, whole)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_real_models_prompt_whole_or_token_by_token(request, which):
    """On the real files (SmolLM2 Q4_1 differed by up to ~1.0 in a logit
    before): a prompt run whole, in chunks, or token by token beside another
    sequence gives the same logits, bit for bit."""
    path = request.getfixturevalue(which)
    eng = Engine(path, n_ctx=256, n_threads=2, n_batch=64)
    try:
        prompt = toks(3, 48)
        whole = eng.decode([(eng.new_sequence(), prompt, "all")])[0]
        s = eng.new_sequence()
        chunks = np.concatenate([eng.decode([(s, prompt[i:i + 13], "all")])[0] for i in range(0, 48, 13)])
        s, o = eng.new_sequence(), eng.new_sequence()
        steps = np.concatenate([eng.decode([(s, prompt[i:i + 1], "all"), (o, [7], None)])[0] for i in range(48)])
        assert np.array_equal(chunks, whole) and np.array_equal(steps, whole)
    finally:
        eng.close()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
def test_repacked_weights_change_no_logit(models, qtype):
    """A model whose weights are repacked at load (csrc/repack.h) computes
    the same bits as one that multiplies the file's rows, at 1 and 2 threads."""
    from llminfer.core import ops
    if qtype not in ops.repacked_types():
        pytest.skip(f"no repacked kernel for {qtype} on this CPU")
    path = models(qtype)
    prompt = toks(3, N_PROMPT)
    for threads in (1, 2):
        got = {}
        for repack in (True, False):
            eng = Engine(path, n_ctx=256, n_batch=16, n_threads=threads, block_size=8, repack=repack)
            try:
                assert (eng.repacked_bytes > 0) == repack
                s = eng.new_sequence()
                # a prefill in passes of 16, then decode steps of one token
                rows = [eng.decode([(s, prompt[i:i + 16], "all")])[0] for i in range(0, 32, 16)]
                rows += [eng.decode([(s, prompt[i:i + 1], "all")])[0] for i in range(32, N_PROMPT)]
                got[repack] = np.concatenate(rows)
            finally:
                eng.close()
        assert np.array_equal(got[True], got[False]), f"{threads} thread(s): differs by {np.abs(got[True] - got[False]).max()}"


@pytest.mark.parametrize("arch,kv_type,qtype", [("llama", "f16", "Q8_0"), ("gemma3", "f16", "Q8_0"),
                                                ("gemma3", "q8_0", "Q8_0"), ("llama", "f16", "IQ4_XS")])
def test_long_prompts_over_several_spans_and_tiles(tmp_path, arch, kv_type, qtype):
    """Past one attention span (256 positions) a token combines several spans'
    results, and the tokens of a prompt chunk share each span's cached rows in
    tiles; a sliding window of 300 starts mid-span. The logits are the same
    whole, in chunks of 37 (a tile's tokens then straddle span ends), and one
    token at a time beside another sequence (whose blocks interleave). The
    feed-forward takes the 700 rows in chunks of 512 (context.h's
    LI_FFN_CHUNK); IQ4_XS multiplies over values unpacked once per chunk."""
    cfg = TinyConfig(arch=arch, qtype=qtype, context_length=1024, sliding_window=300 if arch == "gemma3" else 0)
    path = write_model(tmp_path / "long.gguf", cfg)
    prompt = toks(4, 700)
    for threads in (1, 2):
        eng = Engine(path, n_ctx=1024, kv_pool_tokens=2048, n_batch=700, n_threads=threads, block_size=16,
                     kv_type=kv_type)
        try:
            s = eng.new_sequence()
            whole = eng.decode([(s, prompt, "all")])[0]
            eng.free(s)
            s = eng.new_sequence()
            chunks = np.concatenate([eng.decode([(s, prompt[i:i + 37], "all")])[0] for i in range(0, 700, 37)])
            eng.free(s)
            s, o = eng.new_sequence(), eng.new_sequence()
            steps = np.concatenate([eng.decode([(s, prompt[i:i + 1], "all"), (o, [5], None)])[0]
                                    for i in range(700)])
        finally:
            eng.close()
        if threads == 1:
            ref = whole
        for name, got in (("whole", whole), ("chunks of 37", chunks), ("one at a time", steps)):
            assert np.array_equal(got, ref), f"{name}, {threads} thread(s): differs by {np.abs(got - ref).max()}"


@pytest.mark.parametrize("arch,n_head,n_head_kv", [("llama", 6, 3), ("gemma3", 4, 1)])
def test_decode_shares_a_groups_heads_among_threads(tmp_path, arch, n_head, n_head_kv):
    """A decoded token with few kv heads is shared among the team by query
    head (attention.c's split items): at 2 threads, 3 kv heads of 2 heads
    each are cut in the middle one, and Gemma's one kv head of 4 in two. One
    token at a time, past one attention span (its spans then combined), and
    through a sliding window of 300 that starts mid-span (gemma3), the logits
    are those of the prompt run whole, bit for bit."""
    cfg = TinyConfig(arch=arch, n_head=n_head, n_head_kv=n_head_kv, n_embd=64 * n_head, context_length=1024,
                     sliding_window=300 if arch == "gemma3" else 0)
    path = write_model(tmp_path / "heads.gguf", cfg)
    prompt = toks(6, 330)
    ref = None
    for threads in (1, 2):
        eng = Engine(path, n_ctx=1024, kv_pool_tokens=2048, n_batch=330, n_threads=threads, block_size=16)
        try:
            if ref is None:
                ref = eng.decode([(eng.new_sequence(), prompt, "all")])[0]
            s = eng.new_sequence()
            steps = np.concatenate([eng.decode([(s, prompt[i:i + 1], "all")])[0] for i in range(len(prompt))])
        finally:
            eng.close()
        assert np.array_equal(steps, ref), f"{threads} thread(s): differs by {np.abs(steps - ref).max()}"
