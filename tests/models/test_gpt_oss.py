"""gpt-oss (issue 52): tiny random files written as llama.cpp's converter
writes the architecture (tests/support/tiny_models.py, write_gpt_oss) against the
float64 numpy reference (tests/support/reference_gpt_oss.py): attention sinks,
biases on the projections, the router and the experts, the clamped SwiGLU,
top-k-then-softmax routing, alternating windowed and full layers, YaRN,
and MXFP4 experts; a sequence's logits bitwise the same alone, batched,
chunked and at 1 or 2 threads; `llminfer quantize --type MXFP4_MOE`; and,
marked `peer`, the logits against llama.cpp's."""

import gguf
import numpy as np
import pytest

from llminfer.core import ops
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec
from llminfer.models.base import ACT_SWIGLU_OAI, GATING_SOFTMAX_WEIGHT
from llminfer.core.quantize_model import quantize_model

from reference_gpt_oss import PIECES, GptOssReference
from archs import assert_invariant_across_span, run, run_f32_kv, tokens_for
from tiny_models import GptOssConfig, write_gpt_oss

# Relative to the largest |reference logit|. With an F32 KV cache the
# engine is the reference's arithmetic in float32, its 8-bit activations
# included (GptOssReference(act_q8=True)): ~1e-7 seen. Quantized
# activations make these tiny models chaotic: the clamped SwiGLU's products
# reach 56, so a Q8_0 block of them rounds its small values by ~10%, and
# where a float32 sum and the reference's float64 one round a value to
# different 8-bit levels, or a router's near tie goes the other way, the
# difference spreads through attention to every later token. The quantized
# checks take CALM files (decisive routing, small expert outputs) and 40
# tokens, where none of that happens; the long ones take F32 weights.
TOL_EXACT = 1e-4
TOL_F16_KV = 5e-3  # F32 weights, the default F16 cache (q, k, v and attention weights rounded)
ROUTE_TIE = 1e-3   # router logits this near the k-th may rightly choose the other expert
CALM = dict(gate_scale=2.0, down_scale=0.1, router_scale=8.0)
MXFP4_FILE = dict(expert_qtype="MXFP4", qtype="Q8_0", embd_qtype="Q8_0", **CALM)  # the released files' mix


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    cache = {}

    def get(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            cache[key] = write_gpt_oss(root / f"gpt_oss_{len(cache)}.gguf", GptOssConfig(**kw))
        return cache[key]

    return get


def relative_error(ours, ref, route_gap=None, tie=0.0):
    """max |ours - ref| over the largest |ref|, leaving out the tokens whose
    expert choice was a near tie in the reference (they must be few)"""
    if route_gap is not None:
        keep = route_gap > tie
        assert keep.mean() > 0.8, f"{np.sum(~keep)} of {keep.size} tokens routed on near ties"
        ours, ref = ours[keep], ref[keep]
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def check_top1(ours, ref, err):
    s = np.sort(ref, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > 4 * err * np.abs(ref).max()
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_spec_reads_what_llama_cpp_reads(files):
    spec = build_spec(GGUFFile(files()))
    assert spec.arch == "gpt-oss" and spec.n_expert == 8 and spec.n_expert_used == 2 and spec.n_ff_exp == 128
    assert [L.sliding_window for L in spec.layers] == [8, 0, 8, 0]  # llama.cpp's pattern 2: even layers windowed
    assert spec.gate_fn == ACT_SWIGLU_OAI and spec.expert_gating == GATING_SOFTMAX_WEIGHT
    L = spec.layers[0]
    assert L.attn_sinks.shape == (4,) and L.bo.shape == (256,) and L.router_b.shape == (8,)
    assert L.gate_exps_b.size == 8 * 128 and L.down_exps_b.size == 8 * 256
    assert spec.rope_factors is not None  # YaRN's per-pair divisors
    plain = build_spec(GGUFFile(files(swa_pattern=4)))
    assert [L.sliding_window for L in plain.layers] == [8, 8, 8, 0]


def test_description_checks(files):
    """The C description refuses an unknown gating or gate function, and
    the spec a sink or bias vector of the wrong length, by name."""
    from llminfer import _core
    from llminfer.errors import InvalidArgumentError, ShapeError

    for field, value, what in (("expert_gating", 3, "expert gating"), ("gate_fn", 4, "gate function")):
        spec = build_spec(GGUFFile(files()))
        setattr(spec, field, value)
        with pytest.raises(InvalidArgumentError, match=what):
            _core.ModelDesc(spec)
    for field in ("attn_sinks", "bo", "router_b", "gate_exps_b", "up_exps_b", "down_exps_b"):
        spec = build_spec(GGUFFile(files()))
        setattr(spec.layers[2], field, getattr(spec.layers[2], field)[:-1].copy())
        with pytest.raises(ShapeError, match=f"layer 2: {field}"):
            _core.ModelDesc(spec)


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_logits_match_reference(files, experts):
    """F32 weights, and the released files' mix (MXFP4 experts, Q8_0
    attention and head) against the reference with 8-bit activations, with
    an F32 KV cache; and F32 weights with the default F16 cache."""
    path = files() if experts == "F32" else files(**MXFP4_FILE)
    toks = tokens_for(21, n=40)
    ref_model = GptOssReference(path, act_q8=True)
    ref = ref_model.logits(toks)
    ours = run_f32_kv(path, toks)
    err = relative_error(ours, ref, ref_model.route_gap, ROUTE_TIE)
    assert err < TOL_EXACT, f"{experts} experts: relative logit error {err:.3g}"
    check_top1(ours, ref, err)
    if experts == "F32":
        err = relative_error(run(path, toks, step=7), ref, ref_model.route_gap, ROUTE_TIE)
        assert err < TOL_F16_KV, f"F16 KV cache: relative logit error {err:.3g}"


def test_each_piece_matters(files):
    """Without any one of the pieces (sinks, window, biases, clamps, YaRN)
    the reference's logits move far more than ours differ from it: each is
    exercised by these tiny files, and computed as llama.cpp does."""
    path = files()
    toks = tokens_for(22, n=40)
    ref_model = GptOssReference(path)
    ref = ref_model.logits(toks)
    err = np.abs(run_f32_kv(path, toks) - ref).max()
    for piece in PIECES:
        moved = np.abs(ref_model.logits(toks, without=(piece,)) - ref).max()
        assert moved > 20 * err, f"leaving out {piece} moves the logits by {moved:.4g}, ours differ by {err:.4g}"


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_alone_batched_chunked_and_threads_are_bitwise_the_same(files, experts):
    """300 positions: the windowed layers' keys cross the attention span at
    256 (their spans combined with the sink), the full layers' too; prefill,
    chunks of 7, a decode token by token, 1 or 2 threads and a batch shared
    with another sequence all give a token the same bits; with F32
    weights, the reference's logits too."""
    path = files() if experts == "F32" else files(**MXFP4_FILE)
    assert_invariant_across_span(path)
    if experts == "F32":  # across the span's seam
        a = tokens_for(31, 300)
        ref_model = GptOssReference(path)
        err = relative_error(run_f32_kv(path, a, step=300), ref_model.logits(a), ref_model.route_gap, ROUTE_TIE)
        assert err < TOL_EXACT, f"300 positions: relative logit error {err:.3g}"


def test_mxfp4_experts_repacked(files):
    """Where the kernel level has a repacked MXFP4 kernel, the experts are
    repacked at load (as test_archs.py's test_moe_experts_repacked checks for
    the other types), and a prompt whole, in chunks and token by token gives
    bitwise the file rows' results."""
    if "MXFP4" not in ops.repacked_types():
        pytest.skip("this kernel level has no repacked MXFP4 kernel")
    path = files(**MXFP4_FILE)
    toks = tokens_for(23, n=40)
    sizes = []
    packed = run(path, toks, n_batch=40, engine_out=sizes)
    assert sizes[0] > 0
    plain = run(path, toks, n_batch=40, repack=False)
    assert np.array_equal(packed, plain)
    assert np.array_equal(run(path, toks, step=3, threads=1), plain)
    assert np.array_equal(run(path, toks[:10], step=1, threads=2), plain[:10])


def test_swiglu_oai_is_ggml_formula():
    """ops.swiglu_oai against ggml_swiglu_oai's formula in float32 (clamps
    at 7 on the gate, +-7 on up), beyond the clamps too"""
    rng = np.random.default_rng(0)
    g = (rng.standard_normal(4096) * 6).astype(np.float32)
    u = (rng.standard_normal(4096) * 6).astype(np.float32)
    x = np.minimum(g, np.float32(7))
    want = x / (np.float32(1) + np.exp(np.float32(-1.702) * x)) * (np.clip(u, -7, 7) + np.float32(1))
    np.testing.assert_allclose(ops.swiglu_oai(g, u), want, rtol=2e-6, atol=1e-30)
    assert (g > 7).any() and (np.abs(u) > 7).any()


def test_mxfp4_quantizer_matches_gguf():
    """Our MXFP4 quantizer (llama.cpp's quantize_row_mxfp4_ref) gives the
    gguf package's numpy quantizer's bytes, zero rows and tiny scales too"""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(-8, 8, (64, 1)))).astype(np.float32)
    x[3] = 0.0
    x[5, :32] = 1e-30
    ours = ops.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    assert np.array_equal(ours, gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4))


def test_quantize_mxfp4_moe(files, tmp_path):
    """llminfer quantize --type MXFP4_MOE, as llama-quantize: experts MXFP4
    (still 3-D), the router and the biases kept, every other matrix Q8_0,
    each the gguf package's quantizer's bytes; the file loads and runs as
    the reference computes it."""
    src = files(**CALM)
    dst = tmp_path / "mxfp4.gguf"
    written = quantize_model(src, dst, "MXFP4_MOE")
    assert written["blk.0.ffn_gate_exps.weight"] == "MXFP4" and written["blk.1.ffn_down_exps.weight"] == "MXFP4"
    assert written["blk.0.ffn_gate_inp.weight"] == "F32"
    assert written["blk.0.attn_q.weight"] == "Q8_0" and written["output.weight"] == "Q8_0"
    assert written["token_embd.weight"] == "Q8_0" and written["blk.0.attn_sinks.weight"] == "F32"
    assert written["blk.0.ffn_gate_exps.bias"] == "F32"  # 2-D, but not a weight
    with GGUFFile(dst) as g, GGUFFile(src) as f:
        assert g.tensors["blk.0.ffn_up_exps.weight"].shape == (8, 128, 256)
        assert g.metadata["general.file_type"] == 38
        for name, info in g.tensors.items():
            old = f.tensors[name]
            values = np.asarray(f.tensor_bytes(name)).view(np.float32).reshape(old.shape)
            want = values if info.qtype == old.qtype else gguf.quants.quantize(values, info.qtype)
            assert np.array_equal(np.asarray(g.tensor_bytes(name)).reshape(-1), want.reshape(-1).view(np.uint8)), name
    toks = tokens_for(23, n=40)
    ref_model = GptOssReference(dst, act_q8=True)
    err = relative_error(run_f32_kv(str(dst), toks), ref_model.logits(toks), ref_model.route_gap, ROUTE_TIE)
    assert err < TOL_EXACT, f"MXFP4_MOE: relative logit error {err:.3g}"


# ---- against llama.cpp (peer) ----

def llama_quantize_mxfp4_moe(src, dst):
    """dst: src quantized by llama.cpp's llama-quantize to MXFP4_MOE (skips without it)"""
    import subprocess

    from peer_checks import find_llama_quantize

    exe = find_llama_quantize()
    if exe is None:
        pytest.skip("llama-quantize not found (set LLAMA_QUANTIZE)")
    r = subprocess.run([exe, str(src), str(dst), "MXFP4_MOE"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return str(dst)


@pytest.mark.peer_tools
def test_mxfp4_moe_is_llama_quantize_bit_for_bit(files, tmp_path):
    """Our MXFP4_MOE file holds llama-quantize's tensors, byte for byte:
    the same types, shapes and blocks (MXFP4 experts, Q8_0 elsewhere, the
    router and biases kept)."""
    src = files(**CALM)
    peer = llama_quantize_mxfp4_moe(src, tmp_path / "peer.gguf")
    quantize_model(src, tmp_path / "ours.gguf", "MXFP4_MOE")
    with GGUFFile(tmp_path / "ours.gguf") as a, GGUFFile(peer) as b:
        assert set(a.tensors) == set(b.tensors)
        for name, info in a.tensors.items():
            other = b.tensors[name]
            assert (info.qtype, info.shape) == (other.qtype, other.shape), name
            assert np.array_equal(np.asarray(a.tensor_bytes(name)), np.asarray(b.tensor_bytes(name))), name


@pytest.mark.peer
@pytest.mark.parametrize("experts", ["F16", "MXFP4"])
def test_logits_match_llama_cpp(peer_python, files, tmp_path, experts):
    """F16 weights, and MXFP4 experts made by llama-quantize (MXFP4_MOE),
    against llama.cpp's logits (both with F16 KV caches): within 2% of its
    largest logit, top-1 equal where its margin is 0.25 or more."""
    from peer_checks import check_against_peer, peer_logits

    if experts == "F16":
        path = files(qtype="F16", expert_qtype="F16", embd_qtype="F16", **CALM)
    else:
        path = llama_quantize_mxfp4_moe(files(**CALM), tmp_path / "mxfp4.gguf")
    toks = tokens_for(24, n=40)
    check_against_peer(run(path, toks), peer_logits(peer_python, path, toks, tmp_path), f"gpt-oss/{experts}")
