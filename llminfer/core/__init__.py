"""The floor every other one stands on: the compiled core's Python face
(ops: the kernels on numpy arrays), the machine it runs on (system, gpu),
the GGUF format (ggml: its types; gguf_file: reading a file; quantize_model:
writing one) and the non-finite probe (numerics). Imports nothing of
llminfer but errors and _core."""
