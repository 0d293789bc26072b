"""The `granite` architecture (IBM Granite 3.x dense): the Llama block
(RoPE on adjacent pairs) with four multipliers from the metadata:

- granite.embedding_scale: token embeddings are multiplied by it;
- granite.residual_scale: each half's output is multiplied by it before it
  is added to the residual stream;
- granite.attention.scale: the attention scores' scale, in place of
  1/sqrt(head_dim) (0 or absent: the default);
- granite.logit_scale: logits are divided by it (required, as llama.cpp
  requires it).

rope.scaling.finetuned false turns RoPE off on every layer, as llama.cpp
reads it for granite."""

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NORM, ModelSpec

ARCH = "granite"


def _positive(hp, key, default=None):
    v = hp.float(key, default)
    if not (0.0 < v <= 1e6):
        raise UnsupportedModelError(f"{hp.path}: metadata '{ARCH}.{key}' is {v!r}; it must be positive")
    return v


def _multipliers(spec, w, hp, sh):
    embd = hp.float("embedding_scale", 0.0)
    spec.embd_scale = _positive(hp, "embedding_scale") if embd != 0.0 else 1.0
    res = hp.float("residual_scale", 0.0)
    spec.residual_scale = _positive(hp, "residual_scale") if res != 0.0 else 1.0
    att = hp.float("attention.scale", 0.0)
    if att != 0.0:
        spec.attn_scale = _positive(hp, "attention.scale")
    spec.logit_scale = 1.0 / _positive(hp, "logit_scale")
    finetuned = hp.meta.get(f"{ARCH}.rope.scaling.finetuned", True)
    if not isinstance(finetuned, (bool, np.bool_)):
        raise UnsupportedModelError(f"{hp.path}: metadata '{ARCH}.rope.scaling.finetuned' must be a bool")
    for L in spec.layers:
        L.no_rope = not finetuned


def build(gguf: GGUFFile) -> ModelSpec:
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NORM, customize=_multipliers)
