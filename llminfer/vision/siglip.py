"""The SigLIP ViT that several projector types put before their projector
(gemma3, idefics3, lfm2): patches, learned positions, pre-norm layers and an
optional post norm, as llama.cpp's clip.cpp build_vit builds it.

    pixels [3, S, S]  (S = image_size, normalised; vision.image; lfm2: [3, H, W]
                      of any whole number of patches)
    patches           conv p x p stride p, as a matmul: [P, 3*p*p] @ W.T + b,
                      P = (S/p)^2 patches in row-major order (y, then x)
    + position_embd   [P, E] (lfm2: the table resized to the image's grid)
    per layer (pre-norm):
        h = x + attn_out(attention(layer_norm(x; ln1)))      heads of E/n_head, no mask
        x = h + ffn_down(act(ffn_up(layer_norm(h; ln2))))
    post_ln           layer norm, when the file has one
    -> [P, E]

The matrices are packed once at load (vision.tower.Matrix) and multiplied
in float32 by ops.gemm, their biases and the residual adds fused in; layer
norms, attention (ops.attention: all P patches, no mask) and GELU / SiLU
are threaded kernels of llminfer.core.ops. Each projector's module
(llminfer/vision/<type>.py) takes the [P, E] rows from here.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np

from llminfer.core import ops
from llminfer.errors import InvalidArgumentError
from llminfer.vision.tower import VisionParams, Weights


def plain_pages(shape, dtype=np.float32) -> np.ndarray:
    """Zeros of `shape` in anonymous memory that asks for no huge
    pages. numpy advises huge pages for large arrays, and where Linux's
    transparent huge pages compact memory on such advice (defrag "madvise")
    a fault can wait milliseconds for each 2 MiB: on a busy host, longer
    than the products that fill the array take."""
    n, size = int(np.prod(shape)), np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, max(size * n, 1)), dtype, count=n).reshape(shape)


def layer_norm(x, w, b, eps, nt=1, out=None):
    return ops.layer_norm(np.ascontiguousarray(x, np.float32), w, b, eps, n_threads=nt, out=out)


def _activation(op, f, nt):
    if op == "gelu":
        return ops.gelu(f, n_threads=nt, out=f)
    if op == "silu":
        return ops.silu(f, n_threads=nt, out=f)
    return np.divide(f, 1 + np.exp(np.float32(-1.702) * f), out=f)  # gelu_quick, in place


class _Layer:
    def __init__(self, wt: Weights, i: int, p: VisionParams):
        E, F = p.n_embd, p.n_ff
        pre = f"v.blk.{i}"
        self.ln1 = (wt.f32(f"{pre}.ln1.weight", (E,)), wt.f32(f"{pre}.ln1.bias", (E,)))
        self.ln2 = (wt.f32(f"{pre}.ln2.weight", (E,)), wt.f32(f"{pre}.ln2.bias", (E,)))
        self.q = (wt.matrix(f"{pre}.attn_q.weight", E, E), wt.f32(f"{pre}.attn_q.bias", (E,)))
        self.k = (wt.matrix(f"{pre}.attn_k.weight", E, E), wt.f32(f"{pre}.attn_k.bias", (E,)))
        self.v = (wt.matrix(f"{pre}.attn_v.weight", E, E), wt.f32(f"{pre}.attn_v.bias", (E,)))
        self.o = (wt.matrix(f"{pre}.attn_out.weight", E, E), wt.f32(f"{pre}.attn_out.bias", (E,)))
        up, down = f"{pre}.ffn_up", f"{pre}.ffn_down"
        # old conversions wrote up and down under each other's names
        # (llama.cpp swaps them back when ffn_down's input is the ViT's width)
        if wt.info(f"{down}.weight").shape == (F, E) and F != E:
            up, down = down, up
        self.up = (wt.matrix(f"{up}.weight", F, E), wt.f32(f"{up}.bias", (F,)))
        self.down = (wt.matrix(f"{down}.weight", E, F), wt.f32(f"{down}.bias", (E,)))


class SiglipViT:
    """The ViT of an mmproj file: forward(pixels [3, S, S]) -> [P, E]."""

    def __init__(self, wt: Weights, params: VisionParams):
        self.params = p = params
        E, ps = p.n_embd, p.patch_size
        self.grid = p.image_size // ps
        self.n_patches = self.grid * self.grid
        # the conv kernel as a matrix [E, 3*p*p], input (c, ky, kx); float32
        # (3*14*14 = 588 is no whole number of Q8_0 blocks)
        patch_w = np.ascontiguousarray(wt.f32("v.patch_embd.weight", (E, 3, ps, ps)).reshape(E, 3 * ps * ps))
        self.patch_w = ops.GemmWeight(patch_w, "F32", patch_w.shape)
        self.patch_b = wt.f32("v.patch_embd.bias", (E,)) if wt.has("v.patch_embd.bias") else None
        self.pos = np.ascontiguousarray(wt.f32("v.position_embd.weight", (self.n_patches, E)), np.float32)
        self.layers = [_Layer(wt, i, p) for i in range(p.n_layer)]
        self.post_ln = (wt.f32("v.post_ln.weight", (E,)), wt.f32("v.post_ln.bias", (E,))) \
            if wt.has("v.post_ln.weight") else None
        self._ws, self._ws_threads, self._ws_patches = None, 0, 0
        self._lock = threading.Lock()  # one forward at a time: they share the work buffers

    def _buffers(self, nt: int, P: int) -> dict:
        """The layers' work buffers for P patches, made at the first forward
        and kept (grown for a larger image): a layer's fresh arrays (some
        200 MB at 4096 patches) would be faulted in page by page again in
        every layer and every image."""
        if self._ws is None or self._ws_threads < nt or self._ws_patches < P:
            p = self.params
            P = max(P, self._ws_patches)
            E = p.n_embd
            ws = {n: plain_pages((P, E)) for n in ("h", "q", "k", "v", "a")}
            ws["f"] = plain_pages((P, p.n_ff))
            ws["scratch"] = plain_pages((ops.attention_scratch_bytes(P, p.n_head, E // p.n_head, nt),), np.uint8)
            self._ws, self._ws_threads, self._ws_patches = ws, nt, P
        return self._ws

    def patches(self, pixels: np.ndarray) -> np.ndarray:
        """[P, 3*p*p]: each patch's pixels in (channel, y, x) order, patches
        row-major (y, then x); pixels [3, H, W], H and W multiples of the
        patch size."""
        ps = self.params.patch_size
        if pixels.ndim != 3 or pixels.shape[0] != 3 or pixels.shape[1] % ps or pixels.shape[2] % ps or \
                0 in pixels.shape:
            raise InvalidArgumentError(f"pixels must have shape (3, H, W), H and W positive multiples of {ps}, "
                                       f"got {pixels.shape}")
        gy, gx = pixels.shape[1] // ps, pixels.shape[2] // ps
        x = np.asarray(pixels, np.float32).reshape(3, gy, ps, gx, ps).transpose(1, 3, 0, 2, 4)  # gy, gx, c, ky, kx
        return np.ascontiguousarray(x.reshape(gy * gx, 3 * ps * ps), dtype=np.float32)

    @staticmethod
    def _mm(m, x, nt, out, residual=False):
        """x @ W.T + b into out, or, with residual, out + x @ W.T + b into out's own rows"""
        mat, bias = m
        return mat(x, nt, bias, out if residual else None, out=out)

    def forward(self, pixels: np.ndarray, nt: int, pos: np.ndarray | None = None) -> np.ndarray:
        """float32 [P, E]: the ViT's output rows of one image, patches
        row-major. pos: the image's position rows [P, E] (lfm2 resizes the
        table to each image's grid); None: the file's table, and the image
        must be the file's image size."""
        p = self.params
        E, H, S = p.n_embd, p.n_head, p.image_size
        if pos is None:
            if pixels.shape != (3, S, S):
                raise InvalidArgumentError(f"pixels must have shape (3, {S}, {S}), got {pixels.shape}")
            pos = self.pos
        rows = self.patches(pixels)
        P = len(rows)
        if pos.shape != (P, E):
            raise InvalidArgumentError(f"position rows of shape {pos.shape} for {P} patches of width {E}")
        x = ops.gemm(self.patch_w, rows, self.patch_b, np.ascontiguousarray(pos, np.float32), n_threads=nt,
                     out=plain_pages((P, E)))  # the rows returned
        with self._lock:
            ws = self._buffers(nt, P)
            h, q, k, v, a, f = (ws[n][:P] for n in ("h", "q", "k", "v", "a", "f"))
            for L in self.layers:
                layer_norm(x, *L.ln1, p.eps, nt, out=h)
                for w, y in ((L.q, q), (L.k, k), (L.v, v)):
                    self._mm(w, h, nt, y)
                ops.attention(q, k, v, H, n_threads=nt, out=a, scratch=ws["scratch"])
                self._mm(L.o, a, nt, x, residual=True)
                layer_norm(x, *L.ln2, p.eps, nt, out=h)
                f = _activation(p.ffn_op, self._mm(L.up, h, nt, f), nt)
                self._mm(L.down, f, nt, x, residual=True)
        if self.post_ln is not None:
            x = layer_norm(x, *self.post_ln, p.eps, nt)
        return np.ascontiguousarray(x, np.float32)
