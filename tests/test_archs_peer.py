"""Each architecture's logits against llama.cpp's on the same tiny random
file (llama-cpp-python in its own Python, $LLMINFER_PEER_PYTHON, through
bench/peer_logits.py). Marked `peer`: skipped where llama.cpp is absent.
bench/archs_peer.py prints the same comparison as a table."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from test_archs import NEW_ARCHS, YARN_CASES, config, run, tokens_for
from tiny_models import write_model

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "peer_logits.py"
MARGIN = 0.25       # top-1 must agree where llama.cpp's top logit leads its second by this much
TOL_RELATIVE = 2e-2  # max |ours - llama.cpp| over the largest |llama.cpp logit| (Q8_0 weights, 2 layers)


def peer_logits(peer_python, path, toks, tmp_path, n_ctx=512):
    ids, out = tmp_path / "ids.npy", tmp_path / "out.npy"
    np.save(ids, toks)
    r = subprocess.run([peer_python, str(SCRIPT), str(path), str(ids), str(out), "--n-ctx", str(n_ctx)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"llama.cpp failed on {path}: {r.stderr[-2000:]}"
    return np.load(out)


def check_against_peer(ours, peer, what):
    """ours within TOL_RELATIVE of llama.cpp's logits (relative to its largest),
    and the same top token wherever llama.cpp's leads by MARGIN"""
    err = np.abs(ours - peer).max() / np.abs(peer).max()
    assert err < TOL_RELATIVE, f"{what}: max |ours - llama.cpp| is {err:.4f} of the largest logit"
    s = np.sort(peer, axis=-1)
    clear = s[:, -1] - s[:, -2] >= MARGIN
    assert np.array_equal(ours.argmax(-1)[clear], peer.argmax(-1)[clear]), what


@pytest.mark.peer
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"] + NEW_ARCHS)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_logits_match_llama_cpp(peer_python, tmp_path, arch, qtype):
    path = write_model(tmp_path / f"{arch}.gguf", config(arch, qtype=qtype, pre="default"))
    toks = tokens_for(3)
    check_against_peer(run(path, toks), peer_logits(peer_python, path, toks, tmp_path), f"{arch}/{qtype}")


@pytest.mark.peer
@pytest.mark.parametrize("arch, kw", YARN_CASES)
def test_yarn_and_temperature_match_llama_cpp(peer_python, tmp_path, arch, kw):
    """YaRN's pieces and mistral3's temperature tuning, one at a time, as
    llama.cpp computes them (48 positions: three temperature steps of 16)."""
    path = write_model(tmp_path / f"{arch}.gguf", config(arch, pre="default", **kw))
    toks = tokens_for(13, n=48)
    check_against_peer(run(path, toks, step=7), peer_logits(peer_python, path, toks, tmp_path), f"{arch} {kw}")
