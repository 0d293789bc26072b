"""A loaded model and its memory: the Engine (a model's weights in the C
context, batched decode of many sequences), the paged KV cache and the
recurrent-state pool (kv_cache), saving and loading a sequence (state) and
LoRA adapters (lora). Stands on core, hub, text, models and vision's
descriptions; knows nothing of sampling or of any API."""
