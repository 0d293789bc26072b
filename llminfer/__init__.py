"""llminfer: run GGUF language models on the CPU, fast.

    import llminfer
    llm = llminfer.LLM("smollm2-135m-instruct")          # a path or a known name
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0))
    print(llm.chat([{"role": "user", "content": "What is 2+2?"}], temperature=0))
    print(llminfer.system_info())                        # CPU features, kernel level, threads
"""

try:
    from llminfer import _core  # noqa: F401  (the compiled core; everything below needs it)
except ImportError as e:  # e.g. the source folder shadowing an installed package
    raise ImportError(
        f"llminfer's compiled core (llminfer._core) cannot be imported from {__path__[0]}: {e}. "
        "Install the package (pip install .) and run from outside the source folder, or build "
        "it in place (python setup.py build_ext --inplace).") from e

from llminfer import _moved, errors

_moved.install()  # the flat layout's module names (llminfer.engine, llminfer.llama_chat_format, ...)

from llminfer.core import ops  # noqa: E402 (after the old names are found)
from llminfer.generation.embedder import Embedder
from llminfer.runtime.engine import Engine
from llminfer.hub import pull
from llminfer.generation.llm import LLM, Completion, Timings, generate
from llminfer.compat.llama import Llama, LogitsProcessorList, StoppingCriteriaList
from llminfer.compat.llama_cache import LlamaDiskCache, LlamaRAMCache, LlamaState
from llminfer.compat.llama_grammar import LlamaGrammar
from llminfer.generation.sampling import SamplingParams
from llminfer.core.system import system_info

__version__ = "0.1.0"

__all__ = ["LLM", "Llama", "LlamaGrammar", "LlamaRAMCache", "LlamaDiskCache", "LlamaState",
           "LogitsProcessorList", "StoppingCriteriaList", "Engine", "Embedder", "Completion", "SamplingParams", "Timings", "errors", "generate", "ops",
           "pull", "system_info", "__version__"]
