"""Images in: decoding untrusted bytes with Pillow, and the fixed-size
preprocessing of llama.cpp's mtmd (tools/mtmd/mtmd-image.cpp).

An image is untrusted input. It is refused with ImageError, never read
whole, when it is too many bytes, a format other than JPEG, PNG, WebP or
GIF (SVG among them: Pillow does not rasterise it, and we do not want it
to), larger than `max_pixels` by its header (a decompression bomb: a PNG
of 30000 x 30000 pixels is a few kilobytes), or truncated. A GIF gives its
first frame; an alpha channel is dropped (as stb_image's 3-channel load in
llama.cpp does).
"""

from __future__ import annotations

import io
import math
import os
import threading
import warnings

import numpy as np

from llminfer.errors import ImageError, InvalidArgumentError

FORMATS = ("JPEG", "PNG", "WEBP", "GIF")
MAX_BYTES = 20 << 20          # bytes of one encoded image
MAX_PIXELS = 50_000_000       # width * height by the header, before decoding


def pil():
    """PIL.Image, or ImageError naming the missing optional dependency."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - an optional dependency
        raise ImageError("images need Pillow: pip install 'llminfer[vision]'") from None
    return Image


def image_bytes(source, max_bytes: int = MAX_BYTES) -> bytes:
    """The encoded bytes of `source`: bytes, a path, or a binary file object."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            size = os.path.getsize(path)
            if size > max_bytes:
                raise ImageError(f"{path}: {size} bytes, more than the {max_bytes} an image may have")
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
        except FileNotFoundError:
            raise ImageError(f"no such image file: {path}") from None
        except IsADirectoryError:
            raise ImageError(f"{path} is a directory, not an image") from None
        except OSError as e:
            raise ImageError(f"cannot read the image {path}: {e.strerror or e}") from None
    elif hasattr(source, "read"):
        data = source.read(max_bytes + 1)
        if not isinstance(data, bytes):
            raise InvalidArgumentError("an image file object must be opened in binary mode")
    else:
        raise InvalidArgumentError(f"an image is bytes, a path or a binary file, got {type(source).__name__}")
    if len(data) > max_bytes:
        raise ImageError(f"the image has more than the {max_bytes} bytes an image may have")
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    return data


def _looks_like_svg(data: bytes) -> bool:
    head = data[:512].lstrip().lower()
    return head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:4096].lower())


_open_lock = threading.Lock()


def _open(Image, data):
    """Image.open on the bytes, its header read. Pillow's own bomb check
    warns past Image.MAX_IMAGE_PIXELS and raises past twice that: the
    warning is made an error too (under a lock: the warnings filters are
    the process's), and load_image's tighter limit is checked against the
    header before a pixel is decoded."""
    with _open_lock, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data), formats=list(FORMATS))


def load_image(source, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_BYTES):
    """A decoded RGB PIL image of `source` (bytes, a path or a binary file)."""
    Image = pil()
    data = image_bytes(source, max_bytes)
    if _looks_like_svg(data):
        raise ImageError("SVG images are not supported; send JPEG, PNG, WebP or GIF")
    try:
        im = _open(Image, data)
        w, h = im.size
        if w <= 0 or h <= 0:
            raise ImageError(f"the image has no pixels ({w} x {h})")
        if w * h > max_pixels:
            raise ImageError(f"the image is {w} x {h} pixels, more than the {max_pixels} "
                             f"an image may have")
        im.load()  # the first frame of a GIF or an animated WebP: the one open() positions at
        return im.convert("RGB")
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"the image is too large: {e}") from None
    except Image.UnidentifiedImageError:
        raise ImageError(f"the bytes are no image in a format we read ({', '.join(FORMATS)})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        # Pillow's truncated or corrupt data ("image file is truncated", ...)
        raise ImageError(f"the image cannot be decoded (truncated or corrupt): {e}") from None


def fit_size(w: int, h: int, size: int) -> tuple[int, int]:
    """The size an image of w x h is resized to inside a size x size square,
    its aspect ratio kept (llama.cpp's PAD_CEIL: float32 scale, rounded up)."""
    scale = min(np.float32(size) / np.float32(w), np.float32(size) / np.float32(h))
    nw = min(int(math.ceil(np.float32(w) * scale)), size)
    nh = min(int(math.ceil(np.float32(h) * scale)), size)
    return max(nw, 1), max(nh, 1)


def preprocess_fixed(im, size: int, mean, std) -> np.ndarray:
    """The image as float32 [3, size, size]: resized (Pillow's bilinear
    filter, which llama.cpp reimplements) into the square with its aspect
    ratio kept, centred on black, scaled to [0, 1] and normalised with the
    mmproj's mean and std per channel. What mtmd does for Gemma 3."""
    Image = pil()
    im = im.convert("RGB")
    if im.size != (size, size):
        nw, nh = fit_size(im.size[0], im.size[1], size)
        resized = im.resize((nw, nh), Image.BILINEAR)
        canvas = Image.new("RGB", (size, size), (0, 0, 0))
        canvas.paste(resized, ((size - nw) // 2, (size - nh) // 2))
        im = canvas
    return normalize(im, mean, std)


def resize_two_pass(im, size, resample):
    """im resized to size = (w, h) as mtmd's resize_pillow does it: the
    width first over the whole image, rounded to 8 bits, then the height.
    Pillow's own resize sometimes runs the height first (scaling a 130 x 300
    image to 125 x 288, say), which rounds differently."""
    w, h = size
    if im.size[0] != w:
        im = im.resize((w, im.size[1]), resample)
    if im.size[1] != h:
        im = im.resize((w, h), resample)
    return im


def normalize(im, mean, std) -> np.ndarray:
    """An RGB PIL image as float32 [3, h, w]: scaled to [0, 1] and
    normalised with the mmproj's mean and std per channel (clip_image_f32's
    normalize in mtmd). An 8-bit channel has 256 levels, so each channel's
    (v / 255 - mean) / std is worked out once per level, in float32 as for
    each pixel, and looked up: the same bits, without the image-sized
    temporaries whose fresh pages cost more than the arithmetic."""
    mean, std = np.asarray(mean, np.float32)[:3], np.asarray(std, np.float32)[:3]
    px = np.asarray(im)
    if px.dtype != np.uint8 or px.ndim != 3 or px.shape[2] != 3:
        x = np.asarray(im, dtype=np.float32) / np.float32(255.0)  # [h, w, 3]
        return np.ascontiguousarray(((x - mean) / std).transpose(2, 0, 1))
    levels = np.arange(256, dtype=np.float32) / np.float32(255.0)
    lut = (levels[None, :] - mean[:, None]) / std[:, None]  # [3, 256]
    out = np.empty((3,) + px.shape[:2], np.float32)
    for c in range(3):
        np.take(lut[c], px[:, :, c], out=out[c])
    return out


# ---- mtmd's smart resize (gemma4v, lfm2) ----

def _f32(x) -> np.float32:
    return np.float32(x)


def target_size(w: int, h: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size an image of w x h is resized to: each side a multiple of
    align, the aspect ratio kept, the area within [min_pixels, max_pixels]
    (mtmd's calc_size_preserved_ratio, its float32 arithmetic and its
    rounding half away from zero)."""
    f = _f32(align)

    def round_by(x):
        return int(math.floor(float(_f32(x) / f) + 0.5)) * align

    def ceil_by(x):
        return int(math.ceil(float(_f32(x) / f))) * align

    def floor_by(x):
        return int(math.floor(float(_f32(x) / f))) * align

    w_bar, h_bar = max(align, round_by(w)), max(align, round_by(h))
    if h_bar * w_bar > max_pixels:
        beta = np.sqrt(_f32(h) * _f32(w) / _f32(max_pixels), dtype=np.float32)
        h_bar = max(align, floor_by(_f32(h) / beta))
        w_bar = max(align, floor_by(_f32(w) / beta))
    elif h_bar * w_bar < min_pixels:
        beta = np.sqrt(_f32(min_pixels) / (_f32(h) * _f32(w)), dtype=np.float32)
        h_bar = ceil_by(_f32(h) * beta)
        w_bar = ceil_by(_f32(w) * beta)
    return w_bar, h_bar


def rgb_image(image):
    """An image (bytes, a path, a file, or a PIL image) as an RGB PIL image,
    opened through load_image's checks unless it is a PIL image already."""
    im = image if hasattr(image, "convert") and hasattr(image, "size") else load_image(image)
    return im.convert("RGB")


def fit_and_pad(im, tw: int, th: int):
    """im drawn inside tw x th (fit_box's size, bicubic, the width first as
    mtmd's resize), centred on black; im itself when it is that size."""
    if im.size == (tw, th):
        return im
    Image = pil()
    nw, nh = fit_box(im.size[0], im.size[1], tw, th)
    canvas = Image.new("RGB", (tw, th), (0, 0, 0))
    canvas.paste(resize_two_pass(im, (nw, nh), Image.BICUBIC), ((tw - nw) // 2, (th - nh) // 2))
    return canvas


def fit_box(w: int, h: int, tw: int, th: int) -> tuple[int, int]:
    """The size of a w x h image drawn inside tw x th, its aspect ratio kept
    (mtmd's PAD_CEIL: float32 scale, rounded up, at most the box)."""
    scale = min(_f32(tw) / _f32(w), _f32(th) / _f32(h))
    nw = min(int(math.ceil(float(_f32(w) * scale))), tw)
    nh = min(int(math.ceil(float(_f32(h) * scale))), th)
    return max(nw, 1), max(nh, 1)
