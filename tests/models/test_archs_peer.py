"""Each architecture's logits against llama.cpp's on the same tiny random
file (llama-cpp-python in its own Python, $LLMINFER_PEER_PYTHON, through
bench/peer_logits.py). Marked `peer`: skipped where llama.cpp is absent.
bench/archs_peer.py prints the same comparison as a table."""


import pytest

from archs import NEW_ARCHS, ROUTE_TIE, YARN_CASES, config, run, tokens_for
from tiny_models import MOE_ARCHS, write_model
from peer_checks import check_against_peer, peer_logits
from reference import ReferenceModel

@pytest.mark.peer
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"] + NEW_ARCHS)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_logits_match_llama_cpp(peer_python, tmp_path, arch, qtype):
    """MoE archs (4 experts, 2 per token: wider margins than 8 and 3) leave
    out the tokens whose expert choice is a near tie in the float64
    reference: llama.cpp's or our 8-bit activations may pick the other
    expert there (qwen3vlmoe/Q4_K with 8 and 3 over 4 layers: one token
    2.4e-2 from llama.cpp, the others within 5.1e-3)."""
    moe = arch in MOE_ARCHS
    path = write_model(tmp_path / f"{arch}.gguf", config(arch, qtype=qtype, pre="default",
                                                         **(dict(n_expert=4, n_expert_used=2) if moe else {})))
    toks = tokens_for(3)
    gap = None
    if moe:
        ref = ReferenceModel(path)
        ref.logits(toks)
        gap = ref.route_gap
    check_against_peer(run(path, toks), peer_logits(peer_python, path, toks, tmp_path), f"{arch}/{qtype}",
                       route_gap=gap, route_tie=ROUTE_TIE)


@pytest.mark.peer
@pytest.mark.parametrize("arch, kw", YARN_CASES)
def test_yarn_and_temperature_match_llama_cpp(peer_python, tmp_path, arch, kw):
    """YaRN's pieces and mistral3's temperature tuning, one at a time, as
    llama.cpp computes them (48 positions: three temperature steps of 16)."""
    path = write_model(tmp_path / f"{arch}.gguf", config(arch, pre="default", **kw))
    toks = tokens_for(13, n=48)
    check_against_peer(run(path, toks, step=7), peer_logits(peer_python, path, toks, tmp_path), f"{arch} {kw}")
