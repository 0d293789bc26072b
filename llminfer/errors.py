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


class ImageError(LLMInferError, ValueError):
    """An image that cannot be used: bytes that are no image, a format not
    read (SVG, say), a truncated file, or one too large (a decompression
    bomb). The message says which."""


class TokenizerError(LLMInferError, ValueError):
    """A vocabulary we cannot build a tokenizer from, or text we cannot encode."""


class ChatTemplateError(LLMInferError, ValueError):
    """A chat template that fails to render."""


class GrammarError(InvalidArgumentError):
    """A grammar, JSON schema or response_format that llguidance cannot use,
    or a constrained generation the grammar cannot continue."""


class ModelNotFoundError(LLMInferError, FileNotFoundError):
    """A model path that does not exist, or a model name we do not know."""


class NumericalError(LLMInferError, ArithmeticError):
    """The model's computation went wrong: NaN or infinite logits, or logits
    all equal (nothing to choose between). The fault of the model file or of
    the numerics, not of the caller's arguments; `llminfer info --check`
    scans a file's weights for non-finite values."""


class VocabularyMismatchError(LLMInferError, ValueError):
    """Two models that must share a vocabulary (a draft model and its
    target, for speculative decoding) do not."""


class OutOfMemoryError(LLMInferError, MemoryError):
    """An allocation failed, or would need more memory than the machine has
    available (a KV cache for a huge n_ctx, say)."""


class GPUUnavailableError(LLMInferError, RuntimeError):
    """n_gpu_layers asked for a GPU that cannot be used: llminfer was built
    without a GPU backend, the driver is missing or too old, or no device is
    present. The message says which."""


class HubUnreachableError(LLMInferError, ConnectionError):
    """The Hugging Face Hub (or $HF_ENDPOINT) cannot be reached and the file
    asked for is not in the local cache. The message says what to do."""


class DeviceError(LLMInferError, RuntimeError):
    """The GPU backend failed while loading or running a model: out of device
    memory, a tensor type it does not run, a kernel that failed."""


class LoRAAdapterError(LLMInferError, ValueError):
    """A LoRA adapter file that cannot be applied to this model: not a GGUF
    LoRA adapter (general.type "adapter", adapter.type "lora"), made for
    another architecture, a tensor naming no weight of the model or one
    llminfer does not adapt, a lora_a without its lora_b (or the reverse),
    or shapes that do not fit the weight. The message names the tensor."""


_BY_STATUS = {
    -1: InvalidArgumentError,
    -2: UnsupportedTypeError,
    -3: ShapeError,
    -4: OutOfMemoryError,
    -5: UnsupportedISAError,
    -6: ContextFullError,
    -7: TokenError,
    -8: InvalidArgumentError,
    -9: DeviceError,
}


def from_status(status, name, what):
    """The exception for a C status code (csrc/llminfer.h)."""
    cls = _BY_STATUS.get(status, LLMInferError)
    return cls(f"{what}: {name}")
