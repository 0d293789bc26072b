"""Model architectures, one file each, named after GGUF's general.architecture.
Each file's build(gguf) reads hyperparameters and tensors into a ModelSpec."""

from llminfer.errors import UnsupportedModelError
from llminfer.gguf_file import GGUFFile
from llminfer.models import gemma3, llama, qwen2
from llminfer.models.base import ModelSpec

ARCHITECTURES = {
    llama.ARCH: llama.build,
    qwen2.ARCH: qwen2.build,
    gemma3.ARCH: gemma3.build,
}


def build_spec(gguf: GGUFFile) -> ModelSpec:
    count = gguf.metadata.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        # one part of a gguf-split model holds only some of the tensors
        raise UnsupportedModelError(
            f"{gguf.path} is part {gguf.metadata.get('split.no', 0) + 1} of a model split into {count} files; "
            f"llminfer loads one file: join the parts (llminfer.hf.join_split, or llama.cpp's "
            f"llama-gguf-split --merge), or fetch it with LLM.from_pretrained / llminfer pull hf://..., "
            f"which join them")
    arch = gguf.architecture
    builder = ARCHITECTURES.get(arch)
    if builder is None:
        raise UnsupportedModelError(f"{gguf.path}: architecture {arch!r} is not supported; "
                                    f"supported: {', '.join(sorted(ARCHITECTURES))}")
    return builder(gguf)


__all__ = ["ARCHITECTURES", "ModelSpec", "build_spec"]
