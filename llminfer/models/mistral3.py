"""The `mistral3` architecture (Ministral 3 and the text model of Mistral's
3-series files): the Llama block with RoPE on adjacent pairs, read as
llama.cpp reads it, plus

- YaRN RoPE scaling with the betas and yarn_log_multiplier the file gives
  (rope.scaling.yarn_beta_fast / yarn_beta_slow / yarn_log_multiplier);
- Llama 4's attention temperature tuning when attention.temperature_scale
  is set: the query at position p is multiplied by
  ln(floor(p / n) + 1) * temperature_scale + 1, n the original context
  length (rope.scaling.original_context_length, else context_length);
- no sliding window (llama.cpp reads none for mistral3).

Files with experts (expert_count > 0) are refused: llama.cpp's mistral3
routes them with an expert weight scale the MoE core here does not apply."""

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import llama
from llminfer.models.base import ROPE_NORM, Hparams, ModelSpec

ARCH = "mistral3"


def _customize(spec, w, hp, sh):
    n_expert = hp.int("expert_count", 0)
    if n_expert:
        raise UnsupportedModelError(f"{hp.path}: {ARCH} with experts (expert_count {n_expert}) is not supported")
    for L in spec.layers:
        L.sliding_window = 0
    temp = hp.float("attention.temperature_scale", 0.0)
    if temp != 0.0:
        floor = hp.int("rope.scaling.original_context_length", spec.context_length)
        spec.attn_temp_scale, spec.attn_temp_floor, spec.attn_temp_offset = temp, floor, 0.0


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    yarn = (hp.float("rope.scaling.yarn_beta_fast", 32.0), hp.float("rope.scaling.yarn_beta_slow", 1.0),
            hp.float("rope.scaling.yarn_log_multiplier", 0.0))
    return llama.build(gguf, arch=ARCH, rope_mode=ROPE_NORM, customize=_customize, yarn=yarn)
