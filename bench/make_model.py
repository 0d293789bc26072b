"""Write a random-weight GGUF of a real model's shape, for speed measurements
at laptop scale where no real model of that size can be downloaded.

    python bench/make_model.py -o llama1b-f16.gguf            # Llama-3.2-1B shape
    llama-quantize llama1b-f16.gguf llama1b-q4_k_m.gguf Q4_K_M

The shape defaults to Llama-3.2-1B (n_embd 2048, 16 layers, 32 heads, 8 kv
heads, n_ff 8192). `--moe` writes a Qwen3-30B-A3B-shaped mixture of experts
instead (qwen3moe: n_embd 2048, 32 heads of 128, 4 kv heads, q/k norms, 128
experts of n_ff 768, 8 used per token), with --n-layer layers (48 in the
real model; 8 make a 2.6 GB Q4_K_M):

    python bench/make_model.py --moe --n-layer 8 -o qwen3moe-8l-f16.gguf

`--qwen35` writes a Qwen3.5-2B-shaped hybrid (qwen35: n_embd 2048, 24
layers of which every 4th is gated attention with 8 heads of 256 and 2 kv
heads, a quarter of each head rotated, the others Gated DeltaNet with 16
key and 16 value heads of 128, n_ff 6144); `--qwen35moe` a
Qwen3.6-35B-A3B-shaped one (attention 16 heads, DeltaNet 32 value heads,
256 experts of 512 with 8 used and a gated shared expert of 512) with
--n-layer layers:

    python bench/make_model.py --qwen35 -o qwen35-2b-f16.gguf
    python bench/make_model.py --qwen35moe --n-layer 8 -o qwen35moe-8l-f16.gguf

`--gemma4` writes a Gemma-4-shaped dense model of about 1B parameters
(gemma4: n_embd 1536, 18 layers, sliding layers (5 of every 6, window 512)
with 8 heads of 256 and 2 kv heads, full layers with 8 heads of 512 and 1
kv head whose keys are also its values, a quarter of each full head rotated
(rope_freqs), q/k/v norms, per-layer output scales, n_ff 6144, final soft-cap
30, the vocabulary padded to 262144 and tied to the head); --n-layer,
--gemma4-shared (the last layers reading earlier layers' keys and values) and
--gemma4-pe (per-layer embeddings of that width, as the E models) change it:

    python bench/make_model.py --gemma4 -o gemma4-1b-f16.gguf

`--gpt-oss` writes a gpt-oss-20b-shaped model (gpt-oss: n_embd 2880, 64
heads of 64 and 8 kv heads with q/k/v/o biases and attention sinks, layers
alternating between a sliding window of 128 and the whole context, YaRN
RoPE (theta 150000, factor 32, original context 4096), 32 experts of 2880
with 4 used and biases, the vocabulary padded to 201088, an untied head)
with --n-layer layers (24 in the real model, 6 by default here: 12 GB of
F16); llama-quantize's MXFP4_MOE then makes its experts MXFP4 (and the
other matrices Q8_0), as the released files are:

    python bench/make_model.py --gpt-oss -o gptoss-6l-f16.gguf
    llama-quantize gptoss-6l-f16.gguf gptoss-6l-mxfp4.gguf MXFP4_MOE

The vocabulary and tokenizer are SmolLM2's (taken from its
GGUF), so text prompts work; --n-vocab pads it with unused tokens to a
real model's size (248320 for Qwen3.5), whose output head a token reads. Weights are N(0, 0.02) in F16, norms 1. The text
such a model writes is noise; its speed is that of a real model of its shape.
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np

from llminfer import hub


def copy_tokenizer(w: gguf.GGUFWriter, src: str, n_vocab_to: int | None = None) -> int:
    """Copy the tokenizer.* keys of src into w, the tokens padded with unused
    ones up to n_vocab_to when given; returns the vocabulary size."""
    r = gguf.GGUFReader(src)
    n_vocab = 0
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            if n_vocab_to and name == "tokenizer.ggml.tokens":
                vals += [f"<|unused_{i}|>" for i in range(n_vocab_to - len(vals))]
            elif n_vocab_to and name == "tokenizer.ggml.token_type":
                vals += [5] * (n_vocab_to - len(vals))  # UNUSED
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[f.data[0]]).decode("utf-8"))
        else:
            val = f.parts[f.data[0]].tolist()[0]
            {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
             gguf.GGUFValueType.BOOL: w.add_bool, gguf.GGUFValueType.FLOAT32: w.add_float32}[t](name, val)
    return n_vocab


class Lazy:
    """A tensor's shape and type, its data made only when it is written."""

    def __init__(self, shape, dtype, make):
        self.shape, self.dtype, self.make = shape, np.dtype(dtype), make


def random_makers(rng):
    """rand(*shape): N(0, 0.02) in F16, ones(n): F32 ones, both Lazy."""
    def rand(*shape):
        return Lazy(shape, np.float16,
                    lambda: (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))

    def ones(n):
        return Lazy((n,), np.float32, lambda: np.ones(n, np.float32))

    return rand, ones


class Plan:
    """The tensors of a file too big to hold in memory: their shapes first,
    then each one's data made as it is written."""

    def __init__(self):
        self.plan = []

    def add_tensor(self, name, t):
        if not isinstance(t, Lazy):
            arr = np.asarray(t)
            t = Lazy(arr.shape, arr.dtype, lambda: arr)
        self.plan.append((name, t))

    def write(self, out: gguf.GGUFWriter, path: str):
        for name, t in self.plan:
            out.add_tensor_info(name, t.shape, t.dtype, int(np.prod(t.shape)) * t.dtype.itemsize)
        out.write_header_to_file()
        out.write_kv_data_to_file()
        out.write_ti_data_to_file()
        for i, (name, t) in enumerate(self.plan):
            out.write_tensor_data(t.make())
            print(f"\r{i + 1}/{len(self.plan)} {name}", end="", flush=True)
        out.close()
        print("\n" + path)


def write_qwen35(a):
    moe = a.qwen35moe
    arch = "qwen35moe" if moe else "qwen35"
    n_layer = a.n_layer if a.n_layer != 16 else (8 if moe else 24)
    E, hd, n_head, n_kv = 2048, 256, (16 if moe else 8), 2
    dk, nk, nv, conv = 128, 16, (32 if moe else 16), 4
    d_inner = nv * dk
    F = 6144
    ne, nu, Fe, Fs = 256, 8, 512, 512
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, arch)
    n_vocab = copy_tokenizer(w, str(hub.pull("smollm2-135m-instruct")), a.n_vocab or 248320)
    w.add_name(f"random-{arch}-shape")
    w.add_context_length(8192)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(F)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd // 4)
    w.add_array(f"{arch}.rope.dimension_sections", [11, 11, 10, 0])
    w.add_rope_freq_base(10000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.ssm.conv_kernel", conv)
    w.add_uint32(f"{arch}.ssm.state_size", dk)
    w.add_uint32(f"{arch}.ssm.group_count", nk)
    w.add_uint32(f"{arch}.ssm.time_step_rank", nv)
    w.add_uint32(f"{arch}.ssm.inner_size", d_inner)
    w.add_uint32(f"{arch}.full_attention_interval", 4)
    if moe:
        w.add_expert_count(ne)
        w.add_expert_used_count(nu)
        w.add_expert_feed_forward_length(Fe)
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", Fs)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # tensors are made one at a time as they are written (an 8-layer MoE is 13 GB of F16)
    rand, ones = random_makers(rng)
    out, w = w, Plan()
    w.add_tensor("token_embd.weight", rand(n_vocab, E))
    w.add_tensor("output_norm.weight", ones(E))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(E))
        w.add_tensor(b + "post_attention_norm.weight", ones(E))
        if (i + 1) % 4 == 0:
            w.add_tensor(b + "attn_q.weight", rand(2 * n_head * hd, E))
            w.add_tensor(b + "attn_k.weight", rand(n_kv * hd, E))
            w.add_tensor(b + "attn_v.weight", rand(n_kv * hd, E))
            w.add_tensor(b + "attn_output.weight", rand(E, n_head * hd))
            w.add_tensor(b + "attn_q_norm.weight", ones(hd))
            w.add_tensor(b + "attn_k_norm.weight", ones(hd))
        else:
            ch = 2 * nk * dk + d_inner
            w.add_tensor(b + "attn_qkv.weight", rand(ch, E))
            w.add_tensor(b + "attn_gate.weight", rand(d_inner, E))
            w.add_tensor(b + "ssm_beta.weight", rand(nv, E))
            w.add_tensor(b + "ssm_alpha.weight", rand(nv, E))
            w.add_tensor(b + "ssm_conv1d.weight", rng.standard_normal((ch, conv), dtype=np.float32) * 0.5)
            w.add_tensor(b + "ssm_dt.bias", np.zeros(nv, np.float32))
            w.add_tensor(b + "ssm_a", -np.exp(rng.uniform(-1, 1, nv)).astype(np.float32))
            w.add_tensor(b + "ssm_norm.weight", ones(dk))
            w.add_tensor(b + "ssm_out.weight", rand(E, d_inner))
        if moe:
            w.add_tensor(b + "ffn_gate_inp.weight", rng.standard_normal((ne, E), dtype=np.float32) * 0.02)
            w.add_tensor(b + "ffn_gate_exps.weight", rand(ne, Fe, E))
            w.add_tensor(b + "ffn_up_exps.weight", rand(ne, Fe, E))
            w.add_tensor(b + "ffn_down_exps.weight", rand(ne, E, Fe))
            w.add_tensor(b + "ffn_gate_inp_shexp.weight", rng.standard_normal(E, dtype=np.float32) * 0.02)
            w.add_tensor(b + "ffn_gate_shexp.weight", rand(Fs, E))
            w.add_tensor(b + "ffn_up_shexp.weight", rand(Fs, E))
            w.add_tensor(b + "ffn_down_shexp.weight", rand(E, Fs))
        else:
            w.add_tensor(b + "ffn_gate.weight", rand(F, E))
            w.add_tensor(b + "ffn_up.weight", rand(F, E))
            w.add_tensor(b + "ffn_down.weight", rand(E, F))
    w.write(out, a.out)


def write_gemma4(a):
    arch = "gemma4"
    n_layer = a.n_layer if a.n_layer != 16 else 18
    E, H, F, window = 1536, 8, 6144, 512
    hd_swa, hd_full, kv_swa, kv_full = 256, 512, 2, 1
    swa = [i % 6 != 5 for i in range(n_layer)]
    n_shared, P = a.gemma4_shared, a.gemma4_pe
    if n_shared and (n_layer - n_shared < 2 or not swa[n_layer - n_shared - 2] or swa[n_layer - n_shared - 1]):
        raise SystemExit(f"--gemma4-shared {n_shared}: layers {n_layer - n_shared - 2} and {n_layer - n_shared - 1} "
                         f"must be a sliding and a full layer (what llama.cpp's sharing reads)")
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, arch)
    n_vocab = copy_tokenizer(w, str(hub.pull("smollm2-135m-instruct")), a.n_vocab or 262144)
    w.add_name(f"random-{arch}-shape")
    w.add_context_length(131072)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv([kv_swa if s else kv_full for s in swa])
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_uint32(f"{arch}.attention.key_length_swa", hd_swa)
    w.add_uint32(f"{arch}.attention.value_length_swa", hd_swa)
    w.add_rope_dimension_count(hd_full)
    w.add_uint32(f"{arch}.rope.dimension_count_swa", hd_swa)
    w.add_rope_freq_base(1000000.0)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.attention.sliding_window", window)
    w.add_array(f"{arch}.attention.sliding_window_pattern", swa)
    w.add_uint32(f"{arch}.attention.shared_kv_layers", n_shared)
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", P)
    w.add_float32(f"{arch}.final_logit_softcapping", 30.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def rand(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n):
        return np.ones(n, np.float32)

    w.add_tensor("token_embd.weight", rand(n_vocab, E))
    w.add_tensor("output_norm.weight", ones(E))
    w.add_tensor("rope_freqs.weight", np.array([1.0] * (hd_full // 8) + [1e30] * (hd_full // 2 - hd_full // 8),
                                               np.float32))
    if P:
        w.add_tensor("per_layer_token_embd.weight", rand(n_vocab, n_layer * P))
        w.add_tensor("per_layer_model_proj.weight", rand(n_layer * P, E))
        w.add_tensor("per_layer_proj_norm.weight", ones(P))
    for i in range(n_layer):
        b = f"blk.{i}."
        hd, nkv = (hd_swa, kv_swa) if swa[i] else (hd_full, kv_full)
        w.add_tensor(b + "attn_norm.weight", ones(E))
        w.add_tensor(b + "attn_q.weight", rand(H * hd, E))
        # q and k norms of hd^-1/4: unscaled scores of about unit size, not sqrt(hd) (random weights
        # would otherwise make every softmax an argmax, and the text chaotic in float32)
        w.add_tensor(b + "attn_q_norm.weight", ones(hd) * hd ** -0.25)
        if i < n_layer - n_shared:
            w.add_tensor(b + "attn_k.weight", rand(nkv * hd, E))
            if swa[i]:  # the full layers' values are their keys (no attn_v)
                w.add_tensor(b + "attn_v.weight", rand(nkv * hd, E))
            w.add_tensor(b + "attn_k_norm.weight", ones(hd) * hd ** -0.25)
        w.add_tensor(b + "attn_output.weight", rand(E, H * hd))
        w.add_tensor(b + "post_attention_norm.weight", ones(E))
        w.add_tensor(b + "ffn_norm.weight", ones(E))
        w.add_tensor(b + "ffn_gate.weight", rand(F, E))
        w.add_tensor(b + "ffn_up.weight", rand(F, E))
        w.add_tensor(b + "ffn_down.weight", rand(E, F))
        w.add_tensor(b + "post_ffw_norm.weight", ones(E))
        w.add_tensor(b + "layer_output_scale.weight", np.array([0.5], np.float32))
        if P:
            w.add_tensor(b + "inp_gate.weight", rand(P, E))
            w.add_tensor(b + "proj.weight", rand(E, P))
            w.add_tensor(b + "post_norm.weight", ones(E))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()
    print(a.out)


def write_gpt_oss(a):
    """gpt-oss-20b's shape (tensor names as tests/tiny_models.py's write_gpt_oss and llama.cpp's
    openai-moe.cpp read them): 1-D tensors, biases, sinks and the router in F32, the rest F16."""
    arch = "gpt-oss"
    n_layer = a.n_layer if a.n_layer != 16 else 6
    E, H, n_kv, hd, window = 2880, 64, 8, 64, 128
    ne, nu, Fe = 32, 4, 2880
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, arch)
    n_vocab = copy_tokenizer(w, str(hub.pull("smollm2-135m-instruct")), a.n_vocab or 201088)
    w.add_name(f"random-{arch}-shape")
    w.add_context_length(131072)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(Fe)
    w.add_expert_feed_forward_length(Fe)
    w.add_expert_count(ne)
    w.add_expert_used_count(nu)
    w.add_head_count(H)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(window)  # even layers windowed, odd ones global (the default pattern of 2)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    rand, ones = random_makers(rng)

    def f32(*shape):
        return Lazy(shape, np.float32, lambda: rng.standard_normal(shape, dtype=np.float32) * 0.02)

    out, w = w, Plan()
    w.add_tensor("token_embd.weight", rand(n_vocab, E))
    w.add_tensor("output_norm.weight", ones(E))
    w.add_tensor("output.weight", rand(n_vocab, E))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(E))
        w.add_tensor(b + "post_attention_norm.weight", ones(E))
        w.add_tensor(b + "attn_q.weight", rand(H * hd, E))
        w.add_tensor(b + "attn_k.weight", rand(n_kv * hd, E))
        w.add_tensor(b + "attn_v.weight", rand(n_kv * hd, E))
        w.add_tensor(b + "attn_q.bias", f32(H * hd))
        w.add_tensor(b + "attn_k.bias", f32(n_kv * hd))
        w.add_tensor(b + "attn_v.bias", f32(n_kv * hd))
        w.add_tensor(b + "attn_output.weight", rand(E, H * hd))
        w.add_tensor(b + "attn_output.bias", f32(E))
        w.add_tensor(b + "attn_sinks.weight", f32(H))
        w.add_tensor(b + "ffn_gate_inp.weight", f32(ne, E))
        w.add_tensor(b + "ffn_gate_inp.bias", f32(ne))
        w.add_tensor(b + "ffn_gate_exps.weight", rand(ne, Fe, E))
        w.add_tensor(b + "ffn_up_exps.weight", rand(ne, Fe, E))
        w.add_tensor(b + "ffn_down_exps.weight", rand(ne, E, Fe))
        w.add_tensor(b + "ffn_gate_exps.bias", f32(ne, Fe))
        w.add_tensor(b + "ffn_up_exps.bias", f32(ne, Fe))
        w.add_tensor(b + "ffn_down_exps.bias", f32(ne, E))
    w.write(out, a.out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--n-embd", type=int, default=2048)
    p.add_argument("--n-layer", type=int, default=16)
    p.add_argument("--n-head", type=int, default=32)
    p.add_argument("--n-head-kv", type=int, default=8)
    p.add_argument("--n-ff", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--moe", action="store_true", help="a Qwen3-30B-A3B-shaped qwen3moe model")
    p.add_argument("--n-expert", type=int, default=128)
    p.add_argument("--n-expert-used", type=int, default=8)
    p.add_argument("--n-ff-exp", type=int, default=768)
    p.add_argument("--qwen35", action="store_true", help="a Qwen3.5-2B-shaped hybrid (Gated DeltaNet) model")
    p.add_argument("--qwen35moe", action="store_true", help="a Qwen3.6-35B-A3B-shaped hybrid MoE")
    p.add_argument("--n-vocab", type=int, default=None, help="pad the vocabulary with unused tokens to this size")
    p.add_argument("--gemma4", action="store_true", help="a Gemma-4-shaped dense model of about 1B parameters")
    p.add_argument("--gemma4-shared", type=int, default=0,
                   help="gemma4: layers reading earlier layers' keys and values")
    p.add_argument("--gemma4-pe", type=int, default=0,
                   help="gemma4: per-layer embeddings of this width (E models: 256)")
    p.add_argument("--gpt-oss", action="store_true",
                   help="a gpt-oss-20b-shaped model (6 layers unless --n-layer says otherwise)")
    a = p.parse_args()
    if a.gpt_oss:
        return write_gpt_oss(a)
    if a.gemma4:
        return write_gemma4(a)
    if a.qwen35 or a.qwen35moe:
        return write_qwen35(a)
    if a.moe and a.n_head_kv == 8:
        a.n_head_kv = 4
    rng = np.random.default_rng(a.seed)
    arch = "qwen3moe" if a.moe else "llama"
    w = gguf.GGUFWriter(a.out, arch)
    n_vocab = copy_tokenizer(w, str(hub.pull("smollm2-135m-instruct")), a.n_vocab)
    E = a.n_embd
    hd = 128 if a.moe else E // a.n_head
    nq, nkv = a.n_head * hd, a.n_head_kv * hd
    w.add_name(f"random-{arch}-shape")
    w.add_context_length(8192)
    w.add_embedding_length(E)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(1000000.0 if a.moe else 500000.0)
    w.add_layer_norm_rms_eps(1e-6 if a.moe else 1e-5)
    if a.moe:
        w.add_expert_count(a.n_expert)
        w.add_expert_used_count(a.n_expert_used)
        w.add_expert_feed_forward_length(a.n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def rand(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    w.add_tensor("token_embd.weight", rand(n_vocab, E))
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for i in range(a.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(b + "attn_q.weight", rand(nq, E))
        w.add_tensor(b + "attn_k.weight", rand(nkv, E))
        w.add_tensor(b + "attn_v.weight", rand(nkv, E))
        w.add_tensor(b + "attn_output.weight", rand(E, nq))
        w.add_tensor(b + "ffn_norm.weight", np.ones(E, np.float32))
        if a.moe:
            w.add_tensor(b + "attn_q_norm.weight", np.ones(hd, np.float32))
            w.add_tensor(b + "attn_k_norm.weight", np.ones(hd, np.float32))
            w.add_tensor(b + "ffn_gate_inp.weight", rng.standard_normal((a.n_expert, E), dtype=np.float32) * 0.02)
            w.add_tensor(b + "ffn_gate_exps.weight", rand(a.n_expert, a.n_ff_exp, E))
            w.add_tensor(b + "ffn_up_exps.weight", rand(a.n_expert, a.n_ff_exp, E))
            w.add_tensor(b + "ffn_down_exps.weight", rand(a.n_expert, E, a.n_ff_exp))
            continue
        w.add_tensor(b + "ffn_gate.weight", rand(a.n_ff, E))
        w.add_tensor(b + "ffn_up.weight", rand(a.n_ff, E))
        w.add_tensor(b + "ffn_down.weight", rand(E, a.n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()
    print(a.out)


if __name__ == "__main__":
    main()
