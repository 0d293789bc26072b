"""Tiny LoRA adapters written as llama.cpp's convert_lora_to_gguf.py writes
them (general.type "adapter", adapter.type "lora", adapter.lora.alpha,
`<weight>.lora_a` [rank, n_in] and `.lora_b` [n_out, rank] in numpy's order),
for tests/runtime/test_lora.py and the peer comparison."""

from __future__ import annotations

import gguf
import numpy as np

from llminfer.core.gguf_file import GGUFFile

# the projections a tiny llama has, by GGUF name
LAYER_WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def random_pairs(model_path, rank=4, seed=0, weights=LAYER_WEIGHTS, output=False, embd=False, scale=0.05):
    """{base weight name: (a, b)} float32 for every layer's `weights` (and
    output.weight, token_embd.weight when asked), shaped for the model at
    model_path; token_embd's flipped as llama.cpp reads it: a [n_vocab,
    rank], b [n_embd, rank]."""
    rng = np.random.default_rng(seed)
    out = {}
    with GGUFFile(model_path) as f:
        names = [n for n in f.tensors if n.startswith("blk.") and n.endswith(".weight") and n.split(".")[2] in weights]
        if output:
            names.append("output.weight")
        for name in sorted(names):
            rows, k = f.tensors[name].shape
            a = (rng.standard_normal((rank, k)) * scale).astype(np.float32)
            b = (rng.standard_normal((rows, rank)) * scale).astype(np.float32)
            out[name] = (a, b)
        if embd:
            n_vocab, n_embd = f.tensors["token_embd.weight"].shape
            out["token_embd.weight"] = ((rng.standard_normal((n_vocab, rank)) * scale).astype(np.float32),
                                        (rng.standard_normal((n_embd, rank)) * scale).astype(np.float32))
    return out


def write_adapter(path, arch, pairs, alpha=8.0, dtype="F32", general_type="adapter", adapter_type="lora",
                  drop=(), extra=None) -> str:
    """pairs {base name: (a, b)} written as an adapter file; dtype F32, F16
    or BF16 (Q8_0 quantized by gguf.quants); drop: tensor names left out (a
    missing half); extra: {name: array} more tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    if general_type is not None:
        w.add_string("general.type", general_type)
    if adapter_type is not None:
        w.add_string("adapter.type", adapter_type)
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", float(alpha))
    qt = getattr(gguf.GGMLQuantizationType, dtype)
    for name, (a, b) in pairs.items():
        for half, arr in (("lora_a", a), ("lora_b", b)):
            tname = f"{name}.{half}"
            if tname in drop:
                continue
            if dtype == "F32":
                w.add_tensor(tname, arr.astype(np.float32))
            elif dtype == "F16":
                w.add_tensor(tname, arr.astype(np.float16))
            else:
                w.add_tensor(tname, gguf.quants.quantize(arr.astype(np.float32), qt), raw_dtype=qt)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def effective(pairs, alpha, scale):
    """{name: scale_eff * B @ A} in float64, as llama.cpp's scale = scale * alpha / rank"""
    out = {}
    for name, (a, b) in pairs.items():
        rank = b.shape[1]
        s = np.float32(scale) * np.float32(alpha) / np.float32(rank) if alpha else np.float32(scale)
        if name == "token_embd.weight":  # flipped: row t gets b a[t]
            out[name] = float(s) * (a.astype(np.float64) @ b.astype(np.float64).T)
        else:
            out[name] = float(s) * (b.astype(np.float64) @ a.astype(np.float64))
    return out
