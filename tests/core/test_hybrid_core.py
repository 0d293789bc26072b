"""The C core's recurrent mixers and state pool (csrc/recurrent.c, model.c)
on small hybrid models built in memory: Gated DeltaNet layers beside gated
attention (qwen35's plan, and qwen35moe's with routed experts beside a
gated shared one), LFM2's short convolutions, and Mamba2 layers (one
without a feed-forward, as mamba2 and nemotron_h have them). Against a float64
numpy forward pass written from the formulas, and the engine's invariance:
a sequence's logits are the same bits whole, in chunks or one token at a
time, alone or beside another sequence, at 1 or 2 threads, forked or fresh.
The architecture files and GGUF round trips are tests/models/test_hybrid_models.py."""

import numpy as np
import pytest

from llminfer import _core, errors
from llminfer.models.base import (ACT_RELU_SQR, MIX_ATTN, MIX_GDN, MIX_MAMBA2, MIX_NONE, MIX_SHORTCONV, ROPE_NEOX,
                                  LayerSpec, Matrix, ModelSpec, MoESpec)

E, V, FF = 64, 50, 96
N_HEAD, N_KV, HD, N_ROT = 4, 2, 16, 8
H, G, N, K = 4, 2, 16, 4  # GDN value heads, key heads, head size, conv taps
DI = H * N
EPS = 1e-6
KV_F32 = 0


def f32(rng, *shape, scale=0.2):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mat(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    return Matrix(np.frombuffer(a.tobytes(), dtype=np.uint8).copy(), 0, a.shape[0], a.shape[1])


def layer(rng, mixer, gated=False):
    L = LayerSpec(attn_norm=1 + f32(rng, E, scale=0.1), wq=None, wk=None, wv=None, wo=None,
                  ffn_norm=1 + f32(rng, E, scale=0.1), w_gate=mat(f32(rng, FF, E)), w_up=mat(f32(rng, FF, E)),
                  w_down=mat(f32(rng, E, FF)), mixer=mixer)
    if mixer == MIX_ATTN:
        L.wq = mat(f32(rng, N_HEAD * HD * (2 if gated else 1), E))
        L.wk, L.wv = mat(f32(rng, N_KV * HD, E)), mat(f32(rng, N_KV * HD, E))
        L.wo = mat(f32(rng, E, N_HEAD * HD))
        L.q_norm, L.k_norm = 1 + f32(rng, HD, scale=0.1), 1 + f32(rng, HD, scale=0.1)
        L.attn_out_gate = gated
        L.rope_base = 10000.0
    elif mixer == MIX_GDN:
        ch = 2 * G * N + DI
        L.ssm_in, L.ssm_z = mat(f32(rng, ch, E)), mat(f32(rng, DI, E))
        L.ssm_beta, L.ssm_alpha = mat(f32(rng, H, E)), mat(f32(rng, H, E))
        L.ssm_conv = f32(rng, ch, K, scale=0.5)
        L.ssm_dt_b = f32(rng, H, scale=0.5)
        L.ssm_a = -np.exp(f32(rng, H, scale=0.5))
        L.ssm_norm = 1 + f32(rng, N, scale=0.1)
        L.ssm_out = mat(f32(rng, E, DI))
    elif mixer == MIX_SHORTCONV:
        L.ssm_in, L.ssm_out = mat(f32(rng, 3 * E, E)), mat(f32(rng, E, E))
        L.ssm_conv = f32(rng, E, 3, scale=0.5)
    elif mixer == MIX_MAMBA2:
        ch = DI + 2 * G * N
        L.ssm_in = mat(f32(rng, DI + ch + H, E))
        L.ssm_conv, L.ssm_conv_b = f32(rng, ch, K, scale=0.5), f32(rng, ch, scale=0.1)
        L.ssm_dt_b, L.ssm_d = f32(rng, H, scale=0.5), f32(rng, H, scale=0.5)
        L.ssm_a = -np.exp(f32(rng, H, scale=0.5))
        L.ssm_norm = 1 + f32(rng, DI, scale=0.1)
        L.ssm_out = mat(f32(rng, E, DI))
    return L


N_EXP, N_USED, FE, FS = 8, 2, 32, 48  # experts, used per token, an expert's width, the shared expert's


def moe(rng, L):
    """qwen35moe's feed-forward: routed experts beside a sigmoid-gated shared one"""
    L.w_gate = L.w_up = L.w_down = None
    L.moe = MoESpec(router=mat(f32(rng, N_EXP, E, scale=1.0)), gate_exps=mat(f32(rng, N_EXP * FE, E)),
                    up_exps=mat(f32(rng, N_EXP * FE, E)), down_exps=mat(f32(rng, N_EXP * E, FE)))
    L.gate_shexp, L.up_shexp, L.down_shexp = mat(f32(rng, FS, E)), mat(f32(rng, FS, E)), mat(f32(rng, E, FS))
    L.gate_inp_shexp = f32(rng, E, scale=0.5)
    return L


def no_ffn(L):
    L.ffn_norm = L.w_gate = L.w_up = L.w_down = None
    return L


def model(kind, seed=0):
    rng = np.random.default_rng(seed)
    if kind in ("gdn", "gdn_grouped"):
        layers = [layer(rng, MIX_GDN), layer(rng, MIX_GDN), layer(rng, MIX_ATTN, gated=True), layer(rng, MIX_GDN)]
        conv = K
    elif kind == "gdn_moe":
        layers = [moe(rng, layer(rng, MIX_GDN)), moe(rng, layer(rng, MIX_ATTN, gated=True)),
                  moe(rng, layer(rng, MIX_GDN))]
        conv = K
    elif kind == "nemotron":  # nemotron_h's plan: a mixer or a feed-forward per layer, the latter ungated
        ffn_only = layer(rng, MIX_NONE)
        ffn_only.w_gate = None
        layers = [no_ffn(layer(rng, MIX_MAMBA2)), ffn_only, no_ffn(layer(rng, MIX_ATTN))]
        conv = K
    elif kind == "mamba2":
        layers = [no_ffn(layer(rng, MIX_MAMBA2)), layer(rng, MIX_ATTN), layer(rng, MIX_MAMBA2)]
        conv = K
    else:
        layers = [layer(rng, MIX_SHORTCONV), layer(rng, MIX_ATTN), layer(rng, MIX_SHORTCONV)]
        conv = 3
    emb = mat(f32(rng, V, E, scale=1.0))
    spec = ModelSpec(arch=kind, n_vocab=V, n_embd=E, n_head=N_HEAD, n_head_kv=N_KV, head_dim=HD, head_dim_v=HD,
                     n_ff=FF, n_rot=N_ROT, rope_mode=ROPE_NEOX, gate_fn=0, norm_eps=EPS, embd_scale=1.0,
                     attn_scale=HD ** -0.5, context_length=512, tok_embd=emb, output_norm=1 + f32(rng, E, scale=0.1),
                     output=emb, layers=layers, ssm_d_conv=conv, ssm_d_inner=DI, ssm_d_state=N, ssm_n_group=G,
                     ssm_n_head=H)
    if kind == "gdn_grouped":  # qwen3next's order: value head h reads key head h // (H / G)
        spec.ssm_kv_grouped = True
    if kind == "nemotron":
        spec.gate_fn = ACT_RELU_SQR
    if kind == "gdn_moe":
        spec.n_expert, spec.n_expert_used, spec.n_ff_exp, spec.n_ff_shexp = N_EXP, N_USED, FE, FS
    return spec


# ---- the numpy reference (float64) ----

def w64(m):
    return np.frombuffer(m.data.tobytes(), dtype=np.float32).reshape(m.rows, m.k).astype(np.float64)


def rms(x, w, eps=EPS):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1 + np.exp(-x))


def rope(x, pos):  # x [n, heads, HD], NEOX on the first N_ROT dims
    half = N_ROT // 2
    freq = 10000.0 ** (-np.arange(half) * 2 / N_ROT)
    ang = pos[:, None] * freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    a, b = x[..., :half], x[..., half:N_ROT]
    out[..., :half] = a * c - b * s
    out[..., half:N_ROT] = a * s + b * c
    return out


def reference(spec, tokens):
    """logits [n, V] of one sequence from position 0"""
    n = len(tokens)
    x = w64(spec.tok_embd)[tokens]
    for L in spec.layers:
        h = rms(x, L.attn_norm)
        if L.mixer == MIX_NONE:
            o = 0
        elif L.mixer == MIX_ATTN:
            qf = (h @ w64(L.wq).T).reshape(n, N_HEAD, -1)
            q, gate = (qf[..., :HD], qf[..., HD:]) if L.attn_out_gate else (qf, None)
            k = (h @ w64(L.wk).T).reshape(n, N_KV, HD)
            v = (h @ w64(L.wv).T).reshape(n, N_KV, HD)
            q, k = rope(rms(q, L.q_norm), np.arange(n)), rope(rms(k, L.k_norm), np.arange(n))
            out = np.zeros((n, N_HEAD, HD))
            for hh in range(N_HEAD):
                kv = hh // (N_HEAD // N_KV)
                sc = q[:, hh] @ k[:, kv].T * HD ** -0.5
                sc = np.where(np.tril(np.ones((n, n))) > 0, sc, -np.inf)
                p = np.exp(sc - sc.max(-1, keepdims=True))
                out[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
            if gate is not None:
                out = out / (1 + np.exp(-gate))
            o = out.reshape(n, -1) @ w64(L.wo).T
        elif L.mixer == MIX_GDN:
            qkv = h @ w64(L.ssm_in).T
            z = h @ w64(L.ssm_z).T
            beta = 1 / (1 + np.exp(-(h @ w64(L.ssm_beta).T)))
            alpha = h @ w64(L.ssm_alpha).T
            w = L.ssm_conv.astype(np.float64)
            pad = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
            conv = silu(np.stack([(pad[t:t + K].T * w).sum(-1) for t in range(n)]))
            S = np.zeros((H, N, N))
            o = np.zeros((n, DI))
            for t in range(n):
                qs = conv[t, :G * N].reshape(G, N)
                ks = conv[t, G * N:2 * G * N].reshape(G, N)
                vs = conv[t, 2 * G * N:].reshape(H, N)
                qs = qs / np.maximum(np.linalg.norm(qs, axis=-1, keepdims=True), EPS) / np.sqrt(N)
                ks = ks / np.maximum(np.linalg.norm(ks, axis=-1, keepdims=True), EPS)
                for hh in range(H):
                    g = hh // (H // G) if spec.ssm_kv_grouped else hh % G
                    decay = np.exp(np.log1p(np.exp(alpha[t, hh] + L.ssm_dt_b[hh])) * L.ssm_a[hh])
                    S[hh] *= decay
                    d = (vs[hh] - S[hh] @ ks[g]) * beta[t, hh]
                    S[hh] += np.outer(d, ks[g])
                    oh = S[hh] @ qs[g]
                    o[t, hh * N:(hh + 1) * N] = rms(oh, L.ssm_norm) * silu(z[t, hh * N:(hh + 1) * N])
            o = o @ w64(L.ssm_out).T
        elif L.mixer == MIX_MAMBA2:
            zxbcdt = h @ w64(L.ssm_in).T
            ch = DI + 2 * G * N
            z, xbc, dt = zxbcdt[:, :DI], zxbcdt[:, DI:DI + ch], zxbcdt[:, DI + ch:]
            pad = np.concatenate([np.zeros((K - 1, ch)), xbc])
            conv = silu(np.stack([(pad[t:t + K].T * L.ssm_conv).sum(-1) for t in range(n)]) + L.ssm_conv_b)
            hd = DI // H
            S = np.zeros((H, hd, N))
            y = np.zeros((n, DI))
            for t in range(n):
                xs = conv[t, :DI].reshape(H, hd)
                B = conv[t, DI:DI + G * N].reshape(G, N)
                C = conv[t, DI + G * N:].reshape(G, N)
                for hh in range(H):
                    g = hh // (H // G)
                    dts = np.log1p(np.exp(dt[t, hh] + L.ssm_dt_b[hh]))
                    S[hh] = S[hh] * np.exp(dts * L.ssm_a[hh]) + np.outer(xs[hh] * dts, B[g])
                    y[t, hh * hd:(hh + 1) * hd] = S[hh] @ C[g] + xs[hh] * L.ssm_d[hh]
            y = y * silu(z)
            gs = DI // G
            y = np.concatenate([rms(y[:, i * gs:(i + 1) * gs], L.ssm_norm[i * gs:(i + 1) * gs]) for i in range(G)], -1)
            o = y @ w64(L.ssm_out).T
        else:  # shortconv
            bcx = h @ w64(L.ssm_in).T
            b, c, xx = bcx[:, :E], bcx[:, E:2 * E], bcx[:, 2 * E:]
            bx = b * xx
            kk = L.ssm_conv.shape[1]
            pad = np.concatenate([np.zeros((kk - 1, E)), bx])
            conv = np.stack([(pad[t:t + kk].T * L.ssm_conv).sum(-1) for t in range(n)])
            o = (c * conv) @ w64(L.ssm_out).T
        x = x + o
        if L.moe is not None:
            h = rms(x, L.ffn_norm)
            logits = h @ w64(L.moe.router).T
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out = np.zeros_like(x)
            for t in range(n):
                top = np.argsort(-p[t], kind="stable")[:N_USED]
                w = p[t, top] / p[t, top].sum()
                for e, we in zip(top, w):
                    g = h[t] @ w64(L.moe.gate_exps)[e * FE:(e + 1) * FE].T
                    u = h[t] @ w64(L.moe.up_exps)[e * FE:(e + 1) * FE].T
                    out[t] += we * ((silu(g) * u) @ w64(L.moe.down_exps)[e * E:(e + 1) * E].T)
            shared = (silu(h @ w64(L.gate_shexp).T) * (h @ w64(L.up_shexp).T)) @ w64(L.down_shexp).T
            gate = 1 / (1 + np.exp(-(h @ L.gate_inp_shexp.astype(np.float64))))
            x = x + out + gate[:, None] * shared
            continue
        if L.w_up is None:
            continue
        h = rms(x, L.ffn_norm)
        if L.w_gate is None:  # ungated, squared ReLU
            x = x + (np.maximum(h @ w64(L.w_up).T, 0) ** 2) @ w64(L.w_down).T
            continue
        x = x + (silu(h @ w64(L.w_gate).T) * (h @ w64(L.w_up).T)) @ w64(L.w_down).T
    return rms(x, spec.output_norm) @ w64(spec.output).T


# ---- driving the C core ----

class Runner:
    """A context over a spec, with block tables and state slots handed out here."""

    def __init__(self, spec, slots=8, threads=2, block=16, n_batch=64):
        self.desc = _core.ModelDesc(spec)
        self.block = block
        self.ctx = _core.Context(self.desc, KV_F32, block, (64, 0), n_batch, threads, n_state_slots=slots)
        self.free_blocks = list(range(64))
        self.threads = threads

    def seq(self, slot):
        self.ctx.clear_state(slot)
        return {"slot": slot, "blocks": [], "n": 0}

    def run(self, parts, threads=None):
        """parts: [(seq, tokens)]: one pass; the logits of every token of every part"""
        toks, pos, sidx, tables = [], [], [], []
        for i, (s, ids) in enumerate(parts):
            while len(s["blocks"]) * self.block < s["n"] + len(ids):
                s["blocks"].append(self.free_blocks.pop(0))
            toks += list(ids)
            pos += list(range(s["n"], s["n"] + len(ids)))
            sidx += [i] * len(ids)
            tables.append((np.array(s["blocks"], np.int32), None, s["slot"]))
        n = len(toks)
        out = np.empty(n * V, np.float32)
        self.ctx.decode(np.array(toks, np.int32), None, np.array(pos, np.int32), np.array(sidx, np.int32),
                        np.ones(n, np.int8), tables, out, threads or self.threads)
        for s, ids in parts:
            s["n"] += len(ids)
        return out.reshape(n, V)


TOKENS = np.random.default_rng(7).integers(0, V, 40)


@pytest.fixture(scope="module", params=["gdn", "gdn_grouped", "gdn_moe", "shortconv", "mamba2", "nemotron"])
def spec(request):
    return model(request.param)


def test_logits_match_the_numpy_reference(spec, isa):
    """at every kernel level this CPU runs (the recurrences go through each level's vector kernels)"""
    r = Runner(spec)
    ours = r.run([(r.seq(0), TOKENS)])
    ref = reference(spec, TOKENS)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < 1e-4, f"{spec.arch}/{isa}: largest difference {err:.2e} of the largest logit"


def test_whole_chunked_and_one_at_a_time_give_the_same_bits(spec, isa):
    r = Runner(spec)
    whole = r.run([(r.seq(0), TOKENS)])
    s = r.seq(1)
    chunked = np.concatenate([r.run([(s, TOKENS[a:b])]) for a, b in ((0, 7), (7, 8), (8, 30), (30, 40))])
    for slot, threads in ((2, 1), (3, 2)):  # one token a pass: alone, and in each thread's own row
        s = r.seq(slot)
        single = np.concatenate([r.run([(s, TOKENS[i:i + 1])], threads=threads) for i in range(len(TOKENS))])
        assert np.array_equal(whole, single), threads
    assert np.array_equal(whole, chunked)


def test_batched_beside_another_sequence_gives_the_same_bits(spec):
    r = Runner(spec)
    alone = r.run([(r.seq(0), TOKENS)])
    other = np.random.default_rng(3).integers(0, V, 25)
    a, b = r.seq(1), r.seq(2)
    # interleaved in one pass, then on: the other's tokens change nothing of a's
    mixed = r.run([(b, other[:10]), (a, TOKENS[:20])], threads=1)[10:]
    rest = r.run([(a, TOKENS[20:]), (b, other[10:])])[:20]
    assert np.array_equal(alone, np.concatenate([mixed, rest]))


def test_a_forked_state_goes_on_as_the_original(spec):
    r = Runner(spec)
    a = r.seq(0)
    r.run([(a, TOKENS[:15])])
    b = {"slot": 1, "blocks": [], "n": 0}
    r.ctx.copy_state(0, 1)
    # the copy's KV: the same tokens written again into blocks of its own (the state is what is forked)
    snap = r.ctx.read_state(1)
    tail_a = r.run([(a, TOKENS[15:])])
    r.ctx.write_state(1, np.frombuffer(snap, np.uint8))
    b["blocks"] = list(a["blocks"][:1])  # block 0 holds positions 0..15: shared, read only below
    b["n"] = 15
    b["blocks"] += [r.free_blocks.pop(0) for _ in range(2)]
    # positions 15.. of b go to its own blocks; block 0's rows 0..14 are a's, the same keys
    tail_b = r.run([(b, TOKENS[15:])])
    assert np.array_equal(tail_a, tail_b)


def test_state_slots_are_checked(spec):
    r = Runner(spec, slots=2)
    with pytest.raises(errors.LLMInferError, match="state slot 2 is outside the pool of 2"):
        r.ctx.clear_state(2)
    a, b = r.seq(0), r.seq(0)
    with pytest.raises(errors.LLMInferError, match="two sequences of one batch hold state slot 0"):
        r.run([(a, TOKENS[:3]), (b, TOKENS[:3])])
    bad = {"slot": -1, "blocks": [], "n": 0}
    with pytest.raises(errors.LLMInferError, match="state slot -1 is outside"):
        r.run([(bad, TOKENS[:3])])
    with pytest.raises(errors.LLMInferError, match="not 3"):
        r.ctx.write_state(0, np.zeros(3, np.uint8))
    assert _core.state_slot_bytes(r.desc) == len(r.ctx.read_state(1)) > 0


def test_a_context_without_state_slots_is_refused(spec):
    desc = _core.ModelDesc(spec)
    with pytest.raises(errors.LLMInferError, match="state slots"):
        _core.Context(desc, KV_F32, 16, (64, 0), 16, 1)
