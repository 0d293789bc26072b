"""Write a random-weight GGUF of a real model's shape, for speed measurements
at laptop scale where no real model of that size can be downloaded.

    python bench/make_model.py -o llama1b-f16.gguf            # Llama-3.2-1B shape
    llama-quantize llama1b-f16.gguf llama1b-q4_k_m.gguf Q4_K_M

The shape defaults to Llama-3.2-1B (n_embd 2048, 16 layers, 32 heads, 8 kv
heads, n_ff 8192); the vocabulary and tokenizer are SmolLM2's (taken from its
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
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, "llama")
    n_vocab = copy_tokenizer(w, str(hub.pull("smollm2-135m-instruct")))
    E, hd = a.n_embd, a.n_embd // a.n_head
    w.add_name("random-llama-shape")
    w.add_context_length(8192)
    w.add_embedding_length(E)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def rand(rows, k):
        return (rng.standard_normal((rows, k), dtype=np.float32) * 0.02).astype(np.float16)

    w.add_tensor("token_embd.weight", rand(n_vocab, E))
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for i in range(a.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(b + "attn_q.weight", rand(E, E))
        w.add_tensor(b + "attn_k.weight", rand(a.n_head_kv * hd, E))
        w.add_tensor(b + "attn_v.weight", rand(a.n_head_kv * hd, E))
        w.add_tensor(b + "attn_output.weight", rand(E, E))
        w.add_tensor(b + "ffn_norm.weight", np.ones(E, np.float32))
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
