"""The `qwen2` architecture: the Llama block with biases on the q, k and v
projections, and RoPE on (i, i + n_rot/2) pairs (NeoX layout)."""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NEOX, ModelSpec

ARCH = "qwen2"


def build(gguf: GGUFFile) -> ModelSpec:
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NEOX, biases=True)
