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

The vocabulary and tokenizer are SmolLM2's (taken from its
GGUF), so text prompts work. Weights are N(0, 0.02) in F16, norms 1. The text
such a model writes is noise; its speed is that of a real model of its shape.
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np

from llminfer import hub


def copy_tokenizer(w: gguf.GGUFWriter, src: str) -> int:
    """Copy the tokenizer.* keys of src into w; returns the vocabulary size."""
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
    a = p.parse_args()
    if a.moe and a.n_head_kv == 8:
        a.n_head_kv = 4
    rng = np.random.default_rng(a.seed)
    arch = "qwen3moe" if a.moe else "llama"
    w = gguf.GGUFWriter(a.out, arch)
    n_vocab = copy_tokenizer(w, str(hub.pull("smollm2-135m-instruct")))
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
