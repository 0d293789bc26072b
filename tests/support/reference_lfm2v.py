"""LFM2-VL's vision tower (projector "lfm2") in float64 numpy, for the tests:
the position table resized to the image's grid as ggml_interpolate's
antialiased bilinear mode computes each output value (a 2-D sum over the
source cells, written from the formula, not the library's separable
weights), the SigLIP ViT over any grid, the pixel unshuffle, the layer norm
and the GELU MLP. Weights through gguf's own dequantizer (images.reference_file)."""

import math

import numpy as np

from images import reference_file


def resize_table(table, gx, gy):
    """table [n * n, E] (row-major, y then x) -> [gy * gx, E]: for each
    output cell, the source cells within the filter's reach weighted by
    the product of the two triangles (widened by 1/scale when shrinking),
    divided by the weights' sum. Half-pixel centres, no corner alignment."""
    n = math.isqrt(table.shape[0])
    t = table.reshape(n, n, -1)
    if (gx, gy) == (n, n):
        return table.copy()
    sx, sy = gx / n, gy / n
    rx, ry = max(1.0, 1.0 / sx), max(1.0, 1.0 / sy)  # the filters' half widths in source cells
    out = np.zeros((gy, gx, t.shape[2]))
    for Y in range(gy):
        cy = (Y + 0.5) / sy  # the output cell's centre, in source coordinates
        for X in range(gx):
            cx = (X + 0.5) / sx
            acc, total = 0.0, 0.0
            for y in range(n):
                wy = max(0.0, 1.0 - abs(y + 0.5 - cy) / ry)
                for x in range(n):
                    wx = max(0.0, 1.0 - abs(x + 0.5 - cx) / rx)
                    if wx * wy > 0:
                        acc = acc + wx * wy * t[y, x]
                        total += wx * wy
            out[Y, X] = acc / total
    return out.reshape(gy * gx, -1)


def _ln(v, w, b, eps):
    mu = v.mean(-1, keepdims=True)
    y = (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + eps)
    return y * (1.0 if w is None else w) + (0.0 if b is None else b)


def _gelu(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


class Lfm2VisionReference:
    def __init__(self, path):
        self.md, self.t = reference_file(path)

    def vit(self, pixels):
        """[gy * gx, E] of normalised pixels [3, H, W]."""
        md, t = self.md, self.t
        ps = md["clip.vision.patch_size"]
        E, H = md["clip.vision.embedding_length"], md["clip.vision.attention.head_count"]
        eps = md["clip.vision.attention.layer_norm_epsilon"]
        gy, gx = pixels.shape[1] // ps, pixels.shape[2] // ps
        W = t["v.patch_embd.weight"]  # [E, 3, p, p]
        x = np.zeros((gy * gx, E))
        for py in range(gy):
            for px in range(gx):
                patch = pixels[:, py * ps:(py + 1) * ps, px * ps:(px + 1) * ps].astype(np.float64)
                x[py * gx + px] = np.einsum("ecij,cij->e", W, patch)
        x += t["v.patch_embd.bias"] + resize_table(t["v.position_embd.weight"], gx, gy)
        D = E // H
        for i in range(md["clip.vision.block_count"]):
            T = lambda n: t[f"v.blk.{i}.{n}"]  # noqa: E731
            h = _ln(x, T("ln1.weight"), T("ln1.bias"), eps)
            q, k, v = (h @ T(f"attn_{n}.weight").T + T(f"attn_{n}.bias") for n in "qkv")
            out = np.zeros_like(h)
            for hh in range(H):
                sl = slice(hh * D, (hh + 1) * D)
                s = q[:, sl] @ k[:, sl].T / math.sqrt(D)
                s = np.exp(s - s.max(1, keepdims=True))
                out[:, sl] = (s / s.sum(1, keepdims=True)) @ v[:, sl]
            x = x + out @ T("attn_out.weight").T + T("attn_out.bias")
            h = _ln(x, T("ln2.weight"), T("ln2.bias"), eps)
            x = x + _gelu(h @ T("ffn_up.weight").T + T("ffn_up.bias")) @ T("ffn_down.weight").T + T("ffn_down.bias")
        return _ln(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps), gx, gy

    def encode_piece(self, pixels):
        """[cells, n_embd_text] of one piece: each s x s block of patches
        concatenated row-major into one row, blocks row-major; layer norm
        (eps 1e-5); mm.2(gelu(mm.1 x))."""
        t = self.t
        s = self.md["clip.vision.projector.scale_factor"]
        x, gx, gy = self.vit(pixels)
        rows = []
        for by in range(gy // s):
            for bx in range(gx // s):
                rows.append(np.concatenate([x[(by * s + a) * gx + bx * s + b] for a in range(s) for b in range(s)]))
        x = _ln(np.array(rows), t.get("mm.input_norm.weight"), t.get("mm.input_norm.bias"), 1e-5)
        return _gelu(x @ t["mm.1.weight"].T + t["mm.1.bias"]) @ t["mm.2.weight"].T + t["mm.2.bias"]
