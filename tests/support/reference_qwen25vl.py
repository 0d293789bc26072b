"""A float64 numpy Qwen2.5-VL vision tower (qwen2.5vl_merger), written from
llama.cpp's graph (tools/mtmd/models/qwen2vl.cpp) and clip.cpp's inputs
for it, as plainly as possible: patches in row-major order, the window
rule as an attention mask over row-major patches (no reordering), and
the 2-D rotation pair by pair. It takes preprocessed pixels [3, H, W].

tensors: {name: float64 array} from images.reference_file."""

import numpy as np

WINDOW = 112


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _gelu(x):  # ggml_gelu: the tanh form
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1 + np.exp(-x))


def encode(md, t, pixels):
    """float64 [n_cells, n_embd_text], cells row-major."""
    E = int(md["clip.vision.embedding_length"])
    H = int(md["clip.vision.attention.head_count"])
    ps = int(md["clip.vision.patch_size"])
    eps = float(md["clip.vision.attention.layer_norm_epsilon"])
    n_layer = int(md["clip.vision.block_count"])
    pattern = int(md.get("clip.vision.n_wa_pattern", 0))
    D = E // H
    _, h, w = pixels.shape
    gy, gx = h // ps, w // ps
    cy, cx = gy // 2, gx // 2
    # each patch (row-major) as a vector (c, ky, kx): the conv, both temporal slices
    pat = pixels.reshape(3, gy, ps, gx, ps).transpose(1, 3, 0, 2, 4).reshape(gy * gx, -1)
    kern = (t["v.patch_embd.weight"] + t["v.patch_embd.weight.1"]).reshape(E, -1)
    x = pat @ kern.T
    prow = np.repeat(np.arange(gy), gx)
    pcol = np.tile(np.arange(gx), gy)
    # windows of WINDOW pixels: patches see each other when their cells share one
    win = WINDOW // ps // 2
    wid = (prow // 2 // win) * 10000 + (pcol // 2 // win)
    same_window = wid[:, None] == wid[None, :]
    # rotation angles per patch and pair i < D/2 (pairs (i, i + D/2)): the
    # first D/4 by the row, the rest by the column, each section from 0
    q4 = D // 4
    inv = 10000.0 ** (-2.0 * np.arange(q4) / (D / 2))
    ang = np.concatenate([prow[:, None] * inv[None, :], pcol[:, None] * inv[None, :]], axis=1)  # [P, D/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):  # v [P, H, D]
        a, b = v[..., :D // 2], v[..., D // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    P = gy * gx
    for il in range(n_layer):
        p = f"v.blk.{il}."
        hn = _rms(x, t[p + "ln1.weight"], eps)
        q = (hn @ t[p + "attn_q.weight"].T + t[p + "attn_q.bias"]).reshape(P, H, D)
        k = (hn @ t[p + "attn_k.weight"].T + t[p + "attn_k.bias"]).reshape(P, H, D)
        v = (hn @ t[p + "attn_v.weight"].T + t[p + "attn_v.bias"]).reshape(P, H, D)
        q, k = rope(q), rope(k)
        full = pattern <= 0 or (il + 1) % pattern == 0
        att = np.empty((P, H, D))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh].T / np.sqrt(D)
            if not full:
                s = np.where(same_window, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, hh]
        x = x + att.reshape(P, E) @ t[p + "attn_out.weight"].T + t[p + "attn_out.bias"]
        hn = _rms(x, t[p + "ln2.weight"], eps)
        g = hn @ t[p + "ffn_gate.weight"].T + t[p + "ffn_gate.bias"]
        u = hn @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"]
        x = x + (_silu(g) * u) @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"]
    x = _rms(x, t["v.post_ln.weight"], eps)
    # each cell's four patches (dy, dx) side by side, cells row-major
    cells = x.reshape(cy, 2, cx, 2, E).transpose(0, 2, 1, 3, 4).reshape(cy * cx, 4 * E)
    y = _gelu(cells @ t["mm.0.weight"].T + t["mm.0.bias"])
    return y @ t["mm.2.weight"].T + t["mm.2.bias"]
