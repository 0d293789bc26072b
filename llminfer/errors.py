"""Exceptions raised by llminfer. Callers key on the class, never the message.

Everything derives from LLMInferError. Errors about what the caller passed
(bad shapes, unknown types, invalid parameters, malformed files) are also
ValueErrors, so code that already catches ValueError keeps working.
"""


class LLMInferError(Exception):
    """Base class of every llminfer error."""


class InvalidArgumentError(LLMInferError, ValueError):
    """A parameter has a value the operation cannot take."""


class UnsupportedTypeError(LLMInferError, ValueError):
    """A tensor type (GGML quantization type) that this operation does not support."""


class ShapeError(LLMInferError, ValueError):
    """Sizes that do not agree: byte lengths, block multiples, matrix shapes."""


class UnsupportedISAError(LLMInferError, RuntimeError):
    """An instruction-set level that this CPU or this build cannot run."""


class ContextFullError(LLMInferError):
    """The tokens do not fit in the model's context window (n_ctx)."""


class KVCacheFullError(ContextFullError):
    """The KV cache's pool of blocks has none left for the tokens asked for."""


class TokenError(LLMInferError, ValueError):
    """A token id outside the vocabulary."""


class GGUFError(LLMInferError, ValueError):
    """A file that is not a valid GGUF model: bad magic, truncated, corrupt metadata."""


class UnsupportedModelError(LLMInferError, ValueError):
    """A GGUF file whose architecture, tensor types or tensors we cannot run."""


class TokenizerError(LLMInferError, ValueError):
    """A vocabulary we cannot build a tokenizer from, or text we cannot encode."""


class ChatTemplateError(LLMInferError, ValueError):
    """A chat template that fails to render."""


class ModelNotFoundError(LLMInferError, FileNotFoundError):
    """A model path that does not exist, or a model name we do not know."""


_BY_STATUS = {
    -1: InvalidArgumentError,
    -2: UnsupportedTypeError,
    -3: ShapeError,
    -4: MemoryError,
    -5: UnsupportedISAError,
    -6: ContextFullError,
    -7: TokenError,
    -8: InvalidArgumentError,
}


def from_status(status, name, what):
    """The exception for a C status code (csrc/llminfer.h)."""
    cls = _BY_STATUS.get(status, LLMInferError)
    return cls(f"{what}: {name}")
