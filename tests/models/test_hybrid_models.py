"""Hybrid models (issue 51): lfm2's and lfm2moe's short convolutions,
qwen35's, qwen35moe's and qwen3next's Gated DeltaNet layers, Mamba2 layers
(mamba2, granitehybrid, nemotron_h) beside attention, on tiny random-weight files written as
llama.cpp reads them (tiny_models.write_hybrid).

- what the architecture files read (mixers, sizes, refusals) needs no
  native code;
- llminfer's logits against the numpy reference (reference_hybrid.py),
  which runs the recurrences token by token, skip until the C core runs
  recurrent layers (llminfer._core.state_slot_bytes);
- the reference and llminfer against llama.cpp on the same files (marked
  `peer`: $LLMINFER_PEER_PYTHON, a Python with llama-cpp-python)."""

import numpy as np
import pytest

from llminfer import _core
from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec, qwen35moe, support_line
from llminfer.models.base import MIX_ATTN, MIX_GDN, MIX_MAMBA2, MIX_NONE, MIX_SHORTCONV

from reference_hybrid import HybridReference
from archs import ROUTE_TIE, TOL_FLOAT_WEIGHTS, TOL_QUANT_WEIGHTS, check_close, run, tokens_for
from peer_checks import MARGIN, check_against_peer, peer_logits
from tiny_models import HybridConfig, hybrid_layout, write_hybrid

NATIVE = hasattr(_core, "state_slot_bytes")
needs_native = pytest.mark.skipif(not NATIVE, reason="the C core does not run recurrent layers yet "
                                                     "(llminfer._core has no state_slot_bytes)")

# MoE: 4 experts, 2 used, 2 layers, so that few tokens' expert choice is a near tie (10-12% here)
MOE = {"n_ff_shexp": 0, "n_expert": 4, "n_layer": 2}
# Granite 4.0-H Tiny / Small: experts n_ff wide in every layer, a shared expert of n_ff_shexp (256) ungated
GRANITE_MOE = {"granite_moe": True, "n_expert": 4, "n_layer": 2, "layout": "RA"}
OURS = [("lfm2", {}), ("qwen35", {}), ("qwen35", {"recurrent_array": True}), ("qwen35moe", MOE),
        ("qwen35moe", {**MOE, "n_ff_shexp": 256}), ("qwen3next", {**MOE, "n_v_head": 2, "d_state": 128}),
        ("qwen3next", {**MOE, "n_ff_shexp": 256}), ("lfm2moe", {"n_expert": 4, "n_layer": 2, "layout": "RA"}), ("mamba2", {}),
        ("granitehybrid", {}), ("granitehybrid", GRANITE_MOE), ("granitehybrid", {**GRANITE_MOE, "n_ff_shexp": 0}),
        ("nemotron_h", {})]
GDN_ARCHS = ("qwen35", "qwen35moe", "qwen3next")
# against llama.cpp: untied heads, so that the top token is not the input token
ALL = [(arch, {"tie_output": False})
       for arch in ("lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen3next", "mamba2", "granitehybrid",
                    "nemotron_h")] + [("granitehybrid", {"tie_output": False, **GRANITE_MOE})]
PEER_TOL_FLOAT = 3e-3  # F32/F16 weights: llama.cpp's float32 against float64 (seen: at most 1.2e-3)
PEER_TOL_MOE = 1e-2    # the same beside near ties of the expert choice (seen: 4.6e-3 two tokens after one)


def _id(case):
    arch, kw = case
    return arch + "".join(f"-{k}={v}" for k, v in kw.items())


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    cache = {}

    def get(arch, qtype="Q8_0", **kw):
        key = (arch, qtype, tuple(sorted(kw.items())))
        if key not in cache:
            embd = qtype if qtype in ("F32", "F16") else "Q8_0"
            cfg = HybridConfig(arch=arch, qtype=qtype, embd_qtype=embd, **kw)
            cache[key] = write_hybrid(root / f"{arch}_{qtype}_{len(cache)}.gguf", cfg)
        return cache[key]

    return get


# ---- what the architecture files read ----

@pytest.mark.parametrize("case", OURS, ids=_id)
def test_spec_has_the_layers_mixers_and_sizes(hybrid, case):
    arch, kw = case
    cfg = HybridConfig(arch=arch, **kw)
    spec = build_spec(GGUFFile(hybrid(arch, **kw)))
    recurrent = MIX_SHORTCONV if arch in ("lfm2", "lfm2moe") else MIX_GDN if arch in GDN_ARCHS else MIX_MAMBA2
    want = hybrid_layout(cfg)
    kinds = {"R": recurrent, "A": MIX_ATTN, "F": MIX_NONE}
    assert [L.mixer for L in spec.layers] == [kinds[k] for k in want]
    assert spec.recurrent_layers == [i for i, k in enumerate(want) if k == "R"]
    for L, k in zip(spec.layers, want):
        if k == "F":  # nemotron_h's feed-forward alone: its one norm is the feed-forward's
            assert L.ffn_norm is not None and L.w_up is not None and L.w_gate is None
            continue
        assert L.attn_norm is not None
        assert (L.ffn_norm is None) == (arch in ("mamba2", "nemotron_h"))
        if L.mixer == MIX_ATTN:
            assert L.wq is not None and L.ssm_in is None
            assert (L.q_norm is not None) == (arch not in ("granitehybrid", "nemotron_h"))
            assert L.attn_out_gate == (arch in GDN_ARCHS)
            # neither rotates (Granite 4.0-H: rope.scaling.finetuned false; Nemotron-H's attention has no RoPE)
            assert L.no_rope == (arch in ("granitehybrid", "nemotron_h"))
            assert L.wq.rows == cfg.n_head * cfg.head_dim * (2 if L.attn_out_gate else 1)
        else:
            assert L.wq is None and L.wk is None and L.wv is None and L.wo is None
            assert L.ssm_conv.dtype == np.float32 and L.ssm_conv.ndim == 1 and L.ssm_conv.flags.c_contiguous
    if arch in ("lfm2", "lfm2moe"):
        assert (spec.ssm_d_conv, spec.ssm_d_inner) == (cfg.l_cache, cfg.n_embd)
        assert spec.n_rot == spec.head_dim == cfg.n_embd // cfg.n_head
        assert spec.layers[0].ssm_conv.size == cfg.n_embd * cfg.l_cache
    elif arch in GDN_ARCHS:
        d_inner = cfg.n_v_head * cfg.d_state
        assert (spec.ssm_d_conv, spec.ssm_d_inner, spec.ssm_d_state, spec.ssm_n_group, spec.ssm_n_head) == \
            (cfg.d_conv, d_inner, cfg.d_state, cfg.n_group, cfg.n_v_head)
        L = spec.layers[0]
        assert L.ssm_in.rows == 2 * cfg.n_group * cfg.d_state + d_inner and L.ssm_z.rows == d_inner
        assert L.ssm_conv.size == L.ssm_in.rows * cfg.d_conv
        assert np.all(L.ssm_a < 0) and L.ssm_norm.size == cfg.d_state and L.ssm_out.k == d_inner
        assert spec.n_rot == cfg.n_rot < spec.head_dim
    else:
        di, ng, ds, nh = cfg.mamba_inner, cfg.n_group, cfg.mamba_state, cfg.mamba_heads
        assert (spec.ssm_d_conv, spec.ssm_d_inner, spec.ssm_d_state, spec.ssm_n_group, spec.ssm_n_head) == \
            (cfg.d_conv, di, ds, ng, nh)
        L = spec.layers[0]
        assert L.ssm_in.rows == 2 * di + 2 * ng * ds + nh and L.ssm_out.k == di
        assert L.ssm_conv.size == (di + 2 * ng * ds) * cfg.d_conv and L.ssm_conv_b.size == di + 2 * ng * ds
        assert L.ssm_a.size == L.ssm_d.size == L.ssm_dt_b.size == nh and np.all(L.ssm_a < 0)
        assert L.ssm_norm.size == di
    if arch == "granitehybrid":
        assert spec.embd_scale == cfg.embedding_scale and spec.residual_scale == cfg.residual_scale
        assert spec.attn_scale == pytest.approx(cfg.attention_scale)
        assert spec.logit_scale == pytest.approx(1 / cfg.logit_scale)
    if arch in ("qwen35moe", "qwen3next"):
        assert (spec.n_expert, spec.n_expert_used) == (cfg.n_expert, cfg.n_expert_used)
        assert all(L.moe is not None and L.w_gate is None for L in spec.layers)
    if arch == "granitehybrid" and cfg.granite_moe:  # the experts are feed_forward_length wide
        assert (spec.n_expert, spec.n_expert_used, spec.n_ff_exp) == (cfg.n_expert, cfg.n_expert_used, cfg.n_ff)
        assert spec.n_ff_shexp == cfg.n_ff_shexp
        for L in spec.layers:
            assert L.moe is not None and L.w_gate is None and L.gate_inp_shexp is None
            assert (L.gate_shexp is not None) == (cfg.n_ff_shexp > 0)
            assert L.moe.gate_exps.rows == cfg.n_expert * cfg.n_ff


def test_conv_taps_are_the_files_rows(hybrid):
    """ssm_conv is GGUF's {d_conv, channels}: channel c's taps, the oldest
    input's first, at c * d_conv, as the reference reads them."""
    path = hybrid("qwen35")
    spec = build_spec(GGUFFile(path))
    ref = HybridReference(path)
    want = ref.t["blk.0.ssm_conv1d.weight"]  # [channels, d_conv]
    assert np.array_equal(spec.layers[0].ssm_conv.reshape(want.shape), want.astype(np.float32))


@pytest.mark.parametrize("arch, match", [
    pytest.param("qwen35moe", "shared expert", marks=pytest.mark.skipif(
        qwen35moe.shared_expert_supported(), reason="this build runs the shared expert"))])
def test_what_the_core_cannot_run_is_refused_by_name(hybrid, arch, match):
    path = hybrid(arch)
    with pytest.raises(UnsupportedModelError, match=match):
        build_spec(GGUFFile(path))
    assert match in support_line(GGUFFile(path))


def test_qwen3next_beta_and_alpha_are_split_per_key_head(hybrid):
    """ssm_ba holds, per key head, its value heads' betas then their alphas."""
    path = hybrid("qwen3next", "F32", n_ff_shexp=0, n_v_head=2, d_state=128)
    L = build_spec(GGUFFile(path)).layers[0]
    ba = HybridReference(path).t["blk.0.ssm_ba.weight"].reshape(2, 2, -1)  # [key head, (beta, alpha), n_embd]
    assert np.array_equal(L.ssm_beta.data.view(np.float32).reshape(2, -1), ba[:, 0].astype(np.float32))
    assert np.array_equal(L.ssm_alpha.data.view(np.float32).reshape(2, -1), ba[:, 1].astype(np.float32))


def test_qwen35_multi_token_prediction_block_is_left_out(tmp_path):
    """nextn_predict_layers: the last block is a draft head that the main
    pass does not run; the trunk is the other blocks."""
    for kw in ({}, {"recurrent_array": True}):
        path = write_hybrid(tmp_path / "mtp.gguf", HybridConfig(arch="qwen35", n_nextn=1, **kw))
        spec = build_spec(GGUFFile(path))
        assert [L.mixer for L in spec.layers] == [MIX_GDN, MIX_ATTN, MIX_GDN, MIX_ATTN]


@pytest.mark.parametrize("arch, key, value, match", [
    ("qwen35", "qwen35.rope.dimension_sections", [1, 1, 1, 1], "fourth"),
    ("qwen35", "qwen35.rope.dimension_sections", None, "dimension_sections' is missing"),
    ("qwen35", "qwen35.ssm.inner_size", 128, "inner_size 128"),
    ("qwen35", "qwen35.ssm.group_count", 3, "group_count 3"),
    ("qwen35", "qwen35.ssm.conv_kernel", 1, "conv_kernel' is 1"),
    ("qwen35", "qwen35.ssm.state_size", None, "state_size' is missing"),
    ("lfm2", "lfm2.attention.head_count_kv", None, "head_count_kv' is missing"),
    ("lfm2", "lfm2.attention.head_count_kv", [0, 2, 0, 1], "different KV head counts"),
    ("lfm2", "lfm2.attention.head_count_kv", [0, 2, 0], "array of 4"),
    ("lfm2", "lfm2.shortconv.l_cache", 0, "l_cache' is 0"),
    ("mamba2", "mamba2.ssm.time_step_rank", 7, "time_step_rank 7"),
    ("mamba2", "mamba2.ssm.group_count", 3, "group_count 3"),
    ("granitehybrid", "granitehybrid.attention.head_count_kv", None, "head_count_kv' is missing"),
    ("granitehybrid", "granitehybrid.expert_count", 4, "expert_used_count 0"),
    ("granitehybrid", "granitehybrid.rope.scaling.finetuned", 1, "must be a bool"),
    ("nemotron_h", "nemotron_h.feed_forward_length", [0, 512, 4, 0], "not both"),
])
def test_bad_metadata_is_refused(tmp_path, arch, key, value, match):
    path = write_hybrid(tmp_path / f"{arch}.gguf", HybridConfig(arch=arch), meta={key: value})
    with pytest.raises(UnsupportedModelError, match=match):
        build_spec(GGUFFile(path))


# ---- llminfer against the numpy reference ----

@needs_native
@pytest.mark.parametrize("case", OURS, ids=_id)
@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K"])
def test_logits_match_reference(hybrid, case, qtype):
    arch, kw = case
    path = hybrid(arch, qtype, **kw)
    toks = tokens_for(len(arch) + 1, n=40)
    ref = HybridReference(path)
    want = ref.logits(toks)
    ours = run(path, toks)
    check_close(ours, want, TOL_FLOAT_WEIGHTS if qtype == "F32" else TOL_QUANT_WEIGHTS, f"{_id(case)}/{qtype}",
                route_gap=ref.route_gap)


needs_shared_expert = pytest.mark.skipif(not (NATIVE and qwen35moe.shared_expert_supported()),
                                         reason="no shared expert in LayerSpec and the C core yet")


@needs_shared_expert
@pytest.mark.parametrize("arch", ["qwen35moe"])
@pytest.mark.parametrize("qtype", ["F32", "Q4_K"])
def test_shared_expert_matches_reference(hybrid, arch, qtype):
    """qwen35moe as released: routed experts plus a shared one, gated per
    token by sigmoid(ffn_gate_inp_shexp . x)."""
    path = hybrid(arch, qtype, n_expert=4, n_layer=2)
    toks = tokens_for(len(arch) + 1, n=40)
    ref = HybridReference(path)
    want = ref.logits(toks)
    check_close(run(path, toks), want, TOL_FLOAT_WEIGHTS if qtype == "F32" else TOL_QUANT_WEIGHTS,
                f"{arch}/{qtype}", route_gap=ref.route_gap)


@pytest.mark.peer
@needs_shared_expert
@pytest.mark.parametrize("qtype", ["F16", "Q4_K"])
def test_shared_expert_matches_llama_cpp(peer_python, hybrid, tmp_path, qtype):
    path = hybrid("qwen35moe", qtype, n_expert=4, n_layer=2)
    toks = tokens_for(3, n=40)
    check_against_peer(run(path, toks), peer_logits(peer_python, path, toks, tmp_path), f"qwen35moe/{qtype}")


@needs_native
@pytest.mark.parametrize("case", OURS, ids=_id)
def test_prompt_whole_in_pieces_token_by_token_and_batched_is_bitwise_the_same(hybrid, case):
    """A sequence's state carries over between decode calls: its logits do
    not depend on how its prompt is split, on the thread count, or on the
    other sequences in its batch."""
    from llminfer.runtime.engine import Engine
    arch, kw = case
    path = hybrid(arch, **kw)
    a, b = tokens_for(1, 37), tokens_for(2, 45)
    whole = run(path, a, threads=1)
    assert np.array_equal(run(path, a, step=5, threads=2), whole)
    assert np.array_equal(run(path, a, step=1, threads=2), whole)
    eng = Engine(path, n_ctx=512, n_batch=128, n_threads=2, block_size=16)
    try:
        sa, sb = eng.new_sequence(), eng.new_sequence()
        la, lb = eng.decode([(sa, a, "all"), (sb, b, "all")])
    finally:
        eng.close()
    assert np.array_equal(la, whole)
    assert np.array_equal(lb, run(path, b))


# ---- against llama.cpp ----

@pytest.mark.peer
@pytest.mark.parametrize("case", ALL, ids=_id)
@pytest.mark.parametrize("qtype", ["F32", "F16", "Q4_K"])
def test_reference_matches_llama_cpp(peer_python, hybrid, tmp_path, case, qtype):
    """The numpy reference is llama.cpp's model: with float weights the two
    differ by float32 rounding (PEER_TOL_FLOAT of the largest logit); with
    Q4_K, where llama.cpp also rounds each matrix's input to 8 bits, the top
    token is the same wherever llama.cpp's leads its second by MARGIN (the
    differences: bench/hybrid_peer.py)."""
    arch, kw = case
    path = hybrid(arch, qtype, **kw)
    toks = tokens_for(7, n=70)  # past llama.cpp's 64-token chunks of the delta rule
    ref = HybridReference(path)
    want = ref.logits(toks)
    peer = peer_logits(peer_python, path, toks, tmp_path)
    keep, tol = np.ones(len(toks), bool), PEER_TOL_FLOAT
    if ref.route_gap is not None:
        # a token whose expert choice was a near tie (expert probabilities within ROUTE_TIE, or 1e-3
        # where llama.cpp rounds only to float32 or F16) may go either way (one did, by 0.26 of the
        # largest logit), and its difference carries on a little into the next tokens
        keep = ref.route_gap > (1e-3 if qtype in ("F32", "F16") else ROUTE_TIE)
        tol = PEER_TOL_MOE
        assert keep.mean() > 0.6, f"{_id(case)}/{qtype}: {np.sum(~keep)} tokens routed on near ties"
    err = np.abs(want - peer)[keep].max() / np.abs(peer).max()
    what = f"{_id(case)}/{qtype}: max |reference - llama.cpp| {err:.2e} of the largest logit"
    if qtype in ("F32", "F16"):
        assert err < tol, what
    s = np.sort(peer, axis=-1)
    clear = (s[:, -1] - s[:, -2] >= MARGIN) & keep
    assert clear.sum() >= 5, f"{what}: too few clear top tokens ({clear.sum()})"
    assert np.array_equal(want.argmax(-1)[clear], peer.argmax(-1)[clear]), what


@pytest.mark.peer
@needs_native
@pytest.mark.parametrize("case", [c for c in OURS if c[0] not in ("qwen35moe", "qwen3next")], ids=_id)
@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K"])
def test_logits_match_llama_cpp(peer_python, hybrid, tmp_path, case, qtype):
    """llminfer against llama.cpp as test_archs_peer compares the others
    (TOL_RELATIVE of the largest logit, tied heads; top-1 where clear).
    Not the MoE files llminfer runs: llama.cpp requires their shared expert."""
    arch, kw = case
    path = hybrid(arch, qtype, **kw)
    toks = tokens_for(3, n=40)
    check_against_peer(run(path, toks), peer_logits(peer_python, path, toks, tmp_path), f"{_id(case)}/{qtype}")
