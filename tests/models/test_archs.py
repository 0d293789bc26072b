"""The architectures beyond llama/qwen2/gemma3 (qwen3, gemma2, phi3, granite,
olmo2, smollm3, qwen3moe, qwen3vlmoe, llama with a sliding window), each on a tiny
random-weight GGUF written as llama.cpp's converter writes that architecture
(tests/support/tiny_models.py), against the numpy reference (tests/support/reference.py):
whole prompts, prompts fed in pieces, and several sequences batched
together, which must give each sequence the logits it gets alone."""

import re

import numpy as np
import pytest

from llminfer.core import ops
from llminfer.runtime.engine import Engine
from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec

from reference import ReferenceModel
from tiny_models import write_model
from archs import NEW_ARCHS, TOL_FLOAT_WEIGHTS, TOL_QUANT_WEIGHTS, YARN_CASES, check_close, config, run, tokens_for

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


@pytest.mark.parametrize("arch", NEW_ARCHS)
@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K"])
def test_logits_match_reference(tiny, arch, qtype):
    path = tiny(arch, qtype)
    toks = tokens_for(len(arch))
    model = ReferenceModel(path, n_ctx=512)
    ref = model.logits(toks)
    ours = run(path, toks)
    # qwen3vlmoe's tokens routed on near ties are left out (8-bit activations may pick the
    # other expert there: Q4_K lands 6e-2 off on one); qwen3moe's 8 experts pass whole here
    gap = model.route_gap if arch == "qwen3vlmoe" else None
    check_close(ours, ref, TOL_FLOAT_WEIGHTS if qtype == "F32" else TOL_QUANT_WEIGHTS, f"{arch}/{qtype}",
                route_gap=gap)


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


@pytest.mark.parametrize("orig", [64, 1024])
def test_phi3_long_rope_factors_by_context(tiny, orig):
    """LongRoPE: a context longer than rope.scaling.original_context_length
    (64 here) takes the long factors, a shorter one (1024) the short ones;
    either way with the attention factor."""
    path = tiny("phi3", long_context=orig)
    toks = tokens_for(5)
    ref = ReferenceModel(path, n_ctx=512).logits(toks)
    check_close(run(path, toks, n_ctx=512), ref, TOL_QUANT_WEIGHTS, f"phi3 LongRoPE, original context {orig}")
    other = ReferenceModel(path, n_ctx=32 if orig == 64 else 2048).logits(toks)
    assert np.abs(other - ref).max() > 0.1 * np.abs(ref).max()  # the choice matters


# YaRN's pieces and mistral3's temperature tuning one at a time (also in test_archs_peer)
@pytest.mark.parametrize("arch, kw", YARN_CASES)
def test_yarn_and_temperature_tuning(tiny, arch, kw):
    """Each of YaRN's pieces and the queries' temperature tuning, alone, gives
    the reference's logits, and changes them (against the same file without it)."""
    path = tiny(arch, **kw)
    toks = tokens_for(13, n=48)
    ours = run(path, toks, step=7)
    ref = ReferenceModel(path).logits(toks)
    check_close(ours, ref, TOL_QUANT_WEIGHTS, f"{arch} {kw}")
    plain = ReferenceModel(tiny(arch, yarn_factor=0.0, attn_temp_scale=0.0)).logits(toks)
    assert np.abs(plain - ref).max() > 10 * np.abs(ours - ref).max()


def test_yarn_is_refused_where_not_built():
    """gemma3 builds its layers itself (two RoPE bases): YaRN there is refused by name."""
    from llminfer.models.base import Hparams, rope_scale

    class Meta:  # the little of a GGUFFile that Hparams reads
        path = "x.gguf"
        metadata = {"gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 4.0}

    with pytest.raises(UnsupportedModelError, match="RoPE scaling 'yarn' is not supported \\(only linear\\)"):
        rope_scale(Hparams(Meta(), "gemma3"))
    assert rope_scale(Hparams(Meta(), "gemma3"), yarn_ok=True) == 1.0


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_moe_prefill_and_decode_agree(tiny, qtype):
    """Prefill runs each expert once over all its tokens (over 32 of them
    here, so through the packed GEMM where the type has one), decode one
    token at a time: both give every token bitwise the same logits, and the
    reference's."""
    path = tiny("qwen3moe", qtype, n_expert=4, n_expert_used=2)
    toks = tokens_for(9, n=160)
    whole = run(path, toks, n_batch=160)
    assert np.array_equal(run(path, toks, step=7, n_batch=160), whole)
    assert np.array_equal(run(path, toks[:20], step=1, threads=1), whole[:20])
    ref = ReferenceModel(path)
    check_close(whole, ref.logits(toks), TOL_QUANT_WEIGHTS, f"qwen3moe/{qtype}", route_gap=ref.route_gap)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K"])
def test_moe_experts_repacked(tiny, qtype):
    """The expert tensors are repacked at load, expert by expert, and give
    bitwise the file rows' results, in prefill (each expert over the tokens
    routed to it) and in decode."""
    if qtype not in ops.repacked_types():
        pytest.skip(f"this kernel level has no repacked {qtype} kernel")
    path = tiny("qwen3moe", qtype, n_expert=4, n_expert_used=2)
    with GGUFFile(path) as g:
        spec = build_spec(g)
        experts = sum(m.data.nbytes for L in spec.layers for m in (L.moe.gate_exps, L.moe.up_exps, L.moe.down_exps))
        dense = sum(getattr(L, n).data.nbytes for L in spec.layers for n in ("wq", "wk", "wv", "wo"))
    toks = tokens_for(11, n=48)
    sizes = []
    packed = run(path, toks, n_batch=48, engine_out=sizes)
    assert sizes[0] > dense + experts  # the experts' copies (padded to groups) beside the rest
    plain = run(path, toks, n_batch=48, repack=False)
    assert np.array_equal(packed, plain)
    assert np.array_equal(run(path, toks[:12], step=1, threads=1), plain[:12])


def test_moe_weights_read_per_token(tiny):
    """A MoE model's weight_bytes counts the router and k of n experts."""
    with GGUFFile(tiny("qwen3moe")) as g:
        spec = build_spec(g)
    L = spec.layers[0]
    experts = sum(m.data.nbytes for m in (L.moe.gate_exps, L.moe.up_exps, L.moe.down_exps))
    dense = spec.output.data.nbytes + spec.n_layer * sum(m.data.nbytes for m in (L.wq, L.wk, L.wv, L.wo))
    assert spec.weight_bytes() == dense + spec.n_layer * (L.moe.router.data.nbytes + experts * 3 // 8)


@pytest.mark.parametrize("arch, key, value, match", [
    ("qwen3moe", "qwen3moe.expert_used_count", 9, "expert_count 8 and expert_used_count 9"),
    ("qwen3vlmoe", "qwen3vlmoe.expert_used_count", 9, "qwen3vlmoe.expert_count 4 and expert_used_count 9"),
    ("qwen3vlmoe", "qwen3vlmoe.rope.dimension_sections", None, "'qwen3vlmoe.rope.dimension_sections' is missing"),
    ("granite", "granite.logit_scale", None, "'granite.logit_scale' is missing"),
    ("gemma2", "gemma2.final_logit_softcapping", -1.0, "final_logit_softcapping"),
    ("mistral3", "mistral3.rope.scaling.yarn_beta_slow", -1.0, "yarn_beta_slow' is -1.0, outside"),
    ("mistral3", "mistral3.rope.scaling.yarn_log_multiplier", -1000.0, "magnitude scale that is not positive"),
    ("mistral3", "mistral3.attention.temperature_scale", float("nan"), "temperature_scale' is nan"),
])
def test_bad_metadata_is_refused(tmp_path, arch, key, value, match):
    import gguf as gg
    src = write_model(tmp_path / "a.gguf", config(arch))
    reader = gg.GGUFReader(src)
    out = gg.GGUFWriter(str(tmp_path / "b.gguf"), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == key:
            if value is None:
                continue
            out.add_key_value(name, value, field.types[0])
        else:
            v = field.contents()
            out.add_key_value(name, v, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        out.add_tensor(t.name, np.asarray(t.data), raw_shape=None, raw_dtype=t.tensor_type)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    with pytest.raises(UnsupportedModelError, match=match):
        with GGUFFile(tmp_path / "b.gguf") as g:
            build_spec(g)


@pytest.mark.parametrize("arch, declared, want", [
    ("qwen3moe", None, r"loads as qwen3moe: 2 layers, .*8 experts of which 3 per token"),
    ("gemma2", None, r"loads as gemma2: .*1 sliding-window layers"),
    ("qwen3", "deepseek2", r"cannot load: architecture 'deepseek2' is not supported; supported: .*qwen3moe"),
])
def test_info_says_whether_and_why(tmp_path, capsys, arch, declared, want):
    from llminfer.cli import commands as cli

    path = write_model(tmp_path / "m.gguf", config(arch), declared_arch=declared)
    assert cli.main(["info", "-m", path]) == 0
    assert re.search(want, capsys.readouterr().out)


def test_info_names_a_tensor_it_cannot_use(tmp_path, capsys):
    from llminfer.cli import commands as cli

    def drop_norm(name, data, qtype):
        return None if name == "blk.1.attn_q_norm.weight" else (data, qtype)

    path = write_model(tmp_path / "m.gguf", config("qwen3"), tensor_hook=drop_norm)
    assert cli.main(["info", "-m", path]) == 0
    assert "cannot load: tensor 'blk.1.attn_q_norm.weight' is missing" in capsys.readouterr().out
