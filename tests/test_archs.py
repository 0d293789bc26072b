"""The architectures beyond llama/qwen2/gemma3 (qwen3, gemma2, phi3, granite,
olmo2, smollm3, qwen3moe, llama with a sliding window), each on a tiny
random-weight GGUF written as llama.cpp's converter writes that architecture
(tests/tiny_models.py), against the numpy reference (tests/reference.py):
whole prompts, prompts fed in pieces, and several sequences batched
together, which must give each sequence the logits it gets alone."""

import numpy as np
import pytest

from llminfer.engine import Engine
from llminfer.errors import UnsupportedModelError
from llminfer.gguf_file import GGUFFile
from llminfer.models import build_spec

from reference import ReferenceModel
from tiny_models import TinyConfig, write_model

TOL_FLOAT_WEIGHTS = 5e-3   # as in test_forward: relative to the largest |reference logit|
TOL_QUANT_WEIGHTS = 3e-2

NEW_ARCHS = ["qwen3"]


def config(arch, **kw):
    defaults = dict(arch=arch, tie_output=arch not in ("olmo2", "qwen2"))
    if arch == "gemma2":
        defaults["sliding_window"] = 8
    defaults.update(kw)
    return TinyConfig(**defaults)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    cache = {}

    def get(arch, qtype="Q8_0", **kw):
        key = (arch, qtype, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = write_model(root / f"{arch}_{qtype}_{len(cache)}.gguf", config(arch, qtype=qtype, **kw))
        return cache[key]

    return get


def run(path, tokens, step=None, n_ctx=512, n_batch=64, threads=2, block_size=16):
    eng = Engine(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, block_size=block_size)
    try:
        seq = eng.new_sequence()
        step = step or len(tokens)
        parts = [eng.decode([(seq, tokens[i:i + step], "all")])[0] for i in range(0, len(tokens), step)]
        return np.concatenate(parts)
    finally:
        eng.close()


def tokens_for(seed, n=40, vocab=268):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


def check_close(ours, ref, tol, what):
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < tol, f"{what}: relative logit error {err:.4f} >= {tol}"
    s = np.sort(ref, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > 4 * err * np.abs(ref).max()
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear]), what


@pytest.mark.parametrize("arch", NEW_ARCHS)
@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K"])
def test_logits_match_reference(tiny, arch, qtype):
    path = tiny(arch, qtype)
    toks = tokens_for(len(arch))
    ref = ReferenceModel(path, n_ctx=512).logits(toks)
    ours = run(path, toks)
    check_close(ours, ref, TOL_FLOAT_WEIGHTS if qtype == "F32" else TOL_QUANT_WEIGHTS, f"{arch}/{qtype}")


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_prompt_in_pieces_and_batched_is_bitwise_the_same(tiny, arch):
    """A sequence's logits do not depend on how its prompt is split, on
    the thread count, or on the other sequences in its batch."""
    path = tiny(arch)
    a, b = tokens_for(1, 37), tokens_for(2, 45)
    whole = run(path, a, threads=1)
    assert np.array_equal(run(path, a, step=5, threads=2), whole)
    eng = Engine(path, n_ctx=512, n_batch=128, n_threads=2, block_size=16)
    try:
        sa, sb = eng.new_sequence(), eng.new_sequence()
        la, lb = eng.decode([(sa, a, "all"), (sb, b, "all")])
    finally:
        eng.close()
    assert np.array_equal(la, whole)
    assert np.array_equal(lb, run(path, b))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sliding_window_on_every_layer(tiny, arch):
    """A llama-shaped file that sets attention.sliding_window (Mistral 7B
    v0.1) attends through the window on every layer: over 60 tokens fed 3 at
    a time the windowed blocks are given back, and the logits are the
    reference's windowed attention."""
    path = tiny(arch, sliding_window=8)
    toks = tokens_for(11, n=60)
    ours = run(path, toks, step=3, n_batch=3, block_size=4)
    ref = ReferenceModel(path).logits(toks)
    check_close(ours, ref, TOL_QUANT_WEIGHTS, f"{arch} with a window")
    unwindowed = ReferenceModel(tiny(arch)).logits(toks)
    assert np.abs(unwindowed - ref).max() > 10 * np.abs(ours - ref).max()  # the window matters here
