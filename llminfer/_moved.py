"""The module names llminfer had before its modules went into floors
(llminfer/core, text, runtime, generation, compat, cli, hub): importing an old
name gives the module under its new one, the same object (a patch through
either name is seen through both), so code written against the flat layout,
and llama-cpp-python code with `llama_cpp` replaced by `llminfer`
(llminfer.llama_chat_format and the rest), runs unchanged."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

OLD_NAMES = {
    "system": "core.system", "gpu": "core.gpu", "ggml": "core.ggml", "gguf_file": "core.gguf_file",
    "ops": "core.ops", "numerics": "core.numerics", "quantize_model": "core.quantize_model",
    "tokenizer": "text.tokenizer", "wordpiece": "text.wordpiece", "chat": "text.chat",
    "chat_sandbox": "text.chat_sandbox", "harmony": "text.harmony", "reasoning": "text.reasoning",
    "tools": "text.tools", "structured": "text.structured", "jsonlimits": "text.jsonlimits",
    "engine": "runtime.engine", "kv_cache": "runtime.kv_cache", "state": "runtime.state", "lora": "runtime.lora",
    "sampling": "generation.sampling", "sampling_extra": "generation.sampling_extra",
    "speculative": "generation.speculative", "llm": "generation.llm", "completions": "generation.completions",
    "embeddings": "generation.embeddings", "embedder": "generation.embedder", "rerank": "generation.rerank",
    "perplexity": "generation.perplexity", "openai_shapes": "generation.openai_shapes",
    "llama_cache": "compat.llama_cache", "llama_chat_format": "compat.llama_chat_format",
    "llama_grammar": "compat.llama_grammar", "llama_speculative": "compat.llama_speculative",
    "hf": "hub.hf", "cache": "hub.cache", "chat_repl": "cli.chat_repl", "bench_cli": "cli.bench",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds llminfer.<old name> and loads it as the module of its new name."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, leaf = fullname.partition(".")
        if head != "llminfer" or leaf not in OLD_NAMES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module("llminfer." + OLD_NAMES[spec.name.partition(".")[2]])

    def exec_module(self, module):
        pass  # already run under its new name


def install():
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
