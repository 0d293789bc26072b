"""The GGUF reader: metadata and tensors as gguf's own reader sees them, and
clear GGUFError / UnsupportedModelError for files that are not valid models."""

import struct

import gguf
import numpy as np
import pytest

from llminfer.errors import GGUFError, ModelNotFoundError, UnsupportedModelError
from llminfer.gguf_file import GGUFFile
from llminfer.models import build_spec

from tiny_models import TinyConfig, write_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("g") / "tiny.gguf", TinyConfig(qtype="Q4_K"))


def test_metadata_and_tensors_match_gguf_reader(model_path):
    ours = GGUFFile(model_path)
    ref = gguf.GGUFReader(model_path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        if isinstance(got, np.ndarray):
            got = got.tolist()
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.qtype == int(t.tensor_type)
        assert info.shape == tuple(int(v) for v in reversed(t.shape.tolist()))
        assert np.array_equal(ours.tensor_bytes(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_real_models_open_quickly_and_fully(smollm2_path):
    f = GGUFFile(smollm2_path)
    assert f.architecture == "llama"
    assert len(f.metadata["tokenizer.ggml.tokens"]) == f.tensors["token_embd.weight"].shape[0]


def corrupt(tmp_path, data, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_not_a_gguf_file(tmp_path):
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(corrupt(tmp_path, b"PK\x03\x04" + b"\0" * 64))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(corrupt(tmp_path, b"GGUF"))
    with pytest.raises(ModelNotFoundError):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile(tmp_path)


def test_unsupported_version(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 7, 0, 0)
    with pytest.raises(GGUFError, match="version 7"):
        GGUFFile(corrupt(tmp_path, data))


@pytest.mark.parametrize("keep", [0.001, 0.01, 0.3, 0.9, 0.999])
def test_truncated_file(model_path, tmp_path, keep):
    data = open(model_path, "rb").read()
    cut = max(24, int(len(data) * keep))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(corrupt(tmp_path, data[:cut]))


def test_absurd_counts_and_lengths(tmp_path):
    huge = b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1)
    with pytest.raises(GGUFError, match="corrupt header"):
        GGUFFile(corrupt(tmp_path, huge + b"\0" * 64))
    # a key whose length runs past the end
    bad_key = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 50) + b"abc"
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        GGUFFile(corrupt(tmp_path, bad_key + b"\0" * 16))
    # an unknown value type
    key = b"k"
    odd = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 99)
    with pytest.raises(GGUFError, match="unknown value type 99"):
        GGUFFile(corrupt(tmp_path, odd + b"\0" * 16))


def test_invalid_utf8_key(tmp_path):
    key = b"\xff\xfe"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    data += struct.pack("<I", 4) + struct.pack("<I", 1)
    with pytest.raises(GGUFError, match="not valid UTF-8"):
        GGUFFile(corrupt(tmp_path, data + b"\0" * 16))


def write_custom(path, arch=None, drop=None, shape_override=None, qtype=None):
    """A tiny model with one tensor missing, misshapen or of an odd type."""
    def hook(name, data, t):
        if name == drop:
            return None
        if name == shape_override:
            return np.zeros((3, 5), dtype=np.float32), gguf.GGMLQuantizationType.F32
        if name == qtype:
            # an IQ type llminfer cannot compute with, of the right byte size
            rows = data.shape[0]
            k = data.shape[1] // gguf.GGML_QUANT_SIZES[t][1] * gguf.GGML_QUANT_SIZES[t][0]
            return (np.zeros((rows, k // 256 * 66), dtype=np.uint8),
                    gguf.GGMLQuantizationType.IQ2_XXS)
        return data, t

    return write_model(path, TinyConfig(qtype="Q4_K"), declared_arch=arch, tensor_hook=hook)


def test_unsupported_architecture_lists_supported(tmp_path):
    p = write_custom(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(UnsupportedModelError, match=r"'mamba' is not supported; supported: gemma3, llama, qwen2"):
        build_spec(GGUFFile(p))


def test_missing_tensor(tmp_path):
    p = write_custom(tmp_path / "m.gguf", drop="blk.1.ffn_up.weight")
    with pytest.raises(UnsupportedModelError, match=r"'blk.1.ffn_up.weight' is missing"):
        build_spec(GGUFFile(p))


def test_inconsistent_shape(tmp_path):
    p = write_custom(tmp_path / "m.gguf", shape_override="blk.0.attn_q.weight")
    with pytest.raises(UnsupportedModelError, match=r"'blk.0.attn_q.weight' has shape \(3, 5\)"):
        build_spec(GGUFFile(p))


def test_unsupported_tensor_type(tmp_path):
    p = write_custom(tmp_path / "m.gguf", qtype="blk.0.ffn_gate.weight")
    with pytest.raises(UnsupportedModelError, match=r"IQ2_XXS, which llminfer cannot compute with"):
        build_spec(GGUFFile(p))
