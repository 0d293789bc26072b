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


def _ln(x, w, b, eps):
    m = x.mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + eps) * w + b


def _gelu(x):  # ggml_gelu: the tanh form
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1 + np.exp(-x))


def encode(md, t, pixels):
    """float64 [n_cells, n_embd_text], cells row-major. A qwen2vl_merger file
    (Qwen2-VL): LayerNorms, an ungated gelu_quick feed-forward, no windows."""
    v2 = md["clip.projector_type"] == "qwen2vl_merger"
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

    def norm(v, name):
        return _ln(v, t[name + ".weight"], t[name + ".bias"], eps) if v2 else _rms(v, t[name + ".weight"], eps)

    for il in range(n_layer):
        p = f"v.blk.{il}."
        hn = norm(x, p + "ln1")
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
        hn = norm(x, p + "ln2")
        u = hn @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"]
        if v2:  # gelu_quick
            f = u / (1 + np.exp(-1.702 * u))
        else:
            f = _silu(hn @ t[p + "ffn_gate.weight"].T + t[p + "ffn_gate.bias"]) * u
        x = x + f @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"]
    x = norm(x, "v.post_ln")
    # each cell's four patches (dy, dx) side by side, cells row-major
    cells = x.reshape(cy, 2, cx, 2, E).transpose(0, 2, 1, 3, 4).reshape(cy * cx, 4 * E)
    y = _gelu(cells @ t["mm.0.weight"].T + t["mm.0.bias"])
    return y @ t["mm.2.weight"].T + t["mm.2.bias"]


def encode_qwen3vl(md, t, pixels):
    """Qwen3-VL's tower (qwen3vl_merger) the same plain way: float64
    [n_cells, n_embd_text * (1 + DeepStack layers)], cells row-major. The
    position table resized with align-corners bilinear interpolation
    (source coordinate i (n - 1) / (out - 1))."""
    E = int(md["clip.vision.embedding_length"])
    H = int(md["clip.vision.attention.head_count"])
    ps = int(md["clip.vision.patch_size"])
    eps = float(md["clip.vision.attention.layer_norm_epsilon"])
    n_layer = int(md["clip.vision.block_count"])
    D = E // H
    _, h, w = pixels.shape
    gy, gx = h // ps, w // ps
    cy, cx = gy // 2, gx // 2
    pat = pixels.reshape(3, gy, ps, gx, ps).transpose(1, 3, 0, 2, 4).reshape(gy * gx, -1)
    kern = (t["v.patch_embd.weight"] + t["v.patch_embd.weight.1"]).reshape(E, -1)
    x = pat @ kern.T + t["v.patch_embd.bias"]
    table = t["v.position_embd.weight"]
    n = int(round(np.sqrt(table.shape[0])))
    table = table.reshape(n, n, E)

    def src(out):
        return np.arange(out) * ((n - 1) / (out - 1)) if out > 1 else np.zeros(1)

    sy, sx = src(gy), src(gx)
    y0, x0 = np.floor(sy).astype(int), np.floor(sx).astype(int)
    y1, x1 = np.minimum(y0 + 1, n - 1), np.minimum(x0 + 1, n - 1)
    dy, dx = (sy - y0)[:, None, None], (sx - x0)[None, :, None]
    pos = (table[y0][:, x0] * (1 - dy) * (1 - dx) + table[y0][:, x1] * (1 - dy) * dx +
           table[y1][:, x0] * dy * (1 - dx) + table[y1][:, x1] * dy * dx)
    x = x + pos.reshape(gy * gx, E)
    prow = np.repeat(np.arange(gy), gx)
    pcol = np.tile(np.arange(gx), gy)
    q4 = D // 4
    inv = 10000.0 ** (-2.0 * np.arange(q4) / (D / 2))
    ang = np.concatenate([prow[:, None] * inv[None, :], pcol[:, None] * inv[None, :]], axis=1)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):
        a, b = v[..., :D // 2], v[..., D // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    def cells_of(v):  # [P, E] row-major patches -> [cells, 4E], each cell's (dy, dx) side by side
        return v.reshape(cy, 2, cx, 2, E).transpose(0, 2, 1, 3, 4).reshape(cy * cx, 4 * E)

    P = gy * gx
    deep = []
    for il in range(n_layer):
        p = f"v.blk.{il}."
        hn = _ln(x, t[p + "ln1.weight"], t[p + "ln1.bias"], eps)
        qkv = hn @ t[p + "attn_qkv.weight"].T + t[p + "attn_qkv.bias"]
        q, k, v = (qkv[:, j * E:(j + 1) * E].reshape(P, H, D) for j in range(3))
        q, k = rope(q), rope(k)
        att = np.empty((P, H, D))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh].T / np.sqrt(D)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, hh]
        x = x + att.reshape(P, E) @ t[p + "attn_out.weight"].T + t[p + "attn_out.bias"]
        hn = _ln(x, t[p + "ln2.weight"], t[p + "ln2.bias"], eps)
        x = x + _gelu(hn @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"]) @ t[p + "ffn_down.weight"].T \
            + t[p + "ffn_down.bias"]
        d = f"v.deepstack.{il}."
        if d + "fc1.weight" in t:
            m = _ln(cells_of(x), t[d + "norm.weight"], t[d + "norm.bias"], eps)
            deep.append(_gelu(m @ t[d + "fc1.weight"].T + t[d + "fc1.bias"]) @ t[d + "fc2.weight"].T
                        + t[d + "fc2.bias"])
    x = _ln(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    y = _gelu(cells_of(x) @ t["mm.0.weight"].T + t["mm.0.bias"]) @ t["mm.2.weight"].T + t["mm.2.bias"]
    return np.concatenate([y] + deep, axis=1)
