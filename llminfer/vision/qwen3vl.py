"""Qwen3-VL's vision tower (clip.projector_type "qwen3vl_merger"): Qwen2.5-VL's
preprocessing, patch order and 2-D RoPE (llminfer.vision.qwen25vl), with
learned positions, LayerNorm, a plain GELU feed-forward, no windows, and
DeepStack: some layers' outputs are merged and projected too, beside the
final rows.

    preprocess  as qwen2.5vl's (cells of 2 x 2 patches, 8 to 4096 of them)
    patches     [P, 3*p*p] @ (W0 + W1).T + b, patches by 2 x 2 cell (each
                cell's four (dy, dx) in a row), cells row-major
    + position  position_embd [n * n, E] as an n x n grid, resized to the
                image's patch grid by ggml's bilinear interpolation with
                aligned corners (where the grid differs), in the same order
    per layer   h = layer_norm(x; ln1)
                q, k, v = split(h @ Wqkv.T + bqkv); 2-D RoPE as qwen2.5vl's
                x = x + softmax(q k^T / sqrt(D)) v @ Wo.T + bo
                x = x + down(gelu(up(layer_norm(x; ln2))))
                a DeepStack layer (v.deepstack.IL.*): its output's cells
                (four rows side by side, [P/4, 4E]) through layer_norm(4E),
                fc1, GELU, fc2 -> [n_cells, n_embd_text]
    merge       layer_norm(x; post_ln), each cell's four rows side by side
    project     gelu(x @ mm.0.T + b0) @ mm.2.T + b2
    out         [n_cells, n_embd_text * (1 + DeepStack layers)]: the
                projection, then each DeepStack layer's rows, side by side

The text model (qwen3vl) takes the first n_embd_text of a row as its input
and adds the others after its first layers (li_model_desc.n_deepstack).

llama.cpp's tools/mtmd/models/qwen3vl.cpp, clip.cpp
(resize_position_embeddings) and ggml's upscale (bilinear, align corners),
written again here.
"""

from __future__ import annotations

import numpy as np

from llminfer.core import ops
from llminfer.core.system import check_threads
from llminfer.errors import UnsupportedModelError
from llminfer.vision.gemma4 import activation
from llminfer.vision.qwen25vl import (MAX_TOKENS, MERGE, MIN_TOKENS, Qwen25VLVision, grid_rows, packed_rows,
                                      rope_permutation)
from llminfer.vision.siglip import layer_norm
from llminfer.vision.tower import VisionParams, Weights


def resize_bilinear(table: np.ndarray, gx: int, gy: int) -> np.ndarray:
    """table [n, n, E] (rows by y, then x) resized to [gy, gx, E] as ggml's
    upscale does with GGML_SCALE_MODE_BILINEAR | ALIGN_CORNERS, in float32:
    output (i1, i0) reads the source at (i1 / sf1, i0 / sf0), sf = (out - 1)
    / (in - 1) (out / in where a side is 1), its four neighbours clamped."""
    n_y, n_x = table.shape[0], table.shape[1]
    f = np.float32

    def axis(out, inp):
        sf = f(out - 1) / f(inp - 1) if out > 1 and inp > 1 else f(out) / f(inp)
        pos = np.arange(out, dtype=np.float32) / sf
        i0 = np.floor(pos).astype(np.int64)
        lo, hi = np.clip(i0, 0, inp - 1), np.clip(i0 + 1, 0, inp - 1)
        d = np.clip(pos - lo.astype(np.float32), f(0), f(1)).astype(np.float32)
        return lo, hi, d

    y0, y1, dy = axis(gy, n_y)
    x0, x1, dx = axis(gx, n_x)
    t = table.astype(np.float32)
    a, b = t[y0][:, x0], t[y0][:, x1]
    c, d = t[y1][:, x0], t[y1][:, x1]
    dx, dy = dx[None, :, None], dy[:, None, None]
    one = f(1)
    return (a * (one - dx) * (one - dy) + b * dx * (one - dy) + c * (one - dx) * dy + d * dx * dy).astype(np.float32)


def _ln(wt: Weights, name: str, n: int):
    return wt.f32(f"{name}.weight", (n,)), wt.f32(f"{name}.bias", (n,))


class _Layer:
    def __init__(self, wt: Weights, i: int, p: VisionParams, perm: np.ndarray):
        E, F = p.n_embd, p.n_ff
        pre = f"v.blk.{i}"
        self.ln1, self.ln2 = _ln(wt, f"{pre}.ln1", E), _ln(wt, f"{pre}.ln2", E)
        # q and k rows reordered for the 2-D RoPE (qwen25vl.rope_permutation), v as it is
        order = np.concatenate([perm, E + perm, 2 * E + np.arange(E)])
        self.qkv = (packed_rows(wt, f"{pre}.attn_qkv.weight", 3 * E, E, order),
                    wt.f32(f"{pre}.attn_qkv.bias", (3 * E,))[order])
        self.o = wt.matrix(f"{pre}.attn_out.weight", E, E), wt.f32(f"{pre}.attn_out.bias", (E,))
        self.up = wt.matrix(f"{pre}.ffn_up.weight", F, E), wt.f32(f"{pre}.ffn_up.bias", (F,))
        self.down = wt.matrix(f"{pre}.ffn_down.weight", E, F), wt.f32(f"{pre}.ffn_down.bias", (E,))
        self.deep = None
        ds = f"v.deepstack.{i}"
        if wt.has(f"{ds}.fc1.weight"):
            fc1 = wt.info(f"{ds}.fc1.weight")
            hid = int(fc1.shape[0])
            out = int(wt.info(f"{ds}.fc2.weight").shape[0])
            self.deep = (_ln(wt, f"{ds}.norm", 4 * E),
                         (wt.matrix(f"{ds}.fc1.weight", hid, 4 * E), wt.f32(f"{ds}.fc1.bias", (hid,))),
                         (wt.matrix(f"{ds}.fc2.weight", out, hid), wt.f32(f"{ds}.fc2.bias", (out,))))


class Qwen3VLVision(Qwen25VLVision):
    """The encoder of a qwen3vl_merger mmproj: encode(image) -> float32
    [n_cells, n_embd_text * (1 + DeepStack layers)] (GridRows)."""

    def __init__(self, gguf, params: VisionParams, n_threads=None):
        self.gguf, self.params = gguf, params
        self.path = gguf.path
        self.n_threads = check_threads(n_threads)
        p, wt = params, Weights(gguf)
        E, ps, H = p.n_embd, p.patch_size, p.n_head
        if p.n_merge != MERGE:
            raise UnsupportedModelError(f"{self.path}: spatial merge {p.n_merge}; qwen3vl merges 2 x 2 patches")
        if (E // H) % 4:
            raise UnsupportedModelError(f"{self.path}: head size {E // H} is not a multiple of 4")
        self.wa_pattern = 0  # no windows
        self.window = 1
        self.cell = ps * MERGE
        self.min_pixels = MIN_TOKENS * self.cell * self.cell
        self.max_pixels = MAX_TOKENS * self.cell * self.cell
        w0 = wt.f32("v.patch_embd.weight", (E, 3, ps, ps))
        w1 = wt.f32("v.patch_embd.weight.1", (E, 3, ps, ps)) if wt.has("v.patch_embd.weight.1") else 0
        patch_w = np.ascontiguousarray((w0 + w1).reshape(E, 3 * ps * ps), np.float32)
        self.patch_w = ops.GemmWeight(patch_w, "F32", patch_w.shape)
        self.patch_b = wt.f32("v.patch_embd.bias", (E,))
        pos = wt.info("v.position_embd.weight")
        side = int(round(np.sqrt(pos.shape[0]))) if len(pos.shape) == 2 else 0
        if len(pos.shape) != 2 or pos.shape[1] != E or side * side != pos.shape[0]:
            raise UnsupportedModelError(f"{self.path}: v.position_embd.weight has shape {tuple(pos.shape)}, "
                                        f"expected (n * n, {E})")
        self.pos_table = wt.f32("v.position_embd.weight").reshape(side, side, E)
        self.perm = rope_permutation(E, H)
        self.layers = [_Layer(wt, i, p, self.perm) for i in range(p.n_layer)]
        self.post_ln = _ln(wt, "v.post_ln", E) if wt.has("v.post_ln.weight") else None
        mm2 = wt.info("mm.2.weight")
        if tuple(wt.info("mm.0.weight").shape) != (4 * E, 4 * E) or len(mm2.shape) != 2 or mm2.shape[1] != 4 * E:
            raise UnsupportedModelError(f"{self.path}: mm.0.weight and mm.2.weight are not ({4 * E}, {4 * E}) and "
                                        f"(n_embd, {4 * E})")
        self.n_text = int(mm2.shape[0])
        self.mm0 = wt.matrix("mm.0.weight", 4 * E, 4 * E), wt.f32("mm.0.bias", (4 * E,))
        self.mm2 = wt.matrix("mm.2.weight", self.n_text, 4 * E), wt.f32("mm.2.bias", (self.n_text,))
        deep = [L.deep for L in self.layers if L.deep is not None]
        if any(d[2][0].shape[0] != self.n_text for d in deep):
            raise UnsupportedModelError(f"{self.path}: a DeepStack layer does not project to {self.n_text}")
        self.n_deepstack = len(deep)
        self.n_embd_out = self.n_text * (1 + self.n_deepstack)
        self._ident = self.file_ident(gguf)

    def positions(self, gx: int, gy: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """[P, E]: the learned positions of the patches at (rows, cols)."""
        t = self.pos_table
        if (gy, gx) != t.shape[:2]:
            t = resize_bilinear(t, gx, gy)
        return np.ascontiguousarray(t[rows, cols], np.float32)

    def vit(self, pixels: np.ndarray, nt: int):
        p = self.params
        E, H, eps = p.n_embd, p.n_head, p.eps
        D = E // H
        cx, cy = self.grid(pixels)
        ps = p.patch_size
        cells, rows, cols = self.layout(cx, cy)
        P = len(rows)
        x = ops.gemm(self.patch_w, self.patches(pixels, rows, cols), self.patch_b,
                     self.positions(pixels.shape[2] // ps, pixels.shape[1] // ps, rows, cols), n_threads=nt)
        pos = np.ascontiguousarray(np.stack([rows, cols], axis=1), np.int32)
        deep = []
        # one set of buffers for every layer (fresh ones cost a page fault a page)
        h, a = np.empty((P, E), np.float32), np.empty((P, E), np.float32)
        qkv, f = np.empty((P, 3 * E), np.float32), np.empty((P, p.n_ff), np.float32)
        scratch = ops.attention_scratch(P, H, D, nt)
        for L in self.layers:
            layer_norm(x, *L.ln1, eps, nt, h)
            L.qkv[0](h, nt, L.qkv[1], out=qkv)
            q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]  # rows 3E apart, turned and read in place
            self.rope(q, pos, H, nt)
            self.rope(k, pos, H, nt)
            ops.attention(q, k, v, H, n_threads=nt, out=a, scratch=scratch)
            L.o[0](a, nt, L.o[1], x, out=x)
            layer_norm(x, *L.ln2, eps, nt, h)
            L.down[0](activation(p.ffn_op, L.up[0](h, nt, L.up[1], out=f), nt, out=f), nt, L.down[1], x, out=x)
            if L.deep is not None:
                norm, fc1, fc2 = L.deep
                m = layer_norm(x.reshape(-1, 4 * E), *norm, eps, nt)
                deep.append(fc2[0](ops.gelu(fc1[0](m, nt, fc1[1]), n_threads=nt), nt, fc2[1]))
        if self.post_ln is not None:
            x = layer_norm(x, *self.post_ln, eps, nt)
        return np.ascontiguousarray(x, np.float32), cells, deep

    def encode_pixels(self, pixels: np.ndarray, n_threads=None) -> np.ndarray:
        """GridRows [n_cells, n_embd_out], the cells in row-major order."""
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        cx, cy = self.grid(pixels)
        x, cells, deep = self.vit(pixels, nt)
        E = self.params.n_embd
        h = self.mm0[0](x.reshape(-1, 4 * E), nt, self.mm0[1])
        ops.gelu(h, n_threads=nt, out=h)
        y = np.concatenate([self.mm2[0](h, nt, self.mm2[1])] + deep, axis=1)
        out = np.empty_like(y)
        out[cells] = y
        return grid_rows(out, cx, cy)
