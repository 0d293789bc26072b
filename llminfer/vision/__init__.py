"""llminfer.vision: images in, through a model's mmproj file.

    enc = load_mmproj("mmproj-gemma-3-4b-f16.gguf")
    rows = enc.encode("cat.jpg")      # float32 [256, n_embd of the text model]

LLM(model, mmproj=PATH) loads one beside the model, and chat messages take
OpenAI's image_url parts (data: URLs, or paths and bytes in the library).
Projector types run: gemma3 (SigLIP, average pooling, projection),
idefics3 (SmolVLM: tiles, pixel shuffle), lfm2 (LFM2-VL: SigLIP2 NaFlex
over an image of its own size or in tiles, pixel unshuffle, MLP), gemma4v
(Gemma 4: a ViT with 2-D RoPE over an image of its own size, pooling,
projection), qwen2vl_merger and qwen2.5vl_merger (Qwen2-VL, Qwen2.5-VL:
window attention, 2 x 2 merge, MLP; their rows take M-RoPE positions in
the qwen2vl text model) and qwen3vl_merger (Qwen3-VL: learned positions
resized, DeepStack slices beside each row).
"""

from llminfer.vision.image import MAX_BYTES, MAX_PIXELS, load_image
from llminfer.vision.mmproj import SUPPORTED, load_mmproj

__all__ = ["load_mmproj", "load_image", "SUPPORTED", "MAX_BYTES", "MAX_PIXELS"]
