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

li_layer_desc has no way to say the grouped order, and the order cannot be
changed here (ssm_out's columns would have to move inside quantized
blocks), so a file whose value heads outnumber its key heads (every
released one: 32 and 16) is refused; so is the shared expert, as for
qwen35moe, and the older fused ssm_in (q, k, v and z in one)."""

from llminfer.errors import UnsupportedModelError
from llminfer.gguf_file import GGUFFile
from llminfer.models import qwen35, qwen35moe
from llminfer.models.base import Hparams, ModelSpec
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
    hp = Hparams(gguf, ARCH)
    n_group, n_head = hp.int("ssm.group_count"), hp.int("ssm.time_step_rank")
    if n_head != n_group:
        raise UnsupportedModelError(
            f"{gguf.path}: {ARCH}'s {n_head} value heads read its {n_group} key heads in grouped order (value head "
            f"h reads key head h // {max(n_head // max(n_group, 1), 1)}); llminfer's Gated DeltaNet reads them "
            f"tiled (h % {n_group}), as qwen35's conversion reorders them, and cannot reorder these")
    return qwen35.build(gguf, arch=ARCH, make_ffn=qwen35moe.experts, customize=qwen35moe.moe_sizes,
                        sections=False, make_gdn=_gdn)
