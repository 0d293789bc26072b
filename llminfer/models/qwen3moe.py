"""The `qwen3moe` architecture (Qwen3-30B-A3B, Qwen3-235B-A22B and kin):
Qwen3's attention (per-head q/k RMSNorm, NeoX RoPE, no biases) and, in place
of the dense feed-forward, a mixture of experts without a shared expert:

- the router ffn_gate_inp [n_expert, n_embd] gives each token a softmax over
  expert_count experts; the expert_used_count most probable are used, their
  probabilities renormalized to sum to 1;
- each expert is a SiLU-gated feed-forward of expert_feed_forward_length
  (default feed_forward_length / expert_used_count), stored as 3-D tensors
  ffn_gate_exps / ffn_up_exps [n_expert, n_ff_exp, n_embd] and ffn_down_exps
  [n_expert, n_embd, n_ff_exp];
- the layer's output is the weighted sum of the chosen experts' outputs.

The C core runs each expert once per batch over the tokens routed to it
(csrc/model.c, moe_half), so a decoded token reads only its experts' bytes."""

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, LayerSpec, ModelSpec, MoESpec, rope_scale

ARCH = "qwen3moe"
MAX_EXPERTS = 4096  # LI_MAX_EXPERTS in csrc/context.h


def _experts(hp, sh):
    """expert_count, expert_used_count and the experts' width, checked (the
    metadata keys under hp's architecture: qwen3vlmoe reads its own)."""
    n_expert = hp.int("expert_count", 0)
    n_used = hp.int("expert_used_count", 0)
    if not (0 < n_expert <= MAX_EXPERTS) or not (0 < n_used <= n_expert):
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.expert_count {n_expert} and expert_used_count {n_used} "
                                    f"must satisfy 0 < used <= count <= {MAX_EXPERTS}")
    n_ff_exp = hp.int("expert_feed_forward_length", max(sh.n_ff // n_used, 1))
    if not (0 < n_ff_exp <= 1 << 20):
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.expert_feed_forward_length {n_ff_exp} is out of range")
    return n_expert, n_used, n_ff_exp


def moe_layers(w, hp, sh):
    """llama.build's make_layers: Qwen3's attention beside the routed experts."""
    E = sh.n_embd
    nq, nk, nv = sh.n_head * sh.head_dim, sh.n_head_kv * sh.head_dim, sh.n_head_kv * sh.head_dim_v
    n_expert, _, Fe = _experts(hp, sh)
    base, scale = hp.float("rope.freq_base", 10000.0), rope_scale(hp, yarn_ok=True)
    layers = []
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        layers.append(LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", E),
            wq=w.matrix(p + "attn_q.weight", nq, E),
            wk=w.matrix(p + "attn_k.weight", nk, E),
            wv=w.matrix(p + "attn_v.weight", nv, E),
            wo=w.matrix(p + "attn_output.weight", E, sh.n_head * sh.head_dim_v),
            ffn_norm=w.vector(p + "ffn_norm.weight", E),
            w_gate=None, w_up=None, w_down=None,
            q_norm=w.vector(p + "attn_q_norm.weight", sh.head_dim),
            k_norm=w.vector(p + "attn_k_norm.weight", sh.head_dim),
            rope_base=base, rope_scale=scale,
            moe=MoESpec(
                router=w.matrix(p + "ffn_gate_inp.weight", n_expert, E),
                gate_exps=w.expert_matrix(p + "ffn_gate_exps.weight", n_expert, Fe, E),
                up_exps=w.expert_matrix(p + "ffn_up_exps.weight", n_expert, Fe, E),
                down_exps=w.expert_matrix(p + "ffn_down_exps.weight", n_expert, E, Fe))))
    return layers


def moe_counts(spec, w, hp, sh):
    """llama.build's customize: the expert counts on the spec."""
    spec.n_expert, spec.n_expert_used, spec.n_ff_exp = _experts(hp, sh)


def build(gguf: GGUFFile, arch: str = ARCH) -> ModelSpec:
    """arch: the metadata prefix (qwen3vlmoe builds this block under its own)."""
    return llama.build(gguf, arch=arch, rope_mode=ROPE_NEOX, customize=moe_counts, make_layers=moe_layers,
                       default_eps=1e-6)
