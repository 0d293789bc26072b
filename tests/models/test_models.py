"""Hyperparameters and tensors checked as a model is built: every value out of
a sane range, every count that disagrees with the tensors, and every tensor
left unused raises UnsupportedModelError naming the key or tensor."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

import llminfer
from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec

from gguf_bytes import Tensor, kv, tiny_llama

F64 = GGUFValueType.FLOAT64


def build(tmp_path, data):
    p = tmp_path / "m.gguf"
    p.write_bytes(data)
    with GGUFFile(p) as g:
        return build_spec(g)


def test_the_tiny_model_builds(tmp_path):
    spec = build(tmp_path, tiny_llama())
    assert (spec.n_layer, spec.n_embd, spec.n_head, spec.head_dim) == (1, 32, 2, 16)


@pytest.mark.parametrize("key, value, vtype", [
    ("llama.attention.layer_norm_rms_epsilon", 1e300, F64),
    ("llama.attention.layer_norm_rms_epsilon", float("inf"), None),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), None),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, None),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5, None),
    ("llama.rope.freq_base", float("inf"), None),
    ("llama.rope.freq_base", float("nan"), None),
    ("llama.rope.freq_base", 0.5, None),
    ("llama.attention.head_count", 0, None),
    ("llama.attention.head_count_kv", 0, None),
    ("llama.attention.key_length", 0, None),
    ("llama.embedding_length", 1 << 40, GGUFValueType.UINT64),
    ("llama.block_count", 0, None),
    ("llama.context_length", 1 << 31, GGUFValueType.UINT64),
    ("llama.feed_forward_length", -5, GGUFValueType.INT32),
    ("llama.attention.sliding_window", 1 << 30, None),
])
def test_values_out_of_range(tmp_path, key, value, vtype):
    with pytest.raises(UnsupportedModelError, match=rf"metadata '{key}' is .*, outside the range"):
        build(tmp_path, tiny_llama(replace={key: kv(key, value, vtype)}))


@pytest.mark.parametrize("value, vtype, want", [
    (2.5, GGUFValueType.FLOAT32, "an integer"),
    ("2", GGUFValueType.STRING, "an integer"),
    (True, GGUFValueType.BOOL, "an integer"),
])
def test_integers_must_be_stored_as_integers(tmp_path, value, vtype, want):
    key = "llama.block_count"
    with pytest.raises(UnsupportedModelError, match=rf"'{key}' must be {want}"):
        build(tmp_path, tiny_llama(replace={key: kv(key, value, vtype)}))


def test_float_given_as_string(tmp_path):
    key = "llama.rope.freq_base"
    with pytest.raises(UnsupportedModelError, match=rf"'{key}' must be a number, got str"):
        build(tmp_path, tiny_llama(replace={key: kv(key, "10000")}))


def test_heads_that_do_not_group(tmp_path):
    key = "llama.attention.head_count_kv"
    with pytest.raises(UnsupportedModelError, match="head_count 2 is not a multiple of attention.head_count_kv 3"):
        build(tmp_path, tiny_llama(replace={key: kv(key, 3)}))


def test_width_not_divisible_by_heads(tmp_path):
    key = "llama.attention.head_count"
    with pytest.raises(UnsupportedModelError, match="embedding_length 32 is not a multiple of attention.head_count 3"):
        build(tmp_path, tiny_llama(replace={key: kv(key, 3)}))


@pytest.mark.parametrize("n_rot", [3, 18])
def test_rope_dimensions(tmp_path, n_rot):
    key = "llama.rope.dimension_count"
    with pytest.raises(UnsupportedModelError, match=rf"rope.dimension_count {n_rot} must be even and at most "
                                                     r"the head size 16"):
        build(tmp_path, tiny_llama(replace={key: kv(key, n_rot)}))


def test_block_count_smaller_than_the_file(tmp_path):
    data = tiny_llama(n_layer=3, replace={"llama.block_count": kv("llama.block_count", 2)})
    with pytest.raises(UnsupportedModelError, match=r"block_count is 2, but the file has tensors for 3 blocks "
                                                     r"\(blk.2. to blk.2.\)"):
        build(tmp_path, data)


def test_block_count_larger_than_the_file(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"'blk.2.attn_norm.weight' is missing"):
        build(tmp_path, tiny_llama(n_layer=3, tensor_layers=2))


def test_unused_tensor_is_reported(tmp_path):
    bias = Tensor("blk.0.attn_q.bias", (32,), GGMLQuantizationType.F32, np.ones(32, np.float32).tobytes())
    with pytest.raises(UnsupportedModelError, match=r"tensors that the llama architecture does not use: "
                                                     r"blk.0.attn_q.bias"):
        build(tmp_path, tiny_llama(extra_tensors=[bias]))


def test_non_finite_norm_weight(tmp_path):
    bad = np.ones(32, np.float32)
    bad[5] = np.nan
    norm = Tensor("output_norm.weight", (32,), GGMLQuantizationType.F32, bad.tobytes())
    data = tiny_llama(drop=("output_norm.weight",), extra_tensors=[norm])
    with pytest.raises(UnsupportedModelError, match=r"'output_norm.weight' holds 1 non-finite value\(s\), "
                                                     r"the first nan at index 5"):
        build(tmp_path, data)


def test_vocabulary_and_embedding_disagree(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"has 32 tokens, but the model has 40"):
        build(tmp_path, tiny_llama(replace={"llama.vocab_size": kv("llama.vocab_size", 40)}))


def test_llm_refuses_an_absurd_epsilon(tmp_path):
    """Once, through the public API: this file used to load and answer ''
    with finish_reason "stop" (every logit 0)."""
    p = tmp_path / "eps.gguf"
    key = "llama.attention.layer_norm_rms_epsilon"
    p.write_bytes(tiny_llama(replace={key: kv(key, 1e300, F64)}))
    with pytest.raises(UnsupportedModelError, match="layer_norm_rms_epsilon"):
        llminfer.LLM(p, n_ctx=32)
