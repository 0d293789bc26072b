"""The native forward pass against the plain numpy reference (tests/support/reference.py)
on tiny random models of each architecture and several tensor types, over the
paged KV cache: sliding windows, long attention split into spans, the KV
cache types, and the errors bad batches get."""

import zlib

import numpy as np
import pytest

from llminfer import _core
from llminfer.runtime.engine import Engine
from llminfer.errors import ContextFullError, InvalidArgumentError, TokenError

from reference import ReferenceModel
from tiny_models import RANDOM_BLOCK_TYPES, WEIGHT_TYPES, TinyConfig, write_model

# Largest |ours - reference| over the largest |reference logit|. Float weights
# differ from float64 only by float32 accumulation and the float16 KV cache;
# quantized weights also see their activations quantized to 8 bits per block
# (about 0.4% per product), compounded over the layers of the tiny models.
TOL_FLOAT_WEIGHTS = 5e-3
TOL_QUANT_WEIGHTS = 3e-2
# The grid i-quants' tiny models hold random grid blocks (no quantizer makes
# them from Gaussian weights): a few magnitudes and no small values, which
# carry the 8-bit activation rounding further through the layers (measured
# 0.013 - 0.031 over six token draws on qwen2, against 0.015 - 0.023 for Q4_K).
TOL_RANDOM_GRID_WEIGHTS = 4.5e-2
# A quantized KV cache against the F16 one, relative to the largest logit:
# keys and values rounded to 8 (4) bits per block of 32, and queries to 8 bits
# for the integer K.Q products.
TOL_KV = {"q8_0": 2e-2, "q4_0": 1.5e-1, "f32": 5e-3}

FLOAT_TYPES = {"F32", "F16", "BF16"}
TYPES = WEIGHT_TYPES
N_TOKENS = 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny model files by (arch, type), written once per module."""
    root = tmp_path_factory.mktemp("tiny")
    cache = {}

    def get(arch, qtype, **kw):
        key = (arch, qtype, tuple(sorted(kw.items())))
        if key not in cache:
            cfg = TinyConfig(arch=arch, qtype=qtype, tie_output=arch != "qwen2",
                             sliding_window=8 if arch == "gemma3" else 0, **kw)
            cache[key] = write_model(root / f"{arch}_{qtype}_{len(cache)}.gguf", cfg)
        return cache[key]

    return get


def run(path, tokens, step=None, n_ctx=1024, n_batch=64, threads=2, kv_type="f16", block_size=16):
    """Logits of every token, fed `step` at a time (all at once by default)."""
    eng = Engine(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, kv_type=kv_type, block_size=block_size)
    try:
        seq = eng.new_sequence()
        n = len(tokens)
        step = step or n
        parts = [eng.decode([(seq, tokens[i:i + step], "all")])[0] for i in range(0, n, step)]
        return np.concatenate(parts)
    finally:
        eng.close()


def tokens_for(seed, n=N_TOKENS, vocab=268):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("qtype", TYPES)
def test_logits_match_numpy_reference(tiny, arch, qtype, isa):
    path = tiny(arch, qtype)
    toks = tokens_for(zlib.crc32(f"{arch}/{qtype}".encode()) % 1000)  # the same tokens every run
    ref = ReferenceModel(path).logits(toks)
    ours = run(path, toks)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    tol = TOL_FLOAT_WEIGHTS if qtype in FLOAT_TYPES else \
        TOL_RANDOM_GRID_WEIGHTS if qtype in RANDOM_BLOCK_TYPES else TOL_QUANT_WEIGHTS
    assert err < tol, f"{arch}/{qtype}/{isa}: relative logit error {err:.4f} >= {tol}"
    # the reference's top choice is ours wherever it leads clearly
    s = np.sort(ref, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > 4 * err * np.abs(ref).max()
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_sliding_window_against_the_reference(tiny):
    """gemma3's local layers see the last 8 positions; over 60 tokens fed 3 at
    a time, their blocks fall out of the window and are given back, and the
    logits still equal the reference's windowed attention."""
    path = tiny("gemma3", "Q8_0")
    toks = tokens_for(11, n=60)
    ours = run(path, toks, step=3, n_batch=3, block_size=4)
    ref = ReferenceModel(path).logits(toks)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < TOL_QUANT_WEIGHTS


def test_sliding_window_memory_is_bounded(tiny):
    """The sliding-window group holds about window + batch positions per
    sequence, however long the text; the full group grows with it."""
    path = tiny("gemma3", "Q8_0")
    eng = Engine(path, n_ctx=512, n_batch=16, n_threads=1, block_size=4)
    try:
        seq = eng.new_sequence()
        most = 0
        for i in range(0, 400, 16):
            eng.decode([(seq, tokens_for(i, n=16), None)])
            most = max(most, eng.kv_usage()["sliding-window"]["used"])
        assert most <= (8 + 16) // 4 + 3
        assert eng.kv_usage()["full-attention"]["used"] == 400 // 4
    finally:
        eng.close()


@pytest.mark.parametrize("kv_type", ["f32", "q8_0", "q4_0"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_kv_types_against_f16(tiny, arch, kv_type):
    """The quantized caches are read directly by the attention kernels; their
    logits stay within the stated tolerance of the F16 cache's."""
    path = tiny(arch, "Q8_0")
    toks = tokens_for(21, n=50)
    f16 = run(path, toks, step=7)
    other = run(path, toks, step=7, kv_type=kv_type)
    err = np.abs(other - f16).max() / np.abs(f16).max()
    assert err < TOL_KV[kv_type], err


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_quantized_cache_is_exactly_the_rounded_attention(tiny, arch, kv_type):
    """With F32 weights, the quantized cache's logits equal (to float32
    accumulation) a reference whose keys and values are rounded to kv_type
    and queries to Q8_0 by the gguf package: the cache stores and reads what
    it should, and the rest of its distance to F16 is the rounding itself
    (the tiny models' Q8_0 embedding and output head add their 8-bit
    activations: the float-weights tolerance)."""
    path = tiny(arch, "F32")
    toks = tokens_for(23, n=40)
    ours = run(path, toks, step=9, kv_type=kv_type)
    ref = ReferenceModel(path).logits(toks, kv_type=kv_type)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < TOL_FLOAT_WEIGHTS


def test_kv_type_memory(tiny):
    """Bytes per layer: q8_0 takes 34/64 of f16, q4_0 18/64."""
    path = tiny("llama", "Q8_0")
    sizes = {}
    for kv in ("f16", "q8_0", "q4_0"):
        eng = Engine(path, n_ctx=256, n_threads=1, kv_type=kv)
        sizes[kv] = eng.kv_cache_bytes()[0]
        eng.close()
    assert sizes["q8_0"] * 64 == sizes["f16"] * 34
    assert sizes["q4_0"] * 64 == sizes["f16"] * 18


def test_decode_rejects_bad_batches(tiny):
    """The C core checks what it is handed and says what is wrong."""
    path = tiny("llama", "Q8_0")
    eng = Engine(path, n_ctx=64, n_batch=8, n_threads=1, block_size=4)
    ctx, V = eng.ctx, eng.n_vocab
    logits = np.zeros(V * 8, dtype=np.float32)
    table = (np.arange(4, dtype=np.int32), None)

    def call(tokens, pos, seq=None, want=None, tables=(table,), out=logits):
        n = len(pos)
        ctx.decode(np.asarray(tokens, np.int32), None, np.asarray(pos, np.int32),
                   np.zeros(n, np.int32) if seq is None else np.asarray(seq, np.int32),
                   np.zeros(n, np.int8) if want is None else np.asarray(want, np.int8), list(tables), out, 1)

    call([1, 2], [0, 1])  # a good one
    with pytest.raises(TokenError, match="outside the vocabulary"):
        call([1, V], [0, 1])
    with pytest.raises(InvalidArgumentError, match="beyond sequence 0's 4 blocks"):
        call([1], [16])  # position 16 needs a fifth block
    with pytest.raises(InvalidArgumentError, match="not in the pool"):
        call([1], [0], tables=((np.array([10 ** 6], np.int32), None),))
    with pytest.raises(InvalidArgumentError, match="views were given"):
        call([1], [0], seq=[3])
    with pytest.raises(InvalidArgumentError, match="takes 1 to 8"):
        call(np.zeros(9), np.arange(9))
    with pytest.raises(ValueError, match="logits buffer"):
        call([1, 2], [0, 1], want=[1, 1], out=logits[:V])
    with pytest.raises(ContextFullError):
        eng.decode([(eng.new_sequence(), np.zeros(65, np.int32))])
    eng.close()


def test_model_description_errors_name_the_tensor(tiny):
    """A wrong shape in the description says which tensor of which layer."""
    from llminfer.core.gguf_file import GGUFFile
    from llminfer.models import build_spec

    spec = build_spec(GGUFFile(tiny("llama", "Q8_0")))
    spec.layers[1].wk.rows += 1
    with pytest.raises(ValueError, match="layer 1's attn_k"):
        _core.ModelDesc(spec)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_long_attention_in_spans(tiny, arch, isa):
    """600 positions cross two span boundaries (256): each token's attention
    is combined from up to three spans, whether it is decoded alone (spans
    split across the team) or in a prompt; both match the reference."""
    path = tiny(arch, "F32")
    toks = tokens_for(13, n=600)
    whole = run(path, toks, n_batch=600, kv_type="f32")
    step = run(path, toks, step=1, n_batch=600, kv_type="f32")
    ref = ReferenceModel(path).logits(toks)
    assert np.array_equal(step, whole)
    assert np.abs(step - ref).max() / np.abs(ref).max() < TOL_FLOAT_WEIGHTS


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_untied_output_head(tmp_path, arch):
    """A file with its own output.weight uses it rather than the embedding."""
    path = write_model(tmp_path / "untied.gguf",
                       TinyConfig(arch=arch, qtype="Q8_0", tie_output=False,
                                  sliding_window=8 if arch == "gemma3" else 0))
    toks = tokens_for(5)
    ref = ReferenceModel(path).logits(toks)
    ours = run(path, toks)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < TOL_QUANT_WEIGHTS
