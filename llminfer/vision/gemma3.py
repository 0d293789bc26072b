"""Gemma 3's vision tower (clip.projector_type "gemma3"): the SigLIP ViT
(llminfer.vision.siglip), then average pooling, an RMS norm and a
projection into the text model's width.

    vit               [P, E], P = (S/p)^2 patches row-major (siglip.py)
    pool              average over n_merge x n_merge patches: [(S/p/n_merge)^2, E]
    soft_emb_norm     rms_norm(x, eps) * w
    input_projection  x @ W, W [E, n_embd_text]

The graph of llama.cpp's tools/mtmd/models/siglip.cpp, written again here.
"""

from __future__ import annotations

import hashlib

import numpy as np

from llminfer.core import ops
from llminfer.errors import UnsupportedModelError
from llminfer.core.system import check_threads
from llminfer.vision.image import load_image, preprocess_fixed
from llminfer.vision.siglip import SiglipViT
from llminfer.vision.tower import Projector, VisionParams, Weights

# mtmd's text around a Gemma 3 image's embeddings
IMAGE_BEGIN = "<start_of_image>"
IMAGE_END = "<end_of_image>"


class Gemma3Vision(Projector):
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
        E = p.n_embd
        self.vit = SiglipViT(wt, p)
        self.grid, self.n_patches = self.vit.grid, self.vit.n_patches
        self.pooled = self.grid // p.n_merge
        self.n_tokens = self.pooled * self.pooled
        self.soft_norm = wt.f32("mm.soft_emb_norm.weight", (E,))
        proj = wt.info("mm.input_projection.weight")
        if len(proj.shape) != 2 or proj.shape[0] != E:
            raise UnsupportedModelError(f"{self.path}: mm.input_projection.weight has shape {tuple(proj.shape)}, "
                                        f"expected ({E}, n_embd of the text model)")
        self.n_embd_out = int(proj.shape[1])
        # stored [E, n_out] (x @ W): packed transposed, as float32 panels
        proj_t = np.ascontiguousarray(wt.f32("mm.input_projection.weight").T)
        self.proj = ops.GemmWeight(proj_t, "F32", proj_t.shape)
        self._ident = self.file_ident(gguf)

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

    def patches(self, pixels: np.ndarray) -> np.ndarray:
        """[P, 3*p*p]: each patch's pixels in (channel, y, x) order."""
        return self.vit.patches(pixels)

    def encode_pixels(self, pixels: np.ndarray, n_threads=None) -> np.ndarray:
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        p = self.params
        x = self.vit.forward(pixels, nt)
        m, n, E = p.n_merge, self.pooled, p.n_embd
        x = x.reshape(n, m, n, m, E).mean(axis=(1, 3)).reshape(n * n, E)
        x = ops.rms_norm(np.ascontiguousarray(x, np.float32), self.soft_norm, eps=p.eps)
        return ops.gemm(self.proj, x, n_threads=nt)
