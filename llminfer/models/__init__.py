"""Model architectures, one file each, named after GGUF's general.architecture.
Each file's build(gguf) reads hyperparameters and tensors into a ModelSpec;
a build that also takes n_ctx (phi3: LongRoPE's factors depend on the
context length) is given the context the model will run with."""

import inspect

from llminfer.errors import UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import (gemma2, gemma3, gemma4, gpt_oss, granite, granitehybrid, lfm2, llama, mamba2, mistral3,
                             nemotron_h, olmo2, phi3, qwen2, qwen2vl, qwen3, qwen3moe, qwen3next, qwen3vl, qwen3vlmoe,
                             qwen35, qwen35moe, smollm3)
from llminfer.models.base import ModelSpec

ENCODER_ARCHS = ("bert", "nomic-bert")  # llminfer.models.bert, run by llminfer.generation.embeddings

ARCHITECTURES = {
    llama.ARCH: llama.build,
    qwen2.ARCH: qwen2.build,
    qwen2vl.ARCH: qwen2vl.build,
    gemma3.ARCH: gemma3.build,
    qwen3.ARCH: qwen3.build,
    qwen3vl.ARCH: qwen3vl.build,
    qwen3moe.ARCH: qwen3moe.build,
    qwen3vlmoe.ARCH: qwen3vlmoe.build,
    gemma2.ARCH: gemma2.build,
    phi3.ARCH: phi3.build,
    granite.ARCH: granite.build,
    olmo2.ARCH: olmo2.build,
    smollm3.ARCH: smollm3.build,
    mistral3.ARCH: mistral3.build,
    lfm2.ARCH: lfm2.build,
    lfm2.MOE_ARCH: lfm2.build_moe,
    qwen35.ARCH: qwen35.build,
    qwen35moe.ARCH: qwen35moe.build,
    qwen3next.ARCH: qwen3next.build,
    mamba2.ARCH: mamba2.build,
    granitehybrid.ARCH: granitehybrid.build,
    nemotron_h.ARCH: nemotron_h.build,
    gpt_oss.ARCH: gpt_oss.build,
    gemma4.ARCH: gemma4.build,
}


def build_spec(gguf: GGUFFile, n_ctx: int | None = None) -> ModelSpec:
    count = gguf.metadata.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        # one part of a gguf-split model holds only some of the tensors
        raise UnsupportedModelError(
            f"{gguf.path} is part {gguf.metadata.get('split.no', 0) + 1} of a model split into {count} files; "
            f"llminfer loads one file: join the parts (llminfer.hub.hf.join_split, or llama.cpp's "
            f"llama-gguf-split --merge), or fetch it with LLM.from_pretrained / llminfer pull hf://..., "
            f"which join them")
    arch = gguf.architecture
    builder = ARCHITECTURES.get(arch)
    if builder is None and arch in ENCODER_ARCHS:
        raise UnsupportedModelError(f"{gguf.path}: {arch!r} is an encoder (embedding) model, which does not "
                                    f"generate text; load it with llminfer.Embedder")
    if builder is None:
        raise UnsupportedModelError(f"{gguf.path}: architecture {arch!r} is not supported; "
                                    f"supported: {', '.join(sorted(ARCHITECTURES))}")
    if "n_ctx" in inspect.signature(builder).parameters:
        return builder(gguf, n_ctx=n_ctx)
    return builder(gguf)


def support_line(gguf: GGUFFile) -> str:
    """One line for `llminfer info`: what llminfer would run, or what in the
    file it cannot load and why (the architecture, a tensor type, a shape or
    a metadata value, as build_spec's error names it)."""
    try:
        spec = build_spec(gguf)
    except UnsupportedModelError as e:
        why = str(e)
        prefix = f"{gguf.path}: "
        return f"llminfer: cannot load: {why[len(prefix):] if why.startswith(prefix) else why}"
    moe = (f", {spec.n_expert} experts of which {spec.n_expert_used} per token"
           if spec.n_expert else "")
    windows = sum(1 for L in spec.layers if L.sliding_window)
    swa = f", {windows} sliding-window layers" if windows else ""
    recurrent = len(spec.recurrent_layers)
    if recurrent:
        swa += f", {recurrent} recurrent layers (a state per sequence)"
    return (f"llminfer: loads as {spec.arch}: {spec.n_layer} layers, {spec.n_params() / 1e6:.1f}M parameters"
            f"{moe}{swa}, {spec.weight_bytes() / 1e6:.1f} MB of weights read per token")


__all__ = ["ARCHITECTURES", "ModelSpec", "build_spec", "support_line"]
