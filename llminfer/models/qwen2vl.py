"""The `qwen2vl` architecture (the text model of Qwen2-VL and Qwen2.5-VL):
qwen2's block (biases on q, k and v; NeoX RoPE) with M-RoPE.

M-RoPE (llama.cpp's GGML_ROPE_TYPE_MROPE, not interleaved): the rotated
pairs fall into four sections by rope.dimension_sections, [16, 24, 24, 0]
for head size 128; pair i turns by the token's temporal position where
i % S < s0, its height position where i % S < s0 + s1, its width position
where i % S < s0 + s1 + s2, else by a fourth (S the sections' sum). A text
token's positions are (p, p, p, 0); an image's rows take 2-D ones
(Engine.decode_rows with a grid: mtmd's layout), and the text after an
image continues behind its cache places (Sequence.rope_marks).
"""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, Hparams, ModelSpec, rope_sections

ARCH = "qwen2vl"


def build(gguf: GGUFFile) -> ModelSpec:
    spec = llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, biases=True)
    s = rope_sections(Hparams(gguf, ARCH), spec.n_rot)
    spec.rope_sect_t, spec.rope_sect_h, spec.rope_sect_w, spec.rope_sect_e = s
    return spec
