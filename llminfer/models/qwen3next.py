"""The `qwen3next` architecture (Qwen3-Next-80B-A3B), as llama.cpp's
converter stores it (src/models/qwen3next.cpp there): qwen35moe's layers
(see qwen35.py and qwen35moe.py) with three differences:

- RoPE is the plain NeoX one on the first rope.dimension_count dims (no
  sections);
- beta and alpha come from one tensor, ssm_ba [2 * n_head, n_embd]: per key
  head g, the betas of its n_head / n_group value heads, then their alphas
  (split here into ssm_beta and ssm_alpha rows);
- value head h reads key head h // (n_head / n_group) (HF's grouped order,
  which llama.cpp repeats with an interleave), where qwen35's converter
  reorders the value heads so that h reads h % n_group.

The grouped order is li_model_desc's ssm_kv_grouped (the C core reads
it); the older fused ssm_in (q, k, v and z in one) is refused."""

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import qwen35, qwen35moe
from llminfer.models.base import ModelSpec
from llminfer.models.hybrid import gather_rows, gdn_layer

ARCH = "qwen3next"


def _gdn(w, p, n_embd, d_conv, d_state, n_group, n_head, ffn_norm, ffn):
    if w.has(p + "ssm_in.weight"):
        raise UnsupportedModelError(f"{w.gguf.path}: {p}ssm_in.weight (q, k, v and z in one tensor, an older "
                                    f"conversion) is not supported; convert the model again (attn_qkv, attn_gate)")
    ba = w.matrix(p + "ssm_ba.weight", 2 * n_head, n_embd)
    r = n_head // n_group
    beta_rows = [g * 2 * r + j for g in range(n_group) for j in range(r)]
    alpha_rows = [g * 2 * r + r + j for g in range(n_group) for j in range(r)]
    return gdn_layer(w, p, n_embd, d_conv, d_state, n_group, n_head, ffn_norm, ffn,
                     beta_alpha=dict(ssm_beta=gather_rows(ba, beta_rows), ssm_alpha=gather_rows(ba, alpha_rows)))


def build(gguf: GGUFFile) -> ModelSpec:
    spec = qwen35.build(gguf, arch=ARCH, make_ffn=qwen35moe.experts, customize=qwen35moe.moe_sizes,
                        sections=False, make_gdn=_gdn)
    spec.ssm_kv_grouped = True
    return spec
