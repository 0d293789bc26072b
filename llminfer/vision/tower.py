"""An mmproj file's parameters and weights (llminfer.vision.mmproj opens one).

The vision encoder and projector that llama.cpp's tools/mtmd reads beside a
language model (`--mmproj`).

Its metadata is under `clip.*` (clip.projector_type names the projector,
clip.vision.* the ViT's sizes, image size, patch size, mean and std); its
tensors under `v.*` (the ViT) and `mm.*` (the projector). One module per
projector type builds the encoder (llminfer/vision/<type>.py), as llama.cpp
keeps one graph per type in tools/mtmd/models/. Weights stay in the file's
memory map; matrices are packed once into ops.GemmWeight panels (F16 kept
as F16, the other types as float32) and multiplied in float32 by ops.gemm.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from llminfer.core import ops
from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.core.ggml import GGMLQuantizationType

# the projector types this version runs, each a module of llminfer.vision
SUPPORTED = ("gemma3", "gemma4v", "idefics3", "lfm2", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
# cells of 2 x 2 patches (clip.vision.spatial_merge_size)
QWEN_VL = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
# the types whose image size is each image's own (the file's image_size a placeholder)
DYNAMIC_SIZE = ("gemma4v",) + QWEN_VL
WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0")


class Projector:
    """What every projector module's encoder shares: an image's rows are its
    encode_pixels of its preprocess, placed between its image_begin and
    image_end texts (where a projector lays an image out otherwise, it says
    so in its own image_parts), and the file closes with it."""

    def file_ident(self, gguf) -> str:
        """What names this encoder's file in its keys: its path and size."""
        return hashlib.sha256(f"{self.path}:{gguf.file_size}".encode()).hexdigest()[:16]

    def key(self, pixels: np.ndarray) -> str:
        """The content hash of preprocessed pixels (of any shape) under this encoder."""
        h = hashlib.sha256(f"{self._ident}:{pixels.shape}".encode())
        h.update(np.ascontiguousarray(pixels, np.float32).tobytes())
        return h.hexdigest()

    def image_parts(self, rows: np.ndarray) -> list:
        """The image's place in the prompt: text and its rows, in order."""
        return [self.image_begin, rows, self.image_end]

    def encode(self, image, n_threads=None) -> np.ndarray:
        """float32 [n_rows, n_embd_text]: an image's rows for the text model, in prompt order."""
        return np.asarray(self.encode_pixels(self.preprocess(image), n_threads))

    def close(self):
        self.gguf.close()


@dataclass
class VisionParams:
    """clip.vision.* of the file."""

    projector: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    eps: float
    mean: tuple
    std: tuple
    n_merge: int
    ffn_op: str      # gelu (tanh form), silu or gelu_quick, as clip.use_gelu / clip.use_silu say


class Weights:
    """Tensors of an open mmproj file: matrices packed for ops.gemm, vectors
    and small tensors as float32."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def has(self, name) -> bool:
        return name in self.gguf.tensors

    def info(self, name):
        try:
            return self.gguf.tensors[name]
        except KeyError:
            raise UnsupportedModelError(f"{self.gguf.path}: the mmproj has no tensor {name}") from None

    def _type(self, name):
        info = self.info(name)
        try:
            t = GGMLQuantizationType(info.qtype)
        except ValueError:
            t = None
        if t is None or t.name not in WEIGHT_TYPES:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name} is {info.type_name}; the vision "
                                        f"encoder takes {', '.join(WEIGHT_TYPES)}")
        return t

    def f32(self, name, shape=None) -> np.ndarray:
        """The tensor dequantized to float32, in numpy's shape (slowest first)."""
        info, t = self.info(name), self._type(name)
        if shape is not None and tuple(info.shape) != tuple(shape):
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name} has shape {tuple(info.shape)}, "
                                        f"expected {tuple(shape)}")
        return ops.dequantize(self.gguf.tensor_bytes(name), t, info.shape).reshape(info.shape)

    def matrix(self, name, rows=None, k=None) -> "Matrix":
        info, t = self.info(name), self._type(name)
        if len(info.shape) != 2 or (rows is not None and info.shape[0] != rows) or \
                (k is not None and info.shape[1] != k):
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name} has shape {tuple(info.shape)}, "
                                        f"expected ({rows}, {k})")
        return Matrix(self.gguf.tensor_bytes(name), t, tuple(info.shape))


class Matrix:
    """A weight (rows, k) packed once, when the file is opened, into the
    float GEMM's panels (ops.GemmWeight: F16 stays F16, the other types
    become float32); y = x @ W.T (+ bias) (+ residual) in float32."""

    def __init__(self, data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple):
        self.qtype, self.shape = qtype, tuple(shape)
        self.packed = ops.GemmWeight(data, qtype, self.shape)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes

    def __call__(self, x, n_threads, bias=None, residual=None, out=None):
        return ops.gemm(self.packed, np.ascontiguousarray(x, np.float32), bias, residual, n_threads=n_threads, out=out)


def _meta(md, key, kind, path, default=None):
    v = md.get(key, default)
    if v is None:
        raise UnsupportedModelError(f"{path}: the mmproj has no {key}")
    try:
        if kind is int:
            iv = int(v)
            if iv <= 0:
                raise ValueError
            return iv
        if kind is float:
            return float(v)
        if kind is bool:
            return bool(v)
        if kind is tuple:
            out = tuple(float(a) for a in v)
            if len(out) < 3:
                raise ValueError
            return out
    except (TypeError, ValueError):
        raise UnsupportedModelError(f"{path}: {key} has an unusable value {v!r}") from None
    return v


def read_params(gguf: GGUFFile) -> VisionParams:
    md, path = gguf.metadata, gguf.path
    arch = md.get("general.architecture")
    if arch != "clip":
        raise UnsupportedModelError(f"{path}: not an mmproj file (general.architecture is {arch!r}, not 'clip')")
    if md.get("clip.has_vision_encoder") is False:
        raise UnsupportedModelError(f"{path}: the mmproj has no vision encoder")
    proj = md.get("clip.vision.projector_type", md.get("clip.projector_type"))
    if not isinstance(proj, str):
        raise UnsupportedModelError(f"{path}: the mmproj names no clip.projector_type")
    if proj not in SUPPORTED:
        raise UnsupportedModelError(f"{path}: projector type {proj!r} is not supported yet "
                                    f"(supported: {', '.join(SUPPORTED)})")
    p = VisionParams(
        projector=proj,
        image_size=_meta(md, "clip.vision.image_size", int, path),
        patch_size=_meta(md, "clip.vision.patch_size", int, path),
        n_embd=_meta(md, "clip.vision.embedding_length", int, path),
        n_ff=_meta(md, "clip.vision.feed_forward_length", int, path),
        n_layer=_meta(md, "clip.vision.block_count", int, path),
        n_head=_meta(md, "clip.vision.attention.head_count", int, path),
        eps=_meta(md, "clip.vision.attention.layer_norm_epsilon", float, path, 1e-6),
        mean=_meta(md, "clip.vision.image_mean", tuple, path),
        std=_meta(md, "clip.vision.image_std", tuple, path),
        # the side of the patch grid is pooled by 4 (Gemma 3; 3 for Gemma 4, 2 for LFM2-VL) unless the file says
        n_merge=(_meta(md, "clip.vision.spatial_merge_size", int, path, 2) if proj in QWEN_VL else
                 _meta(md, "clip.vision.projector.scale_factor", int, path, {"gemma4v": 3, "lfm2": 2}.get(proj, 4))),
        ffn_op=("gelu" if md.get("clip.use_gelu") else "silu" if md.get("clip.use_silu") else "gelu_quick"),
    )
    if any(s == 0 for s in p.std):
        raise UnsupportedModelError(f"{path}: clip.vision.image_std has a zero")
    # gemma4v's and qwen2.5vl's image size is each image's own (the file's image_size is a placeholder)
    if proj not in DYNAMIC_SIZE and (p.image_size % p.patch_size or (p.image_size // p.patch_size) % p.n_merge):
        raise UnsupportedModelError(f"{path}: image size {p.image_size} is not a whole number of patches "
                                    f"({p.patch_size}) pooled by {p.n_merge}")
    if p.n_embd % p.n_head:
        raise UnsupportedModelError(f"{path}: {p.n_head} heads do not divide the width {p.n_embd}")
    if p.image_size > 4096:
        raise UnsupportedModelError(f"{path}: image size {p.image_size} is out of range")
    return p
