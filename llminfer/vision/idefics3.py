"""Idefics3's vision tower (clip.projector_type "idefics3", SmolVLM): an
image cut into tiles, each through the SigLIP ViT (llminfer.vision.siglip),
then a pixel shuffle and one linear projection into the text model's width.

    preprocess  the image resized (Lanczos) so its longer side is
                clip.vision.preproc_image_size, the shorter kept to the
                aspect ratio and made even; resized again up to whole tiles
                (gx x gy tiles of image_size, the aspect ratio not kept);
                cut into those tiles, row-major; and the whole of it resized
                to one tile, the overview, last
    per tile    vit               [P, E], P = g^2 patches (g = S/p), row-major
                pixel shuffle     s x s neighbouring patches side by side:
                                  [(g/s)^2, s*s*E], s = clip.vision.projector.scale_factor
                mm.model.fc       x @ W.T, W [n_embd_text, s*s*E]

In the prompt (mtmd's MTMD_SLICE_TMPL_IDEFICS3, transformers'
processing_idefics3): each tile as "<fake_token_around_image><row_Y_col_X>"
then its rows, "\\n" after each row of tiles but the last; then "\\n\\n",
"<fake_token_around_image><global-img>", the overview's rows and
"<fake_token_around_image>". The rows attend causally, as text does.

llama.cpp's tools/mtmd/mtmd-image.cpp (mtmd_image_preprocessor_idefics3,
its longest-edge path; Pillow's Lanczos is the filter mtmd reimplements)
and models/siglip.cpp (build_patch_merge_permute), written again here.
"""

from __future__ import annotations

import hashlib

import numpy as np

from llminfer.errors import UnsupportedModelError
from llminfer.core.system import check_threads
from llminfer.vision.image import normalize, pil, rgb_image
from llminfer.vision.siglip import SiglipViT
from llminfer.vision.tower import Projector, VisionParams, Weights

FAKE = "<fake_token_around_image>"
MAX_TILES = 64  # tiles of one image: a preproc size past 8 x 8 tiles is refused when the file is opened


class Tiled(np.ndarray):
    """An image's tiles (float32 [n, 3, S, S]) or their rows (float32 [n *
    tokens per tile, n_embd]), slices row-major and the overview last, with
    grid: (columns, rows) of slices."""

    def __array_finalize__(self, obj):
        self.grid = getattr(obj, "grid", None)


def _tiled(a, grid) -> Tiled:
    t = np.ascontiguousarray(a, np.float32).view(Tiled)
    t.grid = grid
    return t


def resized_size(w: int, h: int, longest: int) -> tuple[int, int]:
    """The size before tiling: the longer side `longest`, the shorter to the
    aspect ratio, truncated and made even (mtmd's arithmetic; at least 2,
    where mtmd would make an empty image of a 1000:1 strip)."""
    aspect = w / h
    if w >= h:
        rw, rh = longest, int(longest / aspect)
        rh += rh % 2
    else:
        rw, rh = int(longest * aspect), longest
        rw += rw % 2
    return max(rw, 2), max(rh, 2)


class Idefics3Vision(Projector):
    """The encoder of an idefics3 mmproj: encode(image) -> float32 [n_rows, n_embd_text]
    (every tile's rows, in prompt order; image_parts lays them out)."""

    image_begin = image_end = ""  # the text between the rows is image_parts'
    placeholder = "<image>"  # the id recorded at the rows' positions, where the vocabulary has it
    non_causal = False

    def __init__(self, gguf, params: VisionParams, n_threads=None):
        self.gguf, self.params = gguf, params
        self.path = gguf.path
        self.n_threads = check_threads(n_threads)
        p, wt = params, Weights(gguf)
        self.vit = SiglipViT(wt, p)
        if p.n_merge < 2:
            raise UnsupportedModelError(f"{self.path}: an idefics3 projector needs a scale factor of 2 or more, "
                                        f"got {p.n_merge}")
        self.side = self.vit.grid // p.n_merge
        self.n_tokens = self.side * self.side  # rows per tile
        longest = gguf.metadata.get("clip.vision.preproc_image_size")
        if not isinstance(longest, int) or isinstance(longest, bool) or longest <= 0:
            raise UnsupportedModelError(f"{self.path}: the idefics3 mmproj has no clip.vision.preproc_image_size "
                                        f"(older conversions: convert it again with llama.cpp's convert_hf_to_gguf)")
        side = -(-longest // p.image_size)  # tiles on the longer side
        if side * side > MAX_TILES:
            raise UnsupportedModelError(f"{self.path}: preproc_image_size {longest} makes more than {MAX_TILES} "
                                        f"tiles of {p.image_size}")
        self.longest = longest
        fc = wt.info("mm.model.fc.weight")
        k = p.n_embd * p.n_merge * p.n_merge
        if len(fc.shape) != 2 or fc.shape[1] != k:
            raise UnsupportedModelError(f"{self.path}: mm.model.fc.weight has shape {tuple(fc.shape)}, expected "
                                        f"(n_embd of the text model, {k})")
        self.n_embd_out = int(fc.shape[0])
        self.fc = wt.matrix("mm.model.fc.weight", self.n_embd_out, k)
        self._ident = self.file_ident(gguf)

    # ---- preprocessing ----

    def preprocess(self, image) -> Tiled:
        """float32 [gx * gy + 1, 3, S, S]: the tiles row-major, then the overview."""
        Image = pil()
        im = rgb_image(image)
        p, S = self.params, self.params.image_size
        rw, rh = resized_size(im.size[0], im.size[1], self.longest)
        gx, gy = -(-rw // S), -(-rh // S)

        def resize(img, size):
            return img if img.size == size else img.resize(size, Image.LANCZOS)

        refined = resize(resize(im, (rw, rh)), (gx * S, gy * S))
        tiles = [refined.crop((x * S, y * S, (x + 1) * S, (y + 1) * S)) for y in range(gy) for x in range(gx)]
        tiles.append(resize(refined, (S, S)))
        return _tiled(np.stack([normalize(t, p.mean, p.std) for t in tiles]), (gx, gy))

    def key(self, pixels: Tiled) -> str:
        """The content hash of preprocessed tiles under this encoder."""
        h = hashlib.sha256(f"{self._ident}:{pixels.grid}".encode())
        h.update(np.ascontiguousarray(pixels, np.float32).tobytes())
        return h.hexdigest()

    # ---- the graph ----

    def shuffle(self, x: np.ndarray) -> np.ndarray:
        """[g^2, E] -> [(g/s)^2, s*s*E]: each s x s block of patches as one
        row, its patches row-major side by side (build_patch_merge_permute)."""
        s, n, E = self.params.n_merge, self.side, x.shape[1]
        return np.ascontiguousarray(x.reshape(n, s, n, s, E).transpose(0, 2, 1, 3, 4).reshape(n * n, s * s * E))

    def encode_pixels(self, pixels: Tiled, n_threads=None) -> Tiled:
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        rows = [self.fc(self.shuffle(self.vit.forward(tile, nt)), nt) for tile in np.asarray(pixels)]
        return _tiled(np.concatenate(rows), pixels.grid)

    def image_parts(self, rows: Tiled) -> list:
        """The image's place in the prompt: text (tokenized with its special
        tokens) and blocks of rows, in order (see the module's doc)."""
        gx, gy = rows.grid
        n = self.n_tokens
        parts = []
        for y in range(gy):
            for x in range(gx):
                k = y * gx + x
                parts += [f"{FAKE}<row_{y + 1}_col_{x + 1}>", rows[k * n:(k + 1) * n]]
            if y != gy - 1:
                parts.append("\n")
        parts += ["\n\n", f"{FAKE}<global-img>", rows[gx * gy * n:], FAKE]
        return parts
