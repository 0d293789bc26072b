"""A plain numpy forward pass, the reference our native one is tested against.

It shares nothing with llminfer: it reads the file with gguf's own
GGUFReader, dequantizes with gguf.quants, and computes in float64 with
exact SiLU/GELU and exact attention. It implements the architectures as
llama.cpp reads their GGUF files (src/models/*.cpp there):

- llama, smollm3 (no RoPE on every 4th layer), granite (embedding,
  residual, attention and logit multipliers; no RoPE when
  rope.scaling.finetuned is false): RoPE on adjacent pairs;
- qwen2 (q/k/v biases), qwen3 (per-head q/k norms), qwen3moe (and routed
  experts: softmax router, top-k, weights renormalized), phi3 (fused qkv and
  gate/up, LongRoPE factors and attention factor), olmo2 (no pre-norms,
  q/k norms over the whole projection, post-norms), gemma2 (soft-capped
  scores and logits, post-norms, alternating windows), gemma3 (per-head
  q/k norms, post-norms, windows on 5 of 6 layers): RoPE on (i, i + n/2);
- mistral3: llama's block with YaRN (its own betas and log multiplier) and
  the queries' temperature tuning;
- YaRN RoPE scaling wherever the file asks for it;
- a sliding window on every layer of any other architecture whose file sets
  attention.sliding_window.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

NEOX = ("qwen2", "qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "olmo2")


class ReferenceModel:
    def __init__(self, path, n_ctx=None):
        r = GGUFReader(str(path))
        self.meta = {k: f.contents() for k, f in r.fields.items()
                     if not k.startswith("tokenizer.ggml.")}
        self.arch = self.meta["general.architecture"]
        self.n_ctx = n_ctx
        self.t = {}
        for t in r.tensors:
            shape = tuple(int(v) for v in reversed(t.shape.tolist()))
            self.t[t.name] = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)

    def hp(self, key, default=None):
        return self.meta.get(f"{self.arch}.{key}", default)

    def _windowed(self, i):
        """(window, whether layer i uses it)"""
        a = self.arch
        if a == "mistral3":  # llama.cpp reads no window for it
            return 0, False
        window = self.hp("attention.sliding_window", 0)
        if a == "gemma2":
            window = self.hp("attention.sliding_window", 4096)
        if window <= 0:
            return 0, False
        default = {"gemma3": 6, "gemma2": 2, "olmo2": 4}.get(a)
        if default is None:
            return window, True
        pattern = self.hp("attention.sliding_window_pattern", default)
        return window, pattern == 0 or i % pattern < pattern - 1

    def hidden(self, tokens) -> np.ndarray:
        """The final normed hidden states [n, n_embd] (what the head reads)."""
        return self.logits(tokens, hidden=True)

    def encoder(self, tokens) -> np.ndarray:
        """The last hidden states [n, n_embd] of a bert / nomic-bert encoder
        (llama.cpp's graph): post-norm LayerNorm blocks, attention over every
        position, token type 0 added, absolute positions (bert) or NeoX RoPE
        (nomic-bert), GELU (tanh form, as ggml) or SiLU-gated feed-forward."""
        a = self.arch
        E = self.hp("embedding_length")
        n_head = self.hp("attention.head_count")
        hd = E // n_head
        eps = self.hp("attention.layer_norm_epsilon")
        base = self.hp("rope.freq_base", 10000.0)
        tokens = np.asarray(tokens)
        n = len(tokens)
        pos = np.arange(n)
        t = self.t

        def ln(x, w, b):
            mu = x.mean(axis=-1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
            return (x - mu) / np.sqrt(var + eps) * w + b

        def rope(x):
            half = hd // 2
            ang = pos[:, None] * (base ** (-2.0 * np.arange(half) / hd))[None, :]
            c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
            x0, x1 = x[..., :half].copy(), x[..., half:].copy()
            return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

        x = t["token_embd.weight"][tokens]
        if "token_types.weight" in t:
            x = x + t["token_types.weight"][0]
        if a == "bert":
            x = x + t["position_embd.weight"][pos]
        x = ln(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"])
        for i in range(self.hp("block_count")):
            p = f"blk.{i}."
            T = lambda name, d=None: t.get(p + name, d)  # noqa: E731
            if p + "attn_qkv.weight" in t:
                qkv = x @ T("attn_qkv.weight").T
                q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
            else:
                q = x @ T("attn_q.weight").T + T("attn_q.bias", 0.0)
                k = x @ T("attn_k.weight").T + T("attn_k.bias", 0.0)
                v = x @ T("attn_v.weight").T + T("attn_v.bias", 0.0)
            q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_head, hd), v.reshape(n, n_head, hd)
            if a == "nomic-bert":
                q, k = rope(q), rope(k)
            att = np.zeros((n, n_head, hd))
            for h in range(n_head):
                s = q[:, h] @ k[:, h].T / math.sqrt(hd)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                att[:, h] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h]
            o = att.reshape(n, E) @ T("attn_output.weight").T + T("attn_output.bias", 0.0)
            x = ln(x + o, T("attn_output_norm.weight"), T("attn_output_norm.bias"))
            u = x @ T("ffn_up.weight").T + T("ffn_up.bias", 0.0)
            if p + "ffn_gate.weight" in t:
                g = x @ T("ffn_gate.weight").T
                h_ = g / (1 + np.exp(-g)) * u
            else:
                h_ = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
            d = h_ @ T("ffn_down.weight").T + T("ffn_down.bias", 0.0)
            x = ln(x + d, T("layer_output_norm.weight"), T("layer_output_norm.bias"))
        return x

    def logits(self, tokens, positions=None, kv_type=None, hidden=False, rows=None, both_ways=(),
               rope_pos=None) -> np.ndarray:
        """Logits at every token; rows: {index: float [n_embd]}, input rows
        that replace those tokens' embeddings, unscaled (an image's, as
        llama.cpp feeds them); both_ways: (start, end) index ranges whose
        tokens see each other both ways (a non-causal image); `positions`
        (default 0, 1, ...) give each
        token's position, increasing, for a context with gaps (a context shift).
        kv_type "q8_0" or "q4_0": keys and values rounded to that type per
        head row, and queries to Q8_0, as a quantized KV cache stores them.
        rope_pos [n, 4] (qwen2vl): each token's M-RoPE positions, pair i of a
        head turning by the one of its section (rope.dimension_sections, not
        interleaved); default (p, p, p, 0)."""
        a = self.arch
        E = self.hp("embedding_length")
        n_head = self.hp("attention.head_count")
        n_kv = self.hp("attention.head_count_kv", n_head)
        hd = self.hp("attention.key_length", E // n_head)
        n_rot = self.hp("rope.dimension_count", hd)
        eps = self.hp("attention.layer_norm_rms_epsilon")
        base = self.hp("rope.freq_base", 10000.0)
        gemma = a in ("gemma2", "gemma3")
        neox = a in NEOX
        tokens = np.asarray(tokens)
        n = len(tokens)
        self.route_gap = None  # MoE: per token, the smallest margin of its expert choice over the layers
        pos = np.arange(n) if positions is None else np.asarray(positions)

        sections = self.hp("rope.dimension_sections") if a in ("qwen2vl", "qwen3vl", "qwen3vlmoe") else None
        if sections is not None:
            sections = [int(v) for v in sections] + [0] * (4 - len(sections))
            rpos = (np.stack([pos, pos, pos, 0 * pos], axis=1) if rope_pos is None
                    else np.asarray(rope_pos)).astype(np.float64)
        scale = 1.0 / math.sqrt(hd)
        factors = self.t.get("rope_freqs.weight")
        if a == "granite" and self.hp("attention.scale", 0.0):
            scale = self.hp("attention.scale")
        if a == "phi3" and "rope_factors_short.weight" in self.t:
            orig = self.hp("rope.scaling.original_context_length", self.hp("context_length"))
            long = self.n_ctx is not None and self.n_ctx > orig
            factors = self.t["rope_factors_long.weight" if long else "rope_factors_short.weight"]
            scale *= self.hp("rope.scaling.attn_factor", 1.0) ** 2  # RoPE scales q and k by it
        softcap = self.hp("attn_logit_softcapping", 50.0) if a == "gemma2" else 0.0

        # YaRN, as ggml's rope computes it: each pair's angle mixes the
        # interpolated (angle * fs) and the original one by a ramp over the
        # pairs, and cos/sin are scaled by mscale
        yarn = self.hp("rope.scaling.type", "none") == "yarn"
        fs, mix, mscale = 1.0, None, 1.0
        if yarn:
            factor = self.hp("rope.scaling.factor", 0.0)
            fs = 1.0 / factor if factor else 1.0
            n_orig = self.hp("rope.scaling.original_context_length", self.hp("context_length"))
            fast, slow, log_mul = 32.0, 1.0, 0.0
            if a == "mistral3":
                fast = self.hp("rope.scaling.yarn_beta_fast", fast)
                slow = self.hp("rope.scaling.yarn_beta_slow", slow)
                log_mul = self.hp("rope.scaling.yarn_log_multiplier", log_mul)

            def corr(turns):
                return n_rot * math.log(n_orig / (turns * 2 * math.pi)) / (2 * math.log(base))

            lo, hi = max(0, math.floor(corr(fast))), min(n_rot - 1, math.ceil(corr(slow)))
            mix = 1 - np.clip((np.arange(n_rot // 2) - lo) / max(0.001, hi - lo), 0, 1)

            def m(f, k):
                return 1.0 if f <= 1 else 0.1 * k * math.log(f) + 1

            f = 1 / fs
            mscale = (m(f, 1) / m(f, log_mul) if log_mul else m(f, 1)) / (1 + 0.1 * math.log(f))
            mscale *= self.hp("rope.scaling.attn_factor", 1.0) * (1 + 0.1 * math.log(f))
        temp = self.hp("attention.temperature_scale", 0.0) if a == "mistral3" else 0.0
        if temp:
            floor = self.hp("rope.scaling.original_context_length", self.hp("context_length"))
            q_temp = np.log(np.floor(pos / floor) + 1) * temp + 1

        def norm(x, w):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

        def rope(x, b):  # x [n, heads, hd]
            half = n_rot // 2
            freqs = b ** (-2.0 * np.arange(half) / n_rot)
            if factors is not None:
                freqs = freqs / factors
            ang = pos[:, None] * freqs[None, :]
            if sections is not None:  # M-RoPE: each pair by its section's position
                s = np.arange(half) % sum(sections)
                if a in ("qwen3vl", "qwen3vlmoe"):  # interleaved: t, h, w, t, h, w, ... each while its section lasts
                    t0, t1, t2 = (3 * v for v in sections[:3])
                    sec = np.where((s % 3 == 1) & (s < t1), 1, np.where((s % 3 == 2) & (s < t2), 2,
                                   np.where((s % 3 == 0) & (s < t0), 0, 3)))
                else:
                    sec = np.searchsorted(np.cumsum(sections), s, side="right")
                ang = rpos[:, sec] * freqs[None, :]
            if yarn:
                ang = fs * ang * (1 - mix) + ang * mix
            c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
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

        def gelu(g):
            return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))

        def silu(g):
            return g / (1 + np.exp(-g))

        act = gelu if gemma else silu
        res_scale = self.hp("residual_scale", 1.0) if a == "granite" else 1.0

        x = self.t["token_embd.weight"][tokens]
        if gemma:
            x = x * math.sqrt(E)
        deep = {}  # qwen3vl's DeepStack: slices after the first of a wider row, added after layers 0, 1, ..
        for i, row in (rows or {}).items():
            x[i] = row[:E]
            if len(row) > E:
                deep[i] = np.asarray(row[E:]).reshape(-1, E)
        if a == "granite":
            x = x * self.hp("embedding_scale", 1.0)
        for i in range(self.hp("block_count")):
            p = f"blk.{i}."
            T = lambda name: self.t[p + name]  # noqa: E731
            window, local = self._windowed(i)
            b = 10000.0 if (a == "gemma3" and local) else base
            use_rope = True
            if a == "smollm3":
                use_rope = (i + 1) % 4 != 0
            if a == "granite":
                use_rope = bool(self.hp("rope.scaling.finetuned", True))
            h = norm(x, T("attn_norm.weight")) if p + "attn_norm.weight" in self.t else x
            if p + "attn_qkv.weight" in self.t:
                qkv = h @ T("attn_qkv.weight").T
                q, k, v = np.split(qkv, [n_head * hd, n_head * hd + n_kv * hd], axis=1)
            else:
                q, k, v = h @ T("attn_q.weight").T, h @ T("attn_k.weight").T, h @ T("attn_v.weight").T
            if p + "attn_q.bias" in self.t:
                q, k, v = q + T("attn_q.bias"), k + T("attn_k.bias"), v + T("attn_v.bias")
            if a == "olmo2":
                q, k = norm(q, T("attn_q_norm.weight")), norm(k, T("attn_k_norm.weight"))
            q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
            if a in ("gemma3", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe"):
                q, k = norm(q, T("attn_q_norm.weight")), norm(k, T("attn_k_norm.weight"))
            if use_rope:
                q, k = rope(q, b), rope(k, b)
            if temp:
                q = q * q_temp[:, None, None]
            if kv_type is not None:
                q, k, v = _rounded(q, "Q8_0"), _rounded(k, kv_type.upper()), _rounded(v, kv_type.upper())
            group = n_head // n_kv
            att = np.zeros((n, n_head, hd))
            visible = pos[None, :] <= pos[:, None]
            for a_, b_ in both_ways:
                visible[a_:b_, a_:b_] = True
            if local:
                visible &= pos[:, None] - pos[None, :] < window
            for h_ in range(n_head):
                s = q[:, h_, :] @ k[:, h_ // group, :].T * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                s = np.where(visible, s, -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, h_, :] = s @ v[:, h_ // group, :]
            o = att.reshape(n, -1) @ T("attn_output.weight").T
            if p + "post_attention_norm.weight" in self.t:
                o = norm(o, T("post_attention_norm.weight"))
            x = x + o * res_scale
            h = norm(x, T("ffn_norm.weight")) if p + "ffn_norm.weight" in self.t else x
            if p + "ffn_gate_inp.weight" in self.t:
                d = self._experts(h, p, act)
            else:
                if p + "ffn_gate.weight" in self.t:
                    g, u = h @ T("ffn_gate.weight").T, h @ T("ffn_up.weight").T
                else:  # phi3: gate and up in one tensor, gate first
                    g, u = np.split(h @ T("ffn_up.weight").T, 2, axis=1)
                d = (act(g) * u) @ T("ffn_down.weight").T
            if p + "post_ffw_norm.weight" in self.t:
                d = norm(d, T("post_ffw_norm.weight"))
            x = x + d * res_scale
            for r, slices in deep.items():
                if i < len(slices):
                    x[r] = x[r] + slices[i]
        if hidden:
            return norm(x, self.t["output_norm.weight"])
        out = self.t.get("output.weight", self.t["token_embd.weight"])
        logits = norm(x, self.t["output_norm.weight"]) @ out.T
        if a == "granite":
            logits = logits / self.hp("logit_scale", 1.0)
        if a == "gemma2":
            cap = self.hp("final_logit_softcapping", 30.0)
            logits = cap * np.tanh(logits / cap)
        return logits

    def _experts(self, h, p, act):
        """Qwen3-MoE's feed-forward: softmax over the router's logits, the k
        most probable experts, their probabilities renormalized to sum 1."""
        k = self.hp("expert_used_count")
        logits = h @ self.t[p + "ffn_gate_inp.weight"].T
        prob = np.exp(logits - logits.max(axis=1, keepdims=True))
        prob /= prob.sum(axis=1, keepdims=True)
        gate, up, down = (self.t[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        # how near each token came to choosing other experts: a quantized
        # engine may choose otherwise where this is small
        srt = -np.sort(-prob, axis=1)
        gap = srt[:, k - 1] - (srt[:, k] if prob.shape[1] > k else 0.0)
        self.route_gap = gap if self.route_gap is None else np.minimum(self.route_gap, gap)
        for t in range(h.shape[0]):
            chosen = np.argsort(-prob[t], kind="stable")[:k]
            w = prob[t, chosen] / prob[t, chosen].sum()
            for e, we in zip(chosen, w):
                out[t] += we * (down[e] @ (act(gate[e] @ h[t]) * (up[e] @ h[t])))
        return out


def _rounded(x, type_name):
    """x with its last axis quantized to a GGML type and back (gguf's numpy code)."""
    from gguf import GGMLQuantizationType, quants

    t = GGMLQuantizationType[type_name]
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    return quants.dequantize(quants.quantize(rows, t), t).reshape(x.shape).astype(np.float64)
