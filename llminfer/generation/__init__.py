"""Tokens from logits, and the library's front: the one per-sequence
generation core (generator), sampling, speculative decoding, the LLM class
and its completions, embeddings, reranking and perplexity, and the one
place OpenAI-shaped results are built (openai_shapes). Stands on runtime."""
