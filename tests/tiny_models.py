"""Tiny random-weight GGUF models for tests, written with gguf.GGUFWriter.

Each has a byte-level BPE vocabulary (the 256 GPT-2 byte symbols, a few
merges, BOS/EOS) so the whole LLM API can run on it, and weights drawn from a
seeded generator so a test is reproducible. Hidden sizes are multiples of 256
so every tensor type, K-quants included, can be used.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

from llminfer import ops


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 bytes (a fact of the format)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


# every weight type a tiny model can be written in
WEIGHT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                "IQ3_S", "IQ1_S", "IQ1_M"]
# types whose tiny-model matrices are random blocks (no quantizer of ours or gguf's)
RANDOM_BLOCK_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]


def quantized_matrix(rng, data, t):
    """float32 rows `data` stored as type t: by our quantizer, else gguf's
    (MXFP4, TQ1_0, TQ2_0), else (the grid i-quants, which need an importance
    matrix to quantize well and have no quantizer in gguf) random blocks
    scaled to the rows' RMS."""
    if t in ops.QUANTIZABLE_TYPES:
        return ops.quantize(data, t)
    try:
        return gguf.quants.quantize(data, t)
    except NotImplementedError:
        pass
    from kernel_cases import random_blocks
    rows, k = data.shape
    seed = int(rng.integers(1 << 31))
    unit = random_blocks(np.random.default_rng(seed), t, rows, k, scale=1.0)
    rms = float(np.sqrt(np.mean(gguf.quants.dequantize(unit, t) ** 2)))
    target = float(np.sqrt(np.mean(data.astype(np.float64) ** 2)))
    return random_blocks(np.random.default_rng(seed), t, rows, k, scale=target / rms)

MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "e n", "a n"]


@dataclass
class TinyConfig:
    arch: str = "llama"
    qtype: str = "Q8_0"           # projections
    embd_qtype: str = "Q8_0"
    n_embd: int = 256
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 512
    tie_output: bool = True
    sliding_window: int = 0       # gemma3 local layers
    swa_pattern: int = 2          # gemma3: every 2nd layer global in tiny models
    rope_base: float = 10000.0
    context_length: int = 512
    seed: int = 0


def vocab():
    tokens = byte_symbols() + [a + b for a, b in (m.split(" ") for m in MERGES)] + ["<s>", "</s>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    return tokens, types


def write_model(path, cfg: TinyConfig, declared_arch=None, tensor_hook=None) -> str:
    """Write the model; declared_arch replaces general.architecture (and the
    metadata prefix), tensor_hook(name, data, qtype) may return None to drop a
    tensor or a replacement (data, qtype) to corrupt it."""
    rng = np.random.default_rng(cfg.seed)
    tokens, types = vocab()
    n_vocab = len(tokens)
    arch = declared_arch or cfg.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", cfg.n_layer)
    w.add_uint32(f"{arch}.context_length", cfg.context_length)
    w.add_uint32(f"{arch}.embedding_length", cfg.n_embd)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.n_ff)
    w.add_uint32(f"{arch}.attention.head_count", cfg.n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.n_head_kv)
    w.add_uint32(f"{arch}.attention.key_length", cfg.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", cfg.head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_base)
    w.add_uint32(f"{arch}.rope.dimension_count", cfg.head_dim)
    if arch == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", cfg.swa_pattern)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", MERGES)
    w.add_uint32("tokenizer.ggml.bos_token_id", n_vocab - 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", n_vocab - 1)
    w.add_bool("tokenizer.ggml.add_bos_token", True)

    def add(name, data, t):
        if tensor_hook is not None:
            replaced = tensor_hook(name, data, t)
            if replaced is None:
                return
            data, t = replaced
        w.add_tensor(name, data, raw_dtype=t)

    def matrix(name, rows, k, qtype, scale):
        data = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        t = gguf.GGMLQuantizationType[qtype]
        add(name, quantized_matrix(rng, data, t), t)

    def vector(name, n, around=1.0, spread=0.1):
        add(name, (around + rng.standard_normal(n) * spread).astype(np.float32), gguf.GGMLQuantizationType.F32)

    E, F, hd = cfg.n_embd, cfg.n_ff, cfg.head_dim
    matrix("token_embd.weight", n_vocab, E, cfg.embd_qtype, 1.0)
    vector("output_norm.weight", E)
    if not cfg.tie_output:
        matrix("output.weight", n_vocab, E, cfg.qtype, 1.0 / np.sqrt(E))
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", E)
        matrix(p + "attn_q.weight", cfg.n_head * hd, E, cfg.qtype, 1.0 / np.sqrt(E))
        matrix(p + "attn_k.weight", cfg.n_head_kv * hd, E, cfg.qtype, 1.0 / np.sqrt(E))
        matrix(p + "attn_v.weight", cfg.n_head_kv * hd, E, cfg.qtype, 1.0 / np.sqrt(E))
        matrix(p + "attn_output.weight", E, cfg.n_head * hd, cfg.qtype, 1.0 / np.sqrt(cfg.n_head * hd))
        vector(p + "ffn_norm.weight", E)
        matrix(p + "ffn_gate.weight", F, E, cfg.qtype, 1.0 / np.sqrt(E))
        matrix(p + "ffn_up.weight", F, E, cfg.qtype, 1.0 / np.sqrt(E))
        matrix(p + "ffn_down.weight", E, F, cfg.qtype, 1.0 / np.sqrt(F))
        if arch == "qwen2":
            vector(p + "attn_q.bias", cfg.n_head * hd, 0.0, 0.2)
            vector(p + "attn_k.bias", cfg.n_head_kv * hd, 0.0, 0.2)
            vector(p + "attn_v.bias", cfg.n_head_kv * hd, 0.0, 0.2)
        if arch == "gemma3":
            vector(p + "attn_q_norm.weight", hd)
            vector(p + "attn_k_norm.weight", hd)
            vector(p + "post_attention_norm.weight", E)
            vector(p + "post_ffw_norm.weight", E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
