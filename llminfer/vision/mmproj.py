"""Opening an mmproj file: the projector type its metadata names picks the
encoder, one module per type (llminfer/vision/<type>.py), as llama.cpp keeps
one graph per type in tools/mtmd/models/. The file's parameters and weights
are read by llminfer.vision.tower."""

from __future__ import annotations

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.vision.gemma3 import Gemma3Vision
from llminfer.vision.gemma4 import Gemma4Vision
from llminfer.vision.idefics3 import Idefics3Vision
from llminfer.vision.lfm2 import Lfm2Vision
from llminfer.vision.qwen25vl import Qwen25VLVision
from llminfer.vision.qwen3vl import Qwen3VLVision
from llminfer.vision.tower import SUPPORTED, read_params

__all__ = ["SUPPORTED", "load_mmproj", "load_for_model"]


def load_mmproj(path, n_threads=None, mmap: bool = True):
    """The vision encoder of an mmproj file (an object with .encode(image)):
    UnsupportedModelError for a projector type not run yet, naming it."""
    gguf = GGUFFile(path, mmap=mmap)
    try:
        params = read_params(gguf)
        if params.projector == "gemma3":
            return Gemma3Vision(gguf, params, n_threads=n_threads)
        if params.projector == "gemma4v":
            return Gemma4Vision(gguf, params, n_threads=n_threads)
        if params.projector == "idefics3":
            return Idefics3Vision(gguf, params, n_threads=n_threads)
        if params.projector == "lfm2":
            return Lfm2Vision(gguf, params, n_threads=n_threads)
        if params.projector in ("qwen2vl_merger", "qwen2.5vl_merger"):
            return Qwen25VLVision(gguf, params, n_threads=n_threads)
        if params.projector == "qwen3vl_merger":
            return Qwen3VLVision(gguf, params, n_threads=n_threads)
        raise UnsupportedModelError(f"{path}: projector type {params.projector!r} is not supported")
    except BaseException:
        gguf.close()
        raise


def load_for_model(path, n_embd: int, model_name, n_threads=None):
    """load_mmproj, refusing a tower that does not project to the text
    model's width n_embd (the mmproj of another model)."""
    vis = load_mmproj(path, n_threads=n_threads)
    if vis.n_embd_out != n_embd:
        vis.close()
        raise UnsupportedModelError(f"the mmproj {path} projects to width {vis.n_embd_out}, the model "
                                    f"{model_name} is {n_embd} wide: not its vision tower")
    return vis
