"""The i-quants, ternary types and MXFP4 on tensors llama.cpp made: a tiny
F16 llama model is quantized by llama.cpp's own `llama-quantize` to each type
(--pure: every matrix in that type; with a generated importance matrix, which
IQ1_*, IQ2_XXS and IQ2_XS require), and on those tensors

- our dequantization equals the gguf package's, bit for bit, at every level;
- our matrix products agree with float64 on the dequantized weights within
  tests/core/test_matmul.py's tolerance, at every level;
- the model's logits agree with the numpy reference forward pass;
- our IQ4_NL / IQ4_XS quantizer's error is no worse than llama-quantize's
  (without an importance matrix, as ours has none).

llama-quantize is found through $LLAMA_QUANTIZE, the PATH, or the
development checkout's build (/work/peer/*/vendor/llama.cpp/build/bin); the
tests skip without it.
"""

import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kernel_cases import at_level, isa, type_id
from llminfer.core import ops, system
from llminfer.runtime.engine import Engine
from reference import ReferenceModel
from kernel_cases import tolerance
from tiny_models import TinyConfig, write_model
from peer_checks import find_llama_quantize, write_imatrix

__all__ = ["isa"]

pytestmark = pytest.mark.peer_tools  # the fixture skips without llama-quantize

# our type -> the llama-quantize file type whose matrices have it (its "IQ2_S" makes IQ2_XS)
FTYPE = {Q.IQ4_NL: "IQ4_NL", Q.IQ4_XS: "IQ4_XS", Q.MXFP4: "MXFP4_MOE", Q.TQ1_0: "TQ1_0",
         Q.TQ2_0: "TQ2_0", Q.IQ2_XXS: "IQ2_XXS", Q.IQ2_XS: "IQ2_XS", Q.IQ2_S: "IQ2_M",
         Q.IQ3_XXS: "IQ3_XXS", Q.IQ3_S: "IQ3_S", Q.IQ1_S: "IQ1_S", Q.IQ1_M: "IQ1_M"}
TYPES = list(FTYPE)
TOL_LOGITS = 3e-2  # as tests/models/test_forward.py for quantized weights


@pytest.fixture(scope="module")
def peer_models(tmp_path_factory):
    exe = find_llama_quantize()
    if exe is None:
        pytest.skip("llama-quantize not found (set LLAMA_QUANTIZE)")
    root = tmp_path_factory.mktemp("peer_quants")
    src = write_model(root / "f16.gguf", TinyConfig(qtype="F16", embd_qtype="F16", tie_output=False))
    imatrix = write_imatrix(src, root / "imatrix.gguf")
    cache = {}

    def get(t, with_imatrix=True):
        key = (t, with_imatrix)
        if key not in cache:
            dst = root / f"{t.name}{'' if with_imatrix else '-plain'}.gguf"
            cmd = [exe, "--pure"] + (["--imatrix", imatrix] if with_imatrix else []) + [src, str(dst), FTYPE[t]]
            run = subprocess.run(cmd, capture_output=True, text=True)
            assert run.returncode == 0, f"{' '.join(cmd)}:\n{run.stderr[-2000:]}"
            cache[key] = str(dst)
        return cache[key]

    get.source = src
    return get


def tensors_of(path, t):
    out = [(x.name, np.asarray(x.data), (int(x.shape[1]), int(x.shape[0])))
           for x in gguf.GGUFReader(path).tensors if x.tensor_type == t]
    assert out, f"no {t.name} tensor in {path}"
    return out


@pytest.mark.parametrize("t", TYPES, ids=type_id)
def test_dequantize_matches_gguf(peer_models, t):
    for name, data, shape in tensors_of(peer_models(t), t):
        want = gguf.quants.dequantize(data, t).reshape(shape)
        for level in system.available_isas():
            got = at_level(level, ops.dequantize, data.reshape(-1), t, shape)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{name} at {level}"


@pytest.mark.parametrize("t", TYPES, ids=type_id)
def test_matmul_matches_float64(peer_models, t, isa):
    rng = np.random.default_rng(int(t))
    for name, data, shape in tensors_of(peer_models(t), t)[:6]:
        wf = gguf.quants.dequantize(data, t).reshape(shape)
        for n in (1, 5, 40):  # decode, small batch, prefill (panels where the type has them)
            x = rng.standard_normal((n, shape[1])).astype(np.float32)
            got = ops.matmul(data.reshape(-1), t, shape, x)
            want = x.astype(np.float64) @ wf.astype(np.float64).T
            assert np.all(np.abs(got - want) <= tolerance(t, wf, x)), f"{name} n={n} at {isa}"


@pytest.mark.parametrize("t", TYPES, ids=type_id)
def test_model_logits_match_reference(peer_models, t, isa):
    path = peer_models(t)
    toks = np.random.default_rng(int(t)).integers(0, 268, 24).astype(np.int32)
    ref = ReferenceModel(path).logits(toks)
    eng = Engine(path, n_ctx=64, n_batch=32, n_threads=2)
    try:
        ours = eng.decode([(eng.new_sequence(), toks, "all")])[0]
    finally:
        eng.close()
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < TOL_LOGITS, f"{t.name} at {isa}: relative logit error {err:.4f}"


@pytest.mark.parametrize("t", [Q.IQ4_NL, Q.IQ4_XS], ids=type_id)
def test_our_iq4_quantizer_error_within_llama_cpp(peer_models, t):
    src = {x.name: gguf.quants.dequantize(x.data, x.tensor_type) for x in gguf.GGUFReader(peer_models.source).tensors}
    theirs_sq = ours_sq = 0.0
    for name, data, shape in tensors_of(peer_models(t, with_imatrix=False), t):
        x = src[name].astype(np.float32).reshape(shape)
        theirs_sq += float(((gguf.quants.dequantize(data, t).reshape(shape) - x) ** 2).sum())
        ours_sq += float(((ops.dequantize(ops.quantize(x, t), t, shape) - x) ** 2).sum())
    assert ours_sq <= 1.02 * theirs_sq, f"{t.name}: squared error ours {ours_sq:.4g}, llama.cpp {theirs_sq:.4g}"
