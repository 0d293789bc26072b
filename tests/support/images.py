"""Images for the vision tests: PNG bytes and data: URLs of synthetic
pictures, the hostile ones every image path must refuse clearly, and the
chat template and special tokens of the tiny Gemma 3 and Gemma 4 vision
models."""

import base64
import io
import struct
import zlib

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from PIL import Image


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


# the special tokens of the tiny Idefics3 (SmolVLM) model's image layout
IDEFICS3_TOKENS = {"<fake_token_around_image>": 4, "<global-img>": 4, "<image>": 4, "\n\n": 4,
                   **{f"<row_{y}_col_{x}>": 4 for y in (1, 2) for x in (1, 2)}}
IMAGE_TOKENS = {"<start_of_image>": 4, "<end_of_image>": 4, "<image_soft_token>": 4,
                "<start_of_turn>": 4, "<end_of_turn>": 4}
# the tiny Gemma 4's: its image markers (mtmd's "<|image>" ... "<image|>", "<|image|>" at the rows)
GEMMA4_IMAGE_TOKENS = {"<|image>": 4, "<image|>": 4, "<|image|>": 4, "<start_of_turn>": 4, "<end_of_turn>": 4}


# the tiny LFM2-VL's: mtmd's "<|image_start|>" ... "<|image_end|>", its tile and thumbnail markers,
# "<image>" at the rows, and ChatML's turns as LFM2's template writes them
LFM2_IMAGE_TOKENS = {"<|image_start|>": 4, "<|image_end|>": 4, "<|img_thumbnail|>": 4, "<image>": 4,
                     "<|im_start|>": 4, "<|im_end|>": 4,
                     **{f"<|img_row_{y}_col_{x}|>": 4 for y in range(1, 11) for x in range(1, 11) if x * y <= 10}}
LFM2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def lfm2_text_model(path, **kw):
    """A tiny lfm2 (tiny_models.HybridConfig(arch="lfm2", **kw)) with LFM2_TEMPLATE and LFM2_IMAGE_TOKENS."""
    from tiny_models import HybridConfig, write_hybrid

    kw.setdefault("pre", "default")  # a pre-tokenizer name llama.cpp knows
    kw.setdefault("context_length", 4096)  # room for a tiled image (up to 10 tiles and a thumbnail)
    return write_hybrid(path, HybridConfig(arch="lfm2", **kw), meta={"tokenizer.chat_template": LFM2_TEMPLATE},
                        extra_tokens=LFM2_IMAGE_TOKENS)


def gemma4_text_model(path, **kw):
    """A tiny gemma4 (tiny_models.Gemma4Config(**kw)) with GEMMA_TEMPLATE and GEMMA4_IMAGE_TOKENS."""
    from tiny_models import Gemma4Config, write_gemma4

    return write_gemma4(path, Gemma4Config(**kw), meta={"tokenizer.chat_template": GEMMA_TEMPLATE},
                        extra_tokens=GEMMA4_IMAGE_TOKENS)


# the tiny Qwen2.5-VL's: ChatML turns and mtmd's "<|vision_start|>" ... "<|vision_end|>" around an image
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_IMAGE_TOKENS = {"<|vision_start|>": 4, "<|vision_end|>": 4, "<|im_start|>": 4, "<|im_end|>": 4}


def qwen2vl_text_model(path, **kw):
    """A tiny qwen2vl (tiny_models.TinyConfig(arch="qwen2vl", **kw)) with QWEN_TEMPLATE and QWEN_IMAGE_TOKENS."""
    from tiny_models import TinyConfig, write_model

    cfg = dict(arch="qwen2vl", pre="default", tie_output=False)
    cfg.update(kw)
    return write_model(path, TinyConfig(**cfg), extra_strings={"tokenizer.chat_template": QWEN_TEMPLATE},
                       extra_tokens=QWEN_IMAGE_TOKENS)


def png(arr) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.asarray(arr, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def data_url(b: bytes, mime="image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(b).decode()


def synthetic(h, w, seed=0):
    return (np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8)


# ---- preprocessing ----


def png_header_only(w, h) -> bytes:
    """A PNG that claims w x h pixels: a valid IHDR, no data (a bomb costs
    its header only)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


HOSTILE = {
    "truncated png": lambda: png(synthetic(64, 64))[:300],
    "truncated jpeg": lambda: (lambda b: b[:len(b) // 2])(_jpeg(synthetic(64, 64))),
    "bomb 30000x30000": lambda: png_header_only(30000, 30000),
    "bomb 8000x8000": lambda: png_header_only(8000, 8000),
    "not an image": lambda: b"hello, this is plain text and no image at all" * 10,
    "svg": lambda: b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>',
    "svg with xml header": lambda: b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"></svg>',
    "empty": lambda: b"",
    "bmp (a format not read)": lambda: _save(synthetic(8, 8), "BMP"),
}


def _jpeg(a):
    return _save(a, "JPEG")


def _save(a, fmt):
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, fmt)
    return buf.getvalue()


def reference_file(path):
    """(metadata, {name: float64 tensor}) of an mmproj, by gguf's own dequantization."""
    r = GGUFReader(str(path))
    md = {k: f.contents() for k, f in r.fields.items()}
    t = {x.name: gguf_dequantize(x.data, x.tensor_type).reshape(tuple(int(v) for v in reversed(x.shape.tolist())))
         .astype(np.float64) for x in r.tensors}
    return md, t
