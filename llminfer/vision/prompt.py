"""Images in chat prompts: OpenAI `image_url` parts to images, and the token
layout of a prompt with images in it.

mtmd's way, followed here: the chat template renders each image as a marker
in the text; the text is split at the markers and each piece tokenized
apart; each image becomes IMAGE_BEGIN's tokens, one placeholder position per
row of its embeddings, and IMAGE_END's tokens. The placeholder positions
are decoded from the rows, not from the placeholder id (Engine.decode_rows).
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import numpy as np

from llminfer.errors import ImageError, InvalidArgumentError
from llminfer.vision.image import MAX_BYTES, image_bytes

MARKER = "<__media__>"  # mtmd_default_marker()


@dataclass
class ImageSpan:
    """An image's rows in a prompt: positions [start, start + len(rows))."""

    start: int
    key: str                     # content hash (the encoder's key of the pixels)
    rows: np.ndarray = field(repr=False)

    @property
    def end(self) -> int:
        return self.start + len(self.rows)

    @property
    def grid(self):
        """(nx, ny) of an image whose rows take 2-D rope positions (Qwen-VL's
        GridRows), else None."""
        return getattr(self.rows, "grid", None)


class PromptIds(list):
    """Token ids of a prompt, with the ImageSpans whose positions hold
    placeholder ids (`images`, in order)."""

    images: tuple = ()


def image_source(part, where: str, allow_files: bool = True, max_bytes: int = MAX_BYTES):
    """The bytes (or PIL image, or path) an image part names. Parts:
    {"type": "image_url", "image_url": {"url": URL}} (or the URL as a
    string); URL a data: URL (base64), or with allow_files a file:// URL or
    a path. http(s) URLs are refused: nothing is fetched from the network."""
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if url is None and "image" in part:  # the library's own form: bytes, a path, a PIL image
        img = part["image"]
        if isinstance(img, (str, os.PathLike)) and not allow_files:
            raise ImageError(f"{where}: image files are not allowed here")
        return img
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError(f"{where}: image_url must be {{'url': 'data:image/...;base64,...'}}")
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or ";base64" not in head:
            raise ImageError(f"{where}: a data: URL of an image must be base64 (data:image/png;base64,...)")
        if len(payload) > (max_bytes * 4) // 3 + 8:
            raise ImageError(f"{where}: the image has more than the {max_bytes} bytes an image may have")
        try:
            return base64.b64decode(payload.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ImageError(f"{where}: the data: URL is not valid base64") from None
    scheme = urlparse(url).scheme.lower()
    if scheme in ("http", "https"):
        raise ImageError(f"{where}: http(s) image URLs are not fetched; send the image as a data: URL")
    if not allow_files:
        raise ImageError(f"{where}: only data: URLs are accepted for images here")
    if scheme == "file":
        return unquote(urlparse(url).path)
    if scheme and len(scheme) > 1:
        raise ImageError(f"{where}: image URLs of scheme {scheme!r} are not supported")
    return url


def split_images(messages, allow_files: bool = True):
    """(messages with each image part replaced by a text part holding
    MARKER, the image sources in order)."""
    if not isinstance(messages, (list, tuple)):
        return messages, []
    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        parts = []
        for j, p in enumerate(content):
            if isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image"):
                images.append(image_source(p, f"messages[{i}].content[{j}]", allow_files))
                parts.append({"type": "text", "text": MARKER})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, images


class ImageRows:
    """An encoder's rows of the last `keep` images, by content hash: an
    image repeated in a conversation is encoded once. Thread-safe (an image
    being encoded holds no lock; two threads may both encode one)."""

    def __init__(self, vision, keep: int = 16, n_threads=None):
        import threading
        from collections import OrderedDict

        self.vision, self.keep, self.n_threads = vision, keep, n_threads
        self._rows = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, source):
        """(content hash, rows, read-only float32 [n, n_embd]) of an image."""
        pixels = self.vision.preprocess(source)
        key = self.vision.key(pixels)
        with self._lock:
            rows = self._rows.get(key)
            if rows is not None:
                self._rows.move_to_end(key)
                return key, rows
        rows = self.vision.encode_pixels(pixels, n_threads=self.n_threads)
        rows.flags.writeable = False
        with self._lock:
            self._rows[key] = rows
            while len(self._rows) > self.keep:
                self._rows.popitem(last=False)
        return key, rows


def lay_out(text, sources, vision, tokenize, rows_of, add_bos) -> PromptIds:
    """The PromptIds of a rendered chat `text` holding one MARKER per image
    of `sources`: each piece of text tokenized apart (the first with BOS when
    add_bos), each image as vision.image_parts lays it out: its text (a
    Gemma 3 image: vision.image_begin, the rows, vision.image_end; an
    Idefics3 one: text between its tiles' rows) and one placeholder per
    row. tokenize(text, add_bos) -> ids; rows_of(source) -> (content hash,
    rows). A marker count that is not the image count (a template that
    drops parts, or a marker typed as text) is an error."""
    pieces = text.split(MARKER)
    if len(pieces) - 1 != len(sources):
        raise InvalidArgumentError(f"the prompt holds {len(pieces) - 1} image markers for {len(sources)} images "
                                   f"(the chat template dropped an image, or the text holds {MARKER!r})")
    soft = tokenize(vision.placeholder, False) if vision.placeholder else []
    placeholder = soft[0] if len(soft) == 1 else 0
    ids, spans = PromptIds(), []
    for i, piece in enumerate(pieces):
        if i:
            key, rows = rows_of(sources[i - 1])
            parts = vision.image_parts(rows)
            blocks = sum(not isinstance(part, str) for part in parts)
            k = 0
            for part in parts:
                if isinstance(part, str):
                    if part:
                        ids.extend(tokenize(part, False))
                    continue
                # an image's blocks of rows, each its own span (its own key: the hash and its place)
                spans.append(ImageSpan(len(ids), key if blocks == 1 else f"{key}/{k}", part))
                ids.extend([placeholder] * len(part))
                k += 1
        if piece or i == 0:
            ids.extend(tokenize(piece, add_bos and i == 0))
    ids.images = tuple(spans)
    return ids


def has_images(messages) -> bool:
    return isinstance(messages, (list, tuple)) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list) and any(
            isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image") for p in m["content"])
        for m in messages)


def check_bytes(source, max_bytes=MAX_BYTES):
    """bytes of a source that is bytes; others pass (read when loaded)."""
    return image_bytes(source, max_bytes) if isinstance(source, (bytes, bytearray)) else source
