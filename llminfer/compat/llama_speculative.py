"""llama-cpp-python's `llama_cpp.llama_speculative` names, for code ported to
`llminfer.Llama`:

    from llminfer import Llama
    from llminfer.compat.llama_speculative import LlamaPromptLookupDecoding

    llm = Llama(model_path="model.gguf", draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

The drafting itself is llminfer's own n-gram prompt lookup
(llminfer.generation.speculative, spec="ngram"); this class only carries its settings.
Greedy output is unchanged by it, as with every llminfer speculation.
"""

from __future__ import annotations

from llminfer.errors import InvalidArgumentError


class LlamaPromptLookupDecoding:
    """Prompt lookup decoding: drafts up to num_pred_tokens tokens that
    followed an earlier occurrence of the last 1..max_ngram_size tokens."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        for name, v in (("max_ngram_size", max_ngram_size), ("num_pred_tokens", num_pred_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens

    def spec_config(self):
        """The llminfer SpecConfig these settings map to (llminfer drafts at
        most 32 tokens a pass and looks at n-grams of at most NGRAM_MAX)."""
        from llminfer.generation.speculative import NGRAM_MAX, SpecConfig

        return SpecConfig(mode="ngram", draft_max=min(self.num_pred_tokens, 32),
                          ngram_max=min(self.max_ngram_size, NGRAM_MAX))
