"""The `qwen3vlmoe` architecture (the text model of Qwen3-VL-30B-A3B and
Qwen3-VL-235B-A22B): qwen3moe's block (per-head q/k RMS norms, NeoX RoPE,
routed SiLU experts with a softmax router, no shared expert) with qwen3vl's
interleaved M-RoPE (rope.dimension_sections) and DeepStack (input rows
n_embd * (1 + n_deepstack_layers) wide, slice il + 1 added to the residual
stream after layer il). llama.cpp: src/models/qwen3vlmoe.cpp.
"""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import qwen3moe, qwen3vl
from llminfer.models.base import ModelSpec

ARCH = "qwen3vlmoe"


def build(gguf: GGUFFile) -> ModelSpec:
    return qwen3vl.vision_rope(qwen3moe.build(gguf, arch=ARCH), gguf, ARCH)
