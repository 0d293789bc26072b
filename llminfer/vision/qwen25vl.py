"""Qwen2.5-VL's vision tower (clip.projector_type "qwen2.5vl_merger"): a
ViT over an image kept near its own aspect ratio, with 2-D rotary
positions and attention inside windows on most layers, then a 2 x 2 merge
and a two-layer MLP into the text model's width.

    preprocess  the image resized (bicubic) to a whole number of a x a
                cells, a = patch_size * 2, its aspect ratio kept, between 8
                and 4096 cells (mtmd's smart resize, as Gemma 4's:
                vision.gemma4.target_size), drawn centred on black where the
                rounding leaves a margin (the width resized first, then the
                height, as mtmd's resize_pillow), scaled to [0, 1], normalised with
                the file's mean and std
    patches     the two temporal slices of the 3-D conv (v.patch_embd.weight
                and .weight.1) both see the still image: [P, 3*p*p] @ (W0 +
                W1).T, no bias
    order       patches by 2 x 2 cell (each cell's four (dy, dx) in a row),
                cells by window: windows of w x w cells (w = 112 / p / 2,
                llama.cpp's default window for qwen2.5vl) row-major, cells
                row-major inside a window (the last windows of a row or
                column cut short); the ViT runs in this order
    per layer   h = rms_norm(x) * ln1
                q, k, v = h @ W.T + b; 2-D RoPE, base 10000, on pairs (i,
                i + D/2) of each head: i < D/4 by the patch's row, angle
                row * base^(-4i/D), the rest by its column, angle col *
                base^(-4(i - D/4)/D) (ggml's GGML_ROPE_TYPE_VISION with
                sections [D/4] * 4)
                a = softmax(q k^T / sqrt(D)) v: over the whole image on the
                full-attention layers (every n_wa_pattern-th: (il + 1) %
                n_wa_pattern == 0), else inside each window
                x = x + a @ Wo.T + bo
                x = x + down(silu(gate h2) * up h2), h2 = rms_norm(x) * ln2
                (the file's ffn_op: silu where clip.use_silu says)
    merge       rms_norm(x) * post_ln, each cell's four rows side by side:
                [P/4, 4E]
    project     gelu(x @ mm.0.T + b0) @ mm.2.T + b2 -> the cells back in
                row-major order: [n_cells, n_embd_text]

In the prompt: "<|vision_start|>", one row per cell, "<|vision_end|>".
The text model (qwen2vl) gives the rows M-RoPE positions on the cell grid
(Engine.decode_rows' grid): image_parts hands the rows on as GridRows.

llama.cpp's tools/mtmd/models/qwen2vl.cpp, clip.cpp (its inputs for
qwen2.5vl: window order, mask, positions) and mtmd-image.cpp
(mtmd_image_preprocessor_dyn_size), written again here.
"""

from __future__ import annotations

import numpy as np

from llminfer.core import ops
from llminfer.core.system import check_threads
from llminfer.errors import InvalidArgumentError, UnsupportedModelError
from llminfer.vision.gemma4 import activation, rms, rope_2d
from llminfer.vision.image import fit_and_pad, normalize, rgb_image, target_size
from llminfer.vision.siglip import layer_norm
from llminfer.vision.tower import Matrix, Projector, VisionParams, Weights

IMAGE_BEGIN = "<|vision_start|>"
IMAGE_END = "<|vision_end|>"
MIN_TOKENS, MAX_TOKENS = 8, 4096   # llama.cpp's set_limit_image_tokens(8, 4096) for Qwen-VL
WINDOW = 112                        # llama.cpp's attn_window_size default for qwen2.5vl, in pixels
ROPE_BASE = 10000.0
MERGE = 2                           # the cell side in patches (qwen2vl.cpp's merge_ratio)


class GridRows(np.ndarray):
    """An image's rows [ny * nx, n_embd] that know their cell grid: `grid`
    is (nx, ny), the rows in row-major order. Slices keep it, for the
    image's rows decoded in parts (Engine.decode_rows' grid and first)."""

    grid = None

    def __array_finalize__(self, obj):
        self.grid = getattr(obj, "grid", None)


def grid_rows(rows: np.ndarray, nx: int, ny: int) -> GridRows:
    out = np.asarray(rows).view(GridRows)
    out.grid = (int(nx), int(ny))
    return out


def window_order(cx: int, cy: int, w: int) -> np.ndarray:
    """The cells (row-major indices, cx x cy of them) in window order:
    windows of w x w cells row-major, cells row-major inside each."""
    out = []
    for y in range(0, cy, w):
        for x in range(0, cx, w):
            for dy in range(min(w, cy - y)):
                out.extend((y + dy) * cx + x + np.arange(min(w, cx - x)))
    return np.asarray(out, dtype=np.int64)


def windows(cx: int, cy: int, w: int) -> list:
    """[(first cell, cells)] of each window, in window order."""
    out, at = [], 0
    for y in range(0, cy, w):
        for x in range(0, cx, w):
            n = min(w, cy - y) * min(w, cx - x)
            out.append((at, n))
            at += n
    return out


def rope_permutation(E: int, H: int) -> np.ndarray:
    """Rows of q and k reordered per head so that its row-turned dims come
    first as NeoX pairs of half a head, then its column-turned ones: [0,
    D/4) and [D/2, 3D/4) (pairs (i, i + D/2), i < D/4), then [D/4, D/2) and
    [3D/4, D). q . k is the same in any order both share."""
    D = E // H
    q = D // 4
    head = np.concatenate([np.arange(0, q), np.arange(2 * q, 3 * q), np.arange(q, 2 * q), np.arange(3 * q, 4 * q)])
    return (np.arange(H)[:, None] * D + head[None, :]).reshape(-1)


def packed_rows(wt: Weights, name: str, rows: int, k: int, order=None) -> Matrix:
    """A weight (rows, k) packed for ops.gemm, its rows taken in `order`."""
    m = wt.matrix(name, rows, k)
    if order is None:
        return m
    data = wt.gguf.tensor_bytes(name).reshape(rows, -1)[order]
    return Matrix(np.ascontiguousarray(data).reshape(-1), m.qtype, m.shape)


class _Layer:
    def __init__(self, wt: Weights, i: int, p: VisionParams, perm: np.ndarray):
        E, F = p.n_embd, p.n_ff
        pre = f"v.blk.{i}"
        if p.projector == "qwen2vl_merger" and not (wt.has(f"{pre}.ln1.bias") and wt.has(f"{pre}.ln2.bias")):
            raise UnsupportedModelError(f"{wt.gguf.path}: layer {i} of the qwen2vl tower has no ln1 or ln2 bias "
                                        f"(its norms are LayerNorms)")
        self.ln1 = wt.f32(f"{pre}.ln1.weight", (E,)), (wt.f32(f"{pre}.ln1.bias", (E,))
                                                      if wt.has(f"{pre}.ln1.bias") else None)
        self.ln2 = wt.f32(f"{pre}.ln2.weight", (E,)), (wt.f32(f"{pre}.ln2.bias", (E,))
                                                      if wt.has(f"{pre}.ln2.bias") else None)
        self.q = packed_rows(wt, f"{pre}.attn_q.weight", E, E, perm), wt.f32(f"{pre}.attn_q.bias", (E,))[perm]
        self.k = packed_rows(wt, f"{pre}.attn_k.weight", E, E, perm), wt.f32(f"{pre}.attn_k.bias", (E,))[perm]
        self.v = wt.matrix(f"{pre}.attn_v.weight", E, E), wt.f32(f"{pre}.attn_v.bias", (E,))
        self.o = wt.matrix(f"{pre}.attn_out.weight", E, E), wt.f32(f"{pre}.attn_out.bias", (E,))
        self.gate = ((wt.matrix(f"{pre}.ffn_gate.weight", F, E), self._bias(wt, f"{pre}.ffn_gate.bias", F))
                     if wt.has(f"{pre}.ffn_gate.weight") else None)
        self.up = wt.matrix(f"{pre}.ffn_up.weight", F, E), self._bias(wt, f"{pre}.ffn_up.bias", F)
        self.down = wt.matrix(f"{pre}.ffn_down.weight", E, F), self._bias(wt, f"{pre}.ffn_down.bias", E)

    @staticmethod
    def _bias(wt, name, n):
        return wt.f32(name, (n,)) if wt.has(name) else None


class Qwen25VLVision(Projector):
    """The encoder of a qwen2.5vl_merger mmproj (or of Qwen2-VL's
    qwen2vl_merger: LayerNorms, a plain feed-forward, no windows):
    encode(image) -> float32 [n_cells, n_embd_text]."""

    image_begin = IMAGE_BEGIN
    image_end = IMAGE_END
    placeholder = None  # mtmd records no id of its own at the rows' places
    non_causal = False  # the rows are decoded causally (mtmd_decode_use_non_causal is false)

    def __init__(self, gguf, params: VisionParams, n_threads=None):
        self.gguf, self.params = gguf, params
        self.path = gguf.path
        self.n_threads = check_threads(n_threads)
        p, wt = params, Weights(gguf)
        E, ps, H = p.n_embd, p.patch_size, p.n_head
        D = E // H
        # Qwen2-VL's tower (qwen2vl_merger): LayerNorms where Qwen2.5-VL has RMS norms, and no windows
        self.layer_norm = p.projector == "qwen2vl_merger"
        if p.n_merge != MERGE:
            raise UnsupportedModelError(f"{self.path}: spatial merge {p.n_merge}; qwen2.5vl merges 2 x 2 patches")
        if D % 4:
            raise UnsupportedModelError(f"{self.path}: head size {D} is not a multiple of 4 (2-D RoPE turns "
                                        f"pairs of half a head by the row, half by the column)")
        md = gguf.metadata
        self.wa_pattern = 0 if self.layer_norm else int(md.get("clip.vision.n_wa_pattern", 0) or 0)
        if self.wa_pattern < 0:
            raise UnsupportedModelError(f"{self.path}: clip.vision.n_wa_pattern {self.wa_pattern} is negative")
        self.window = max(1, WINDOW // ps // MERGE)  # cells a side
        self.cell = ps * MERGE
        self.min_pixels = MIN_TOKENS * self.cell * self.cell
        self.max_pixels = MAX_TOKENS * self.cell * self.cell
        # the conv's two temporal slices see the same still image: one kernel, their sum; [E, 3*p*p]
        w0 = wt.f32("v.patch_embd.weight", (E, 3, ps, ps))
        w1 = wt.f32("v.patch_embd.weight.1", (E, 3, ps, ps)) if wt.has("v.patch_embd.weight.1") else 0
        patch_w = np.ascontiguousarray((w0 + w1).reshape(E, 3 * ps * ps), np.float32)
        self.patch_w = ops.GemmWeight(patch_w, "F32", patch_w.shape)
        self.perm = rope_permutation(E, H)
        self.layers = [_Layer(wt, i, p, self.perm) for i in range(p.n_layer)]
        self.post_ln = ((wt.f32("v.post_ln.weight", (E,)),
                         wt.f32("v.post_ln.bias", (E,)) if wt.has("v.post_ln.bias") else None)
                        if wt.has("v.post_ln.weight") else None)
        mm0 = wt.info("mm.0.weight")
        mm2 = wt.info("mm.2.weight")
        if tuple(mm0.shape) != (4 * E, 4 * E) or len(mm2.shape) != 2 or mm2.shape[1] != 4 * E:
            raise UnsupportedModelError(f"{self.path}: mm.0.weight {tuple(mm0.shape)} and mm.2.weight "
                                        f"{tuple(mm2.shape)} are not ({4 * E}, {4 * E}) and (n_embd, {4 * E})")
        self.n_embd_out = int(mm2.shape[0])
        self.mm0 = wt.matrix("mm.0.weight", 4 * E, 4 * E), wt.f32("mm.0.bias", (4 * E,))
        self.mm2 = wt.matrix("mm.2.weight", self.n_embd_out, 4 * E), wt.f32("mm.2.bias", (self.n_embd_out,))
        self._ident = self.file_ident(gguf)

    # ---- preprocessing ----

    def size_for(self, w: int, h: int) -> tuple[int, int]:
        """The (width, height) an image of w x h becomes."""
        return target_size(w, h, self.cell, self.min_pixels, self.max_pixels)

    def preprocess(self, image) -> np.ndarray:
        """float32 [3, H, W] of an image (bytes, a path, a file, or a PIL
        image), H and W multiples of the cell side."""
        im = rgb_image(image)
        tw, th = self.size_for(*im.size)
        return normalize(fit_and_pad(im, tw, th), self.params.mean, self.params.std)

    # ---- the graph ----

    def grid(self, pixels: np.ndarray) -> tuple[int, int]:
        """(columns, rows) of cells of preprocessed pixels, checked."""
        c = self.cell
        if pixels.ndim != 3 or pixels.shape[0] != 3 or pixels.shape[1] % c or pixels.shape[2] % c or \
                pixels.shape[1] == 0 or pixels.shape[2] == 0:
            raise InvalidArgumentError(f"pixels must have shape (3, H, W), H and W positive multiples of {c}, "
                                       f"got {pixels.shape}")
        cx, cy = pixels.shape[2] // c, pixels.shape[1] // c
        if cx * cy > MAX_TOKENS:
            raise InvalidArgumentError(f"{cx} x {cy} cells: more than {MAX_TOKENS}")
        return cx, cy

    def layout(self, cx: int, cy: int):
        """(order, rows, cols): the ViT's patches in window order as indices
        into the row-major cells times 4 plus (dy, dx), and each one's patch
        row and column."""
        cells = window_order(cx, cy, self.window) if self.wa_pattern > 0 else np.arange(cx * cy)
        sub = np.arange(4)
        rows = ((cells // cx)[:, None] * 2 + sub[None, :] // 2).reshape(-1)
        cols = ((cells % cx)[:, None] * 2 + sub[None, :] % 2).reshape(-1)
        return cells, rows.astype(np.int32), cols.astype(np.int32)

    def patches(self, pixels: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """[P, 3*p*p]: the patches at (rows, cols), each in (channel, y, x) order."""
        ps = self.params.patch_size
        gy, gx = pixels.shape[1] // ps, pixels.shape[2] // ps
        x = np.asarray(pixels, np.float32).reshape(3, gy, ps, gx, ps).transpose(1, 3, 0, 2, 4)
        return np.ascontiguousarray(x[rows, cols].reshape(len(rows), 3 * ps * ps), dtype=np.float32)

    @staticmethod
    def rope(x: np.ndarray, pos: np.ndarray, H: int, nt: int) -> np.ndarray:
        """x [P, E] (H heads, dims in rope_permutation's order; rows may be
        a column slice of wider ones) rotated in place: each head's first
        half by the patch's row, its second by its column, NeoX pairs of
        half a head, base 10000. pos: int32 [P, 2], (row, col); as half-heads
        [P, 2H, D/2] they take the row and the column in turn."""
        return rope_2d(x, pos, H, ROPE_BASE, nt)

    def vit(self, pixels: np.ndarray, nt: int):
        """(float32 [P, E], cells): the ViT's output rows in window order,
        and the row-major cell of each group of four."""
        p = self.params
        E, H, F = p.n_embd, p.n_head, p.n_ff
        cx, cy = self.grid(pixels)
        cells, rows, cols = self.layout(cx, cy)
        P = len(rows)
        pos = np.ascontiguousarray(np.stack([rows, cols], axis=1), np.int32)
        x = ops.gemm(self.patch_w, self.patches(pixels, rows, cols), n_threads=nt)
        spans = windows(cx, cy, self.window) if self.wa_pattern > 0 else [(0, cx * cy)]
        eps = p.eps
        norm = self._norm
        # one set of buffers for every layer: fresh ones of these sizes cost a
        # page fault a page, layer after layer
        h, q, k, v, a = (np.empty((P, E), np.float32) for _ in range(5))
        g, u = np.empty((P, F), np.float32), np.empty((P, F), np.float32)
        scratch = ops.attention_scratch(P, H, E // H, nt)
        for il, L in enumerate(self.layers):
            norm(x, L.ln1, eps, nt, h)
            self.rope(L.q[0](h, nt, L.q[1], out=q), pos, H, nt)
            self.rope(L.k[0](h, nt, L.k[1], out=k), pos, H, nt)
            L.v[0](h, nt, L.v[1], out=v)
            full = self.wa_pattern <= 0 or (il + 1) % self.wa_pattern == 0
            for c0, n in ([(0, cx * cy)] if full else spans):
                r0, r1 = 4 * c0, 4 * (c0 + n)
                ops.attention(q[r0:r1], k[r0:r1], v[r0:r1], H, n_threads=nt, out=a[r0:r1], scratch=scratch)
            L.o[0](a, nt, L.o[1], x, out=x)
            norm(x, L.ln2, eps, nt, h)
            if L.gate is not None:
                f = activation(p.ffn_op, L.gate[0](h, nt, L.gate[1], out=g), nt, L.up[0](h, nt, L.up[1], out=u), out=g)
            else:
                f = activation(p.ffn_op, L.up[0](h, nt, L.up[1], out=g), nt, out=g)
            L.down[0](f, nt, L.down[1], x, out=x)
        if self.post_ln is not None:
            x = norm(x, self.post_ln, eps, nt)
        return x, cells

    def _norm(self, x, wb, eps, nt, out=None):
        """The tower's norm of x [n, E] with (weight, bias or None): LayerNorm
        (qwen2vl_merger) or RMS norm (qwen2.5vl_merger), into out when given."""
        if self.layer_norm:
            return layer_norm(x, wb[0], wb[1], eps, nt, out)
        return rms(x, wb, eps, nt, out)

    def encode_pixels(self, pixels: np.ndarray, n_threads=None) -> np.ndarray:
        """GridRows [n_cells, n_embd_text], the cells in row-major order."""
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        cx, cy = self.grid(pixels)
        x, cells = self.vit(pixels, nt)
        E = self.params.n_embd
        h = self.mm0[0](x.reshape(-1, 4 * E), nt, self.mm0[1])
        ops.gelu(h, n_threads=nt, out=h)
        y = self.mm2[0](h, nt, self.mm2[1])
        out = np.empty_like(y)
        out[cells] = y
        return grid_rows(out, cx, cy)
