"""The OpenAPI 3.1 document of `llminfer serve` (/openapi.json): one entry
per route the app has, its summary, description, request body and answers.
Written here rather than from endpoint docstrings (Starlette's
SchemaGenerator reads YAML from them): the endpoints are closures over their
server, and the wire formats are OpenAI's, Anthropic's and Ollama's, described loosely
(the fields llminfer reads), not re-specified.

document(routes) describes exactly the routes given: a route without an
entry below still appears, summarised as undocumented, and the tests keep
that list empty."""

from __future__ import annotations

import re

from llminfer import __version__

_OBJ = {"type": "object"}
_MESSAGES = {"type": "array", "items": {"type": "object", "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _OBJ}, {"type": "null"}]},
    "tool_calls": {"type": "array", "items": _OBJ}, "tool_call_id": {"type": "string"}},
    "required": ["role"]}}
_SAMPLING = {
    "model": {"type": "string", "description": "the model's id (with one model loaded, any name is served by it)"},
    "max_tokens": {"type": "integer", "minimum": 1}, "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number"}, "top_k": {"type": "integer"}, "min_p": {"type": "number"},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "seed": {"type": "integer"}, "n": {"type": "integer", "minimum": 1},
    "presence_penalty": {"type": "number"}, "frequency_penalty": {"type": "number"},
    "repeat_penalty": {"type": "number"}, "logit_bias": _OBJ, "ignore_eos": {"type": "boolean"},
    "stream": {"type": "boolean", "description": "answer as server-sent events"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "response_format": _OBJ, "json_schema": _OBJ, "grammar": {"type": "string"},
    "lora": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                         "scale": {"type": "number"}}},
             "description": "llama-server's per-request LoRA scales; adapters left out are off"},
}
_OLLAMA_OPTIONS = {"type": "object", "properties": {
    k: {"type": "integer" if k in ("top_k", "seed", "num_predict") else "number"}
    for k in ("temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "repeat_penalty", "presence_penalty",
              "frequency_penalty")} | {"stop": {"type": "array", "items": {"type": "string"}}}}
_ERRORS = {"400": "a bad request (OpenAI's error shape: {error: {message, type, param, code}})",
           "401": "the API key is missing or wrong", "404": "an unknown model (with many models)",
           "503": "the engine is not running, or (with many models) no room to load the model: see Retry-After"}


def _body(props: dict, required=()) -> dict:
    schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(summary, description, body=None, ok="the answer", errors=True, produces="application/json") -> dict:
    op = {"summary": summary, "description": description,
          "responses": {"200": {"description": ok, "content": {produces: {}}}}}
    if body is not None:
        op["requestBody"] = body
        op["responses"].update({k: {"description": v} for k, v in _ERRORS.items()} if errors else {})
    return op


OPERATIONS = {
    ("/v1/chat/completions", "post"): _op(
        "Chat completion (OpenAI)",
        "Messages rendered by the model's chat template; tools and tool_choice; logprobs and top_logprobs; "
        "streamed as server-sent `chat.completion.chunk` events with `stream: true`.",
        _body({**_SAMPLING, "messages": _MESSAGES, "tools": {"type": "array", "items": _OBJ},
               "tool_choice": {"anyOf": [{"type": "string"}, _OBJ]}, "logprobs": {"type": "boolean"},
               "top_logprobs": {"type": "integer"}, "max_completion_tokens": {"type": "integer"}}, ["messages"]),
        "a chat.completion, or text/event-stream chunks ending in [DONE]"),
    ("/v1/completions", "post"): _op(
        "Text completion (OpenAI)",
        "A prompt (text, token ids, or a list of either) continued; suffix for fill-in-the-middle; echo and "
        "logprobs for scoring.",
        _body({**_SAMPLING, "prompt": {"anyOf": [{"type": "string"}, {"type": "array"}]},
               "suffix": {"type": "string"}, "echo": {"type": "boolean"}, "logprobs": {"type": "integer"}},
              ["prompt"]),
        "a text_completion, or text/event-stream chunks ending in [DONE]"),
    ("/v1/embeddings", "post"): _op(
        "Embeddings (OpenAI)", "Pooled, L2-normalised hidden states of each input, as float or base64.",
        _body({"model": {"type": "string"}, "input": {"anyOf": [{"type": "string"}, {"type": "array"}]},
               "encoding_format": {"type": "string", "enum": ["float", "base64"]},
               "dimensions": {"type": "integer"}}, ["input"]),
        "a list of embedding objects"),
    **{(path, "post"): _op(
        "Rerank documents (llama-server, Jina, Cohere)" + ("" if path == "/v1/rerank" else " (an alias)"),
        "A relevance score per document for the query, from a reranker GGUF (pooling_type rank); results "
        "best first, top_n of them, with return_documents each document's text. With `texts` in place of "
        "`documents`, TEI's shape: a list of {index, score}.",
        _body({"model": {"type": "string"}, "query": {"type": "string"},
               "documents": {"type": "array", "items": {"anyOf": [{"type": "string"}, _OBJ]}},
               "texts": {"type": "array", "items": {"type": "string"}},
               "top_n": {"type": "integer"}, "return_documents": {"type": "boolean"}}, ["query"]),
        "{model, object, results: [{index, relevance_score, document?}], usage}")
       for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")},
    ("/v1/models", "get"): _op(
        "The models served", "OpenAI's model list; with many models (--models-dir, --models-config) each "
        "with status.value: unloaded, loading, loaded or unloading."),
    ("/v1/models/{name}", "get"): _op("One model", "The model by its id (or the name or path it was served "
                                                   "from); 404 for another."),
    ("/tokenize", "post"): _op(
        "Token ids of a text or chat", "llama-server's and vLLM's tokenize: a prompt, or messages rendered by "
        "the chat template.",
        _body({"model": {"type": "string"}, "prompt": {"type": "string"}, "messages": _MESSAGES,
               "add_special_tokens": {"type": "boolean"}}), "{tokens, count, max_model_len}"),
    ("/detokenize", "post"): _op("Text of token ids", "The text the ids decode to.",
                                 _body({"model": {"type": "string"}, "tokens": {"type": "array",
                                                                               "items": {"type": "integer"}}},
                                       ["tokens"]), "{prompt}"),
    ("/v1/messages", "post"): _op(
        "Messages (Anthropic)",
        "Anthropic's Messages API over the same chat path: system, multi-turn, tools / tool_use / tool_result, "
        "thinking blocks, image blocks (base64; with --mmproj), stop_sequences; streamed as message_start ... message_stop events. Errors in "
        "Anthropic's shape; the key as x-api-key or a bearer token.",
        _body({"model": {"type": "string"}, "max_tokens": {"type": "integer"}, "messages": _MESSAGES,
               "system": {"anyOf": [{"type": "string"}, {"type": "array"}]}, "stream": {"type": "boolean"},
               "stop_sequences": {"type": "array", "items": {"type": "string"}},
               "temperature": {"type": "number"}, "top_p": {"type": "number"}, "top_k": {"type": "integer"},
               "tools": {"type": "array", "items": _OBJ}, "tool_choice": _OBJ, "thinking": _OBJ},
              ["model", "max_tokens", "messages"]),
        "a message object, or text/event-stream events"),
    ("/v1/messages/count_tokens", "post"): _op(
        "Count a Messages request's tokens (Anthropic)", "The prompt's tokens as the chat template renders it.",
        _body({"model": {"type": "string"}, "messages": _MESSAGES, "system": {}, "tools": {"type": "array"}},
              ["messages"]), "{input_tokens}"),
    ("/v1/responses", "post"): _op(
        "Responses (OpenAI, stateless)",
        "OpenAI's Responses API: input as text or items, instructions, function tools and their outputs, "
        "reasoning items, text.format json_schema; streamed as response.* events. previous_response_id is "
        "refused: nothing is stored.",
        _body({"model": {"type": "string"}, "input": {"anyOf": [{"type": "string"}, {"type": "array"}]},
               "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer"},
               "temperature": {"type": "number"}, "top_p": {"type": "number"}, "stream": {"type": "boolean"},
               "tools": {"type": "array", "items": _OBJ}, "tool_choice": {}, "text": _OBJ},
              ["input"]), "a response object, or text/event-stream events"),
    ("/api/chat", "post"): _op(
        "Chat (Ollama)",
        "Ollama's chat over the same chat path: messages with base64 `images` (with --mmproj), tools, `options` "
        "(temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty, presence_penalty, "
        "frequency_penalty), `format` json or a JSON schema, `think`; newline-delimited JSON unless "
        "`stream: false`. Errors as {error}.",
        _body({"model": {"type": "string"}, "messages": _MESSAGES, "stream": {"type": "boolean"},
               "options": _OLLAMA_OPTIONS, "format": {"anyOf": [{"type": "string"}, _OBJ]},
               "think": {"anyOf": [{"type": "boolean"}, {"type": "string"}]},
               "tools": {"type": "array", "items": _OBJ}}, ["model"]),
        "a chat response, or application/x-ndjson lines, the last with done: true"),
    ("/api/generate", "post"): _op(
        "Generate (Ollama)",
        "A prompt (with system and base64 `images`) rendered by the chat template, or with `raw: true` as it "
        "is; `suffix` for fill-in-the-middle; options, format and think as /api/chat; no prompt: the model's "
        "load answer (done_reason load).",
        _body({"model": {"type": "string"}, "prompt": {"type": "string"}, "system": {"type": "string"},
               "images": {"type": "array", "items": {"type": "string"}}, "raw": {"type": "boolean"},
               "suffix": {"type": "string"}, "stream": {"type": "boolean"}, "options": _OLLAMA_OPTIONS,
               "format": {"anyOf": [{"type": "string"}, _OBJ]}}, ["model"]),
        "a generate response, or application/x-ndjson lines, the last with done: true"),
    ("/api/show", "post"): _op(
        "Show a model (Ollama)", "The model's details, metadata (model_info), chat template and capabilities.",
        _body({"model": {"type": "string"}}, ["model"]),
        "{details, model_info, template, capabilities, modified_at, modelfile, parameters}"),
    ("/api/tags", "get"): _op("The models (Ollama)", "Every model served: name, size, details."),
    ("/api/ps", "get"): _op("The loaded models (Ollama)", "The models loaded now, with their context length."),
    ("/api/version", "get"): _op("The server's version (Ollama)", "{version}: llminfer's."),
    ("/lora-adapters", "get"): _op(
        "LoRA adapters (llama-server)", "The adapters loaded with --lora: [{id, path, scale}], scale the global "
        "one a request without its own \"lora\" list runs with."),
    ("/lora-adapters", "post"): _op(
        "Set the LoRA scales (llama-server)", "An array of {id, scale}: the global scales from now on (adapters "
        "left out: 0, off). A request's own \"lora\" list in chat/completions bodies replaces them for it.",
        {"required": True, "content": {"application/json": {"schema": {"type": "array", "items": {
            "type": "object", "properties": {"id": {"type": "integer"}, "scale": {"type": "number"}},
            "required": ["id"]}}}}}, "{success: true}"),
    ("/health", "get"): _op("Liveness", "200 {status: ok} while the engine runs, else 503; no API key needed."),
    ("/metrics", "get"): _op("Prometheus metrics", "vLLM's metric names under the llminfer: prefix, each "
                                                   "labelled model_name; no API key needed.",
                             produces="text/plain"),
    ("/", "get"): _op("The chat page", "A page to chat with the served models: streaming, a model picker, "
                                       "a system prompt, a stop button.", produces="text/html"),
    ("/docs", "get"): _op("This API's documentation", "The operations below, read from /openapi.json.",
                          produces="text/html"),
    ("/static/{name}", "get"): _op("The pages' scripts and styles", "The chat page's and /docs' files.",
                                   produces="text/javascript"),
    ("/openapi.json", "get"): _op("This document", "OpenAPI 3.1 over every route the server has."),
}


def _path(route_path: str) -> str:
    """A Starlette path as OpenAPI writes it: {name:path} -> {name}."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route_path)


def document(routes) -> dict:
    paths: dict = {}
    for r in routes:
        methods = sorted(m.lower() for m in (getattr(r, "methods", None) or ()) if m != "HEAD")
        for m in methods:
            p = _path(r.path)
            op = OPERATIONS.get((p, m)) or _op("(undocumented)", "")
            slug = re.sub(r"[^A-Za-z0-9]+", "_", p).strip("_")
            op = {**op, "operationId": f"{m}_{slug or 'root'}"}
            params = re.findall(r"\{(\w+)\}", p)
            if params:
                op["parameters"] = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                                    for n in params]
            paths.setdefault(p, {})[m] = op
    return {"openapi": "3.1.0",
            "info": {"title": "llminfer serve", "version": __version__,
                     "description": "OpenAI's, Anthropic's, Ollama's and the Responses API over continuous "
                                    "batching."},
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{}, {"bearer": []}],
            "paths": paths}
