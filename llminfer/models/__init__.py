"""Model architectures, one file each, named after GGUF's general.architecture.
Each file's build(gguf) reads hyperparameters and tensors into a ModelSpec."""

from llminfer.errors import UnsupportedModelError
from llminfer.gguf_file import GGUFFile
from llminfer.models import gemma3, llama, qwen2, qwen3
from llminfer.models.base import ModelSpec

ARCHITECTURES = {
    llama.ARCH: llama.build,
    qwen2.ARCH: qwen2.build,
    gemma3.ARCH: gemma3.build,
    qwen3.ARCH: qwen3.build,
}


def build_spec(gguf: GGUFFile) -> ModelSpec:
    arch = gguf.architecture
    builder = ARCHITECTURES.get(arch)
    if builder is None:
        raise UnsupportedModelError(f"{gguf.path}: architecture {arch!r} is not supported; "
                                    f"supported: {', '.join(sorted(ARCHITECTURES))}")
    return builder(gguf)


__all__ = ["ARCHITECTURES", "ModelSpec", "build_spec"]
