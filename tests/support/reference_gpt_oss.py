"""A float64 numpy forward pass of `gpt-oss`, written from llama.cpp's graph
(src/models/openai-moe.cpp, build_attn with sinks, build_moe_ffn with
LLM_FFN_SWIGLU_OAI_MOE and LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT) and
ggml's CPU ops (soft_max with sinks, swiglu_oai). It shares nothing with
llminfer: gguf's reader and dequantizers, exact exp everywhere.

Per layer: x += Wo softmax_sink(q k^T / sqrt(n_rot)) v + bo, with q, k, v
biased and NeoX-RoPE'd (YaRN as ggml computes it), the softmax's
denominator counting exp(sink_h) beside the scores of head h, and even
layers (of llama.cpp's default pattern 2) seeing the last
attention.sliding_window positions; then x += sum over the k largest router
logits (h Wr^T + br) of softmax-over-those-k weights times
down_e(swiglu_oai(gate_e h + bg_e, up_e h + bu_e)) + bd_e, h =
rmsnorm(x) * post_attention_norm.
"""

from __future__ import annotations

import math

import numpy as np

from reference import ReferenceModel

ALPHA, LIMIT = 1.702, 7.0


def swiglu_oai(g, u, clamp=True):
    if clamp:
        g = np.minimum(g, LIMIT)
        u = np.clip(u, -LIMIT, LIMIT)
    return g / (1.0 + np.exp(-ALPHA * g)) * (u + 1.0)


# what logits(without=...) can leave out, to show that each piece matters
PIECES = ("sinks", "window", "biases", "clamp", "yarn")


def _q8_0(x):
    """rows of x through Q8_0 and back (gguf's numpy code), as an engine
    quantizes the activations a Q8_0-class weight multiplies"""
    from gguf import GGMLQuantizationType, quants

    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    t = GGMLQuantizationType.Q8_0
    return quants.dequantize(quants.quantize(rows, t), t).reshape(x.shape).astype(np.float64)


class GptOssReference(ReferenceModel):
    def __init__(self, path, act_q8=False):
        """act_q8: the inputs of every product with a quantized weight
        rounded to Q8_0 first, as llminfer (and ggml) compute them: what is
        left is the rest of the arithmetic's rounding."""
        super().__init__(path)
        from gguf import GGMLQuantizationType, GGUFReader

        plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
        self.quantized = {t.name for t in GGUFReader(str(path)).tensors if t.tensor_type not in plain}
        self.act_q8 = act_q8

    def _mm(self, x, name):
        """x @ W^T for tensor `name` (2-D), x rounded first where act_q8 says"""
        if self.act_q8 and name in self.quantized:
            x = _q8_0(x)
        return x @ self.t[name].T

    def logits(self, tokens, positions=None, kv_type=None, hidden=False, without=()) -> np.ndarray:
        """without: PIECES to leave out (sinks, the window, every bias, the
        SwiGLU's clamps, YaRN) for tests that show each one matters. (The
        softmax over the k chosen logits equals qwen3moe's softmax over all
        renormalized over the k: the two differ in rounding alone.)"""
        assert kv_type is None and set(without) <= set(PIECES)
        t = self.t
        E = self.hp("embedding_length")
        H = self.hp("attention.head_count")
        Hkv = self.hp("attention.head_count_kv", H)
        hd = self.hp("attention.key_length", E // H)
        n_rot = self.hp("rope.dimension_count", hd)
        eps = self.hp("attention.layer_norm_rms_epsilon")
        base = self.hp("rope.freq_base", 10000.0)
        window = self.hp("attention.sliding_window")
        pattern = self.hp("attention.sliding_window_pattern", 2)
        k_used = self.hp("expert_used_count")
        tokens = np.asarray(tokens)
        n = len(tokens)
        pos = np.arange(n) if positions is None else np.asarray(positions)
        self.route_gap = np.full(n, np.inf)  # per token, the least margin of its k-th logit over the next

        # YaRN, ggml's rope_yarn: the angle mixes interpolated and original by a
        # ramp over the pairs; cos and sin times mscale (llama.cpp's attn factor
        # cancels ggml's own correction, leaving 1 + 0.1 ln(factor))
        fs, mix, mscale = 1.0, None, 1.0
        if self.hp("rope.scaling.type", "none") == "yarn" and "yarn" not in without:
            factor = self.hp("rope.scaling.factor", 0.0)
            fs = 1.0 / factor if factor else 1.0
            n_orig = self.hp("rope.scaling.original_context_length", self.hp("context_length"))

            def corr(turns):
                return n_rot * math.log(n_orig / (turns * 2 * math.pi)) / (2 * math.log(base))

            lo, hi = max(0, math.floor(corr(32.0))), min(n_rot - 1, math.ceil(corr(1.0)))
            mix = 1 - np.clip((np.arange(n_rot // 2) - lo) / max(0.001, hi - lo), 0, 1)
            if factor > 1:
                mscale = 1 + 0.1 * math.log(factor)
            mscale *= self.hp("rope.scaling.attn_factor", 1.0)

        def norm(x, w):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

        def rope(x):  # [n, heads, hd], NeoX pairs (i, i + n_rot/2)
            half = n_rot // 2
            ang = pos[:, None] * (base ** (-2.0 * np.arange(half) / n_rot))[None, :]
            if mix is not None:
                ang = fs * ang * (1 - mix) + ang * mix
            c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
            x = x.copy()
            x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
            x[..., :half] = x0 * c - x1 * s
            x[..., half:n_rot] = x0 * s + x1 * c
            return x

        def T(name):
            if "biases" in without and name.endswith(".bias"):
                return 0.0
            return t[p + name]

        x = t["token_embd.weight"][tokens]
        for i in range(self.hp("block_count")):
            p = f"blk.{i}."
            h = norm(x, T("attn_norm.weight"))
            q = self._mm(h, p + "attn_q.weight") + T("attn_q.bias")
            k = self._mm(h, p + "attn_k.weight") + T("attn_k.bias")
            v = self._mm(h, p + "attn_v.weight") + T("attn_v.bias")
            q, k, v = rope(q.reshape(n, H, hd)), rope(k.reshape(n, Hkv, hd)), v.reshape(n, Hkv, hd)
            visible = pos[None, :] <= pos[:, None]
            if (pattern == 0 or i % pattern < pattern - 1) and "window" not in without:
                visible &= pos[:, None] - pos[None, :] < window
            sinks = T("attn_sinks.weight") if "sinks" not in without else np.full(H, -np.inf)
            att = np.zeros((n, H, hd))
            for h_ in range(H):
                s = q[:, h_] @ k[:, h_ // (H // Hkv)].T / math.sqrt(n_rot)
                s = np.where(visible, s, -np.inf)
                m = np.maximum(s.max(axis=1, keepdims=True), sinks[h_])
                e = np.exp(s - m)
                e /= e.sum(axis=1, keepdims=True) + np.exp(sinks[h_] - m)
                att[:, h_] = e @ v[:, h_ // (H // Hkv)]
            x = x + self._mm(att.reshape(n, -1), p + "attn_output.weight") + T("attn_output.bias")

            h = norm(x, T("post_attention_norm.weight"))
            logits = self._mm(h, p + "ffn_gate_inp.weight") + T("ffn_gate_inp.bias")
            q8 = self.act_q8 and p + "ffn_gate_exps.weight" in self.quantized
            hq = _q8_0(h) if q8 else h
            gate, up, down = (T(f"ffn_{nm}_exps.weight") for nm in ("gate", "up", "down"))
            # [n_expert, rows] each (0.0 when leaving the biases out)
            gb, ub = (np.broadcast_to(T(f"ffn_{nm}_exps.bias"), gate.shape[:2]) for nm in ("gate", "up"))
            db = np.broadcast_to(T("ffn_down_exps.bias"), down.shape[:2])
            srt = -np.sort(-logits, axis=1)
            if logits.shape[1] > k_used:
                self.route_gap = np.minimum(self.route_gap, srt[:, k_used - 1] - srt[:, k_used])
            out = np.zeros_like(x)
            for r in range(n):
                chosen = np.argsort(-logits[r], kind="stable")[:k_used]
                w = np.exp(logits[r, chosen] - logits[r, chosen].max())
                w /= w.sum()
                for e_, we in zip(chosen, w):
                    a = swiglu_oai(gate[e_] @ hq[r] + gb[e_], up[e_] @ hq[r] + ub[e_], clamp="clamp" not in without)
                    if q8:
                        a = _q8_0(a)
                    out[r] += we * (down[e_] @ a + db[e_])
            x = x + out
        if hidden:
            return norm(x, t["output_norm.weight"])
        head = "output.weight" if "output.weight" in t else "token_embd.weight"
        return self._mm(norm(x, t["output_norm.weight"]), head)
