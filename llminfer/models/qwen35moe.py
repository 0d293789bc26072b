"""The `qwen35moe` architecture (Qwen3.5 / Qwen3.6 MoE, e.g. 35B-A3B, text):
qwen35's layers (Gated DeltaNet and gated attention, see qwen35.py) with a
mixture of experts in place of the dense feed-forward
(src/models/qwen35moe.cpp in llama.cpp):

- routed experts as qwen3moe's: a softmax over ffn_gate_inp's expert_count
  logits, the expert_used_count most probable, their probabilities
  renormalized; each a SiLU-gated feed-forward of
  expert_feed_forward_length in 3-D tensors ffn_{gate,up,down}_exps;
- plus a shared expert, a SiLU-gated feed-forward of
  expert_shared_feed_forward_length (ffn_{gate,up,down}_shexp) whose output
  is multiplied per token by sigmoid(ffn_gate_inp_shexp . x) and added.

The shared expert goes into LayerSpec's gate_shexp, up_shexp, down_shexp
and gate_inp_shexp (and ModelSpec.n_ff_shexp) where LayerSpec has them and
the compiled core passes them on (_core.LAYER_FIELDS); a build without them
refuses a file with a shared expert (every released one;
llama.cpp requires it) by name. A file without one runs on the routed
experts."""

from llminfer import _core
from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import qwen35
from llminfer.models.base import LayerSpec, ModelSpec, MoESpec
from llminfer.models.qwen3moe import MAX_EXPERTS

ARCH = "qwen35moe"


def _sizes(hp):
    n_expert = hp.int("expert_count", 0)
    n_used = hp.int("expert_used_count", 0)
    if not (0 < n_expert <= MAX_EXPERTS) or not (0 < n_used <= n_expert):
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.expert_count {n_expert} and expert_used_count {n_used} "
                                    f"must satisfy 0 < used <= count <= {MAX_EXPERTS}")
    n_ff = hp.int("feed_forward_length", 0)
    n_ff_exp = hp.int("expert_feed_forward_length", max(n_ff // n_used, 0))
    if not (0 < n_ff_exp <= 1 << 20):
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.expert_feed_forward_length {n_ff_exp} is out of range")
    return n_expert, n_used, n_ff_exp


SHARED_FIELDS = ("gate_shexp", "up_shexp", "down_shexp", "gate_inp_shexp")


def _shared_width(hp) -> int:
    """expert_shared_feed_forward_length, else feed_forward_length (llama.cpp's default)."""
    n = hp.int("expert_shared_feed_forward_length", 0) or hp.int("feed_forward_length", 0)
    if not 0 < n <= 1 << 20:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.expert_shared_feed_forward_length {n} is out of range")
    return n


def shared_expert_supported() -> bool:
    """Whether LayerSpec has the shared expert's fields and the compiled core
    hands them to the C forward pass (its LAYER_FIELDS): never dropped silently."""
    core = getattr(_core, "LAYER_FIELDS", ())
    return all(f in LayerSpec.__dataclass_fields__ and f in core for f in SHARED_FIELDS)


def experts(w, hp, p, n_embd):
    """A layer's routed experts, and its shared expert where the file has one
    (llama.cpp requires it) and LayerSpec has a place for it (gate_shexp,
    up_shexp, down_shexp, gate_inp_shexp); refused otherwise."""
    n_expert, _, Fe = _sizes(hp)
    shared = [n for n in ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                          "ffn_down_shexp.weight") if w.has(p + n)]
    out = dict(w_gate=None, w_up=None, w_down=None)
    if shared and not shared_expert_supported():
        raise UnsupportedModelError(
            f"{w.gguf.path}: {hp.arch}'s shared expert ({p}{shared[0]} ...), gated per token by "
            f"sigmoid(ffn_gate_inp_shexp . x), is not supported yet: llminfer's expert path runs routed "
            f"experts only")
    if shared:
        Fs = _shared_width(hp)
        out.update(gate_shexp=w.matrix(p + "ffn_gate_shexp.weight", Fs, n_embd),
                   up_shexp=w.matrix(p + "ffn_up_shexp.weight", Fs, n_embd),
                   down_shexp=w.matrix(p + "ffn_down_shexp.weight", n_embd, Fs),
                   gate_inp_shexp=w.vector(p + "ffn_gate_inp_shexp.weight", n_embd))
    if w.has(p + "ffn_gate_up_exps.weight"):
        raise UnsupportedModelError(f"{w.gguf.path}: {p}ffn_gate_up_exps.weight (gate and up experts fused in "
                                    f"one tensor) is not supported; llminfer reads ffn_gate_exps and ffn_up_exps")
    return dict(out, moe=MoESpec(
        router=w.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd),
        gate_exps=w.expert_matrix(p + "ffn_gate_exps.weight", n_expert, Fe, n_embd),
        up_exps=w.expert_matrix(p + "ffn_up_exps.weight", n_expert, Fe, n_embd),
        down_exps=w.expert_matrix(p + "ffn_down_exps.weight", n_expert, n_embd, Fe)))


def moe_sizes(spec, w, hp):
    spec.n_expert, spec.n_expert_used, spec.n_ff_exp = _sizes(hp)
    if any(L.gate_shexp is not None for L in spec.layers if hasattr(L, "gate_shexp")):
        spec.n_ff_shexp = _shared_width(hp)
    if spec.n_ff <= 0:  # no dense feed-forward: feed_forward_length may be absent
        spec.n_ff = spec.n_ff_exp


def build(gguf: GGUFFile) -> ModelSpec:
    return qwen35.build(gguf, arch=ARCH, make_ffn=experts, customize=moe_sizes)
