"""A float64 numpy forward pass of `gemma4`, written from llama.cpp's graph
(src/models/gemma4.cpp, its hparams in llama-model.cpp and gemma4.cpp's
load_arch_hparams) and ggml's CPU ops. It shares nothing with llminfer:
gguf's reader and dequantizers, exact tanh and exp.

x = token_embd[tok] * sqrt(n_embd); per layer (sliding or full by the
attention.sliding_window_pattern array, each kind with its head size, KV
heads, RoPE dims and base; full layers' RoPE frequencies divided by
rope_freqs):
  h = rmsnorm(x) * attn_norm
  q = rope(rmsnorm_head(h Wq^T) * q_norm)
  k = rope(rmsnorm_head(h Wk^T) * k_norm), v = rmsnorm_head(h Wv^T) (Wv = Wk
      without attn_v), or those of the layer it shares (shared_kv_layers)
  x += rmsnorm(softmax(q k^T) v Wo^T) * post_attention_norm   (scale 1)
  x += rmsnorm(gelu(h' Wg^T) * (h' Wu^T) Wd^T) * post_ffw_norm, h' = rmsnorm(x) * ffn_norm
  E models: x += rmsnorm((gelu(x Wgate^T) * pe[il]) Wproj^T) * post_norm
  x *= layer_output_scale
logits = softcap(rmsnorm(x) * output_norm Wout^T), cap * tanh(z / cap).
"""

from __future__ import annotations

import math

import numpy as np

from reference import ReferenceModel


def gelu(x, f16=False):
    """GELU, tanh form; f16: as ggml's CPU op computes it (and llminfer
    after it): the input rounded to float16, its value looked up in a table
    of float16 results, the input itself above 10 and 0 below -10"""
    if not f16:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    h = x.astype(np.float32).astype(np.float16).astype(np.float64)
    y = (0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))).astype(np.float32)
    y = y.astype(np.float16).astype(np.float64)
    return np.where(x >= 10.0, x, np.where(x <= -10.0, 0.0, y))


# what logits(without=...) can leave out, to show that each piece matters
PIECES = ("window", "v_norm", "rope_freqs", "out_scale", "softcap", "per_layer", "kv_share")
MOE_PIECES = ("router_scale", "expert_scale", "moe_norms")


def _q8_0(x):
    from gguf import GGMLQuantizationType, quants

    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    t = GGMLQuantizationType.Q8_0
    return quants.dequantize(quants.quantize(rows, t), t).reshape(x.shape).astype(np.float64)


class Gemma4Reference(ReferenceModel):
    def __init__(self, path, act_q8=False, gelu16=False):
        """act_q8: the inputs of every product with a quantized weight
        rounded to Q8_0 first, as llminfer (and ggml) compute them; gelu16:
        GELU through float16 as ggml's table gives it. With both, what is
        left is float32 against float64 arithmetic."""
        super().__init__(path)
        from gguf import GGMLQuantizationType, GGUFReader

        plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
        self.quantized = {t.name for t in GGUFReader(str(path)).tensors if t.tensor_type not in plain}
        self.act_q8 = act_q8
        self.gelu16 = gelu16

    def _mm(self, x, name):
        if self.act_q8 and name in self.quantized:
            x = _q8_0(x)
        return x @ self.t[name].T

    def _experts(self, x, p, norm):
        """The routed experts' normed sum: the router reads rmsnorm(x) /
        sqrt(n_embd) * ffn_gate_inp.scale, softmax over all experts, the top
        k renormalized; the experts read rmsnorm(x) * pre_ffw_norm_2; expert
        e's output times ffn_down_exps.scale[e]."""
        t = self.t
        E, K = x.shape[1], self.hp("expert_used_count")
        rs = 1.0 if "router_scale" in self.without else t[p + "ffn_gate_inp.scale"]
        logits = (norm(x) / math.sqrt(E) * rs) @ t[p + "ffn_gate_inp.weight"].T
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        srt = -np.sort(-probs, axis=1)
        if srt.shape[1] > K:
            self.route_gap = np.minimum(self.route_gap, srt[:, K - 1] - srt[:, K])
        h = norm(x, t[p + ("ffn_norm.weight" if "moe_norms" in self.without else "pre_ffw_norm_2.weight")])
        q8 = self.act_q8 and p + "ffn_down_exps.weight" in self.quantized
        hq = _q8_0(h) if q8 else h
        if p + "ffn_gate_up_exps.weight" in t:
            gu = t[p + "ffn_gate_up_exps.weight"]
            gate, up = gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
        else:
            gate, up = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"]
        down = t[p + "ffn_down_exps.weight"]
        scale = None if "expert_scale" in self.without else t.get(p + "ffn_down_exps.scale")
        out = np.zeros_like(x)
        for r in range(x.shape[0]):
            chosen = np.argsort(-probs[r], kind="stable")[:K]
            w = probs[r, chosen] / probs[r, chosen].sum()
            for e, we in zip(chosen, w):
                a = gelu(gate[e] @ hq[r], self.gelu16) * (up[e] @ hq[r])
                if q8:
                    a = _q8_0(a)
                out[r] += we * (1.0 if scale is None else scale[e]) * (down[e] @ a)
        return out if "moe_norms" in self.without else norm(out, t[p + "post_ffw_norm_2.weight"])

    def _per_layer(self, key, n_layer, default):
        v = self.hp(key, default)
        return list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v] * n_layer

    def logits(self, tokens, positions=None, kv_type=None, hidden=False, without=(), rows=None,
               both_ways=(), both_ways_layers="swa") -> np.ndarray:
        """rows: {index: float [n_embd]} input embeddings in place of those
        tokens' (unscaled; the per-layer input takes token 0's, as llama.cpp
        feeds them); both_ways: (start, end) index ranges whose tokens see
        each other both ways in the sliding-window layers (llama.cpp's
        LLAMA_NON_CAUSAL_TYPE_SWA_ONLY, the window still bounding what lies
        before), or in every layer with both_ways_layers "all"."""
        assert kv_type is None and set(without) <= set(PIECES + MOE_PIECES)
        self.without = without
        t = self.t
        E = self.hp("embedding_length")
        NL = self.hp("block_count")
        H = self.hp("attention.head_count")
        swa = [bool(s) for s in self.hp("attention.sliding_window_pattern")]
        hkv = self._per_layer("attention.head_count_kv", NL, H)
        hd_full = self.hp("attention.key_length")
        hd_swa = self.hp("attention.key_length_swa", hd_full)
        rot_full = self.hp("rope.dimension_count", hd_full)
        rot_swa = self.hp("rope.dimension_count_swa", rot_full)
        base_full = self.hp("rope.freq_base", 10000.0)
        base_swa = self.hp("rope.freq_base_swa", 10000.0)
        eps = self.hp("attention.layer_norm_rms_epsilon")
        window = self.hp("attention.sliding_window")
        cap = self.hp("final_logit_softcapping", 30.0)
        P = self.hp("embedding_length_per_layer_input", 0)
        n_shared = self.hp("attention.shared_kv_layers", 0)
        n_kv = NL - n_shared
        tokens = np.asarray(tokens)
        n = len(tokens)
        pos = np.arange(n) if positions is None else np.asarray(positions)
        self.route_gap = np.full(n, np.inf)  # per token, the least margin of its k-th expert's probability

        def norm(x, w=1.0):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

        def rope(x, n_rot, base, factors):  # [n, heads, hd], NeoX pairs (i, i + n_rot/2)
            half = n_rot // 2
            ang = pos[:, None] * (base ** (-2.0 * np.arange(half) / n_rot))[None, :]
            if factors is not None:
                ang = ang / factors[None, :half]
            c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
            x = x.copy()
            x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
            x[..., :half] = x0 * c - x1 * s
            x[..., half:n_rot] = x0 * s + x1 * c
            return x

        x = t["token_embd.weight"][tokens] * math.sqrt(E)
        pe_tokens = tokens.copy()
        for i, r in (rows or {}).items():
            x[i] = np.asarray(r, np.float64)
            pe_tokens[i] = 0
        span = np.zeros((n, n), bool)
        for a_, b_ in both_ways:
            span[a_:b_, a_:b_] = True
        pe = None
        if P and "per_layer" not in without:
            proj = (self._mm(x, "per_layer_model_proj.weight") / math.sqrt(E)).reshape(n, NL, P)
            proj = norm(proj, t["per_layer_proj_norm.weight"])
            tok = t["per_layer_token_embd.weight"][pe_tokens].reshape(n, NL, P) * math.sqrt(P)
            pe = (proj + tok) / math.sqrt(2.0)
        cache = {}
        for il in range(NL):
            p = f"blk.{il}."
            hd = hd_swa if swa[il] else hd_full
            n_rot = rot_swa if swa[il] else rot_full
            base = base_swa if swa[il] else base_full
            factors = None if swa[il] or "rope_freqs" in without else t["rope_freqs.weight"]
            h = norm(x, t[p + "attn_norm.weight"])
            q = rope(norm(self._mm(h, p + "attn_q.weight").reshape(n, H, hd), t[p + "attn_q_norm.weight"]),
                     n_rot, base, factors)
            if il < n_kv:
                kraw = self._mm(h, p + "attn_k.weight").reshape(n, hkv[il], hd)
                vraw = self._mm(h, p + "attn_v.weight").reshape(n, hkv[il], hd) if p + "attn_v.weight" in t else kraw
                k = rope(norm(kraw, t[p + "attn_k_norm.weight"]), n_rot, base, factors)
                v = vraw if "v_norm" in without else norm(vraw)
                cache[il] = (k, v)
            else:
                src = n_kv - (2 if swa[il] else 1)
                if "kv_share" in without:  # another layer of its kind: the first
                    src = swa.index(swa[il])
                k, v = cache[src]
            visible = pos[None, :] <= pos[:, None]
            if swa[il] or both_ways_layers == "all":
                visible = visible | span
            if swa[il] and "window" not in without:
                visible &= pos[:, None] - pos[None, :] < window
            att = np.zeros((n, H, hd))
            g = H // hkv[il]
            for hh in range(H):
                s = q[:, hh] @ k[:, hh // g].T
                s = np.where(visible, s, -np.inf)
                e = np.exp(s - s.max(axis=1, keepdims=True))
                e /= e.sum(axis=1, keepdims=True)
                att[:, hh] = e @ v[:, hh // g]
            x = x + norm(self._mm(att.reshape(n, -1), p + "attn_output.weight"), t[p + "post_attention_norm.weight"])
            h = norm(x, t[p + "ffn_norm.weight"])
            a = gelu(self._mm(h, p + "ffn_gate.weight"), self.gelu16) * self._mm(h, p + "ffn_up.weight")
            f = self._mm(a, p + "ffn_down.weight")
            if p + "ffn_gate_inp.weight" in t:
                if "moe_norms" in self.without:  # the halves summed as they come, the experts read ffn_norm's input
                    f = f + self._experts(x, p, norm)
                else:
                    f = norm(f, t[p + "post_ffw_norm_1.weight"]) + self._experts(x, p, norm)
            x = x + norm(f, t[p + "post_ffw_norm.weight"])
            if pe is not None:
                a = gelu(self._mm(x, p + "inp_gate.weight"), self.gelu16) * pe[:, il]
                x = x + norm(self._mm(a, p + "proj.weight"), t[p + "post_norm.weight"])
            if p + "layer_output_scale.weight" in t and "out_scale" not in without:
                x = x * t[p + "layer_output_scale.weight"][0]
        if hidden:
            return norm(x, t["output_norm.weight"])
        head = "output.weight" if "output.weight" in t else "token_embd.weight"
        z = self._mm(norm(x, t["output_norm.weight"]), head)
        if cap and "softcap" not in without:
            z = cap * np.tanh(z / cap)
        return z
