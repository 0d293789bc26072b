"""Gemma 4's vision tower (clip.projector_type "gemma4v"): a ViT over an
image kept near its own aspect ratio, with 2-D positions, then average
pooling and one projection into the text model's width.

    preprocess  the image resized (bicubic) to a whole number of
                a x a cells, a = patch_size * n_merge, its aspect ratio
                kept, between 70 and 1120 cells (mtmd's smart resize,
                calc_size_preserved_ratio), drawn centred on black where the
                rounding leaves a margin (PAD_CEIL), scaled to [0, 1],
                normalised with the file's mean and std, then 2 x - 1
    patches     conv p x p stride p, no bias: [P, 3*p*p] @ W.T, P = gx * gy
                patches row-major (y, then x)
    + position  position_embd [2, n_pos, E]: table 0 at the patch's column
                plus table 1 at its row
    per layer   h = rms_norm(x) * ln1
                q, k, v = h @ Wq.T, Wk.T, Wv.T (+ biases where the file has them)
                q, k: rms_norm per head * attn_q_norm / attn_k_norm;
                      2-D RoPE, NeoX pairs, base 100: the first half of each
                      head by the column, the second half by the row
                v:    rms_norm per head, no weight
                a = softmax(q k^T) v (scale 1: the norms set the size), no mask
                x = x + rms_norm(a @ Wo.T) * attn_post_norm
                h = rms_norm(x) * ln2
                x = x + rms_norm(down(act(gate h) * up h)) * ffn_post_norm
                x = x * out_scale (where the file has it)
    pool        average over n_merge x n_merge patches, times sqrt(E)
    std         (x - v.std_bias) * v.std_scale (where the file has them)
    project     rms_norm(x) @ mm.input_projection.T -> [n_cells, n_embd_text]

act is the file's ffn_op: gelu_quick unless clip.use_gelu / clip.use_silu
say otherwise (llama.cpp's converter writes neither for Gemma 4, so
llama.cpp runs gelu_quick; so do we). A linear with scalars
NAME.input_min / input_max / output_min / output_max clamps its input and
output (Gemma4ClippableLinear).

In the prompt: "<|image>", one row per cell, "<image|>". llama.cpp decodes
the rows non-causally (in the text model's sliding-window layers only,
llminfer.models.gemma4) unless the text model is 1536 or 2560 wide (E2B,
E4B: causal), as mtmd_decode_use_non_causal says.

llama.cpp's tools/mtmd/models/gemma4v.cpp, clip.cpp (build_vit) and
mtmd-image.cpp (mtmd_image_preprocessor_dyn_size), written again here.
"""

from __future__ import annotations

import math

import numpy as np

from llminfer.core import ops
from llminfer.core.system import check_threads
from llminfer.errors import ImageError, InvalidArgumentError, UnsupportedModelError
# fit_box and target_size live in vision.image (lfm2 shares them); their names stay here too
from llminfer.vision.image import fit_and_pad, fit_box, normalize, rgb_image, target_size  # noqa: F401
from llminfer.vision.tower import Projector, VisionParams, Weights

IMAGE_BEGIN = "<|image>"
IMAGE_END = "<image|>"
MIN_TOKENS, MAX_TOKENS = 70, 1120   # llama.cpp's set_limit_image_tokens(70, 1120) for gemma4v
ROPE_BASE = 100.0
CAUSAL_WIDTHS = (1536, 2560)        # E2B and E4B: their image rows are decoded causally


class _Linear:
    """A weight (rows, k) in its stored type, its bias and its clamps:
    y = clamp(clamp(x, in) @ W.T, out) + b."""

    def __init__(self, wt: Weights, name: str, rows: int, k: int, bias: bool = True):
        self.w = wt.matrix(f"{name}.weight", rows, k)
        self.b = wt.f32(f"{name}.bias", (rows,)) if bias and wt.has(f"{name}.bias") else None
        lim = {}
        for key in ("input_min", "input_max", "output_min", "output_max"):
            t = f"{name}.{key}"
            if wt.has(t):
                v = wt.f32(t).reshape(-1)
                if v.size != 1 or not np.isfinite(v[0]):
                    raise UnsupportedModelError(f"{wt.gguf.path}: {t} is not one finite number")
                lim[key] = float(v[0])
        self.inp = (lim.get("input_min", -np.inf), lim.get("input_max", np.inf))
        self.out = (lim.get("output_min", -np.inf), lim.get("output_max", np.inf))
        self.clamps = bool(lim)

    def __call__(self, x, nt):
        if self.clamps:
            x = np.clip(x, *self.inp).astype(np.float32)
        y = self.w(x, nt)
        if self.clamps:
            y = np.clip(y, *self.out).astype(np.float32)
        return y if self.b is None else y + self.b


def _norm(wt: Weights, name: str, n: int):
    """An RMS norm's weight (and bias, where the file has one), or None."""
    if not wt.has(f"{name}.weight"):
        return None
    return wt.f32(f"{name}.weight", (n,)), (wt.f32(f"{name}.bias", (n,)) if wt.has(f"{name}.bias") else None)


def rms(x, norm, eps, nt=None, out=None):
    """rms_norm over the last axis of x [n, k], times the norm's weight (plus
    its bias), at nt threads (None: the default), into out when given."""
    x = np.ascontiguousarray(x, np.float32)
    if norm is None:
        return ops.rms_norm(x, None, eps=eps, n_threads=nt, out=out)
    w, b = norm
    y = ops.rms_norm(x, w, eps=eps, n_threads=nt, out=out)
    return y if b is None else np.add(y, b, out=y)


def rope_2d(x: np.ndarray, pos: np.ndarray, n_head: int, base: float, nt: int) -> np.ndarray:
    """The 2-D RoPE of vision towers, in place on x [P, n_head * D] (rows of
    contiguous floats, possibly a column slice of wider ones): each head's
    first half turned by pos[:, 0], its second by pos[:, 1], NeoX pairs of
    half a head; as half-heads [P, 2 * n_head, D/2] they take the two
    position columns in turn. Returns x."""
    P, D = x.shape[0], x.shape[1] // n_head
    halves = x.reshape(P, 2 * n_head, D // 2)  # a view: each row's floats are contiguous
    if not np.may_share_memory(halves, x):
        raise InvalidArgumentError("rope: the rows of x must be contiguous")
    ops.rope(halves, pos, n_rot=D // 2, freq_base=base, mode="neox", n_threads=nt, out=halves)
    return x


def activation(op, gate, nt=1, up=None, out=None):
    """The feed-forward's activation of the gate (ggml's gelu, silu or
    gelu_quick), times up when given, at nt threads; into out when given
    (gate itself: in place)."""
    if op in ("gelu", "silu"):
        if up is None:
            return (ops.gelu if op == "gelu" else ops.silu)(gate, n_threads=nt, out=out)
        return (ops.gelu_mul if op == "gelu" else ops.silu_mul)(gate, up, n_threads=nt, out=out)
    y = np.divide(gate, 1 + np.exp(np.float32(-1.702) * gate), out=out, dtype=np.float32)
    return y if up is None else np.multiply(y, up, out=y)


class _Layer:
    def __init__(self, wt: Weights, i: int, p: VisionParams):
        E, F, D = p.n_embd, p.n_ff, p.n_embd // p.n_head
        pre = f"v.blk.{i}"
        self.ln1 = _norm(wt, f"{pre}.ln1", E)
        self.ln2 = _norm(wt, f"{pre}.ln2", E)
        if self.ln1 is None or self.ln2 is None:
            raise UnsupportedModelError(f"{wt.gguf.path}: layer {i} of the gemma4v tower has no ln1 or ln2")
        self.q, self.k, self.v, self.o = (_Linear(wt, f"{pre}.{m}", E, E)
                                          for m in ("attn_q", "attn_k", "attn_v", "attn_out"))
        self.q_norm, self.k_norm = (self._head_norm(wt, f"{pre}.{m}", E, D) for m in ("attn_q_norm", "attn_k_norm"))
        self.attn_post = _norm(wt, f"{pre}.attn_post_norm", E)
        self.ffn_post = _norm(wt, f"{pre}.ffn_post_norm", E)
        self.gate = _Linear(wt, f"{pre}.ffn_gate", F, E) if wt.has(f"{pre}.ffn_gate.weight") else None
        self.up = _Linear(wt, f"{pre}.ffn_up", F, E)
        self.down = _Linear(wt, f"{pre}.ffn_down", E, F)
        self.out_scale = None
        if wt.has(f"{pre}.out_scale.weight"):
            s = wt.f32(f"{pre}.out_scale.weight").reshape(-1)
            if s.size not in (1, E):
                raise UnsupportedModelError(f"{wt.gguf.path}: {pre}.out_scale.weight holds {s.size} values, "
                                            f"expected 1 or {E}")
            self.out_scale = s

    @staticmethod
    def _head_norm(wt, name, E, D):
        """(weight, per head) of a q or k norm: over each head (D values) or the whole row (E)."""
        if not wt.has(f"{name}.weight"):
            return None
        w = wt.f32(f"{name}.weight").reshape(-1)
        if w.size not in (D, E):
            raise UnsupportedModelError(f"{wt.gguf.path}: {name}.weight holds {w.size} values, expected {D} or {E}")
        return w, w.size == D


class Gemma4Vision(Projector):
    """The encoder of a gemma4v mmproj: encode(image) -> float32 [n_cells, n_embd_text]."""

    image_begin = IMAGE_BEGIN
    image_end = IMAGE_END
    placeholder = "<|image|>"  # the id recorded at the rows' positions, where the vocabulary has it

    def __init__(self, gguf, params: VisionParams, n_threads=None):
        self.gguf, self.params = gguf, params
        self.path = gguf.path
        self.n_threads = check_threads(n_threads)
        p, wt = params, Weights(gguf)
        E, ps = p.n_embd, p.patch_size
        D = E // p.n_head
        if D % 4:
            raise UnsupportedModelError(f"{self.path}: head size {D} is not a multiple of 4 (2-D RoPE rotates "
                                        f"pairs in each half of a head)")
        self.cell = ps * p.n_merge
        self.min_pixels = MIN_TOKENS * self.cell * self.cell
        self.max_pixels = MAX_TOKENS * self.cell * self.cell
        # the conv kernel as a matrix [E, 3*p*p], input (c, ky, kx); float32
        self.patch_w = np.ascontiguousarray(wt.f32("v.patch_embd.weight", (E, 3, ps, ps)).reshape(E, 3 * ps * ps))
        pos = wt.info("v.position_embd.weight")
        if len(pos.shape) != 3 or pos.shape[0] != 2 or pos.shape[2] != E:
            raise UnsupportedModelError(f"{self.path}: v.position_embd.weight has shape {tuple(pos.shape)}, "
                                        f"expected (2, n_positions, {E})")
        self.pos = wt.f32("v.position_embd.weight")  # [2, n_pos, E]: by column, by row
        self.n_pos = int(pos.shape[1])
        self.layers = [_Layer(wt, i, p) for i in range(p.n_layer)]
        self.post_ln = _norm(wt, "v.post_ln", E)
        self.std_bias = self.std_scale = None
        if wt.has("v.std_bias") and wt.has("v.std_scale"):
            self.std_bias, self.std_scale = wt.f32("v.std_bias", (E,)), wt.f32("v.std_scale", (E,))
        proj = wt.info("mm.input_projection.weight")
        if len(proj.shape) != 2 or proj.shape[1] != E:
            raise UnsupportedModelError(f"{self.path}: mm.input_projection.weight has shape {tuple(proj.shape)}, "
                                        f"expected (n_embd of the text model, {E})")
        self.n_embd_out = int(proj.shape[0])
        self.proj = _Linear(wt, "mm.input_projection", self.n_embd_out, E, bias=False)
        # mtmd_decode_use_non_causal: E2B and E4B decode their image rows causally
        self.non_causal = self.n_embd_out not in CAUSAL_WIDTHS
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
        ps = self.params.patch_size
        if max(tw, th) // ps > self.n_pos:
            raise ImageError(f"an image of {im.size[0]} x {im.size[1]} becomes {tw} x {th}: "
                             f"{max(tw, th) // ps} patches on a side, more than the {self.n_pos} positions "
                             f"of the tower (its aspect ratio is too far from square)")
        return normalize(fit_and_pad(im, tw, th), self.params.mean, self.params.std)

    # ---- the graph ----

    def grid(self, pixels: np.ndarray) -> tuple[int, int]:
        """(columns, rows) of patches of preprocessed pixels, checked."""
        ps, c = self.params.patch_size, self.cell
        if pixels.ndim != 3 or pixels.shape[0] != 3 or pixels.shape[1] % c or pixels.shape[2] % c or \
                pixels.shape[1] == 0 or pixels.shape[2] == 0:
            raise InvalidArgumentError(f"pixels must have shape (3, H, W), H and W positive multiples of {c}, "
                                       f"got {pixels.shape}")
        gx, gy = pixels.shape[2] // ps, pixels.shape[1] // ps
        if max(gx, gy) > self.n_pos:
            raise InvalidArgumentError(f"{gx} x {gy} patches: more than the tower's {self.n_pos} positions a side")
        if gx * gy > MAX_TOKENS * self.params.n_merge ** 2:
            raise InvalidArgumentError(f"{gx} x {gy} patches: more than {MAX_TOKENS} cells")
        return gx, gy

    def patches(self, pixels: np.ndarray) -> np.ndarray:
        """[P, 3*p*p]: each patch's pixels in (channel, y, x) order, patches row-major."""
        gx, gy = self.grid(pixels)
        ps = self.params.patch_size
        x = np.asarray(pixels, np.float32).reshape(3, gy, ps, gx, ps).transpose(1, 3, 0, 2, 4)
        return np.ascontiguousarray(x.reshape(gx * gy, 3 * ps * ps), dtype=np.float32)

    @staticmethod
    def rope(x: np.ndarray, pos: np.ndarray, nt: int) -> np.ndarray:
        """x [P, H, D] rotated: dims [0, D/2) by the column, [D/2, D) by the
        row, each half in NeoX pairs (i, i + D/4), base 100. pos: int32
        [P, 2], (col, row): as half-heads [P, 2H, D/2] they take the column
        and the row in turn."""
        P, H, D = x.shape
        return rope_2d(np.ascontiguousarray(x, np.float32).reshape(P, H * D), pos, H, ROPE_BASE, nt).reshape(P, H, D)

    def vit(self, pixels: np.ndarray, nt: int) -> np.ndarray:
        """float32 [P, E]: the ViT's output rows, patches row-major."""
        p = self.params
        E, H = p.n_embd, p.n_head
        D = E // H
        gx, gy = self.grid(pixels)
        P = gx * gy
        x = ops.matmul(self.patch_w, "F32", self.patch_w.shape, self.patches(pixels * 2 - 1), n_threads=nt)
        col = np.tile(np.arange(gx, dtype=np.int32), gy)
        row = np.repeat(np.arange(gy, dtype=np.int32), gx)
        x = (x + self.pos[0][col] + self.pos[1][row]).astype(np.float32)
        pos = np.ascontiguousarray(np.stack([col, row], axis=1), np.int32)
        eps = p.eps
        for L in self.layers:
            h = rms(x, L.ln1, eps)
            q, k, v = (f(h, nt).reshape(P, H, D) for f in (L.q, L.k, L.v))
            q, k = (self._qk_norm(t, n, eps) for t, n in ((q, L.q_norm), (k, L.k_norm)))
            q, k = self.rope(q, pos, nt), self.rope(k, pos, nt)
            v = rms(v.reshape(P * H, D), None, eps).reshape(P, H, D)
            # scale 1: the q and k norms set the scores' size
            a = ops.attention(*(np.ascontiguousarray(t.reshape(P, E), np.float32) for t in (q, k, v)), H, scale=1.0,
                              n_threads=nt)
            o = L.o(a, nt)
            x = (x + (rms(o, L.attn_post, eps) if L.attn_post is not None else o)).astype(np.float32)
            h = rms(x, L.ln2, eps)
            if L.gate is not None:
                g = np.ascontiguousarray(L.gate(h, nt), np.float32)
                f = activation(p.ffn_op, g, nt, np.ascontiguousarray(L.up(h, nt), np.float32), out=g)
            else:
                f = activation(p.ffn_op, np.ascontiguousarray(L.up(h, nt), np.float32), nt)
            f = L.down(np.ascontiguousarray(f, np.float32), nt)
            x = (x + (rms(f, L.ffn_post, eps) if L.ffn_post is not None else f)).astype(np.float32)
            if L.out_scale is not None:
                x = (x * L.out_scale).astype(np.float32)
        if self.post_ln is not None:
            x = rms(x, self.post_ln, eps)
        return np.ascontiguousarray(x, np.float32)

    @staticmethod
    def _qk_norm(t, norm, eps):
        if norm is None:
            return t
        w, per_head = norm
        P, H, D = t.shape
        if per_head:
            return ops.rms_norm(np.ascontiguousarray(t.reshape(P * H, D)), w, eps=eps).reshape(P, H, D)
        return ops.rms_norm(np.ascontiguousarray(t.reshape(P, H * D)), w, eps=eps).reshape(P, H, D)

    def encode_pixels(self, pixels: np.ndarray, n_threads=None) -> np.ndarray:
        nt = self.n_threads if n_threads is None else check_threads(n_threads)
        p = self.params
        gx, gy = self.grid(pixels)
        x = self.vit(pixels, nt)
        m, E = p.n_merge, p.n_embd
        x = x.reshape(gy // m, m, gx // m, m, E).mean(axis=(1, 3)).reshape(-1, E)
        x = (x * np.float32(math.sqrt(E))).astype(np.float32)
        if self.std_bias is not None:
            x = ((x - self.std_bias) * self.std_scale).astype(np.float32)
        return self.proj(rms(x, None, p.eps), nt)
