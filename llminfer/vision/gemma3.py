"""Gemma 3's vision tower (clip.projector_type "gemma3"): a SigLIP ViT, then
average pooling, an RMS norm and a projection into the text model's width.

    pixels [3, S, S]  (S = image_size, normalised; vision.image)
    patches           conv p x p stride p, as a matmul: [P, 3*p*p] @ W.T + b,
                      P = (S/p)^2 patches in row-major order (y, then x)
    + position_embd   [P, E]
    per layer (pre-norm):
        h = x + attn_out(attention(layer_norm(x; ln1)))      heads of E/n_head, no mask
        x = h + ffn_down(gelu(ffn_up(layer_norm(h; ln2))))
    post_ln           layer norm
    pool              average over n_merge x n_merge patches: [(S/p/n_merge)^2, E]
    soft_emb_norm     rms_norm(x, eps) * w
    input_projection  x @ W, W [E, n_embd_text]

The graph of llama.cpp's tools/mtmd/models/siglip.cpp and clip.cpp's
build_vit, written again here; the matrices go through llminfer.core.ops.matmul
in their stored type (F16, BF16, Q8_0 or F32), the rest is numpy.
"""

from __future__ import annotations

import hashlib

import numpy as np

from llminfer.core import ops
from llminfer.errors import InvalidArgumentError, UnsupportedModelError
from llminfer.core.system import check_threads
from llminfer.vision.image import load_image, preprocess_fixed
from llminfer.vision.tower import VisionParams, Weights

# mtmd's text around a Gemma 3 image's embeddings
IMAGE_BEGIN = "<start_of_image>"
IMAGE_END = "<end_of_image>"


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    return (d / np.sqrt(var + np.float32(eps))) * w + b


def _activation(op, f):
    if op == "gelu":
        return ops.gelu(f)
    if op == "silu":
        return ops.silu(f)
    return (f / (1 + np.exp(np.float32(-1.702) * f))).astype(np.float32)  # gelu_quick


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
        # old Gemma 3 conversions wrote up and down under each other's names
        # (llama.cpp swaps them back when ffn_down's input is the ViT's width)
        if wt.info(f"{down}.weight").shape == (F, E) and F != E:
            up, down = down, up
        self.up = (wt.matrix(f"{up}.weight", F, E), wt.f32(f"{up}.bias", (F,)))
        self.down = (wt.matrix(f"{down}.weight", E, F), wt.f32(f"{down}.bias", (E,)))


class Gemma3Vision:
    """The encoder of a gemma3 mmproj: encode(image) -> float32 [n_tokens, n_embd_text]."""

    image_begin = IMAGE_BEGIN
    image_end = IMAGE_END
    placeholder = "<image_soft_token>"  # the id recorded at the rows' positions, where the vocabulary has it
    non_causal = True  # an image's rows attend to each other both ways (llama.cpp's mtmd_decode_use_non_causal)

    def __init__(self, gguf, params: VisionParams, n_threads=None):
        self.gguf, self.params = gguf, params
        self.path = gguf.path
        self.n_threads = check_threads(n_threads)
        p, wt = params, Weights(gguf)
        E, ps = p.n_embd, p.patch_size
        self.grid = p.image_size // ps
        self.n_patches = self.grid * self.grid
        self.pooled = self.grid // p.n_merge
        self.n_tokens = self.pooled * self.pooled
        # the conv kernel as a matrix [E, 3*p*p], input (c, ky, kx); float32
        # (3*14*14 = 588 is no whole number of Q8_0 blocks)
        self.patch_w = np.ascontiguousarray(wt.f32("v.patch_embd.weight", (E, 3, ps, ps)).reshape(E, 3 * ps * ps))
        self.patch_b = wt.f32("v.patch_embd.bias", (E,)) if wt.has("v.patch_embd.bias") else None
        self.pos = wt.f32("v.position_embd.weight", (self.n_patches, E))
        self.layers = [_Layer(wt, i, p) for i in range(p.n_layer)]
        self.post_ln = (wt.f32("v.post_ln.weight", (E,)), wt.f32("v.post_ln.bias", (E,))) \
            if wt.has("v.post_ln.weight") else None
        self.soft_norm = wt.f32("mm.soft_emb_norm.weight", (E,))
        proj = wt.info("mm.input_projection.weight")
        if len(proj.shape) != 2 or proj.shape[0] != E:
            raise UnsupportedModelError(f"{self.path}: mm.input_projection.weight has shape {tuple(proj.shape)}, "
                                        f"expected ({E}, n_embd of the text model)")
        self.n_embd_out = int(proj.shape[1])
        # stored [E, n_out] (x @ W): kept transposed, float32, for ops.matmul
        self.proj_t = np.ascontiguousarray(wt.f32("mm.input_projection.weight").T)
        self._ident = hashlib.sha256(f"{self.path}:{gguf.file_size}".encode()).hexdigest()[:16]

    # ---- preprocessing ----

    def preprocess(self, image) -> np.ndarray:
        """float32 [3, S, S] of an image (bytes, a path, a file, or a PIL image)."""
        im = image if hasattr(image, "convert") and hasattr(image, "size") else load_image(image)
        p = self.params
        return preprocess_fixed(im, p.image_size, p.mean, p.std)

    def key(self, pixels: np.ndarray) -> str:
        """The content hash of preprocessed pixels under this encoder."""
        h = hashlib.sha256(self._ident.encode())
        h.update(np.ascontiguousarray(pixels, np.float32).tobytes())
        return h.hexdigest()

    # ---- the graph ----

    def _mm(self, m, x, nt):
        mat, bias = m
        return mat(x, nt, bias)

    def patches(self, pixels: np.ndarray) -> np.ndarray:
        """[P, 3*p*p]: each patch's pixels in (channel, y, x) order."""
        S, ps, g = self.params.image_size, self.params.patch_size, self.grid
        if pixels.shape != (3, S, S):
            raise InvalidArgumentError(f"pixels must have shape (3, {S}, {S}), got {pixels.shape}")
        x = pixels.reshape(3, g, ps, g, ps).transpose(1, 3, 0, 2, 4)  # gy, gx, c, ky, kx
        return np.ascontiguousarray(x.reshape(g * g, 3 * ps * ps), dtype=np.float32)

    def encode_pixels(self, pixels: np.ndarray, n_threads=None) -> np.ndarray:
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        p = self.params
        E, H = p.n_embd, p.n_head
        D = E // H
        x = ops.matmul(self.patch_w, "F32", self.patch_w.shape, self.patches(pixels), n_threads=nt)
        if self.patch_b is not None:
            x = x + self.patch_b
        x = (x + self.pos).astype(np.float32)
        P = x.shape[0]
        scale = np.float32(1.0 / np.sqrt(D))
        for L in self.layers:
            h = layer_norm(x, *L.ln1, p.eps)
            q, k, v = (self._mm(w, h, nt) for w in (L.q, L.k, L.v))
            a = np.empty((P, E), np.float32)
            for j in range(H):  # a head at a time: 4096 patches' scores are 64 MiB a head, 1 GiB for 16
                hs = slice(j * D, (j + 1) * D)
                att = ops.softmax(np.ascontiguousarray(q[:, hs] @ k[:, hs].T * scale, np.float32))
                a[:, hs] = att @ v[:, hs]
            x = x + self._mm(L.o, a, nt)
            h = layer_norm(x, *L.ln2, p.eps)
            f = self._mm(L.up, h, nt)
            f = _activation(p.ffn_op, np.ascontiguousarray(f, np.float32))
            x = (x + self._mm(L.down, f, nt)).astype(np.float32)
        if self.post_ln is not None:
            x = layer_norm(x, *self.post_ln, p.eps)
        m, n = p.n_merge, self.pooled
        x = x.reshape(n, m, n, m, E).mean(axis=(1, 3)).reshape(n * n, E)
        x = ops.rms_norm(np.ascontiguousarray(x, np.float32), self.soft_norm, eps=p.eps)
        return ops.matmul(self.proj_t, "F32", self.proj_t.shape, x, n_threads=nt)

    def encode(self, image, n_threads=None) -> np.ndarray:
        """float32 [n_tokens, n_embd_text]: an image's rows for the text model."""
        return self.encode_pixels(self.preprocess(image), n_threads)

    def close(self):
        self.gguf.close()
