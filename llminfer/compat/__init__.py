"""llama-cpp-python's surface over llminfer.generation: Llama (llama), its
caches, chat handlers, grammar and prompt-lookup draft classes. The old
module names (llminfer.llama_chat_format and the rest, as llama_cpp names
them) keep working: llminfer/_moved.py."""
