"""LFM2-VL's vision tower (clip.projector_type "lfm2"): a SigLIP2 NaFlex
ViT over an image kept near its own aspect ratio (its learned position
table resized to each image's patch grid), then a pixel unshuffle, a layer
norm and a two-layer GELU MLP into the text model's width.

    preprocess  a = patch_size * s (s = clip.vision.projector.scale_factor);
                the image resized (bilinear) to a whole number of a x a
                cells, its aspect ratio kept, between 64 and 256 cells
                (mtmd's smart resize). An image whose cells, rounded to
                whole ones, would cover more than twice the 256 is also cut
                into gx x gy tiles of 512 x 512 (2 to 10 of them, the grid
                whose aspect ratio is nearest the image's): the image drawn
                (bilinear, aspect ratio kept, centred on black) into
                512 gx x 512 gy and cut row-major; then the resized whole,
                the thumbnail, last. Each piece normalised with the file's
                mean and std.
    per piece   patches     conv p x p stride p, as a matmul: [P, 3*p*p] @ W.T + b,
                            P = gx * gy patches row-major (y, then x)
                + position  the table [n * n, E] resized to gy x gx: bilinear,
                            half-pixel centres, antialiased when it shrinks
                            (ggml_interpolate, GGML_SCALE_MODE_BILINEAR |
                            GGML_SCALE_FLAG_ANTIALIAS; PyTorch's
                            interpolate(antialias=True, align_corners=False))
                SigLIP layers and post norm (llminfer.vision.siglip)
                unshuffle   s x s neighbouring patches side by side:
                            [(gy/s) (gx/s), s*s*E], each block's patches row-major
                norm        layer norm, eps 1e-5, times mm.input_norm.weight plus
                            its bias (each where the file has it)
                MLP         mm.2(gelu(mm.1 x + b1)) + b2 -> [cells, n_embd_text]

In the prompt (mtmd's MTMD_SLICE_TMPL_LFM2): "<|image_start|>", the rows,
"<|image_end|>"; a tiled image as "<|image_start|>", each tile as
"<|img_row_Y_col_X|>" and its rows, "<|img_thumbnail|>" and the
thumbnail's rows, "<|image_end|>". The rows attend causally, as text does.

llama.cpp's tools/mtmd/mtmd-image.cpp (mtmd_image_preprocessor_lfm2 and
the llava-uhd slicing it builds on), clip.cpp (resize_position_embeddings,
build_patch_merge_permute) and models/siglip.cpp, written again here.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from llminfer.core import ops
from llminfer.core.system import check_threads
from llminfer.errors import InvalidArgumentError, UnsupportedModelError
from llminfer.vision.image import fit_box, normalize, pil, rgb_image, target_size
from llminfer.vision.siglip import SiglipViT
from llminfer.vision.tower import Projector, VisionParams, Weights

IMAGE_BEGIN = "<|image_start|>"
IMAGE_END = "<|image_end|>"
THUMBNAIL = "<|img_thumbnail|>"
MIN_TOKENS, MAX_TOKENS = 64, 256     # llama.cpp's set_limit_image_tokens(64, 256) for lfm2
TILE = 512                           # mtmd_image_preprocessor_lfm2: tile_size
MIN_TILES, MAX_TILES = 2, 10
MAX_PIXELS_TOLERANCE = 2.0           # tiles past this many times the most pixels
NORM_EPS = 1e-5                      # the projector's nn.LayerNorm


def should_tile(w: int, h: int, patch: int, align: int, max_pixels: int) -> bool:
    """Whether an image of w x h is cut into tiles: its sides rounded to
    whole cells (half to even, as std::nearbyint) cover more than twice the
    most pixels."""
    w_bar = max(patch, round(w / align) * align)
    h_bar = max(patch, round(h / align) * align)
    return h_bar * w_bar > max_pixels * MAX_PIXELS_TOLERANCE


def target_ratios() -> list:
    """(columns, rows) of the grids of 2 to 10 tiles, fewest tiles first."""
    out = []
    for n in range(MIN_TILES, MAX_TILES + 1):
        for w in range(1, n + 1):
            for h in range(1, n + 1):
                if MIN_TILES <= w * h <= MAX_TILES and (w, h) not in out:
                    out.append((w, h))
    return sorted(out, key=lambda r: r[0] * r[1])


def grid_layout(w: int, h: int) -> tuple[int, int]:
    """(columns, rows) of tiles for an image of w x h: the grid whose aspect
    ratio is nearest the image's; of two as near, the larger where the image
    has more than half its pixels (mtmd's float32 arithmetic)."""
    f32 = np.float32
    aspect = f32(w) / f32(h)
    area = f32(w * h)
    best, best_diff = (1, 1), f32(np.inf)
    for rw, rh in target_ratios():
        diff = abs(aspect - f32(rw) / f32(rh))
        if diff < best_diff:
            best, best_diff = (rw, rh), diff
        elif diff == best_diff and area > f32(0.5) * f32(TILE * TILE * rw * rh):
            best = (rw, rh)
    return best


def resize_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: bilinear weights, half-pixel centres, widened by the
    shrink factor when n_out < n_in (antialiasing), each row summing to 1."""
    sf = float(np.float32(n_out) / np.float32(n_in))
    support = max(1.0, 1.0 / sf)
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        x = (i + 0.5) / sf
        lo, hi = max(int(x - support + 0.5), 0), min(int(x + support + 0.5), n_in)
        j = np.arange(lo, hi)
        w[i, lo:hi] = np.maximum(1.0 - np.abs((j - x + 0.5) / support), 0.0)
    return w / w.sum(axis=1, keepdims=True)


class Pieces(list):
    """An image's preprocessed pieces (float32 [3, H, W] each: the tiles
    row-major, then the thumbnail; or the image alone), with grid: (columns,
    rows) of tiles, or None."""

    grid = None


class Rows(np.ndarray):
    """An image's rows (float32 [n, n_embd_text]) with grid (as Pieces') and
    counts: the rows of each piece, in order."""

    def __array_finalize__(self, obj):
        self.grid = getattr(obj, "grid", None)
        self.counts = getattr(obj, "counts", ())


class Lfm2Vision(Projector):
    """The encoder of an lfm2 mmproj: encode(image) -> float32 [n_rows, n_embd_text]
    (every piece's rows, in prompt order; image_parts lays them out)."""

    image_begin = IMAGE_BEGIN
    image_end = IMAGE_END
    placeholder = "<image>"  # the id recorded at the rows' positions, where the vocabulary has it
    non_causal = False

    def __init__(self, gguf, params: VisionParams, n_threads=None):
        self.gguf, self.params = gguf, params
        self.path = gguf.path
        self.n_threads = check_threads(n_threads)
        p, wt = params, Weights(gguf)
        s, ps, E = p.n_merge, p.patch_size, p.n_embd
        if s < 2:
            raise UnsupportedModelError(f"{self.path}: an lfm2 projector needs a scale factor of 2 or more, got {s}")
        self.cell = ps * s
        if TILE % self.cell:
            raise UnsupportedModelError(f"{self.path}: tiles of {TILE} are no whole number of {self.cell}-pixel "
                                        f"cells (patch size {ps}, scale factor {s})")
        self.min_pixels = MIN_TOKENS * self.cell * self.cell
        self.max_pixels = MAX_TOKENS * self.cell * self.cell
        self.vit = SiglipViT(wt, p)
        n_pos = self.vit.pos.shape[0]
        self.side = math.isqrt(n_pos)
        if self.side * self.side != n_pos:
            raise UnsupportedModelError(f"{self.path}: {n_pos} positions are no square grid")
        k = E * s * s
        w1, w2 = wt.info("mm.1.weight"), wt.info("mm.2.weight")
        if len(w1.shape) != 2 or w1.shape[1] != k or len(w2.shape) != 2 or w2.shape[1] != w1.shape[0]:
            raise UnsupportedModelError(f"{self.path}: mm.1.weight {tuple(w1.shape)} and mm.2.weight "
                                        f"{tuple(w2.shape)} are not (n_ff, {k}) and (n_embd of the text model, n_ff)")
        n_ff = int(w1.shape[0])
        self.n_embd_out = int(w2.shape[0])
        self.mm1 = (wt.matrix("mm.1.weight", n_ff, k), wt.f32("mm.1.bias", (n_ff,)))
        self.mm2 = (wt.matrix("mm.2.weight", self.n_embd_out, n_ff), wt.f32("mm.2.bias", (self.n_embd_out,)))
        # the input norm is optional (llama.cpp: weight and bias each where present)
        self.norm = tuple(wt.f32(f"mm.input_norm.{n}", (k,)) if wt.has(f"mm.input_norm.{n}") else None
                          for n in ("weight", "bias"))
        self._table = self.vit.pos.reshape(self.side, self.side, E).astype(np.float64)
        self._ident = self.file_ident(gguf)

    # ---- preprocessing ----

    def size_for(self, w: int, h: int) -> tuple[int, int]:
        """The (width, height) an image of w x h (or its thumbnail) becomes."""
        return target_size(w, h, self.cell, self.min_pixels, self.max_pixels)

    def grid_for(self, w: int, h: int):
        """(columns, rows) of tiles of an image of w x h, or None when it is not tiled."""
        if not should_tile(w, h, self.params.patch_size, self.cell, self.max_pixels):
            return None
        return grid_layout(w, h)

    def preprocess(self, image) -> Pieces:
        """The image's pieces (see Pieces), each normalised float32 [3, H, W]."""
        Image = pil()
        im = rgb_image(image)
        p = self.params
        w, h = im.size

        def resized(size):
            return im if im.size == size else im.resize(size, Image.BILINEAR)

        out = Pieces()
        grid = self.grid_for(w, h)
        if grid is not None:
            gx, gy = grid
            tw, th = TILE * gx, TILE * gy
            refined = im
            if im.size != (tw, th):
                nw, nh = fit_box(w, h, tw, th)
                refined = Image.new("RGB", (tw, th), (0, 0, 0))
                refined.paste(im.resize((nw, nh), Image.BILINEAR), ((tw - nw) // 2, (th - nh) // 2))
            for y in range(gy):
                for x in range(gx):
                    tile = refined.crop((x * TILE, y * TILE, (x + 1) * TILE, (y + 1) * TILE))
                    out.append(normalize(tile, p.mean, p.std))
            out.grid = grid
        out.append(normalize(resized(self.size_for(w, h)), p.mean, p.std))
        return out

    def key(self, pixels: Pieces) -> str:
        """The content hash of preprocessed pieces under this encoder."""
        grid = getattr(pixels, "grid", None)
        h = hashlib.sha256(f"{self._ident}:{grid}:{[np.shape(a) for a in pixels]}".encode())
        for a in pixels:
            h.update(np.ascontiguousarray(a, np.float32).tobytes())
        return h.hexdigest()

    # ---- the graph ----

    def positions(self, gx: int, gy: int) -> np.ndarray:
        """float32 [gy * gx, E]: the position table resized to gx x gy patches, row-major."""
        if (gx, gy) == (self.side, self.side):
            return self.vit.pos
        wy, wx = resize_weights(self.side, gy), resize_weights(self.side, gx)
        t = np.einsum("Yy,yxe->Yxe", wy, self._table)
        t = np.einsum("Xx,Yxe->YXe", wx, t)
        return np.ascontiguousarray(t.reshape(gy * gx, -1), np.float32)

    def unshuffle(self, x: np.ndarray, gx: int, gy: int) -> np.ndarray:
        """[gy * gx, E] -> [(gy/s) (gx/s), s*s*E]: each s x s block of patches
        as one row, its patches row-major side by side, blocks row-major."""
        s, E = self.params.n_merge, x.shape[1]
        x = x.reshape(gy // s, s, gx // s, s, E).transpose(0, 2, 1, 3, 4)
        return np.ascontiguousarray(x.reshape((gy // s) * (gx // s), s * s * E))

    def encode_piece(self, pixels: np.ndarray, nt: int) -> np.ndarray:
        """float32 [cells, n_embd_text] of one normalised piece [3, H, W]."""
        c, ps = self.cell, self.params.patch_size
        if pixels.ndim != 3 or pixels.shape[0] != 3 or pixels.shape[1] % c or pixels.shape[2] % c or \
                0 in pixels.shape:
            raise InvalidArgumentError(f"pixels must have shape (3, H, W), H and W positive multiples of {c}, "
                                       f"got {pixels.shape}")
        gy, gx = pixels.shape[1] // ps, pixels.shape[2] // ps
        x = self.unshuffle(self.vit.forward(pixels, nt, self.positions(gx, gy)), gx, gy)
        x = ops.layer_norm(x, *self.norm, NORM_EPS, n_threads=nt)
        (w1, b1), (w2, b2) = self.mm1, self.mm2
        f = w1(x, nt, b1)
        return w2(ops.gelu(f, n_threads=nt, out=f), nt, b2)

    def encode_pixels(self, pixels: Pieces, n_threads=None) -> Rows:
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        rows = [self.encode_piece(np.asarray(a, np.float32), nt) for a in pixels]
        out = np.concatenate(rows).view(Rows)
        out.grid, out.counts = getattr(pixels, "grid", None), tuple(len(r) for r in rows)
        return out

    def image_parts(self, rows: Rows) -> list:
        """The image's place in the prompt: text (tokenized with its special
        tokens) and blocks of rows, in order (see the module's doc)."""
        grid = getattr(rows, "grid", None)
        if grid is None:
            return [IMAGE_BEGIN, rows, IMAGE_END]
        gx, gy = grid
        counts = rows.counts
        at = np.cumsum((0,) + tuple(counts))
        parts = [IMAGE_BEGIN]
        for k in range(gx * gy):
            parts += [f"<|img_row_{k // gx + 1}_col_{k % gx + 1}|>", rows[at[k]:at[k + 1]]]
        parts += [THUMBNAIL, rows[at[-2]:at[-1]], IMAGE_END]
        return parts
