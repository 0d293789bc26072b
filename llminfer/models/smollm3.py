"""The `smollm3` architecture (SmolLM3): the Llama block (RoPE on adjacent
pairs, the converter permutes q/k for it), except that every 4th layer
(layers 3, 7, 11, ...) applies no RoPE at all. The GGUF file does not list
those layers: llama.cpp fixes the step at 4 (n_no_rope_layer_step), as the
released model's config has it, and so do we."""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NORM, ModelSpec

ARCH = "smollm3"
NO_ROPE_STEP = 4


def uses_rope(layer: int) -> bool:
    return (layer + 1) % NO_ROPE_STEP != 0


def _no_rope_layers(spec, w, hp, sh):
    for i, L in enumerate(spec.layers):
        L.no_rope = not uses_rope(i)


def build(gguf: GGUFFile) -> ModelSpec:
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NORM, customize=_no_rope_layers, default_eps=1e-6)
