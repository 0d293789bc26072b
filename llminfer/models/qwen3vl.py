"""The `qwen3vl` architecture (the text model of Qwen3-VL): qwen3's block
(per-head q/k RMS norms, no biases, NeoX RoPE) with interleaved M-RoPE and
DeepStack.

Interleaved M-RoPE (llama.cpp's GGML_ROPE_TYPE_IMROPE): with sections
(t, h, w) = rope.dimension_sections ([24, 20, 20] for head size 128) and S
their sum, rotated pair i turns by the height position where i % S is 1
mod 3 and below 3 h, the width where it is 2 mod 3 and below 3 w, the
temporal where it is 0 mod 3 and below 3 t; text turns every pair by its
position, an image's rows by their cell's (qwen2vl's layout).

DeepStack: an image's input rows are n_embd * (1 + n_deepstack_layers)
wide (the tower's output, then one slice per DeepStack merger); after
layer il < n_deepstack_layers slice il + 1 is added to the row's residual
stream. Token rows add nothing (llama.cpp pads their embedding with zeros).
"""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, Hparams, ModelSpec
from llminfer.models.base import rope_sections
from llminfer.models.qwen3 import head_norms

ARCH = "qwen3vl"


def vision_rope(spec: ModelSpec, gguf: GGUFFile, arch: str) -> ModelSpec:
    """Interleaved M-RoPE and DeepStack on a built spec, from `{arch}.*`
    (qwen3vlmoe adds them to qwen3moe's block)."""
    hp = Hparams(gguf, arch)
    s = rope_sections(hp, spec.n_rot)
    spec.rope_sect_t, spec.rope_sect_h, spec.rope_sect_w, spec.rope_sect_e = s
    spec.rope_sect_interleave = True
    spec.n_deepstack = hp.int("n_deepstack_layers", 0)
    return spec


def build(gguf: GGUFFile) -> ModelSpec:
    spec = llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, customize=head_norms, default_eps=1e-6)
    return vision_rope(spec, gguf, ARCH)
