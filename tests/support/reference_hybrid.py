"""A plain numpy forward pass for hybrid models (issue 51), the reference
llminfer's recurrent layers are tested against.

As tests/support/reference.py, it shares nothing with llminfer: gguf's GGUFReader
and dequantizer, float64, exact attention. The recurrent layers run token by
token through their recurrence, each keeping its state (a window of past
inputs for the convolution, and a recurrent matrix) as a decoder does. The
formulas are llama.cpp's (src/models/<arch>.cpp; ggml-cpu/ops.cpp for
ggml_ssm_conv, ggml_gated_delta_net, ggml_l2_norm):

- lfm2 (and lfm2moe, whose layers after leading_dense_block_count have
  experts: sigmoid router, the top k of sigmoid + exp_probs_b chosen, their
  sigmoids normalized): pre-norm blocks; a convolution layer projects x to (b, c, x'),
  convolves b * x' over time per channel with l_cache taps (the oldest
  first, l_cache - 1 past inputs in the window, zero at the start),
  multiplies by c and projects out; an attention layer has per-head q/k
  RMSNorm and NeoX RoPE; the final norm is token_embd_norm.
- qwen35 / qwen35moe: Gated DeltaNet layers (every full_attention_interval-th
  layer is attention, or attention.recurrent_layers says which): attn_qkv
  gives q, k, v channels, a causal convolution over d_conv taps then SiLU;
  q and k L2-normalised per head (x / sqrt(sum x^2 + eps)); value head h
  reads key head h % n_group; per head g = softplus(alpha + dt_bias) * ssm_a,
  beta = sigmoid(beta); the state S (rows: value dims, columns: key dims)
  decays by exp(g), then S += ((v - S k) * beta) k^T, and the output is
  S q / sqrt(d_k); RMSNorm per head times ssm_norm, times SiLU(z), then
  ssm_out. Attention layers: wq gives per head [queries, gate]; q/k per-head
  RMSNorm; interleaved multi-section RoPE (a text position p on the t, h
  and w sections, 0 on the fourth) on the first n_rot dims in NeoX pairs;
  the output times sigmoid(gate), then wo. post_attention_norm is the
  feed-forward's pre-norm. qwen35moe's feed-forward: softmax router, top-k
  renormalized, plus a shared expert times sigmoid(ffn_gate_inp_shexp . x).
- qwen3next: qwen35moe's layers with plain NeoX RoPE, beta and alpha in one
  tensor (ssm_ba: per key head, its value heads' betas then alphas), and
  value head h reading key head h // (heads / groups).
- Mamba2 layers (mamba2, granitehybrid, nemotron_h; src/models/mamba-base.cpp
  and ggml_ssm_scan): ssm_in gives z, x, B, C and dt; a causal convolution
  (with its bias) over the x, B and C channels, then SiLU; per head h (of
  inner_size / time_step_rank channels) with group g = h / (heads / groups),
  dt' = softplus(dt + ssm_dt.bias), the state [channels, d_state] becomes
  state * exp(dt' * ssm_a) + (x * dt') B_g^T and y = state C_g + ssm_d * x;
  y times SiLU(z), RMSNorm per group times ssm_norm, then ssm_out.
  mamba2: every layer is that, pre-normed, with no feed-forward.
  granitehybrid: Mamba2 layers where attention.head_count_kv is 0, attention
  (no RoPE when rope.scaling.finetuned is false, else adjacent pairs)
  elsewhere, every layer a SiLU-gated feed-forward after ffn_norm; Granite's
  embedding, residual, attention and logit multipliers.
  nemotron_h: each layer is one of Mamba2, attention without RoPE, or a
  squared-ReLU feed-forward without a gate (feed_forward_length > 0), each
  after its attn_norm.
"""

from __future__ import annotations

import math

import numpy as np

from reference import ReferenceModel


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


class HybridReference(ReferenceModel):
    """logits(tokens) for a file of one of tiny_models.HYBRID_ARCHS."""

    def __init__(self, path):
        super().__init__(path)
        if self.arch not in ("lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen3next", "mamba2", "granitehybrid",
                             "nemotron_h"):
            raise ValueError(f"not a hybrid architecture: {self.arch}")
        self.eps = self.hp("attention.layer_norm_rms_epsilon", self.hp("attention.layer_norm_epsilon"))

    def layer_value(self, key, i, default=0):
        v = self.hp(key, default)
        return int(np.asarray(v).reshape(-1)[i]) if np.ndim(v) else int(v)

    # ---- which layers are recurrent ----
    def kind(self, i) -> str:
        """"A" attention, "R" recurrent, "F" a feed-forward alone (nemotron_h)."""
        if self.arch == "mamba2":
            return "R"
        if self.arch == "nemotron_h" and self.layer_value("feed_forward_length", i) > 0:
            return "F"
        return "R" if self.recurrent(i) else "A"

    def recurrent(self, i) -> bool:
        if self.arch == "mamba2":
            return True
        if self.arch in ("lfm2", "lfm2moe", "granitehybrid", "nemotron_h"):
            return self.layer_value("attention.head_count_kv", i) == 0 and \
                (self.arch != "nemotron_h" or self.layer_value("feed_forward_length", i) == 0)
        arr = self.hp("attention.recurrent_layers")
        if arr is not None:
            return bool(np.asarray(arr).reshape(-1)[i])
        interval = self.hp("full_attention_interval", 4)
        return (i + 1) % interval != 0

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    # ---- the forward pass ----
    def logits(self, tokens, hidden=False, rows=None):
        """rows: {position: input row} in place of those tokens' embeddings
        (an image's, lfm2 only)."""
        if self.arch in ("mamba2", "granitehybrid", "nemotron_h"):
            return self._mamba_family(tokens, hidden)
        tokens = np.asarray(tokens)
        t = self.t
        x = t["token_embd.weight"][tokens]
        for pos, r in (rows or {}).items():
            x[pos] = r
        qwen = self.arch not in ("lfm2", "lfm2moe")
        self.route_gap = None
        for i in range(self.hp("block_count") - self.hp("nextn_predict_layers", 0)):
            p = f"blk.{i}."
            h = self.norm(x, t[p + "attn_norm.weight"])
            if not self.recurrent(i):
                o = self._attention(h, p, i)
            elif qwen:
                o = self._gated_delta_net(h, p)
            else:
                o = self._shortconv(h, p)
            x = x + o
            h = self.norm(x, t[p + ("post_attention_norm.weight" if qwen else "ffn_norm.weight")])
            if p + "exp_probs_b.bias" in t:
                d = self._sigmoid_experts(h, p)
            elif p + "ffn_gate_inp.weight" in t:
                d = self._experts(h, p, silu)
                if p + "ffn_up_shexp.weight" in t:
                    s = (silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)) \
                        @ t[p + "ffn_down_shexp.weight"].T
                    d = d + s * sigmoid(h @ t[p + "ffn_gate_inp_shexp.weight"])[:, None]
            else:
                d = (silu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
            x = x + d
        out_norm = t["token_embd_norm.weight" if not qwen else "output_norm.weight"]
        x = self.norm(x, out_norm)
        if hidden:
            return x
        return x @ t.get("output.weight", t["token_embd.weight"]).T

    def _sigmoid_experts(self, h, p):
        """lfm2moe's experts: sigmoid of the router's logits; the top k of
        those plus exp_probs_b chosen; their unbiased sigmoids, normalized
        to sum 1, weight them (llama.cpp's build_moe_ffn)."""
        t = self.t
        k = self.hp("expert_used_count")
        prob = sigmoid(h @ t[p + "ffn_gate_inp.weight"].T)
        sel = prob + t[p + "exp_probs_b.bias"]
        srt = -np.sort(-sel, axis=1)
        gap = srt[:, k - 1] - srt[:, k]
        self.route_gap = gap if self.route_gap is None else np.minimum(self.route_gap, gap)
        gate, up, down = (t[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for s in range(h.shape[0]):
            chosen = np.argsort(-sel[s], kind="stable")[:k]
            w = prob[s, chosen] / max(prob[s, chosen].sum(), 6.103515625e-5)
            for e, we in zip(chosen, w):
                out[s] += we * (down[e] @ (silu(gate[e] @ h[s]) * (up[e] @ h[s])))
        return out

    def _mamba_family(self, tokens, hidden):
        tokens = np.asarray(tokens)
        t = self.t
        self.route_gap = None
        granite = self.arch == "granitehybrid"
        res = (self.hp("residual_scale", 0.0) or 1.0) if granite else 1.0
        x = t["token_embd.weight"][tokens]
        if granite and self.hp("embedding_scale", 0.0):
            x = x * self.hp("embedding_scale")
        for i in range(self.hp("block_count")):
            p = f"blk.{i}."
            h = self.norm(x, t[p + "attn_norm.weight"])
            kind = self.kind(i)
            if kind == "R":
                o = self._mamba2(h, p)
            elif kind == "A":
                o = self._attention(h, p, i)
            else:  # nemotron_h's squared-ReLU feed-forward
                o = np.maximum(h @ t[p + "ffn_up.weight"].T, 0.0) ** 2 @ t[p + "ffn_down.weight"].T
            x = x + o * res
            if granite:
                h = self.norm(x, t[p + "ffn_norm.weight"])
                if p + "ffn_gate_inp.weight" in t:  # Granite 4.0-H Tiny / Small: experts, a shared one ungated
                    d = self._experts(h, p, silu)
                    if p + "ffn_up_shexp.weight" in t:
                        d = d + (silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)) \
                            @ t[p + "ffn_down_shexp.weight"].T
                else:
                    d = (silu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) \
                        @ t[p + "ffn_down.weight"].T
                x = x + d * res
        x = self.norm(x, t["output_norm.weight"])
        if hidden:
            return x
        logits = x @ t.get("output.weight", t["token_embd.weight"]).T
        if granite and self.hp("logit_scale", 0.0):
            logits = logits / self.hp("logit_scale")
        return logits

    def _mamba2(self, h, p):
        t = self.t
        d_inner = self.hp("ssm.inner_size")
        ds = self.hp("ssm.state_size")
        ng = self.hp("ssm.group_count")
        nh = self.hp("ssm.time_step_rank")
        hd = d_inner // nh
        w = t[p + "ssm_conv1d.weight"]  # [channels, d_conv]
        zxbcdt = h @ t[p + "ssm_in.weight"].T
        z = zxbcdt[:, :d_inner]
        xbc = zxbcdt[:, d_inner:2 * d_inner + 2 * ng * ds]
        dt = softplus(zxbcdt[:, 2 * d_inner + 2 * ng * ds:] + t[p + "ssm_dt.bias"])  # [n, nh]
        A = t[p + "ssm_a"].reshape(-1)
        D = t[p + "ssm_d"].reshape(-1)
        bias = t.get(p + "ssm_conv1d.bias", 0.0)
        window = np.zeros((xbc.shape[1], w.shape[1] - 1))
        state = np.zeros((nh, hd, ds))
        y = np.zeros((h.shape[0], nh, hd))
        for s in range(h.shape[0]):
            conv, window = self._conv_step(window, xbc[s], w)
            conv = silu(conv + bias)
            xs = conv[:d_inner].reshape(nh, hd)
            B = conv[d_inner:d_inner + ng * ds].reshape(ng, ds)
            C = conv[d_inner + ng * ds:].reshape(ng, ds)
            for hh in range(nh):
                g = hh // (nh // ng)
                state[hh] = state[hh] * math.exp(dt[s, hh] * A[hh]) + np.outer(xs[hh] * dt[s, hh], B[g])
                y[s, hh] = state[hh] @ C[g] + D[hh] * xs[hh]
        y = y.reshape(h.shape[0], d_inner) * silu(z)
        y = self.norm(y.reshape(h.shape[0], ng, -1), t[p + "ssm_norm.weight"].reshape(ng, -1))
        return y.reshape(h.shape[0], d_inner) @ t[p + "ssm_out.weight"].T

    @staticmethod
    def _conv_step(window, xt, w):
        """One step of a causal depthwise convolution: the window of past
        inputs [channels, taps - 1] (oldest first) gets xt; returns the
        output and the new window."""
        full = np.concatenate([window, xt[:, None]], axis=1)  # [channels, taps]
        return (full * w).sum(axis=1), full[:, 1:]

    def _shortconv(self, h, p):
        t = self.t
        E = h.shape[1]
        w = t[p + "shortconv.conv.weight"]  # [E, l_cache]
        bcx = h @ t[p + "shortconv.in_proj.weight"].T
        b, c, xx = bcx[:, :E], bcx[:, E:2 * E], bcx[:, 2 * E:]
        window = np.zeros((E, w.shape[1] - 1))
        y = np.zeros_like(h)
        for s in range(h.shape[0]):
            conv, window = self._conv_step(window, b[s] * xx[s], w)
            y[s] = c[s] * conv
        return y @ t[p + "shortconv.out_proj.weight"].T

    def _gated_delta_net(self, h, p):
        t = self.t
        dk = self.hp("ssm.state_size")
        nk = self.hp("ssm.group_count")
        nv = self.hp("ssm.time_step_rank")
        d_inner = self.hp("ssm.inner_size")
        dv = d_inner // nv
        w = t[p + "ssm_conv1d.weight"]  # [channels, d_conv]
        qkv = h @ t[p + "attn_qkv.weight"].T
        z = h @ t[p + "attn_gate.weight"].T
        if self.arch == "qwen3next":
            # ssm_ba: per key head, its nv / nk value heads' betas then their alphas; value head h
            # reads key head h // (nv / nk) (repeat-interleave), where qwen35 has h % nk (tiled)
            r = nv // nk
            ba = (h @ t[p + "ssm_ba.weight"].T).reshape(-1, nk, 2 * r)
            b_raw, a_raw = ba[..., :r].reshape(-1, nv), ba[..., r:].reshape(-1, nv)
            key_head = [hv // r for hv in range(nv)]
        else:
            b_raw, a_raw = h @ t[p + "ssm_beta.weight"].T, h @ t[p + "ssm_alpha.weight"].T
            key_head = [hv % nk for hv in range(nv)]
        beta = sigmoid(b_raw)
        g = softplus(a_raw + t[p + "ssm_dt.bias"]) * t[p + "ssm_a"].reshape(-1)
        window = np.zeros((qkv.shape[1], w.shape[1] - 1))
        S = np.zeros((nv, dv, dk))  # per value head: rows over the value dims, columns over the key dims
        out = np.zeros((h.shape[0], nv, dv))
        for s in range(h.shape[0]):
            conv, window = self._conv_step(window, qkv[s], w)
            conv = silu(conv)
            q = conv[:nk * dk].reshape(nk, dk)
            k = conv[nk * dk:2 * nk * dk].reshape(nk, dk)
            v = conv[2 * nk * dk:].reshape(nv, dv)
            q = q / np.sqrt((q * q).sum(axis=1, keepdims=True) + self.eps)
            k = k / np.sqrt((k * k).sum(axis=1, keepdims=True) + self.eps)
            for hv in range(nv):
                qh, kh = q[key_head[hv]], k[key_head[hv]]
                S[hv] *= math.exp(g[s, hv])
                d = (v[hv] - S[hv] @ kh) * beta[s, hv]
                S[hv] += np.outer(d, kh)
                out[s, hv] = S[hv] @ qh / math.sqrt(dk)
        o = self.norm(out, t[p + "ssm_norm.weight"]) * silu(z.reshape(-1, nv, dv))
        return o.reshape(h.shape[0], -1) @ t[p + "ssm_out.weight"].T

    def _rope_positions(self, n_rot, n):
        """[n, n_rot/2] the position each rotated pair turns by: lfm2 plain
        NeoX; qwen35 interleaved MRoPE over text positions (t, h, w = p, the
        fourth section 0), ggml's ggml_mrope_cache_init."""
        pos = np.arange(n, dtype=np.float64)
        if self.arch not in ("qwen35", "qwen35moe"):
            return np.repeat(pos[:, None], n_rot // 2, axis=1)
        sec = [int(v) for v in np.asarray(self.hp("rope.dimension_sections")).reshape(-1)[:4]]
        total = sum(sec)
        use_p = np.zeros(n_rot // 2, dtype=bool)
        for j in range(n_rot // 2):
            sector = j % total
            use_p[j] = ((sector % 3 == 1 and sector < 3 * sec[1]) or (sector % 3 == 2 and sector < 3 * sec[2])
                        or (sector % 3 == 0 and sector < 3 * sec[0]))
        return np.where(use_p[None, :], pos[:, None], 0.0)

    def _attention(self, h, p, i):
        t = self.t
        n = h.shape[0]
        E = self.hp("embedding_length")
        n_head = self.hp("attention.head_count")
        n_kv = self.layer_value("attention.head_count_kv", i, n_head)
        hd = self.hp("attention.key_length", E // n_head)
        n_rot = self.hp("rope.dimension_count", hd)
        base = self.hp("rope.freq_base", 10000.0)
        scale = 1.0 / math.sqrt(hd)
        rope_mode = "neox"
        if self.arch == "nemotron_h":
            rope_mode = None
        elif self.arch == "granitehybrid":
            rope_mode = "norm" if self.hp("rope.scaling.finetuned", True) else None
            scale = self.hp("attention.scale", 0.0) or scale
        qg = h @ t[p + "attn_q.weight"].T
        if self.arch in ("qwen35", "qwen35moe", "qwen3next"):
            qg = qg.reshape(n, n_head, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(n, n_head * hd)
        else:
            q, gate = qg.reshape(n, n_head, hd), None
        k = (h @ t[p + "attn_k.weight"].T).reshape(n, n_kv, hd)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        if p + "attn_q_norm.weight" in t:
            q, k = self.norm(q, t[p + "attn_q_norm.weight"]), self.norm(k, t[p + "attn_k_norm.weight"])
        half = n_rot // 2
        ang = self._rope_positions(n_rot, n) * (base ** (-2.0 * np.arange(half) / n_rot))[None, :]
        c, s_ = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rope(x):
            x = x.copy()
            if rope_mode == "neox":
                x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
                x[..., :half] = x0 * c - x1 * s_
                x[..., half:n_rot] = x0 * s_ + x1 * c
            elif rope_mode == "norm":
                x0, x1 = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
                x[..., 0:n_rot:2] = x0 * c - x1 * s_
                x[..., 1:n_rot:2] = x0 * s_ + x1 * c
            return x

        q, k = rope(q), rope(k)
        group = n_head // n_kv
        att = np.zeros((n, n_head, hd))
        mask = np.tril(np.ones((n, n), dtype=bool))
        for hh in range(n_head):
            sc = q[:, hh] @ k[:, hh // group].T * scale
            sc = np.where(mask, sc, -np.inf)
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            att[:, hh] = (sc / sc.sum(axis=1, keepdims=True)) @ v[:, hh // group]
        o = att.reshape(n, -1)
        if gate is not None:
            o = o * sigmoid(gate)
        return o @ t[p + "attn_output.weight"].T
