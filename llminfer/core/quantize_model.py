"""Requantize a GGUF model to another tensor type with our own quantizers.

    llminfer quantize -m model-f16.gguf -o model.Q4_0.gguf --type Q4_0
    llminfer quantize -m SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2.Q4_0.gguf --type Q4_0 --allow-requantize

Every weight matrix is dequantized (exactly, as gguf's reference does) and
quantized to the target; vectors (norms, biases) stay as they are. Presets
follow llama.cpp's naming:
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32: every matrix
  in that type, except the token embedding / output head, which get Q8_0 for
  the 4- and 5-bit types (as llama.cpp keeps them at higher precision);
  Q4_K_M: Q4_K, with Q6_K for the output head (or the tied embedding) and for
  attn_v and ffn_down in the first and last eighth of the layers and every
  third layer between, as llama.cpp's Q4_K_M mix does;
  IQ4_NL, IQ4_XS: every matrix in that type (the non-linear 4-bit levels,
  with a searched scale per 32 values), the output head (or the tied
  embedding) in Q6_K, as llama.cpp keeps it;
  MXFP4_MOE: the experts' 3-D tensors in MXFP4 (E2M1 values, one power-of-two
  scale per 32, quantized as llama.cpp's quantize_row_mxfp4_ref), every
  other matrix in Q8_0, as llama-quantize's MXFP4_MOE (gpt-oss).
As llama-quantize, a MoE router (ffn_gate_inp.weight) keeps its type under
every preset (its logits choose the experts, and a rounding there changes
which ones), and so does a tensor whose name does not end in "weight"
(gpt-oss's per-expert biases are 2-D).
A matrix whose rows are not a multiple of 256 falls back as llama.cpp's
does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL).
A model whose weights are already quantized is refused unless
allow_requantize (llama-quantize's --allow-requantize): its weights carry
the first quantization's error, which the second adds to; quantize the
F16/BF16/F32 original instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from llminfer.core import ops
from llminfer.errors import InvalidArgumentError
from llminfer.core.ggml import GGML_QUANT_SIZES
from llminfer.core.ggml import GGMLQuantizationType as T
from llminfer.core.gguf_file import GGUFFile

PRESETS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M", "IQ4_NL", "IQ4_XS",
           "MXFP4_MOE", "F16", "BF16", "F32")
_FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
               "Q4_K": 14, "Q4_K_M": 15, "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32,
               "MXFP4_MOE": 38}


_UNQUANTIZED = (T.F32, T.F16, T.BF16, T.F64)

_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL}


def _more_bits(layer: int, n_layer: int) -> bool:
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def target_type(name: str, shape, preset: str, n_layer: int, tied: bool, qtype: T | None = None) -> T:
    """The type a tensor (shape as numpy's: experts first) gets under
    `preset`; qtype: its type now, which a router keeps."""
    head = name == "output.weight" or (tied and name == "token_embd.weight")
    if qtype is not None and (name.endswith("ffn_gate_inp.weight") or not name.endswith("weight")):
        return qtype  # llama-quantize's rules: routers and what is not a weight (gpt-oss's 2-D expert biases)
    if preset == "MXFP4_MOE":
        t = T.MXFP4 if len(shape) == 3 and shape[0] > 1 and not head else T.Q8_0
    elif preset == "Q4_K_M":
        if head:
            t = T.Q6_K
        elif name.endswith(("attn_v.weight", "ffn_down.weight")) and name.startswith("blk."):
            t = T.Q6_K if _more_bits(int(name.split(".")[1]), n_layer) else T.Q4_K
        else:
            t = T.Q4_K
    elif preset in ("IQ4_NL", "IQ4_XS"):
        t = T.Q6_K if head else T[preset]
    else:
        t = T[preset]
        if (head or name == "token_embd.weight") and preset in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
            t = T.Q8_0
    if shape[-1] % GGML_QUANT_SIZES[t][0]:
        # rows that are not a multiple of 256: the 32-block type llama.cpp falls back to
        t = _FALLBACK.get(t, T.Q8_0)
        if shape[-1] % 32:
            t = T.F16
    return t


def _copy_metadata(src: GGUFFile, w: gguf.GGUFWriter, preset: str):
    import gguf

    for key, value in src.metadata.items():
        if key in ("general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"):
            continue
        if key == "general.alignment":
            # the writer must pad the tensors to it, not just record the key
            w.add_custom_alignment(int(value))
            continue
        vtype, etype = src.metadata_types[key]
        vtype = gguf.GGUFValueType(vtype)
        if key == "general.file_type":
            value = _FILE_TYPES.get(preset, value)
        if vtype == gguf.GGUFValueType.ARRAY:
            value = value.tolist() if isinstance(value, np.ndarray) else list(value)
            w.add_key_value(key, value, vtype, sub_type=gguf.GGUFValueType(etype))
        else:
            w.add_key_value(key, value, vtype)
    if "general.file_type" not in src.metadata:
        w.add_file_type(_FILE_TYPES[preset])  # llama-quantize always records it


def quantized_weights(src: GGUFFile) -> dict:
    """{type name: count} of the weight matrices of src that are already in a
    quantized type (empty for an F32/F16/BF16 model)."""
    counts = {}
    for info in src.tensors.values():
        if len(info.shape) >= 2 and T(info.qtype) not in _UNQUANTIZED:
            counts[T(info.qtype).name] = counts.get(T(info.qtype).name, 0) + 1
    return counts


def quantize_model(src_path, dst_path, preset: str, n_threads=None, log=None, progress=None,
                   allow_requantize: bool = False) -> dict:
    """Write dst_path; returns {tensor name: type name} of what was written.

    log(line): the closing line; progress(done, total): after each tensor.
    The file is written beside dst_path under a temporary name and renamed
    when complete, so a failure leaves no partial model behind."""
    preset = preset.upper()
    if preset not in PRESETS:
        raise InvalidArgumentError(f"unknown quantization {preset!r}; choose from {', '.join(PRESETS)}")
    dst = Path(dst_path)
    if dst.exists() and dst.resolve() == Path(src_path).resolve():
        # the source is memory-mapped and read while the output is written
        raise InvalidArgumentError(f"the output {dst} is the input model; write to another file")
    t0 = time.perf_counter()
    with GGUFFile(src_path) as src:
        already = quantized_weights(src)
        if already and not allow_requantize:
            kinds = ", ".join(f"{n} {name}" for name, n in sorted(already.items()))
            raise InvalidArgumentError(
                f"{src_path} is already quantized ({kinds} weight matrices): quantizing it again adds a second "
                f"rounding error to the first; quantize its F16/BF16/F32 original instead, or pass "
                f"--allow-requantize (allow_requantize=True) to do it anyway")
        partial = dst.with_name(dst.name + ".partial")
        try:
            written = _write(src, partial, preset, n_threads, progress)
            os.replace(partial, dst)
        finally:
            if partial.exists():
                partial.unlink()
    if log:
        log(f"wrote {dst} in {time.perf_counter() - t0:.1f} s")
    return written


def _write(src: GGUFFile, dst_path, preset, n_threads, progress) -> dict:
    arch = src.architecture
    n_layer = int(src.metadata.get(f"{arch}.block_count", 0))
    tied = "output.weight" not in src.tensors
    import gguf  # the writer; imported here, not when the CLI builds its parser

    w = gguf.GGUFWriter(str(dst_path), arch)
    _copy_metadata(src, w, preset)
    written = {}
    total = len(src.tensors)
    for i, (name, info) in enumerate(src.tensors.items()):
        qt = T(info.qtype)
        raw = np.ascontiguousarray(src.tensor_bytes(name))
        if len(info.shape) < 2:
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(int(qt)))  # vectors keep their type
            written[name] = qt.name
            if progress:
                progress(i + 1, total)
            continue
        rows = int(np.prod(info.shape[:-1]))
        new = target_type(name, info.shape, preset, n_layer, tied, qt)
        if new == qt:
            data = raw
        else:
            values = ops.dequantize(raw, qt, (rows, info.shape[-1]), n_threads=n_threads)
            data = ops.quantize(values, new, n_threads=n_threads)
        # an expert tensor stays 3-D: [n_expert, rows, k]
        w.add_tensor(name, data.reshape(*info.shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType(int(new)))
        written[name] = new.name
        if progress:
            progress(i + 1, total)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written
