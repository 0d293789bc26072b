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

from llminfer.core import ops


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
    sliding_window: int = 0       # gemma3 local layers; any other arch: written when > 0
    swa_pattern: int = 2          # gemma3: every 2nd layer global in tiny models
    rope_base: float = 10000.0
    context_length: int = 512
    seed: int = 0
    # gemma2's soft-caps (small, so that tanh bends the tiny model's values)
    attn_softcap: float = 4.0
    final_softcap: float = 150.0  # tiny logits reach ~270
    # granite's multipliers
    embedding_scale: float = 3.0
    residual_scale: float = 0.5
    attention_scale: float = 0.1
    logit_scale: float = 2.5
    # phi3's LongRoPE: factors written when long_context > 0 (the original context length)
    long_context: int = 0
    rope_attn_factor: float = 1.2
    # qwen3moe
    n_expert: int = 8
    n_expert_used: int = 3
    n_ff_exp: int = 256
    pre: str = "gpt2"             # tokenizer.ggml.pre ("default" for llama.cpp, which no longer knows "gpt2")
    # YaRN scaling, written when yarn_factor > 0 (betas and log multiplier: mistral3 only)
    yarn_factor: float = 0.0
    yarn_orig_ctx: int = 16
    yarn_beta_fast: float = 16.0
    yarn_beta_slow: float = 2.0
    yarn_log_mul: float = 0.5
    attn_temp_scale: float = 0.0  # mistral3: attention.temperature_scale, written when != 0
    rope_sections: tuple = (8, 12, 12, 0)  # qwen2vl: rope.dimension_sections (pairs of a 64-wide head)
    # qwen3vl's (interleaved: like Qwen3-VL's [24, 20, 20] of 64 pairs, one pair left to the fourth)
    rope_sections_interleaved: tuple = (12, 10, 10, 0)
    n_deepstack: int = 2          # qwen3vl, qwen3vlmoe: n_deepstack_layers


# What each architecture adds to (or takes from) the Llama block in a tiny model
NEOX_ARCHS = ("qwen2", "qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "olmo2")
ARCHS = ("llama", "qwen2", "qwen2vl", "qwen3vl", "gemma3", "qwen3", "gemma2", "phi3", "granite", "olmo2", "smollm3",
         "qwen3moe", "qwen3vlmoe", "mistral3")
IMROPE_ARCHS = ("qwen3vl", "qwen3vlmoe")  # interleaved M-RoPE sections and DeepStack
MOE_ARCHS = ("qwen3moe", "qwen3vlmoe")    # routed experts in place of the feed-forward


def tensor_adder(w, tensor_hook):
    """w.add_tensor through tensor_hook(name, data, qtype), which may return
    None to drop the tensor or a replacement (data, qtype)."""

    def add(name, data, t):
        if tensor_hook is not None:
            replaced = tensor_hook(name, data, t)
            if replaced is None:
                return
            data, t = replaced
        w.add_tensor(name, data, raw_dtype=t)

    return add


def add_keys(w, kv):
    """Metadata by the value's Python type: bool, uint32, float32, string, or
    an array of float32."""
    for key, v in kv.items():
        if isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        elif isinstance(v, str):
            w.add_string(key, v)
        else:
            w.add_array(key, [float(a) for a in v])


def vocab():
    tokens = byte_symbols() + [a + b for a, b in (m.split(" ") for m in MERGES)] + ["<s>", "</s>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    return tokens, types


def write_model(path, cfg: TinyConfig, declared_arch=None, tensor_hook=None, extra_uint32=None,
                extra_strings=None, extra_tokens=None, extra_arrays=None, extra_tensors=None) -> str:
    """Write the model; declared_arch replaces general.architecture (and the
    metadata prefix), tensor_hook(name, data, qtype) may return None to drop a
    tensor or a replacement (data, qtype) to corrupt it. extra_uint32: more
    metadata keys with integer values (FIM token ids, say); extra_strings:
    with string values (tokenizer.chat_template, say); extra_tokens: more
    vocabulary entries, {piece: token type} (4: user-defined, as a thinking
    model's <think>), placed before BOS and EOS, which stay last.
    extra_arrays: metadata arrays; extra_tensors: {name: fn(rng, n_embd,
    n_vocab) -> float32 array} written after the model's own (a reranker's
    cls.output.weight, say)."""
    rng = np.random.default_rng(cfg.seed)
    tokens, types = vocab()
    if extra_tokens:
        tokens = tokens[:-2] + list(extra_tokens) + tokens[-2:]
        types = types[:-2] + list(extra_tokens.values()) + types[-2:]
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
    if arch in ("gemma3", "gemma2"):
        w.add_uint32(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", cfg.swa_pattern)
    elif cfg.sliding_window > 0:
        w.add_uint32(f"{arch}.attention.sliding_window", cfg.sliding_window)
    if arch == "gemma2":
        w.add_float32(f"{arch}.attn_logit_softcapping", cfg.attn_softcap)
        w.add_float32(f"{arch}.final_logit_softcapping", cfg.final_softcap)
    if arch == "granite":
        w.add_float32(f"{arch}.embedding_scale", cfg.embedding_scale)
        w.add_float32(f"{arch}.residual_scale", cfg.residual_scale)
        w.add_float32(f"{arch}.attention.scale", cfg.attention_scale)
        w.add_float32(f"{arch}.logit_scale", cfg.logit_scale)
    if arch == "phi3" and cfg.long_context:
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", cfg.long_context)
        w.add_float32(f"{arch}.rope.scaling.attn_factor", cfg.rope_attn_factor)
    if cfg.yarn_factor > 0:
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", cfg.yarn_factor)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", cfg.yarn_orig_ctx)
        if arch == "mistral3":
            w.add_float32(f"{arch}.rope.scaling.yarn_beta_fast", cfg.yarn_beta_fast)
            w.add_float32(f"{arch}.rope.scaling.yarn_beta_slow", cfg.yarn_beta_slow)
            w.add_float32(f"{arch}.rope.scaling.yarn_log_multiplier", cfg.yarn_log_mul)
    if cfg.attn_temp_scale:
        w.add_float32(f"{arch}.attention.temperature_scale", cfg.attn_temp_scale)
        if cfg.yarn_factor <= 0:  # the temperature's step, else context_length
            w.add_uint32(f"{arch}.rope.scaling.original_context_length", cfg.yarn_orig_ctx)
    if arch == "qwen2vl":  # M-RoPE's sections, uneven so that a mix-up shows: 8 + 12 + 12 of 32 pairs
        w.add_array(f"{arch}.rope.dimension_sections", list(cfg.rope_sections))
    if arch in IMROPE_ARCHS:
        w.add_array(f"{arch}.rope.dimension_sections", list(cfg.rope_sections_interleaved))
        w.add_uint32(f"{arch}.n_deepstack_layers", cfg.n_deepstack)
    if arch in MOE_ARCHS:
        w.add_uint32(f"{arch}.expert_count", cfg.n_expert)
        w.add_uint32(f"{arch}.expert_used_count", cfg.n_expert_used)
        w.add_uint32(f"{arch}.expert_feed_forward_length", cfg.n_ff_exp)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", cfg.pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", MERGES)
    w.add_uint32("tokenizer.ggml.bos_token_id", n_vocab - 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", n_vocab - 1)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    for key, value in (extra_uint32 or {}).items():
        w.add_uint32(key, value)
    for key, value in (extra_strings or {}).items():
        w.add_string(key, value)
    for key, value in (extra_arrays or {}).items():
        w.add_array(key, value)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, qtype, scale, n_expert=0):
        """[rows, k], or [n_expert, rows, k] as GGUF's 3-D expert tensors"""
        n = max(n_expert, 1)
        data = (rng.standard_normal((n * rows, k)) * scale).astype(np.float32)
        t = gguf.GGMLQuantizationType[qtype]
        q = quantized_matrix(rng, data, t)
        add(name, q.reshape(n, rows, -1) if n_expert else q, t)

    def vector(name, n, around=1.0, spread=0.1):
        add(name, (around + rng.standard_normal(n) * spread).astype(np.float32), gguf.GGMLQuantizationType.F32)

    E, F, hd = cfg.n_embd, cfg.n_ff, cfg.head_dim
    nq, nkv = cfg.n_head * hd, cfg.n_head_kv * hd
    matrix("token_embd.weight", n_vocab, E, cfg.embd_qtype, 1.0)
    vector("output_norm.weight", E)
    if not cfg.tie_output:
        matrix("output.weight", n_vocab, E, cfg.qtype, 1.0 / np.sqrt(E))
    if arch == "phi3" and cfg.long_context:
        vector("rope_factors_long.weight", cfg.head_dim // 2, 4.0, 0.5)
        vector("rope_factors_short.weight", cfg.head_dim // 2, 1.0, 0.1)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if arch != "olmo2":  # olmo2 norms after each half, not before
            vector(p + "attn_norm.weight", E)
            vector(p + "ffn_norm.weight", E)
        if arch == "phi3":  # q, k and v in one tensor; gate and up in one
            matrix(p + "attn_qkv.weight", nq + 2 * nkv, E, cfg.qtype, 1.0 / np.sqrt(E))
        else:
            matrix(p + "attn_q.weight", nq, E, cfg.qtype, 1.0 / np.sqrt(E))
            matrix(p + "attn_k.weight", nkv, E, cfg.qtype, 1.0 / np.sqrt(E))
            matrix(p + "attn_v.weight", nkv, E, cfg.qtype, 1.0 / np.sqrt(E))
        matrix(p + "attn_output.weight", E, nq, cfg.qtype, 1.0 / np.sqrt(nq))
        if arch == "phi3":
            matrix(p + "ffn_up.weight", 2 * F, E, cfg.qtype, 1.0 / np.sqrt(E))
            matrix(p + "ffn_down.weight", E, F, cfg.qtype, 1.0 / np.sqrt(F))
        elif arch in MOE_ARCHS:
            Fe, ne = cfg.n_ff_exp, cfg.n_expert
            matrix(p + "ffn_gate_inp.weight", ne, E, "F32", 1.0 / np.sqrt(E))
            matrix(p + "ffn_gate_exps.weight", Fe, E, cfg.qtype, 1.0 / np.sqrt(E), n_expert=ne)
            matrix(p + "ffn_up_exps.weight", Fe, E, cfg.qtype, 1.0 / np.sqrt(E), n_expert=ne)
            matrix(p + "ffn_down_exps.weight", E, Fe, cfg.qtype, 1.0 / np.sqrt(Fe), n_expert=ne)
        else:
            matrix(p + "ffn_gate.weight", F, E, cfg.qtype, 1.0 / np.sqrt(E))
            matrix(p + "ffn_up.weight", F, E, cfg.qtype, 1.0 / np.sqrt(E))
            matrix(p + "ffn_down.weight", E, F, cfg.qtype, 1.0 / np.sqrt(F))
        if arch in ("qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe"):
            vector(p + "attn_q_norm.weight", hd)
            vector(p + "attn_k_norm.weight", hd)
        if arch == "olmo2":
            vector(p + "attn_q_norm.weight", nq)
            vector(p + "attn_k_norm.weight", nkv)
        if arch in ("gemma2", "olmo2"):
            vector(p + "post_attention_norm.weight", E)
            vector(p + "post_ffw_norm.weight", E)
        if arch in ("qwen2", "qwen2vl"):
            vector(p + "attn_q.bias", cfg.n_head * hd, 0.0, 0.2)
            vector(p + "attn_k.bias", cfg.n_head_kv * hd, 0.0, 0.2)
            vector(p + "attn_v.bias", cfg.n_head_kv * hd, 0.0, 0.2)
        if arch == "gemma3":
            vector(p + "attn_q_norm.weight", hd)
            vector(p + "attn_k_norm.weight", hd)
            vector(p + "post_attention_norm.weight", E)
            vector(p + "post_ffw_norm.weight", E)
    for name, make in (extra_tensors or {}).items():
        add(name, np.asarray(make(rng, E, n_vocab), dtype=np.float32), gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ---- encoders (bert, nomic-bert) for embeddings ----

def wordpiece_vocab():
    """A WordPiece vocabulary as GGUF stores it: word-initial pieces with
    "\u2581", continuations bare, [UNK]/[CLS]/[SEP]/[MASK] at BERT's ids."""
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "is", "good", "emb", "edd", "ing"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["\u2581" + w for w in words] + ["\u2581" + c for c in letters] + letters + \
        ["s", "ing", "ed"] + ["\u2581" + p for p in ".,!?'-"] + list("0123456789")
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [p for p in dict.fromkeys(pieces)]
    types = [3] + [5] * 99 + [2, 3, 3, 3] + [1] * (len(tokens) - 104)
    return tokens, types


def write_encoder(path, arch="bert", qtype="Q8_0", n_embd=256, n_layer=2, n_head=4, n_ff=512,
                  context_length=64, pooling=1, seed=0, rank_head=None, n_labels=1) -> str:
    """A tiny random encoder GGUF (bert: absolute positions, GELU FFN with
    biases; nomic-bert: fused attn_qkv, RoPE, SiLU-gated FFN). rank_head
    (a reranker, with pooling=4): "full" writes the classifier head as
    llama.cpp reads it (cls.weight/bias, cls.output.weight/bias with
    n_labels rows), "dense" only cls.*, "out" only cls.output.*."""
    rng = np.random.default_rng(seed)
    tokens, types = wordpiece_vocab()
    E, F = n_embd, n_ff
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", n_layer)
    w.add_uint32(f"{arch}.context_length", context_length)
    w.add_uint32(f"{arch}.embedding_length", E)
    w.add_uint32(f"{arch}.feed_forward_length", F)
    w.add_uint32(f"{arch}.attention.head_count", n_head)
    w.add_float32(f"{arch}.attention.layer_norm_epsilon", 1e-12)
    w.add_bool(f"{arch}.attention.causal", False)
    w.add_uint32(f"{arch}.pooling_type", pooling)
    if arch == "nomic-bert":
        w.add_float32(f"{arch}.rope.freq_base", 1000.0)
    w.add_string("tokenizer.ggml.model", "bert")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    w.add_uint32("tokenizer.ggml.bos_token_id", 101)
    w.add_uint32("tokenizer.ggml.seperator_token_id", 102)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 100)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)

    def matrix(name, rows, k, t, scale):
        data = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        qt = gguf.GGMLQuantizationType[t]
        w.add_tensor(name, ops.quantize(data, qt), raw_dtype=qt)

    def vector(name, n, around=0.0, spread=0.1):
        w.add_tensor(name, (around + rng.standard_normal(n) * spread).astype(np.float32),
                     raw_dtype=gguf.GGMLQuantizationType.F32)

    matrix("token_embd.weight", len(tokens), E, qtype, 1.0)
    matrix("token_types.weight", 2, E, "F32", 0.5)
    if arch == "bert":
        matrix("position_embd.weight", context_length, E, "F32", 0.5)
    vector("token_embd_norm.weight", E, 1.0)
    vector("token_embd_norm.bias", E)
    s = 1.0 / np.sqrt(E)
    for i in range(n_layer):
        p = f"blk.{i}."
        if arch == "nomic-bert":
            matrix(p + "attn_qkv.weight", 3 * E, E, qtype, s)
        else:
            for x in "qkv":
                matrix(p + f"attn_{x}.weight", E, E, qtype, s)
                vector(p + f"attn_{x}.bias", E)
        matrix(p + "attn_output.weight", E, E, qtype, s)
        if arch == "bert":
            vector(p + "attn_output.bias", E)
        vector(p + "attn_output_norm.weight", E, 1.0)
        vector(p + "attn_output_norm.bias", E)
        matrix(p + "ffn_up.weight", F, E, qtype, s)
        if arch == "nomic-bert":
            matrix(p + "ffn_gate.weight", F, E, qtype, s)
        else:
            vector(p + "ffn_up.bias", F)
        matrix(p + "ffn_down.weight", E, F, qtype, 1.0 / np.sqrt(F))
        if arch == "bert":
            vector(p + "ffn_down.bias", E)
        vector(p + "layer_output_norm.weight", E, 1.0)
        vector(p + "layer_output_norm.bias", E)
    if rank_head in ("full", "dense"):
        matrix("cls.weight", E, E, "F32", s)
        vector("cls.bias", E)
    if rank_head in ("full", "out"):
        matrix("cls.output.weight", n_labels, E, "F32", 1.0)
        vector("cls.output.bias", n_labels)
    if rank_head is not None:
        w.add_array(f"{arch}.classifier.output_labels", [f"LABEL_{i}" for i in range(n_labels)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ---- hybrid models: recurrent layers beside attention (issue 51) ----

HYBRID_ARCHS = ("lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen3next", "mamba2", "granitehybrid", "nemotron_h")


@dataclass
class HybridConfig:
    """A tiny hybrid model, its tensors named and shaped as llama.cpp reads
    the architecture (src/models/<arch>.cpp there) and its 1-D and
    convolution tensors F32 as llama.cpp's converter keeps them. Sizes are
    multiples of 256 wherever a matrix's row length is, so K-quants work."""

    arch: str = "qwen35"
    qtype: str = "Q8_0"           # the matrices
    embd_qtype: str = "Q8_0"
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64            # qwen35: attention.key_length; lfm2: n_embd / n_head
    n_ff: int = 512
    tie_output: bool = True
    rope_base: float = 10000.0
    context_length: int = 512
    seed: int = 0
    eps: float = 1e-6
    # lfm2, granitehybrid, nemotron_h: each layer's kind, "A" attention, "R" recurrent (lfm2's short
    # convolution, Mamba2 elsewhere), "F" a feed-forward alone (nemotron_h); "" the arch's default
    layout: str = ""
    l_cache: int = 3              # lfm2: shortconv.l_cache, the convolution's taps
    # qwen35 / qwen35moe: Gated DeltaNet layers, attention every full_attention_interval-th
    full_attention_interval: int = 2
    recurrent_array: bool = False  # write attention.recurrent_layers instead of the interval
    n_rot: int = 16               # partial RoPE (Qwen3.5: a quarter of the head)
    rope_sections: tuple = (3, 3, 2, 0)  # interleaved MRoPE sections over n_rot / 2 pairs
    d_conv: int = 4               # ssm.conv_kernel
    d_state: int = 64             # ssm.state_size: the key (and value) head size
    n_group: int = 2              # ssm.group_count: key heads
    n_v_head: int = 4             # ssm.time_step_rank: value heads; d_inner = n_v_head * d_state
    # qwen35moe
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 256
    n_ff_shexp: int = 256         # 0: no shared expert (llama.cpp requires one)
    n_nextn: int = 0              # qwen35: multi-token-prediction blocks after the n_layer trunk
    n_dense_lead: int = 1         # lfm2moe: leading layers with a dense feed-forward
    # Mamba2 layers (mamba2, granitehybrid, nemotron_h): heads of mamba_inner / mamba_heads channels,
    # n_group groups of B and C of d_state each; d_conv taps over the x, B and C channels
    mamba_heads: int = 8
    mamba_inner: int = 512        # granitehybrid: 2 * n_embd, as llama.cpp requires
    mamba_state: int = 32
    # granitehybrid with experts (Granite 4.0-H Tiny / Small): routed experts n_ff wide in place of
    # every feed-forward (n_expert, n_expert_used), and an ungated shared expert n_ff_shexp wide
    granite_moe: bool = False
    # granitehybrid's multipliers (0: absent)
    embedding_scale: float = 3.0
    residual_scale: float = 0.5
    attention_scale: float = 0.1
    logit_scale: float = 2.5
    pre: str = "default"


MAMBA2_ARCHS = ("mamba2", "granitehybrid", "nemotron_h")
DEFAULT_LAYOUTS = {"lfm2": "RARA", "lfm2moe": "RARA", "mamba2": "RRRR", "granitehybrid": "RARR", "nemotron_h": "RFAR"}


def hybrid_layout(cfg: HybridConfig) -> str:
    """Each layer's kind: "A" attention, "R" recurrent, "F" feed-forward alone."""
    if cfg.arch in DEFAULT_LAYOUTS:
        layout = cfg.layout or DEFAULT_LAYOUTS[cfg.arch]
        assert len(layout) == cfg.n_layer, (layout, cfg.n_layer)
        return layout
    k = cfg.full_attention_interval
    return "".join("A" if (i + 1) % k == 0 else "R" for i in range(cfg.n_layer))


def write_hybrid(path, cfg: HybridConfig, tensor_hook=None, meta=None, extra_tokens=None) -> str:
    """Write a tiny random file of one of HYBRID_ARCHS; tensor_hook and
    extra_tokens as write_model's; meta: metadata keys to replace (a value)
    or leave out (None)."""
    rng = np.random.default_rng(cfg.seed)
    tokens, types = vocab()
    if extra_tokens:
        tokens = tokens[:-2] + list(extra_tokens) + tokens[-2:]
        types = types[:-2] + list(extra_tokens.values()) + types[-2:]
    n_vocab = len(tokens)
    arch = cfg.arch
    kinds = hybrid_layout(cfg) + "A" * cfg.n_nextn
    E, F, hd = cfg.n_embd, cfg.n_ff, cfg.head_dim
    kv = {}  # key: value (int: uint32, float: float32, list: array, str, bool)
    kv[f"{arch}.block_count"] = cfg.n_layer + cfg.n_nextn
    kv[f"{arch}.context_length"] = cfg.context_length
    kv[f"{arch}.embedding_length"] = E
    kv[f"{arch}.feed_forward_length"] = F
    kv[f"{arch}.attention.head_count"] = cfg.n_head
    kv[f"{arch}.attention.layer_norm_rms_epsilon"] = float(cfg.eps)
    kv[f"{arch}.rope.freq_base"] = float(cfg.rope_base)
    kv[f"{arch}.vocab_size"] = n_vocab
    if arch in ("lfm2", "lfm2moe"):
        # per layer: 0 KV heads marks a convolution layer (llama.cpp's converter)
        kv[f"{arch}.attention.head_count_kv"] = [cfg.n_head_kv if k == "A" else 0 for k in kinds]
        kv[f"{arch}.shortconv.l_cache"] = cfg.l_cache
        assert hd * cfg.n_head == E
    elif arch in MAMBA2_ARCHS:
        kv[f"{arch}.ssm.conv_kernel"] = cfg.d_conv
        kv[f"{arch}.ssm.state_size"] = cfg.mamba_state
        kv[f"{arch}.ssm.group_count"] = cfg.n_group
        kv[f"{arch}.ssm.time_step_rank"] = cfg.mamba_heads
        kv[f"{arch}.ssm.inner_size"] = cfg.mamba_inner
        if arch == "mamba2":  # no attention, no feed-forward (llama.cpp's converter writes 0s)
            kv[f"{arch}.attention.head_count"] = 0
            kv[f"{arch}.feed_forward_length"] = 0
        else:  # per layer: 0 KV heads (and, in nemotron_h, 0 feed-forward) marks a Mamba2 layer
            kv[f"{arch}.attention.head_count_kv"] = [cfg.n_head_kv if k == "A" else 0 for k in kinds]
            kv[f"{arch}.attention.key_length"] = hd
            kv[f"{arch}.attention.value_length"] = hd
        if arch == "nemotron_h":
            kv[f"{arch}.feed_forward_length"] = [F if k == "F" else 0 for k in kinds]
            kv[f"{arch}.attention.layer_norm_epsilon"] = float(cfg.eps)
        if arch == "granitehybrid":
            kv[f"{arch}.rope.scaling.finetuned"] = False  # Granite 4.0-H: no RoPE
            if cfg.granite_moe:
                kv[f"{arch}.expert_count"] = cfg.n_expert
                kv[f"{arch}.expert_used_count"] = cfg.n_expert_used
                if cfg.n_ff_shexp:
                    kv[f"{arch}.expert_shared_feed_forward_length"] = cfg.n_ff_shexp
            for key in ("embedding_scale", "residual_scale", "attention_scale", "logit_scale"):
                if getattr(cfg, key):
                    kv[f"{arch}.{key.replace('attention_', 'attention.')}"] = float(getattr(cfg, key))
    else:
        kv[f"{arch}.attention.head_count_kv"] = cfg.n_head_kv
        kv[f"{arch}.attention.key_length"] = hd
        kv[f"{arch}.attention.value_length"] = hd
        kv[f"{arch}.rope.dimension_count"] = cfg.n_rot
        if arch != "qwen3next":  # qwen3next: plain NeoX RoPE
            kv[f"{arch}.rope.dimension_sections"] = list(cfg.rope_sections)
        kv[f"{arch}.ssm.conv_kernel"] = cfg.d_conv
        kv[f"{arch}.ssm.state_size"] = cfg.d_state
        kv[f"{arch}.ssm.group_count"] = cfg.n_group
        kv[f"{arch}.ssm.time_step_rank"] = cfg.n_v_head
        kv[f"{arch}.ssm.inner_size"] = cfg.n_v_head * cfg.d_state
        if cfg.recurrent_array:
            kv[f"{arch}.attention.recurrent_layers"] = [k == "R" for k in kinds]
        else:
            kv[f"{arch}.full_attention_interval"] = cfg.full_attention_interval
        if cfg.n_nextn:
            kv[f"{arch}.nextn_predict_layers"] = cfg.n_nextn
    if arch == "lfm2moe":  # sigmoid router with a selection bias, after dense leading layers
        kv[f"{arch}.expert_count"] = cfg.n_expert
        kv[f"{arch}.expert_used_count"] = cfg.n_expert_used
        kv[f"{arch}.expert_feed_forward_length"] = cfg.n_ff_exp
        kv[f"{arch}.leading_dense_block_count"] = cfg.n_dense_lead
        kv[f"{arch}.expert_gating_func"] = 2  # gguf.ExpertGatingFuncType.SIGMOID
    if arch in ("qwen35moe", "qwen3next"):
        kv[f"{arch}.expert_count"] = cfg.n_expert
        kv[f"{arch}.expert_used_count"] = cfg.n_expert_used
        kv[f"{arch}.expert_feed_forward_length"] = cfg.n_ff_exp
        if cfg.n_ff_shexp:
            kv[f"{arch}.expert_shared_feed_forward_length"] = cfg.n_ff_shexp
    kv["tokenizer.ggml.model"] = "gpt2"
    kv["tokenizer.ggml.pre"] = cfg.pre
    kv["tokenizer.ggml.tokens"] = tokens
    kv["tokenizer.ggml.token_type"] = types
    kv["tokenizer.ggml.merges"] = MERGES
    kv["tokenizer.ggml.bos_token_id"] = n_vocab - 2
    kv["tokenizer.ggml.eos_token_id"] = n_vocab - 1
    kv["tokenizer.ggml.add_bos_token"] = True
    kv.update(meta or {})
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, qtype=None, scale=None, n_expert=0):
        n = max(n_expert, 1)
        scale = 1.0 / np.sqrt(k) if scale is None else scale
        data = (rng.standard_normal((n * rows, k)) * scale).astype(np.float32)
        t = gguf.GGMLQuantizationType[qtype or cfg.qtype]
        q = quantized_matrix(rng, data, t)
        add(name, q.reshape(n, rows, -1) if n_expert else q, t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, dtype=np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, n, around=1.0, spread=0.1):
        f32(name, around + rng.standard_normal(n) * spread)

    matrix("token_embd.weight", n_vocab, E, cfg.embd_qtype, 1.0)
    # lfm2's final norm is stored as token_embd_norm (llama-arch.cpp, LLM_TENSOR_OUTPUT_NORM_LFM2)
    vector("token_embd_norm.weight" if arch in ("lfm2", "lfm2moe") else "output_norm.weight", E)
    if not cfg.tie_output:
        matrix("output.weight", n_vocab, E)
    dk, nk, nv = cfg.d_state, cfg.n_group, cfg.n_v_head
    d_inner = nv * dk
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", E)
        qwen = arch in ("qwen35", "qwen35moe", "qwen3next")
        if qwen:  # the feed-forward's pre-norm, named post_attention_norm
            vector(p + "post_attention_norm.weight", E)
        elif arch in ("lfm2", "lfm2moe", "granitehybrid"):
            vector(p + "ffn_norm.weight", E)
        if kind == "A":
            matrix(p + "attn_q.weight", cfg.n_head * hd * (2 if qwen else 1), E)  # qwen35: queries and gate
            matrix(p + "attn_k.weight", cfg.n_head_kv * hd, E)
            matrix(p + "attn_v.weight", cfg.n_head_kv * hd, E)
            matrix(p + "attn_output.weight", E, cfg.n_head * hd)
            if arch in ("lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen3next"):
                vector(p + "attn_q_norm.weight", hd)
                vector(p + "attn_k_norm.weight", hd)
        elif kind == "F":
            pass
        elif arch in ("lfm2", "lfm2moe"):
            f32(p + "shortconv.conv.weight", rng.standard_normal((E, cfg.l_cache)) * 0.5)
            matrix(p + "shortconv.in_proj.weight", 3 * E, E)
            matrix(p + "shortconv.out_proj.weight", E, E)
        elif arch in MAMBA2_ARCHS:
            di, nh, ng, ds = cfg.mamba_inner, cfg.mamba_heads, cfg.n_group, cfg.mamba_state
            channels = di + 2 * ng * ds
            matrix(p + "ssm_in.weight", 2 * di + 2 * ng * ds + nh, E)  # z, x, B, C, dt
            f32(p + "ssm_conv1d.weight", rng.standard_normal((channels, cfg.d_conv)) * 0.5)
            vector(p + "ssm_conv1d.bias", channels, 0.0, 0.1)
            vector(p + "ssm_dt.bias", nh, 0.0, 0.5)
            f32(p + "ssm_a", -np.exp(rng.uniform(0.0, 1.5, (nh, 1))))  # -exp(A_log), {1, n_head}
            f32(p + "ssm_d", 1.0 + rng.standard_normal((nh, 1)) * 0.1)
            f32(p + "ssm_norm.weight", 1.0 + rng.standard_normal((ng, di // ng)) * 0.1)
            matrix(p + "ssm_out.weight", E, di)
        else:
            channels = 2 * nk * dk + d_inner
            matrix(p + "attn_qkv.weight", channels, E)
            matrix(p + "attn_gate.weight", d_inner, E)
            if arch == "qwen3next":  # beta and alpha in one: per key head, its value heads' betas then alphas
                matrix(p + "ssm_ba.weight", 2 * nv, E)
            else:
                matrix(p + "ssm_beta.weight", nv, E)
                matrix(p + "ssm_alpha.weight", nv, E)
            f32(p + "ssm_conv1d.weight", rng.standard_normal((channels, cfg.d_conv)) * 0.5)
            vector(p + "ssm_dt.bias", nv, 0.0, 0.5)
            f32(p + "ssm_a", -np.exp(rng.uniform(-1.0, 1.0, nv)))  # -exp(A_log), as the converter stores it
            vector(p + "ssm_norm.weight", dk)
            matrix(p + "ssm_out.weight", E, d_inner)
        if arch == "lfm2moe" and i >= cfg.n_dense_lead:
            ne, Fe = cfg.n_expert, cfg.n_ff_exp
            matrix(p + "ffn_gate_inp.weight", ne, E, "F32")
            matrix(p + "ffn_gate_exps.weight", Fe, E, n_expert=ne)
            matrix(p + "ffn_up_exps.weight", Fe, E, n_expert=ne)
            matrix(p + "ffn_down_exps.weight", E, Fe, n_expert=ne)
            vector(p + "exp_probs_b.bias", ne, 0.0, 0.5)
        elif arch == "granitehybrid" and cfg.granite_moe:
            ne = cfg.n_expert
            matrix(p + "ffn_gate_inp.weight", ne, E, "F32")
            matrix(p + "ffn_gate_exps.weight", F, E, n_expert=ne)
            matrix(p + "ffn_up_exps.weight", F, E, n_expert=ne)
            matrix(p + "ffn_down_exps.weight", E, F, n_expert=ne)
            if cfg.n_ff_shexp:
                matrix(p + "ffn_gate_shexp.weight", cfg.n_ff_shexp, E)
                matrix(p + "ffn_up_shexp.weight", cfg.n_ff_shexp, E)
                matrix(p + "ffn_down_shexp.weight", E, cfg.n_ff_shexp)
        elif arch in ("qwen35moe", "qwen3next"):
            ne, Fe = cfg.n_expert, cfg.n_ff_exp
            matrix(p + "ffn_gate_inp.weight", ne, E, "F32")
            matrix(p + "ffn_gate_exps.weight", Fe, E, n_expert=ne)
            matrix(p + "ffn_up_exps.weight", Fe, E, n_expert=ne)
            matrix(p + "ffn_down_exps.weight", E, Fe, n_expert=ne)
            if cfg.n_ff_shexp:
                Fs = cfg.n_ff_shexp
                vector(p + "ffn_gate_inp_shexp.weight", E, 0.0, 1.0 / np.sqrt(E))
                matrix(p + "ffn_gate_shexp.weight", Fs, E)
                matrix(p + "ffn_up_shexp.weight", Fs, E)
                matrix(p + "ffn_down_shexp.weight", E, Fs)
        elif arch == "nemotron_h":
            if kind == "F":  # squared-ReLU feed-forward without a gate
                matrix(p + "ffn_up.weight", F, E)
                matrix(p + "ffn_down.weight", E, F)
        elif arch != "mamba2":
            matrix(p + "ffn_gate.weight", F, E)
            matrix(p + "ffn_up.weight", F, E)
            matrix(p + "ffn_down.weight", E, F)
        if i >= cfg.n_layer:  # a multi-token-prediction block's own tensors
            matrix(p + "nextn.eh_proj.weight", E, 2 * E)
            vector(p + "nextn.enorm.weight", E)
            vector(p + "nextn.hnorm.weight", E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ---- gpt-oss (issue 52) ----

@dataclass
class GptOssConfig:
    """A tiny gpt-oss, its tensors named and shaped as llama.cpp's
    src/models/openai-moe.cpp reads them (1-D tensors and biases F32, the
    router F32 as llama-quantize leaves it). Layers alternate between a
    sliding window (even layers) and the whole context."""

    qtype: str = "F32"            # attention and the output head
    expert_qtype: str = "F32"     # ffn_{gate,up,down}_exps (the released files: MXFP4)
    embd_qtype: str = "F32"
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 128
    sliding_window: int = 8
    swa_pattern: int = 0          # > 0: written as attention.sliding_window_pattern (llama.cpp's default is 2)
    rope_base: float = 150000.0
    yarn_factor: float = 4.0      # 0: no rope.scaling keys
    yarn_orig_ctx: int = 16
    context_length: int = 512
    tie_output: bool = False
    sink_spread: float = 1.0      # the sinks' spread around 0 (0.0: every sink 0, but still there)
    bias_spread: float = 0.3
    gate_scale: float = 3.0       # gate/up weights this many times 1/sqrt(k): values reach the clamps at 7
    down_scale: float = 1.0       # down weights this many times 1/sqrt(k)
    router_scale: float = 2.0     # router weights this many times 1/sqrt(k)
    seed: int = 0
    eps: float = 1e-5
    pre: str = "default"


def write_gpt_oss(path, cfg: GptOssConfig, tensor_hook=None, meta=None) -> str:
    """Write a tiny random `gpt-oss` file; tensor_hook as write_model's,
    meta: metadata keys to replace (a value) or leave out (None)."""
    rng = np.random.default_rng(cfg.seed)
    tokens, types = vocab()
    n_vocab = len(tokens)
    arch = "gpt-oss"
    E, H, hd, ne, Fe = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_expert, cfg.n_ff_exp
    kv = {
        f"{arch}.block_count": cfg.n_layer,
        f"{arch}.context_length": cfg.context_length,
        f"{arch}.embedding_length": E,
        f"{arch}.feed_forward_length": Fe,
        f"{arch}.expert_feed_forward_length": Fe,
        f"{arch}.expert_count": ne,
        f"{arch}.expert_used_count": cfg.n_expert_used,
        f"{arch}.attention.head_count": H,
        f"{arch}.attention.head_count_kv": cfg.n_head_kv,
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.eps),
        f"{arch}.attention.sliding_window": cfg.sliding_window,
        f"{arch}.rope.freq_base": float(cfg.rope_base),
        f"{arch}.rope.dimension_count": hd,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": cfg.pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": n_vocab - 2,
        "tokenizer.ggml.eos_token_id": n_vocab - 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    if cfg.swa_pattern:
        kv[f"{arch}.attention.sliding_window_pattern"] = cfg.swa_pattern
    if cfg.yarn_factor > 0:
        kv[f"{arch}.rope.scaling.type"] = "yarn"
        kv[f"{arch}.rope.scaling.factor"] = float(cfg.yarn_factor)
        kv[f"{arch}.rope.scaling.original_context_length"] = cfg.yarn_orig_ctx
    kv.update(meta or {})
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, qtype, scale=1.0, n_expert=0):
        n = max(n_expert, 1)
        data = (rng.standard_normal((n * rows, k)) * scale / np.sqrt(k)).astype(np.float32)
        t = gguf.GGMLQuantizationType[qtype]
        q = quantized_matrix(rng, data, t)
        add(name, q.reshape(n, rows, -1) if n_expert else q, t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, dtype=np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, shape, around=1.0, spread=0.1):
        f32(name, around + rng.standard_normal(shape) * spread)

    matrix("token_embd.weight", n_vocab, E, cfg.embd_qtype, np.sqrt(E))
    vector("output_norm.weight", E)
    if not cfg.tie_output:
        matrix("output.weight", n_vocab, E, cfg.qtype)
    nq, nkv = H * hd, cfg.n_head_kv * hd
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", E)
        vector(p + "post_attention_norm.weight", E)
        matrix(p + "attn_q.weight", nq, E, cfg.qtype)
        matrix(p + "attn_k.weight", nkv, E, cfg.qtype)
        matrix(p + "attn_v.weight", nkv, E, cfg.qtype)
        vector(p + "attn_q.bias", nq, 0.0, cfg.bias_spread)
        vector(p + "attn_k.bias", nkv, 0.0, cfg.bias_spread)
        vector(p + "attn_v.bias", nkv, 0.0, cfg.bias_spread)
        matrix(p + "attn_output.weight", E, nq, cfg.qtype)
        vector(p + "attn_output.bias", E, 0.0, cfg.bias_spread)
        vector(p + "attn_sinks.weight", H, 0.0, cfg.sink_spread)
        matrix(p + "ffn_gate_inp.weight", ne, E, "F32", cfg.router_scale)
        vector(p + "ffn_gate_inp.bias", ne, 0.0, cfg.bias_spread)
        matrix(p + "ffn_gate_exps.weight", Fe, E, cfg.expert_qtype, cfg.gate_scale, n_expert=ne)
        matrix(p + "ffn_up_exps.weight", Fe, E, cfg.expert_qtype, cfg.gate_scale, n_expert=ne)
        matrix(p + "ffn_down_exps.weight", E, Fe, cfg.expert_qtype, cfg.down_scale, n_expert=ne)
        vector(p + "ffn_gate_exps.bias", (ne, Fe), 0.0, cfg.bias_spread)
        vector(p + "ffn_up_exps.bias", (ne, Fe), 0.0, cfg.bias_spread)
        vector(p + "ffn_down_exps.bias", (ne, E), 0.0, cfg.bias_spread)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ---- a decoder reranker (Qwen3-Reranker, as convert_hf_to_gguf.py writes it) ----

QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: "
    "Given a web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n"
    "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def write_decoder_reranker(path, qtype="F32", seed=11, rank=True) -> str:
    """A tiny random qwen3 reranker: pooling_type 4, the rerank prompt in
    tokenizer.chat_template.rerank, cls.output.weight [2, n_embd] (the "yes"
    and "no" rows; random here) and the labels; rank=False: the same model
    without them (not a reranker)."""
    cfg = TinyConfig(arch="qwen3", qtype=qtype, embd_qtype=qtype, pre="qwen2", seed=seed)
    specials = {"<|im_start|>": 3, "<|im_end|>": 3}
    if not rank:
        return write_model(path, cfg, extra_tokens=specials)
    return write_model(path, cfg, extra_uint32={"qwen3.pooling_type": 4},
                       extra_strings={"tokenizer.chat_template.rerank": QWEN3_RERANK_TEMPLATE},
                       extra_tokens=specials, extra_arrays={"qwen3.classifier.output_labels": ["yes", "no"]},
                       extra_tensors={"cls.output.weight":
                                      lambda rng, E, V: rng.standard_normal((2, E)) * (2.0 / np.sqrt(E))})


# ---- mmproj files (llminfer.vision) ----

@dataclass
class TinyMmproj:
    projector: str = "gemma3"
    qtype: str = "F16"            # the ViT's and projector's matrices (F32, F16, BF16, Q8_0)
    image_size: int = 56
    patch_size: int = 14
    n_embd: int = 64
    n_ff: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_merge: int = 2              # 4 x 4 patches pooled to 2 x 2 tokens
    n_embd_text: int = 256        # the text model's width (TinyConfig.n_embd)
    eps: float = 1e-6
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    swap_ffn: bool = False        # old conversions: up and down under each other's names
    seed: int = 7
    longest_edge: int = 112       # idefics3: clip.vision.preproc_image_size (112: up to 2 x 2 tiles of 56)
    n_ff_proj: int = 96           # lfm2: the projector MLP's width (mm.1)
    input_norm: bool = True       # lfm2: mm.input_norm.weight and .bias (optional in llama.cpp)


# LFM2-VL's shape, small: 16-pixel patches merged 2 x 2 (cells of 32: tiles of 512 are 16 x 16
# cells), an 8 x 8 position table that each image resizes (the real one is 16 x 16)
LFM2_MMPROJ = dict(projector="lfm2", image_size=128, patch_size=16, n_embd=32, n_ff=64, n_head=2)


def write_mmproj(path, cfg: TinyMmproj = TinyMmproj(), tensor_hook=None, meta=None) -> str:
    """A random Gemma 3-style (or, with projector "idefics3", SmolVLM-style;
    "lfm2", LFM2-VL-style: TinyMmproj(**LFM2_MMPROJ)) vision tower as
    llama.cpp's converter writes one (clip.* metadata, v.*
    and mm.* tensors); meta: keys to add or
    replace ({key: value}, strings, floats, ints, bools)."""
    rng = np.random.default_rng(cfg.seed)
    w = gguf.GGUFWriter(str(path), "clip")
    kv = {
        "clip.projector_type": cfg.projector, "clip.has_vision_encoder": True, "clip.use_gelu": True,
        "clip.vision.image_size": cfg.image_size, "clip.vision.patch_size": cfg.patch_size,
        "clip.vision.embedding_length": cfg.n_embd, "clip.vision.feed_forward_length": cfg.n_ff,
        "clip.vision.block_count": cfg.n_layer, "clip.vision.attention.head_count": cfg.n_head,
        "clip.vision.attention.layer_norm_epsilon": cfg.eps, "clip.vision.projection_dim": cfg.n_embd_text,
        "clip.vision.projector.scale_factor": cfg.n_merge,
        "clip.vision.image_mean": list(cfg.mean), "clip.vision.image_std": list(cfg.std),
    }
    if cfg.projector == "idefics3":
        kv["clip.vision.preproc_image_size"] = cfg.longest_edge
    kv.update(meta or {})
    add_keys(w, kv)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, scale, qtype=None):
        t = gguf.GGMLQuantizationType[qtype or cfg.qtype]
        if k % gguf.GGML_QUANT_SIZES[t][0]:
            # rows that are no whole number of blocks (SigLIP-400M's 4304-wide
            # ffn_down in Q8_0): F16, as convert_hf_to_gguf falls back
            t = gguf.GGMLQuantizationType.F16
        data = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        add(name, quantized_matrix(rng, data, t), t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, n, around=0.0, spread=0.1):
        f32(name, around + rng.standard_normal(n) * spread)

    E, F, ps = cfg.n_embd, cfg.n_ff, cfg.patch_size
    grid = cfg.image_size // ps
    patch = (rng.standard_normal((E, 3, ps, ps)) / np.sqrt(3 * ps * ps)).astype(np.float16)
    add("v.patch_embd.weight", patch, gguf.GGMLQuantizationType.F16)  # conv kernels stay F16, as converted
    vector("v.patch_embd.bias", E)
    f32("v.position_embd.weight", rng.standard_normal((grid * grid, E)) * 0.5)
    for i in range(cfg.n_layer):
        p = f"v.blk.{i}."
        vector(p + "ln1.weight", E, 1.0)
        vector(p + "ln1.bias", E)
        vector(p + "ln2.weight", E, 1.0)
        vector(p + "ln2.bias", E)
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            matrix(p + m + ".weight", E, E, 1.0 / np.sqrt(E))
            vector(p + m + ".bias", E)
        up, down = ("ffn_down", "ffn_up") if cfg.swap_ffn else ("ffn_up", "ffn_down")
        matrix(p + up + ".weight", F, E, 1.0 / np.sqrt(E))
        vector(p + up + ".bias", F)
        matrix(p + down + ".weight", E, F, 1.0 / np.sqrt(F))
        vector(p + down + ".bias", E)
    vector("v.post_ln.weight", E, 1.0)
    vector("v.post_ln.bias", E)
    if cfg.projector == "idefics3":
        # pixel-shuffled rows [n, s*s*E] @ W.T, W [n_embd_text, s*s*E]
        k = E * cfg.n_merge * cfg.n_merge
        matrix("mm.model.fc.weight", cfg.n_embd_text, k, 1.0 / np.sqrt(k))
    elif cfg.projector == "lfm2":
        # unshuffled rows [n, s*s*E]: layer norm, mm.2(gelu(mm.1 x))
        k = E * cfg.n_merge * cfg.n_merge
        if cfg.input_norm:
            vector("mm.input_norm.weight", k, 1.0)
            vector("mm.input_norm.bias", k)
        matrix("mm.1.weight", cfg.n_ff_proj, k, 1.0 / np.sqrt(k))
        vector("mm.1.bias", cfg.n_ff_proj)
        matrix("mm.2.weight", cfg.n_embd_text, cfg.n_ff_proj, 1.0 / np.sqrt(cfg.n_ff_proj))
        vector("mm.2.bias", cfg.n_embd_text)
    else:
        vector("mm.soft_emb_norm.weight", E, 1.0)
        # stored [E, n_embd_text] (ggml ne [n_embd_text, E]): the encoder's x @ W
        f32("mm.input_projection.weight", rng.standard_normal((E, cfg.n_embd_text)) / np.sqrt(E))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@dataclass
class TinyGemma4v:
    """A tiny Gemma 4 vision tower (clip.projector_type "gemma4v") as
    llama.cpp's converter writes one: 2-D position tables, RMS norms, per-head
    q/k norms, post norms, a gated feed-forward, a layer scalar, the
    std_bias/std_scale pair and one projection. Cells of patch_size *
    n_merge pixels (8): an image becomes 70 to 1120 of them. clamp: the
    first layer's attn_q and the projection clamp their inputs and outputs
    (Gemma4ClippableLinear's scalars)."""

    qtype: str = "F16"
    patch_size: int = 4
    n_merge: int = 2
    n_embd: int = 64
    n_ff: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_pos: int = 128              # positions of each table (patches a side)
    n_embd_text: int = 256        # Gemma4Config.n_embd
    eps: float = 1e-6
    mean: tuple = (0.1, 0.2, 0.3)
    std: tuple = (0.9, 0.8, 0.7)
    use_gelu: bool = False        # llama.cpp's converter writes no clip.use_gelu for Gemma 4: gelu_quick
    clamp: bool = False
    seed: int = 11


def write_gemma4v_mmproj(path, cfg: TinyGemma4v = TinyGemma4v(), tensor_hook=None, meta=None) -> str:
    """A random gemma4v mmproj (see TinyGemma4v); tensor_hook and meta as write_mmproj's."""
    rng = np.random.default_rng(cfg.seed)
    w = gguf.GGUFWriter(str(path), "clip")
    E, F, ps, D = cfg.n_embd, cfg.n_ff, cfg.patch_size, cfg.n_embd // cfg.n_head
    kv = {
        "clip.projector_type": "gemma4v", "clip.has_vision_encoder": True,
        "clip.vision.image_size": 224, "clip.vision.patch_size": ps,
        "clip.vision.embedding_length": E, "clip.vision.feed_forward_length": F,
        "clip.vision.block_count": cfg.n_layer, "clip.vision.attention.head_count": cfg.n_head,
        "clip.vision.attention.layer_norm_epsilon": cfg.eps, "clip.vision.projection_dim": cfg.n_embd_text,
        "clip.vision.projector.scale_factor": cfg.n_merge,
        "clip.vision.image_mean": list(cfg.mean), "clip.vision.image_std": list(cfg.std),
    }
    if cfg.use_gelu:
        kv["clip.use_gelu"] = True
    kv.update(meta or {})
    add_keys(w, kv)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, scale):
        t = gguf.GGMLQuantizationType[cfg.qtype]
        data = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        add(name, quantized_matrix(rng, data, t), t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, n, around=0.0, spread=0.1):
        f32(name, around + rng.standard_normal(n) * spread)

    def clamps(name, lo, hi):
        for key, v in (("input_min", -lo), ("input_max", lo), ("output_min", -hi), ("output_max", hi)):
            f32(f"{name}.{key}", [v])

    patch = (rng.standard_normal((E, 3, ps, ps)) / np.sqrt(3 * ps * ps)).astype(np.float16)
    add("v.patch_embd.weight", patch, gguf.GGMLQuantizationType.F16)
    f32("v.position_embd.weight", rng.standard_normal((2, cfg.n_pos, E)) * 0.5)
    for i in range(cfg.n_layer):
        p = f"v.blk.{i}."
        vector(p + "ln1.weight", E, 1.0)
        vector(p + "ln2.weight", E, 1.0)
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            matrix(p + m + ".weight", E, E, 1.0 / np.sqrt(E))
        # q and k normed per head: scores of a few units (the attention is not scaled)
        vector(p + "attn_q_norm.weight", D, 0.5)
        vector(p + "attn_k_norm.weight", D, 0.5)
        vector(p + "attn_post_norm.weight", E, 1.0)
        matrix(p + "ffn_gate.weight", F, E, 2.0 / np.sqrt(E))
        matrix(p + "ffn_up.weight", F, E, 1.0 / np.sqrt(E))
        matrix(p + "ffn_down.weight", E, F, 1.0 / np.sqrt(F))
        vector(p + "ffn_post_norm.weight", E, 1.0)
        vector(p + "out_scale.weight", 1, 0.9, 0.1)
        if cfg.clamp and i == 0:
            clamps(p + "attn_q", 2.5, 2.5)
    vector("v.std_bias", E)
    vector("v.std_scale", E, 1.0)
    # ggml ne [E, n_embd_text]: numpy (n_embd_text, E), the encoder's x @ W.T
    matrix("mm.input_projection.weight", cfg.n_embd_text, E, 1.0 / np.sqrt(E))
    if cfg.clamp:
        clamps("mm.input_projection", 3.0, 2.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@dataclass
class TinyQwen25vl:
    """A tiny Qwen2.5-VL vision tower (clip.projector_type
    "qwen2.5vl_merger") as llama.cpp's converter writes one: the 3-D conv's
    two temporal slices (v.patch_embd.weight, .weight.1), RMS norms with
    weights only, biased q/k/v/out, a SiLU-gated feed-forward with biases,
    post_ln (the merger's ln_q), and the merger's MLP mm.0 / mm.2. Real
    patch size (14), so that windows of 112 pixels are 4 x 4 cells: an
    image of a few hundred pixels a side has several, some cut short.
    wa_pattern 2: layers 1, 3, .. attend to the whole image, the others
    within windows."""

    qtype: str = "F16"
    patch_size: int = 14
    n_embd: int = 64
    n_ff: int = 96
    n_layer: int = 3
    n_head: int = 4
    n_embd_text: int = 256        # the text model's width (TinyConfig.n_embd)
    wa_pattern: int = 2
    eps: float = 1e-6
    mean: tuple = (0.48, 0.46, 0.41)
    std: tuple = (0.27, 0.26, 0.28)
    seed: int = 13
    # "qwen2vl_merger": Qwen2-VL's tower instead (LayerNorms with biases, an ungated
    # gelu_quick feed-forward, no windows: neither clip.use_silu nor n_wa_pattern)
    projector: str = "qwen2.5vl_merger"


def write_qwen25vl_mmproj(path, cfg: TinyQwen25vl = TinyQwen25vl(), tensor_hook=None, meta=None) -> str:
    """A random qwen2.5vl_merger mmproj (see TinyQwen25vl); tensor_hook and meta as write_mmproj's."""
    rng = np.random.default_rng(cfg.seed)
    w = gguf.GGUFWriter(str(path), "clip")
    E, F, ps = cfg.n_embd, cfg.n_ff, cfg.patch_size
    v2 = cfg.projector == "qwen2vl_merger"
    kv = {
        "clip.projector_type": cfg.projector, "clip.has_vision_encoder": True,
        "clip.vision.image_size": 560, "clip.vision.patch_size": ps,
        "clip.vision.embedding_length": E, "clip.vision.feed_forward_length": F,
        "clip.vision.block_count": cfg.n_layer, "clip.vision.attention.head_count": cfg.n_head,
        "clip.vision.attention.layer_norm_epsilon": cfg.eps, "clip.vision.projection_dim": cfg.n_embd_text,
        "clip.vision.image_mean": list(cfg.mean), "clip.vision.image_std": list(cfg.std),
    }
    if not v2:
        kv.update({"clip.use_silu": True, "clip.vision.n_wa_pattern": cfg.wa_pattern})
    kv.update(meta or {})
    add_keys(w, kv)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, scale):
        t = gguf.GGMLQuantizationType[cfg.qtype]
        if k % gguf.GGML_QUANT_SIZES[t][0]:  # Qwen2.5-VL-7B's 3420-wide ffn_down in Q8_0: F16, as converted
            t = gguf.GGMLQuantizationType.F16
        data = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        add(name, quantized_matrix(rng, data, t), t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, n, around=0.0, spread=0.1):
        f32(name, around + rng.standard_normal(n) * spread)

    for j in ("", ".1"):  # conv kernels stay F16, as converted
        patch = (rng.standard_normal((E, 3, ps, ps)) / np.sqrt(2 * 3 * ps * ps)).astype(np.float16)
        add("v.patch_embd.weight" + j, patch, gguf.GGMLQuantizationType.F16)
    for i in range(cfg.n_layer):
        p = f"v.blk.{i}."
        vector(p + "ln1.weight", E, 1.0)
        vector(p + "ln2.weight", E, 1.0)
        if v2:
            vector(p + "ln1.bias", E)
            vector(p + "ln2.bias", E)
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            # q and k twice as large: scores of a few units, so that where each row looks matters
            matrix(p + m + ".weight", E, E, (2.0 if m in ("attn_q", "attn_k") else 1.0) / np.sqrt(E))
            vector(p + m + ".bias", E)
        if not v2:
            matrix(p + "ffn_gate.weight", F, E, 1.0 / np.sqrt(E))
            vector(p + "ffn_gate.bias", F)
        matrix(p + "ffn_up.weight", F, E, 1.0 / np.sqrt(E))
        vector(p + "ffn_up.bias", F)
        matrix(p + "ffn_down.weight", E, F, 1.0 / np.sqrt(F))
        vector(p + "ffn_down.bias", E)
    vector("v.post_ln.weight", E, 1.0)
    if v2:
        vector("v.post_ln.bias", E)
    matrix("mm.0.weight", 4 * E, 4 * E, 1.0 / np.sqrt(4 * E))
    vector("mm.0.bias", 4 * E)
    matrix("mm.2.weight", cfg.n_embd_text, 4 * E, 1.0 / np.sqrt(4 * E))
    vector("mm.2.bias", cfg.n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@dataclass
class TinyQwen3vl:
    """A tiny Qwen3-VL vision tower (clip.projector_type "qwen3vl_merger")
    as llama.cpp's converter writes one: the conv's two temporal slices and
    its bias, a learned position table of n_pos_side x n_pos_side (resized
    to each image's patch grid), LayerNorms with biases, fused q/k/v, a GELU
    feed-forward, DeepStack mergers after the layers in `deepstack`, post_ln
    and the merger's MLP. Patch size 16: cells of 32 pixels."""

    qtype: str = "F16"
    patch_size: int = 16
    n_embd: int = 64
    n_ff: int = 128
    n_layer: int = 3
    n_head: int = 4
    n_pos_side: int = 6
    deepstack: tuple = (0, 1)     # as many as the text model's n_deepstack_layers
    n_embd_text: int = 256
    eps: float = 1e-6
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    seed: int = 17


def write_qwen3vl_mmproj(path, cfg: TinyQwen3vl = TinyQwen3vl(), tensor_hook=None, meta=None) -> str:
    """A random qwen3vl_merger mmproj (see TinyQwen3vl); tensor_hook and meta as write_mmproj's."""
    rng = np.random.default_rng(cfg.seed)
    w = gguf.GGUFWriter(str(path), "clip")
    E, F, ps = cfg.n_embd, cfg.n_ff, cfg.patch_size
    kv = {
        "clip.projector_type": "qwen3vl_merger", "clip.has_vision_encoder": True, "clip.use_gelu": True,
        "clip.vision.image_size": 768, "clip.vision.patch_size": ps, "clip.vision.spatial_merge_size": 2,
        "clip.vision.embedding_length": E, "clip.vision.feed_forward_length": F,
        "clip.vision.block_count": cfg.n_layer, "clip.vision.attention.head_count": cfg.n_head,
        "clip.vision.attention.layer_norm_epsilon": cfg.eps, "clip.vision.projection_dim": cfg.n_embd_text,
        "clip.vision.image_mean": list(cfg.mean), "clip.vision.image_std": list(cfg.std),
    }
    kv.update(meta or {})
    add_keys(w, kv)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, scale):
        t = gguf.GGMLQuantizationType[cfg.qtype]
        if k % gguf.GGML_QUANT_SIZES[t][0]:
            t = gguf.GGMLQuantizationType.F16
        data = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        add(name, quantized_matrix(rng, data, t), t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, n, around=0.0, spread=0.1):
        f32(name, around + rng.standard_normal(n) * spread)

    for j in ("", ".1"):
        patch = (rng.standard_normal((E, 3, ps, ps)) / np.sqrt(2 * 3 * ps * ps)).astype(np.float16)
        add("v.patch_embd.weight" + j, patch, gguf.GGMLQuantizationType.F16)
    vector("v.patch_embd.bias", E)
    f32("v.position_embd.weight", rng.standard_normal((cfg.n_pos_side ** 2, E)) * 0.5)
    for i in range(cfg.n_layer):
        p = f"v.blk.{i}."
        for n in ("ln1", "ln2"):
            vector(p + n + ".weight", E, 1.0)
            vector(p + n + ".bias", E)
        matrix(p + "attn_qkv.weight", 3 * E, E, 1.5 / np.sqrt(E))
        vector(p + "attn_qkv.bias", 3 * E)
        matrix(p + "attn_out.weight", E, E, 1.0 / np.sqrt(E))
        vector(p + "attn_out.bias", E)
        matrix(p + "ffn_up.weight", F, E, 1.0 / np.sqrt(E))
        vector(p + "ffn_up.bias", F)
        matrix(p + "ffn_down.weight", E, F, 1.0 / np.sqrt(F))
        vector(p + "ffn_down.bias", E)
    for i in cfg.deepstack:
        p = f"v.deepstack.{i}."
        vector(p + "norm.weight", 4 * E, 1.0)
        vector(p + "norm.bias", 4 * E)
        matrix(p + "fc1.weight", 4 * E, 4 * E, 1.0 / np.sqrt(4 * E))
        vector(p + "fc1.bias", 4 * E)
        matrix(p + "fc2.weight", cfg.n_embd_text, 4 * E, 1.0 / np.sqrt(4 * E))
        vector(p + "fc2.bias", cfg.n_embd_text)
    vector("v.post_ln.weight", E, 1.0)
    vector("v.post_ln.bias", E)
    matrix("mm.0.weight", 4 * E, 4 * E, 1.0 / np.sqrt(4 * E))
    vector("mm.0.bias", 4 * E)
    matrix("mm.2.weight", cfg.n_embd_text, 4 * E, 1.0 / np.sqrt(4 * E))
    vector("mm.2.bias", cfg.n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


# ---- Gemma 4 (issue 52) ----

GEMMA4_MERGES = ["\u2581 t", "h e", "\u2581t he", "i n", "\u2581 a", "e r", "o n", "\u2581 s", "e n", "a n",
                 "l l", "he ll", "hell o", "\n \n", "\u2581 \u2581"]


def gemma4_vocab():
    """A Gemma-4-style vocabulary (tokenizer.ggml.model "gemma4"): control
    tokens, the 256 <0xXX> byte tokens, U+2581 for the space, printable
    ASCII, newline runs and what the merges make; (tokens, types, merges).
    Characters outside it (any non-ASCII) fall back to bytes."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [3, 3, 3, 2]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    normal = ["\u2581", "\n"] + [chr(c) for c in range(0x21, 0x7F)]
    normal += [a + b for a, b in (m.split(" ") for m in GEMMA4_MERGES)]
    tokens += normal
    types += [1] * len(normal)
    return tokens, types, GEMMA4_MERGES

@dataclass
class Gemma4Config:
    """A tiny gemma4, its tensors named and shaped as llama.cpp's
    src/models/gemma4.cpp loads them (norms as the model applies them, 1-D
    tensors F32). swa: one flag per layer (true: sliding window), written as
    the attention.sliding_window_pattern array. Sliding and full layers have
    their own head sizes and KV head counts; full layers rotate the first
    rope_partial of each head's pairs (rope_freqs.weight: 1e30 elsewhere).
    n_shared: the last layers read earlier layers' keys and values; n_pe > 0:
    per-layer embeddings (the E models); v_from_k: full layers without
    attn_v; wide_shared: the shared layers' feed-forward twice as wide (an
    array feed_forward_length)."""

    qtype: str = "F32"
    embd_qtype: str = "F32"
    n_embd: int = 256
    swa: tuple = (True, True, False, True, True, False)
    n_head: int = 4
    n_head_kv_swa: int = 2
    n_head_kv_full: int = 1
    head_dim_swa: int = 64
    head_dim_full: int = 128
    rope_partial: float = 0.25
    n_ff: int = 512
    sliding_window: int = 8
    rope_base: float = 1000000.0
    rope_base_swa: float = 10000.0
    final_softcap: float = 15.0
    qk_norm: float = 0.4          # q and k norm weights: scores (unscaled) of a few units, not sqrt(head_dim)
    n_shared: int = 0
    n_pe: int = 0
    v_from_k: bool = False
    wide_shared: bool = False
    out_scale: bool = True
    tie_output: bool = True
    context_length: int = 512
    seed: int = 0
    eps: float = 1e-6
    pre: str = "default"
    tokenizer: str = "gpt2"       # "gemma4": gemma4_vocab(), as Gemma 4's files hold it
    # MoE (26B-A4B's layout) when n_expert > 0: every layer's feed-forward a
    # shared expert beside n_expert routed ones; moe_fused: gate and up
    # experts in one ffn_gate_up_exps tensor, as the converter writes them
    n_expert: int = 0
    n_expert_used: int = 2
    n_ff_exp: int = 128
    moe_fused: bool = True
    router_scale: float = 4.0


def write_gemma4(path, cfg: Gemma4Config = Gemma4Config(), tensor_hook=None, meta=None, extra_tensors=None,
                 extra_tokens=None) -> str:
    """Write a tiny random `gemma4` file; tensor_hook as write_model's, meta:
    metadata keys to replace (a value) or leave out (None); extra_tensors:
    {name: float32 array} written after the model's own; extra_tokens as
    write_model's."""
    rng = np.random.default_rng(cfg.seed)
    tokens, types = vocab()
    merges, bos, eos = MERGES, len(tokens) - 2, len(tokens) - 1
    if cfg.tokenizer == "gemma4":
        tokens, types, merges = gemma4_vocab()
        bos, eos = 2, 1
    if extra_tokens:
        tokens = tokens[:-2] + list(extra_tokens) + tokens[-2:]
        types = types[:-2] + list(extra_tokens.values()) + types[-2:]
    n_vocab = len(tokens)
    arch = "gemma4"
    E, H, NL, P = cfg.n_embd, cfg.n_head, len(cfg.swa), cfg.n_pe
    n_kv_layers = NL - cfg.n_shared
    n_ff = [cfg.n_ff * (2 if cfg.wide_shared and i >= n_kv_layers else 1) for i in range(NL)]
    kv = {
        f"{arch}.block_count": NL,
        f"{arch}.context_length": cfg.context_length,
        f"{arch}.embedding_length": E,
        f"{arch}.feed_forward_length": n_ff if cfg.wide_shared else cfg.n_ff,
        f"{arch}.attention.head_count": H,
        f"{arch}.attention.head_count_kv": [cfg.n_head_kv_swa if s else cfg.n_head_kv_full for s in cfg.swa],
        f"{arch}.attention.key_length": cfg.head_dim_full,
        f"{arch}.attention.value_length": cfg.head_dim_full,
        f"{arch}.attention.key_length_swa": cfg.head_dim_swa,
        f"{arch}.attention.value_length_swa": cfg.head_dim_swa,
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.eps),
        f"{arch}.attention.sliding_window": cfg.sliding_window,
        f"{arch}.attention.sliding_window_pattern": [bool(s) for s in cfg.swa],
        f"{arch}.attention.shared_kv_layers": cfg.n_shared,
        f"{arch}.embedding_length_per_layer_input": P,
        f"{arch}.rope.freq_base": float(cfg.rope_base),
        f"{arch}.rope.freq_base_swa": float(cfg.rope_base_swa),
        f"{arch}.rope.dimension_count": cfg.head_dim_full,
        f"{arch}.rope.dimension_count_swa": cfg.head_dim_swa,
        f"{arch}.final_logit_softcapping": float(cfg.final_softcap),
        f"{arch}.expert_count": cfg.n_expert or None,
        f"{arch}.expert_used_count": cfg.n_expert_used if cfg.n_expert else None,
        f"{arch}.expert_feed_forward_length": cfg.n_ff_exp if cfg.n_expert else None,
        "tokenizer.ggml.model": cfg.tokenizer,
        "tokenizer.ggml.pre": cfg.pre if cfg.tokenizer == "gpt2" else None,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": bos,
        "tokenizer.ggml.eos_token_id": eos,
        "tokenizer.ggml.add_bos_token": True,
    }
    if cfg.tokenizer == "gemma4":
        kv["tokenizer.ggml.add_space_prefix"] = False
    kv.update(meta or {})
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)

    add = tensor_adder(w, tensor_hook)

    def matrix(name, rows, k, qtype, scale=1.0, n_expert=0):
        """[rows, k], or [n_expert, rows, k] as GGUF's 3-D expert tensors"""
        n = max(n_expert, 1)
        data = (rng.standard_normal((n * rows, k)) * scale / np.sqrt(k)).astype(np.float32)
        t = gguf.GGMLQuantizationType[qtype]
        q = quantized_matrix(rng, data, t)
        add(name, q.reshape(n, rows, -1) if n_expert else q, t)

    def f32(name, data):
        add(name, np.ascontiguousarray(data, dtype=np.float32), gguf.GGMLQuantizationType.F32)

    def vector(name, n, around=1.0, spread=0.1):
        f32(name, around + rng.standard_normal(n) * spread)

    matrix("token_embd.weight", n_vocab, E, cfg.embd_qtype, np.sqrt(E) / 16)
    vector("output_norm.weight", E)
    if not cfg.tie_output:
        matrix("output.weight", n_vocab, E, cfg.qtype)
    half = cfg.head_dim_full // 2
    n_rotated = int(half * cfg.rope_partial)
    if not all(cfg.swa):  # read by the full layers only
        f32("rope_freqs.weight", [1.0] * n_rotated + [1e30] * (half - n_rotated))
    if P:
        matrix("per_layer_token_embd.weight", n_vocab, NL * P, cfg.embd_qtype, np.sqrt(NL * P) / np.sqrt(P))
        matrix("per_layer_model_proj.weight", NL * P, E, cfg.qtype)
        vector("per_layer_proj_norm.weight", P)
    for i, swa in enumerate(cfg.swa):
        p = f"blk.{i}."
        hd = cfg.head_dim_swa if swa else cfg.head_dim_full
        nkv = (cfg.n_head_kv_swa if swa else cfg.n_head_kv_full) * hd
        own_kv = i < n_kv_layers
        vector(p + "attn_norm.weight", E)
        matrix(p + "attn_q.weight", H * hd, E, cfg.qtype)
        if own_kv:
            matrix(p + "attn_k.weight", nkv, E, cfg.qtype)
            if not (cfg.v_from_k and not swa):
                matrix(p + "attn_v.weight", nkv, E, cfg.qtype)
            vector(p + "attn_k_norm.weight", hd, cfg.qk_norm, 0.1 * cfg.qk_norm)
        vector(p + "attn_q_norm.weight", hd, cfg.qk_norm, 0.1 * cfg.qk_norm)
        matrix(p + "attn_output.weight", E, H * hd, cfg.qtype)
        vector(p + "post_attention_norm.weight", E)
        vector(p + "ffn_norm.weight", E)
        matrix(p + "ffn_gate.weight", n_ff[i], E, cfg.qtype, 2.0)
        matrix(p + "ffn_up.weight", n_ff[i], E, cfg.qtype)
        matrix(p + "ffn_down.weight", E, n_ff[i], cfg.qtype)
        vector(p + "post_ffw_norm.weight", E)
        if cfg.n_expert:
            ne, Fe = cfg.n_expert, cfg.n_ff_exp
            matrix(p + "ffn_gate_inp.weight", ne, E, "F32", cfg.router_scale)
            vector(p + "ffn_gate_inp.scale", E)
            if cfg.moe_fused:
                matrix(p + "ffn_gate_up_exps.weight", 2 * Fe, E, cfg.qtype, 2.0, n_expert=ne)
            else:
                matrix(p + "ffn_gate_exps.weight", Fe, E, cfg.qtype, 2.0, n_expert=ne)
                matrix(p + "ffn_up_exps.weight", Fe, E, cfg.qtype, n_expert=ne)
            matrix(p + "ffn_down_exps.weight", E, Fe, cfg.qtype, n_expert=ne)
            vector(p + "ffn_down_exps.scale", ne, 1.0, 0.3)
            vector(p + "pre_ffw_norm_2.weight", E)
            vector(p + "post_ffw_norm_1.weight", E)
            vector(p + "post_ffw_norm_2.weight", E)
        if cfg.out_scale:
            vector(p + "layer_output_scale.weight", 1, 0.8, 0.3)
        if P:
            matrix(p + "inp_gate.weight", P, E, cfg.qtype, 2.0)
            matrix(p + "proj.weight", E, P, cfg.qtype)
            vector(p + "post_norm.weight", E)
    for name, data in (extra_tensors or {}).items():
        f32(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
