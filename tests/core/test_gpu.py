"""GPU offload (llminfer.core.gpu, csrc/cuda/). Two kinds of test:

- always: the n_gpu_layers plan and the errors a machine without a usable GPU
  gives (a clear GPUUnavailableError, never a crash), and that n_gpu_layers=0
  is the CPU path unchanged;
- with a GPU (skipped, with the reason, where llminfer.core.gpu finds none): every
  weight type's products through the GPU against the CPU, whole-model logits
  with 0, some and all layers offloaded against CPU-only, generation, bad input.

Tolerance of the GPU against the CPU: both quantize activations to 8 bits the
same way, but sum in another order and compute SiLU/GELU without the CPU's
f16 tables, so logits agree to a relative error (max |diff| / max |logit|)
of GPU_RTOL, and greedy generation picks the same tokens on these models.
"""

import numpy as np
import pytest

from llminfer.core import gpu, system
from llminfer.runtime.engine import Engine
from llminfer.errors import GPUUnavailableError, InvalidArgumentError, UnsupportedTypeError

GPU_RTOL = 2e-2

_info = gpu.info()
needs_gpu = pytest.mark.skipif(not _info["available"],
                               reason=f"no usable GPU: {_info['reason'] or 'no device'} (GPU tests run where one is)")


# ---- everywhere ----

@pytest.mark.parametrize("n, want", [(0, (0, False)), (3, (3, False)), (29, (29, False)),
                                     (30, (30, True)), (31, (30, True)), (-1, (30, True))])
def test_plan(n, want):
    assert gpu.plan(n, 30) == want


@pytest.mark.parametrize("bad", [-2, 1.5, "3", None, True])
def test_plan_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        gpu.plan(bad, 30)


def test_system_info_reports_gpu():
    info = system.system_info()["gpu"]
    assert set(info) >= {"backend", "available", "reason", "devices"}
    assert info["available"] == bool(info["devices"])
    if not info["available"]:
        assert info["reason"]


def test_no_gpu_is_a_clear_error(smollm2_path, monkeypatch):
    """Without a usable GPU (here forced with LLMINFER_NO_GPU), n_gpu_layers > 0
    raises GPUUnavailableError naming why; 0 loads on the CPU."""
    monkeypatch.setenv("LLMINFER_NO_GPU", "1")
    monkeypatch.setattr(gpu, "_module", None)
    monkeypatch.setattr(gpu, "_why", None)
    with pytest.raises(GPUUnavailableError, match="LLMINFER_NO_GPU"):
        Engine(smollm2_path, n_ctx=64, n_gpu_layers=2)
    eng = Engine(smollm2_path, n_ctx=64, n_gpu_layers=0)
    assert eng.n_gpu_layers == 0
    eng.close()


@pytest.mark.skipif(_info["available"], reason="this machine has a GPU")
def test_without_gpu_the_error_names_the_cause(smollm2_path):
    with pytest.raises(GPUUnavailableError) as e:
        Engine(smollm2_path, n_ctx=64, n_gpu_layers=-1)
    msg = str(e.value)
    assert "built without a GPU backend" in msg or "driver" in msg or "no GPU device" in msg


# ---- with a GPU ----

def _logits(path, n_gpu_layers, prompt_ids, **kw):
    eng = Engine(path, n_ctx=256, n_gpu_layers=n_gpu_layers, **kw)
    try:
        seq = eng.new_sequence()
        out = eng.decode([(seq, prompt_ids, "all")])[0]
        step = eng.decode([(seq, [int(np.argmax(out[-1]))], "last")])[0]
        return np.asarray(out, dtype=np.float64), np.asarray(step, dtype=np.float64)
    finally:
        eng.close()


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@needs_gpu
@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_logits_match_cpu(request, model):
    """Prefill (every row) and a decode step with 0, some and all layers on the
    GPU against the CPU alone."""
    path = request.getfixturevalue(model)
    ids = list(range(10, 90))
    ref_prefill, ref_step = _logits(path, 0, ids)
    for ngl in (1, 7, -1):
        prefill, step = _logits(path, ngl, ids)
        assert _rel(prefill, ref_prefill) < GPU_RTOL, ngl
        assert _rel(step, ref_step) < GPU_RTOL, ngl
        assert np.array_equal(prefill.argmax(axis=1)[-5:], ref_prefill.argmax(axis=1)[-5:]), ngl


@needs_gpu
def test_every_weight_type(tmp_path):
    """A tiny random model in each GPU weight type, all layers offloaded,
    against the CPU: the products of every type (mat-vec for decode, tiles for
    prefill)."""
    from tiny_models import TinyConfig, write_model

    for qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "F32"):
        path = write_model(str(tmp_path / f"tiny_{qtype}.gguf"), TinyConfig(qtype=qtype))
        ids = list(range(3, 80))
        ref_prefill, ref_step = _logits(path, 0, ids)
        prefill, step = _logits(path, -1, ids)
        assert _rel(prefill, ref_prefill) < GPU_RTOL, qtype
        assert _rel(step, ref_step) < GPU_RTOL, qtype


@needs_gpu
def test_generation_matches_cpu(smollm2_path):
    from llminfer.generation.llm import LLM

    text_cpu = LLM(smollm2_path, n_ctx=256).generate("The capital of France is", max_tokens=16, temperature=0)
    text_gpu = LLM(smollm2_path, n_ctx=256, n_gpu_layers=-1).generate("The capital of France is", max_tokens=16,
                                                                      temperature=0)
    assert text_gpu == text_cpu


@needs_gpu
def test_long_context_spans(smollm2_path):
    """A prompt longer than several attention spans (split along positions)."""
    ids = [int(i) for i in np.random.default_rng(0).integers(10, 4000, 700)]
    eng_c = Engine(smollm2_path, n_ctx=1024)
    eng_g = Engine(smollm2_path, n_ctx=1024, n_gpu_layers=-1)
    try:
        a = np.asarray(eng_c.decode([(eng_c.new_sequence(), ids, "last")])[0], dtype=np.float64)
        b = np.asarray(eng_g.decode([(eng_g.new_sequence(), ids, "last")])[0], dtype=np.float64)
        assert _rel(b, a) < GPU_RTOL
    finally:
        eng_c.close()
        eng_g.close()


@needs_gpu
def test_bad_input_on_gpu(smollm2_path):
    with pytest.raises(UnsupportedTypeError, match="f16"):
        Engine(smollm2_path, n_ctx=64, n_gpu_layers=2, kv_type="q8_0")
    with pytest.raises(InvalidArgumentError):
        Engine(smollm2_path, n_ctx=64, n_gpu_layers=2, main_gpu=99)
    eng = Engine(smollm2_path, n_ctx=64, n_gpu_layers=-1)
    try:
        with pytest.raises(Exception) as e:
            eng.decode([(eng.new_sequence(), [10**7], "last")])
        assert "vocabulary" in str(e.value) or "token" in str(e.value).lower()
    finally:
        eng.close()


@needs_gpu
def test_a_state_of_offloaded_layers_is_refused_by_name(smollm2_path):
    """The offloaded layers' KV cache is on the device: saving or restoring a
    state raises, naming n_gpu_layers, instead of reading CPU pools that do
    not exist; a CPU-only state still loads into a CPU LLM."""
    from llminfer.generation.llm import LLM

    g = LLM(smollm2_path, n_ctx=128, n_gpu_layers=2)
    g.eval(g.tokenize("The capital of France is"))
    with pytest.raises(InvalidArgumentError, match="n_gpu_layers"):
        g.save_state()
    c = LLM(smollm2_path, n_ctx=128)
    c.eval(c.tokenize("The capital of France is"))
    blob = c.save_state()
    with pytest.raises(InvalidArgumentError, match="n_gpu_layers"):
        g.load_state(blob)
    assert g.tokens == []
