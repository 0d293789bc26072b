"""A plain numpy forward pass, the reference our native one is tested against.

It shares nothing with llminfer: it reads the file with gguf's own
GGUFReader, dequantizes with gguf.quants, and computes in float64 with
exact SiLU/GELU and exact attention. It implements the llama, qwen2 and
gemma3 architectures as the GGUF conventions define them.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class ReferenceModel:
    def __init__(self, path):
        r = GGUFReader(str(path))
        self.meta = {k: f.contents() for k, f in r.fields.items()
                     if not k.startswith("tokenizer.ggml.")}
        self.arch = self.meta["general.architecture"]
        self.t = {}
        for t in r.tensors:
            shape = tuple(int(v) for v in reversed(t.shape.tolist()))
            self.t[t.name] = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)

    def hp(self, key, default=None):
        return self.meta.get(f"{self.arch}.{key}", default)

    def logits(self, tokens, positions=None, kv_type=None) -> np.ndarray:
        """Logits at every token; `positions` (default 0, 1, ...) give each
        token's position, increasing, for a context with gaps (a context shift).
        kv_type "q8_0" or "q4_0": keys and values rounded to that type per
        head row, and queries to Q8_0, as a quantized KV cache stores them."""
        a = self.arch
        E = self.hp("embedding_length")
        n_head = self.hp("attention.head_count")
        n_kv = self.hp("attention.head_count_kv", n_head)
        hd = self.hp("attention.key_length", E // n_head)
        n_rot = self.hp("rope.dimension_count", hd)
        eps = self.hp("attention.layer_norm_rms_epsilon")
        base = self.hp("rope.freq_base", 10000.0)
        gemma = a == "gemma3"
        neox = a in ("qwen2", "gemma3")
        window = self.hp("attention.sliding_window", 0) if gemma else 0
        pattern = self.hp("attention.sliding_window_pattern", 6)
        tokens = np.asarray(tokens)
        n = len(tokens)
        pos = np.arange(n) if positions is None else np.asarray(positions)

        def norm(x, w):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

        def rope(x, b):  # x [n, heads, hd]
            half = n_rot // 2
            freqs = b ** (-2.0 * np.arange(half) / n_rot)
            ang = pos[:, None] * freqs[None, :]
            c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
            x = x.copy()
            if neox:
                x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
                x[..., :half] = x0 * c - x1 * s
                x[..., half:n_rot] = x0 * s + x1 * c
            else:
                x0, x1 = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
                x[..., 0:n_rot:2] = x0 * c - x1 * s
                x[..., 1:n_rot:2] = x0 * s + x1 * c
            return x

        x = self.t["token_embd.weight"][tokens]
        if gemma:
            x = x * math.sqrt(E)
        for i in range(self.hp("block_count")):
            p = f"blk.{i}."
            T = lambda name: self.t[p + name]  # noqa: E731
            local = gemma and window > 0 and not (pattern <= 1 or i % pattern == pattern - 1)
            b = 10000.0 if local else base
            h = norm(x, T("attn_norm.weight"))
            q, k, v = h @ T("attn_q.weight").T, h @ T("attn_k.weight").T, h @ T("attn_v.weight").T
            if p + "attn_q.bias" in self.t:
                q, k, v = q + T("attn_q.bias"), k + T("attn_k.bias"), v + T("attn_v.bias")
            q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
            if gemma:
                q, k = norm(q, T("attn_q_norm.weight")), norm(k, T("attn_k_norm.weight"))
            q, k = rope(q, b), rope(k, b)
            if kv_type is not None:
                q, k, v = _rounded(q, "Q8_0"), _rounded(k, kv_type.upper()), _rounded(v, kv_type.upper())
            group = n_head // n_kv
            att = np.zeros((n, n_head, hd))
            visible = pos[None, :] <= pos[:, None]
            if local:
                visible &= pos[:, None] - pos[None, :] < window
            for h_ in range(n_head):
                s = q[:, h_, :] @ k[:, h_ // group, :].T / math.sqrt(hd)
                s = np.where(visible, s, -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, h_, :] = s @ v[:, h_ // group, :]
            o = att.reshape(n, -1) @ T("attn_output.weight").T
            if gemma:
                o = norm(o, T("post_attention_norm.weight"))
            x = x + o
            h = norm(x, T("ffn_norm.weight"))
            g, u = h @ T("ffn_gate.weight").T, h @ T("ffn_up.weight").T
            if gemma:
                act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1 + np.exp(-g))
            d = (act * u) @ T("ffn_down.weight").T
            if gemma:
                d = norm(d, T("post_ffw_norm.weight"))
            x = x + d
        out = self.t.get("output.weight", self.t["token_embd.weight"])
        return norm(x, self.t["output_norm.weight"]) @ out.T


def _rounded(x, type_name):
    """x with its last axis quantized to a GGML type and back (gguf's numpy code)."""
    from gguf import GGMLQuantizationType, quants

    t = GGMLQuantizationType[type_name]
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    return quants.dequantize(quants.quantize(rows, t), t).reshape(x.shape).astype(np.float64)
