"""The native forward pass against the plain numpy reference (tests/reference.py)
on tiny random models of each architecture and several tensor types, with
prefill, token-by-token decode and ragged batches agreeing with each other,
and the sliding-window ring buffer agreeing with a full cache and a mask."""

import numpy as np
import pytest

from llminfer import _core
from llminfer.errors import ContextFullError, InvalidArgumentError, TokenError
from llminfer.gguf_file import GGUFFile
from llminfer.models import build_spec
from llminfer.system import available_isas, current_isa, select_isa

from reference import ReferenceModel
from tiny_models import TinyConfig, write_model

# Largest |ours - reference| over the largest |reference logit|. Float weights
# differ from float64 only by float32 accumulation and the float16 KV cache;
# quantized weights also see their activations quantized to 8 bits per block
# (about 0.4% per product), compounded over the layers of the tiny models.
TOL_FLOAT_WEIGHTS = 5e-3
TOL_QUANT_WEIGHTS = 3e-2
# Prefill multiplies batches with panel kernels and splits attention
# differently from decode, so sums run in other orders. A last-bit
# difference can move a value to the next step wherever values are rounded:
# the SiLU/GELU tables are indexed at float16 precision (1/2048), and
# quantized weights add 8-bit activations (~1/254 of a block).
TOL_BATCHING = 2e-3
TOL_BATCHING_QUANT = 1e-2

FLOAT_TYPES = {"F32", "F16", "BF16"}
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
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


def run(path, tokens, step=None, n_ctx=128, n_batch=64, swa_full=False, threads=2, kv_f16=True):
    spec = build_spec(GGUFFile(path))
    ctx = _core.Context(_core.ModelDesc(spec), n_ctx, n_batch, int(kv_f16), threads, swa_full)
    n = len(tokens)
    out = np.zeros((n, spec.n_vocab), dtype=np.float32)
    step = step or n
    for i in range(0, n, step):
        chunk = np.ascontiguousarray(tokens[i:i + step], dtype=np.int32)
        buf = np.zeros(len(chunk) * spec.n_vocab, dtype=np.float32)
        ctx.forward(chunk, i, True, buf, threads)
        out[i:i + len(chunk)] = buf.reshape(len(chunk), -1)
    return out


def tokens_for(seed, n=N_TOKENS, vocab=268):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


@pytest.fixture(params=available_isas())
def isa(request):
    before = current_isa()
    select_isa(request.param)
    yield request.param
    select_isa(before)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("qtype", TYPES)
def test_logits_match_numpy_reference(tiny, arch, qtype, isa):
    path = tiny(arch, qtype)
    toks = tokens_for(hash((arch, qtype)) % 1000)
    ref = ReferenceModel(path).logits(toks)
    ours = run(path, toks)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    tol = TOL_FLOAT_WEIGHTS if qtype in FLOAT_TYPES else TOL_QUANT_WEIGHTS
    assert err < tol, f"{arch}/{qtype}/{isa}: relative logit error {err:.4f} >= {tol}"
    # the reference's top choice is ours wherever it leads clearly
    s = np.sort(ref, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > 4 * err * np.abs(ref).max()
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("qtype", ["F32", "Q4_0", "Q4_K", "Q8_0"])
def test_prefill_and_decode_agree(tiny, arch, qtype, isa):
    path = tiny(arch, qtype)
    toks = tokens_for(7)
    exact = qtype == "F32"
    whole = run(path, toks, kv_f16=not exact)
    scale = np.abs(whole).max()
    s = np.sort(whole, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > 0.05 * scale
    for step in (1, 5, 17):
        part = run(path, toks, step=step, kv_f16=not exact)
        err = np.abs(part - whole).max() / scale
        assert err < (TOL_BATCHING if exact else TOL_BATCHING_QUANT), f"step {step}: {err:.2e}"
        assert np.array_equal(part.argmax(-1)[clear], whole.argmax(-1)[clear])


def test_thread_counts_agree(tiny):
    path = tiny("llama", "Q4_0")
    toks = tokens_for(3)
    one = run(path, toks, threads=1)
    two = run(path, toks, threads=2)
    assert np.abs(one - two).max() / np.abs(one).max() < TOL_BATCHING


def test_sliding_window_ring_equals_full_cache_with_mask(tiny):
    """gemma3 local layers keep window + n_batch slots; over 60 tokens with a
    window of 8 and batches of 3 the ring wraps many times, yet the logits equal
    a full-length cache whose attention is masked to the window."""
    path = tiny("gemma3", "Q8_0")
    toks = tokens_for(11, n=60)
    ring = run(path, toks, step=3, n_batch=3)
    full = run(path, toks, step=3, n_batch=3, swa_full=True)
    assert np.abs(ring - full).max() / np.abs(full).max() < TOL_BATCHING
    ref = ReferenceModel(path).logits(toks)
    assert np.abs(ring - ref).max() / np.abs(ref).max() < TOL_QUANT_WEIGHTS


def test_ring_memory_is_bounded_by_the_window(tiny):
    path = tiny("gemma3", "Q8_0")
    spec = build_spec(GGUFFile(path))
    ctx = _core.Context(_core.ModelDesc(spec), 512, 16, 1, 1)
    per_slot = spec.n_head_kv * (spec.head_dim + spec.head_dim_v) * 2
    for i, layer in enumerate(spec.layers):
        slots = ctx.kv_bytes(i) // per_slot
        if layer.sliding_window:
            assert slots == layer.sliding_window + 16
        else:
            assert slots == 512


def test_forward_rejects_bad_input(tiny):
    path = tiny("llama", "Q8_0")
    spec = build_spec(GGUFFile(path))
    ctx = _core.Context(_core.ModelDesc(spec), 16, 8, 1, 1)
    logits = np.zeros(spec.n_vocab * 8, dtype=np.float32)
    with pytest.raises(ContextFullError):
        ctx.forward(np.zeros(4, np.int32), 14, False, logits, 1)
    with pytest.raises(TokenError):
        ctx.forward(np.array([1, spec.n_vocab], np.int32), 0, False, logits, 1)
    with pytest.raises(InvalidArgumentError):
        ctx.forward(np.zeros(9, np.int32), 0, False, logits, 1)  # more than n_batch
    with pytest.raises(ValueError):
        ctx.forward(np.zeros(2, np.int32), 0, True, logits[: spec.n_vocab], 1)  # logits too small


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


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decode_splits_long_attention_across_threads(tiny, arch, isa):
    """A decoded token's visible positions are split into chunks shared by the
    team once there are enough of them; the combined softmax must equal the
    one-pass attention of a prefill over the same tokens."""
    path = tiny(arch, "F32")
    toks = tokens_for(13, n=200)
    whole = run(path, toks, n_ctx=256, n_batch=256, kv_f16=False)
    step = run(path, toks, step=1, n_ctx=256, n_batch=256, kv_f16=False)
    ref = ReferenceModel(path).logits(toks)
    scale = np.abs(whole).max()
    assert np.abs(step - whole).max() / scale < TOL_BATCHING
    assert np.abs(step - ref).max() / np.abs(ref).max() < TOL_FLOAT_WEIGHTS
