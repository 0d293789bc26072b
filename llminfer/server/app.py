"""The HTTP side of `llminfer serve`: the OpenAI API over one Scheduler
(Server, the routes of openai_routes), and what the other wire formats
build on (Job, bad_request, until_disconnect); llminfer.server.asgi puts
the app together.

Endpoints: POST /v1/completions, POST /v1/chat/completions (streamed as
server-sent events with "stream": true), GET /v1/models, GET
/v1/models/{id}, POST /tokenize, POST /detokenize, GET /health, GET
/metrics (Prometheus text); Anthropic's POST /v1/messages and
/v1/messages/count_tokens (llminfer.server.anthropic), OpenAI's POST
/v1/responses (llminfer.server.responses) and Ollama's /api/chat,
/api/generate, /api/show, /api/tags, /api/ps, /api/version
(llminfer.server.ollama), all translated into the chat path
(llminfer.server.chatrun). Any model name is served by the one model
loaded.

Every request is checked here, before it reaches the engine thread: a bad
one gets OpenAI's error shape, {"error": {"message", "type", "param",
"code"}}, with 400 (bad JSON, a parameter out of range, a prompt longer than
the context), 401 (missing or wrong API key), 404 (unknown path),
413 (body too large), 429 (queue full) or 503 (engine stopped). A client that
goes away mid-request has its requests cancelled, so their KV blocks go back
at the next engine step.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llminfer import hub

from llminfer.text import jsonlimits
from llminfer.generation import openai_shapes as oai
from llminfer.generation.completions import fim_layout
from llminfer.generation.embedder import Embedder
from llminfer.generation.embeddings import declared_pooling, engine_hidden, l2_normalize, pool
from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, KVCacheFullError, LLMInferError
from llminfer.generation.generator import TokenEvent, token_logprobs
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import bert
from llminfer.text.reasoning import OPTION_NAMES, ChatOptions
from llminfer.generation.sampling import SamplingParams
from llminfer.server.args import ServeArgs
from llminfer.server.metrics import Metrics
from llminfer.server.scheduler import FinishEvent, Request, Scheduler
from llminfer.text.structured import grammar_from_args
from llminfer.text.tools import check_tools, tool_prompt

log = logging.getLogger("llminfer.server")

MAX_N = 16              # choices per request
MAX_STOPS = 16
MAX_STOP_CHARS = 1024   # per stop string: each is searched for after every token
MAX_PROMPTS = 64        # prompts x n choices in one request
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024   # entries
MAX_EMBED_INPUTS = 256  # inputs of one embeddings request
MAX_IMAGES = 8  # images of one chat request (each one is encoded while the request is read)


class APIError(Exception):
    """An error answered to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                              413: "invalid_request_error", 429: "rate_limit_error",
                              503: "service_unavailable"}.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message, param=None, code=None):
    return APIError(400, message, param, code)


# ---- reading parameters ----

def shown(v) -> str:
    """A value as a message quotes it: JSON, cut short (a 400-digit number too)."""
    try:
        text = json.dumps(v)
    except ValueError:  # an integer past str()'s digit limit
        return "a very long integer"
    return text if len(text) <= 60 else text[:57] + "..."


def _int(body, name, default, lo=None, hi=None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise bad_request(f"{name} must be an integer, got {shown(v)}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad_request(f"{name} must be between {lo} and {hi}, got {shown(v)}", name)
    return v


def _float(body, name, default, lo=None, hi=None, lo_open=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise bad_request(f"{name} must be a number, got {shown(v)}", name)
    try:
        f = float(v)  # an integer of 400 digits has no float: OverflowError
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise bad_request(f"{name} must be a finite number, got {shown(v)}", name)
    if (lo is not None and (f < lo or (lo_open and f == lo))) or (hi is not None and f > hi):
        raise bad_request(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {shown(v)}", name)
    return f


def _bool(body, name, default):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"{name} must be true or false, got {shown(v)}", name)
    return v


def _stops(body) -> list:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if len(v) > MAX_STOPS:
        raise bad_request(f"stop takes at most {MAX_STOPS} strings, got {len(v)}", "stop")
    if any(len(x) > MAX_STOP_CHARS for x in v):
        raise bad_request(f"a stop string may have at most {MAX_STOP_CHARS} characters", "stop")
    return [s for s in v if s]


class Server:
    """The engine, its scheduler and what the endpoints share; or, for an
    encoder model (bert, nomic-bert), its Embedder alone: such a server
    answers /v1/embeddings and the tokenizer endpoints, and says so to a
    completion."""

    def __init__(self, args: ServeArgs):
        self.args = args
        self.engine = self.scheduler = self.embedder = None
        self.lora_global = None  # the LoRA scales of a request without its own (GET/POST /lora-adapters)
        self.vision = self.image_rows = None
        path = hub.resolve(args.model)
        with GGUFFile(path) as f:
            encoder = f.architecture in bert.ARCHS
        if encoder:
            self.embedder = Embedder(path, n_threads=args.n_threads, n_ctx=args.n_ctx)
            self.tokenizer = self.embedder.tokenizer
            self.n_ctx, self.n_embd = self.embedder.n_ctx, self.embedder.n_embd
            self.n_vocab = self.tokenizer.n_vocab
            model_path = self.embedder.model_path
        else:
            pool = args.kv_pool_tokens or 4 * args.n_ctx
            if pool < args.n_ctx:
                raise InvalidArgumentError(f"kv_pool_tokens={pool} is less than n_ctx={args.n_ctx}: one request "
                                           f"of the full context would never fit")
            # a hybrid model's state slots: every running request, and the side
            # requests (embeddings, tokens' logprobs) run between steps
            self.engine = Engine(path, n_ctx=args.n_ctx, kv_pool_tokens=pool, n_batch=args.max_batch_tokens,
                                 n_threads=args.n_threads, kv_type=args.kv_type, n_gpu_layers=args.n_gpu_layers,
                                 n_seq_max=args.max_running + 8)
            if args.lora:
                try:
                    scales = {self.engine.add_lora(path): scale for path, scale in args.lora}
                except BaseException:
                    self.engine.close()
                    raise
                self.lora_global = self.engine.lora_scales(scales)
            self.tokenizer = self.engine.tokenizer
            self.n_ctx = self.engine.n_ctx
            self.n_embd = self.engine.spec.n_embd
            self.n_vocab = self.engine.n_vocab
            model_path = self.engine.model_path
            if args.mmproj:
                from llminfer.vision.mmproj import load_for_model
                from llminfer.vision.prompt import ImageRows

                try:
                    self.vision = load_for_model(args.mmproj, self.engine.spec.n_embd_inp, model_path, args.n_threads)
                except BaseException:
                    self.engine.close()
                    raise
                self.image_rows = ImageRows(self.vision, 16, args.n_threads)
        self.max_tokens_limit = min(args.max_tokens_limit or self.n_ctx, self.n_ctx)
        given = str(args.model)
        stem = Path(model_path).name
        stem = stem[:-5] if stem.endswith(".gguf") else stem
        self.model_name = args.served_model_name or (stem if ("/" in given or given.endswith(".gguf")) else given)
        self.model_aliases = {self.model_name, given, stem, str(model_path), Path(model_path).name}
        self.created = int(time.time())
        self._chat_format = None
        if encoder:
            self.metrics = Metrics(self.model_name)
        else:
            self.metrics = Metrics(self.model_name, gauges=lambda: self.scheduler.stats)
            self.scheduler = Scheduler(self.engine, self._deliver, max_batch_tokens=args.max_batch_tokens,
                                       max_running=args.max_running, max_waiting=args.max_waiting,
                                       prefix_caching=args.prefix_caching, metrics=self.metrics)
        self.loop = None

    # ---- lifetime ----

    def start(self):
        self.loop = asyncio.get_running_loop()
        if self.scheduler is not None:
            self.scheduler.start()

    def stop(self):
        if self.scheduler is not None:
            self.scheduler.stop()
            self.engine.close()
            if self.vision is not None:
                self.vision.close()
        else:
            self.embedder.close()

    @property
    def alive(self) -> bool:
        return self.scheduler.alive if self.scheduler is not None else self.embedder is not None

    def check_generates(self):
        """A completion asked of an encoder model: 400 saying what it serves."""
        if self.engine is None:
            raise bad_request(f"{self.model_name} is an embedding model (an encoder): this server answers "
                              f"/v1/embeddings{', /v1/rerank' if self.embedder.is_reranker else ''}, /tokenize and "
                              f"/detokenize", "model", "model_not_generative")

    def _deliver(self, events):
        """From the engine thread: hand a step's events to the event loop in one call."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_dispatch, events)
        except RuntimeError:
            pass  # the loop is shutting down: nobody is listening

    @property
    def chat_format(self):
        self.check_generates()
        if self._chat_format is None:
            from llminfer.text.chat import chat_format_for

            self._chat_format = chat_format_for(self.engine.gguf.metadata, chat_format=self.args.chat_format,
                                                chat_template=self.args.chat_template)
        return self._chat_format

    # ---- requests ----

    def check_auth(self, request: HTTPRequest):
        key = self.args.api_key
        if not key:
            return
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "a valid API key is needed: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    async def read_json(self, request: HTTPRequest, array: bool = False) -> dict:
        """The request's JSON body: an object (array=True: an array, as llama-server's POST /lora-adapters)."""
        limit = self.args.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise APIError(413, f"the request body is {length} bytes, more than the {limit} this server takes")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise APIError(413, f"the request body is more than the {limit} bytes this server takes")
        try:
            body = jsonlimits.loads(bytes(data), "the request body")
        except InvalidArgumentError as e:
            raise bad_request(str(e)) from None
        if array:
            if not isinstance(body, list):
                raise bad_request("the request body must be a JSON array")
        elif not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        return body

    def request_lora(self, value):
        """A request's "lora" (llama-server's [{id, scale}]; adapters it
        leaves out are off) as the scales its sequence runs with; absent or
        empty: the server's global scales."""
        if value is None or value == []:
            return self.lora_global
        scales = _lora_list(value)
        if self.engine is None or not self.engine.loras:
            raise bad_request("this server has no LoRA adapters (llminfer serve --lora FILE)", "lora")
        try:
            return self.engine.lora_scales(scales)
        except InvalidArgumentError as e:
            raise bad_request(str(e), "lora") from None

    def check_model(self, body):
        """A request's model: any name is served by the one model loaded (as
        llama-server and llama-cpp-python's server do: clients name their
        own), and answers give the loaded model's name."""
        m = body.get("model")
        if m is not None and not isinstance(m, str):
            raise bad_request("model must be a string", "model")

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "llminfer",
                "max_model_len": self.n_ctx}

    def check_ids(self, ids, param) -> list:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad_request(f"{param} must hold integer token ids", param)
        for t in ids:
            if not 0 <= t < self.n_vocab:
                raise bad_request(f"token id {shown(t)} is outside the vocabulary [0, {self.n_vocab})", param)
        return list(ids)

    def sampling(self, body, chat: bool):
        """(SamplingParams, max_tokens or None, n, stops, ignore_eos, logprobs,
        grammar, echo). With echo (completions), max_tokens may be 0: the
        prompt's own log-probabilities alone, as evaluation harnesses ask."""
        echo = _bool(body, "echo", False)
        if echo and chat:
            raise bad_request("echo is for completions, not chat completions", "echo")
        if echo and body.get("suffix"):
            raise bad_request("echo cannot be combined with suffix", "echo")
        _int(body, "best_of", 1, 1, 1)  # only 1 is supported
        grammar = self.grammar(body)
        name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = _int(body, name, None if chat else 16, 0 if echo else 1, self.max_tokens_limit)
        bias = body.get("logit_bias")
        if bias is not None:
            if not isinstance(bias, dict):
                raise bad_request("logit_bias must map token ids to numbers", "logit_bias")
            if len(bias) > MAX_LOGIT_BIAS:
                raise bad_request(f"logit_bias takes at most {MAX_LOGIT_BIAS} entries", "logit_bias")
            parsed = {}
            for k, v in bias.items():
                try:
                    t = int(k)
                except ValueError:
                    raise bad_request(f"logit_bias key {k[:40]!r} is not a token id", "logit_bias") from None
                if not 0 <= t < self.n_vocab:
                    raise bad_request(f"logit_bias names token {shown(t)}, outside the vocabulary "
                               f"[0, {self.n_vocab})", "logit_bias")
                parsed[t] = _float(bias, k, 0.0, -100.0, 100.0)
            bias = parsed or None
        seed = _int(body, "seed", None, -(1 << 63), (1 << 64) - 1)
        if seed is not None:
            seed &= (1 << 63) - 1  # OpenAI takes any integer; the sampler a non-negative one
        params = SamplingParams(
            temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=_int(body, "top_k", 0, -1, self.n_vocab),
            min_p=_float(body, "min_p", 0.0, 0.0, 1.0),
            repeat_penalty=_float(body, "repeat_penalty", 1.0, 0.0, 10.0, lo_open=True),
            presence_penalty=_float(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_float(body, "frequency_penalty", 0.0, -2.0, 2.0),
            logit_bias=bias, seed=seed)
        n = _int(body, "n", 1, 1, MAX_N)
        if chat:
            logprobs = None
            if _bool(body, "logprobs", False):
                logprobs = _int(body, "top_logprobs", 0, 0, MAX_LOGPROBS)
            elif body.get("top_logprobs"):
                raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        else:
            logprobs = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
        return params, max_tokens, n, _stops(body), _bool(body, "ignore_eos", False), logprobs, grammar, echo

    @staticmethod
    def grammar(body):
        """The Grammar a request's output must follow, or None: OpenAI's
        response_format (json_object, json_schema), or llama-server's
        `json_schema` and `grammar` (GBNF or Lark) fields; at most one."""
        given = {k: body.get(k) for k in ("response_format", "json_schema", "grammar") if body.get(k) is not None}
        if not given:
            return None
        param = next(iter(given))
        try:
            return grammar_from_args(**given)
        except LLMInferError as e:  # GrammarError, InvalidArgumentError: the request's to mend
            raise bad_request(str(e), param) from None

    def prompt_ids(self, body) -> list:
        """Completions' prompt: a string, a list of ids, or a list of either
        (several prompts); with a suffix, one string laid out for
        fill-in-the-middle."""
        p = body.get("prompt")
        suffix = body.get("suffix")
        if suffix is not None and suffix != "":
            if not isinstance(suffix, str):
                raise bad_request("suffix must be a string", "suffix")
            if not isinstance(p, str):
                raise bad_request("with a suffix, the prompt must be one string", "prompt")
            try:
                return [fim_layout(self.engine.gguf.metadata, self.tokenizer, self.n_vocab, self.model_name, p,
                                   suffix)]
            except LLMInferError as e:
                raise bad_request(str(e), "suffix") from None
        if isinstance(p, list) and p and not isinstance(p[0], int) and len(p) > MAX_PROMPTS:
            raise bad_request(f"at most {MAX_PROMPTS} prompts in one request, got {len(p)}", "prompt")
        if isinstance(p, str):
            return [self.tokenize(p)]
        if isinstance(p, list) and p:
            if all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                return [self.check_ids(p, "prompt")]
            if all(isinstance(x, str) for x in p):
                return [self.tokenize(x) for x in p]
            if all(isinstance(x, list) and x for x in p):
                return [self.check_ids(x, "prompt") for x in p]
        raise bad_request("prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")

    def tokenize(self, text: str, add_special: bool = True) -> list:
        try:
            return self.tokenizer.encode(text, add_bos=add_special, special=True)
        except LLMInferError as e:
            raise bad_request(f"cannot tokenize the prompt: {e}", "prompt") from None

    def chat_options(self, body) -> ChatOptions:
        """A chat request's chat_template_kwargs, enable_thinking,
        reasoning_format, reasoning_budget and reasoning_effort (the server's
        own by default)."""
        given = {"reasoning_format": self.args.reasoning_format, "reasoning_budget": self.args.reasoning_budget}
        for k in OPTION_NAMES:
            if body.get(k) is not None:
                given[k] = body[k]
        try:
            return ChatOptions.make(**given)
        except InvalidArgumentError as e:
            raise bad_request(str(e), next((k for k in given if k in str(e)), None)) from None

    def chat_ids(self, body) -> tuple[list, list, object, object]:
        """(prompt ids, the chat format's stop texts, its _Tools or None, the
        reply's llminfer.text.reasoning.Reasoning or None) of a chat request's
        messages (and tools)."""
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad_request("messages must be a non-empty list", "messages")
        plain, images = [], []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a role", "messages")
            content = m.get("content")
            if content is None:
                content = ""
            elif isinstance(content, list):
                parts = []
                for j, part in enumerate(content):
                    if isinstance(part, dict) and part.get("type") == "image_url":
                        parts.append(self.image_part(part, f"messages[{i}].content[{j}]", images))
                        continue
                    ok = isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    if not ok:
                        raise bad_request(f"messages[{i}].content: only text and image_url parts are supported",
                                          "messages")
                    parts.append(part["text"])
                content = "".join(parts)
            elif not isinstance(content, str):
                raise bad_request(f"messages[{i}].content must be a string or a list of text parts", "messages")
            role = "system" if m["role"] == "developer" else m["role"]
            msg = {"role": role, "content": content}
            # a tool exchange: the assistant's calls, and the tool's answer to one
            if m.get("tool_calls") is not None:
                if not isinstance(m["tool_calls"], list) or not all(
                        isinstance(c, dict) and isinstance(c.get("function"), dict) for c in m["tool_calls"]):
                    raise bad_request(f"messages[{i}].tool_calls must be a list of {{'function': {{...}}}}", "messages")
                msg["tool_calls"] = m["tool_calls"]
            for key in ("tool_call_id", "name"):
                if isinstance(m.get(key), str):
                    msg[key] = m[key]
            plain.append(msg)
        try:  # no tools: ([], "none"), and the messages render as the library renders them
            funcs, choice = check_tools(body.get("tools"), body.get("tool_choice"))
        except InvalidArgumentError as e:
            raise bad_request(str(e), "tool_choice" if "tool_choice" in str(e) else "tools") from None
        options = self.chat_options(body)
        try:
            fmt = self.chat_format
            text, offered, parse_fmt, grammar = tool_prompt(fmt, self.engine.gguf.metadata, self.tokenizer, plain,
                                                            funcs, choice, options.template_kwargs)
        except LLMInferError as e:
            raise bad_request(f"the chat template cannot render these messages: {e}", "messages") from None
        tools = _Tools(offered, parse_fmt, grammar, choice) if offered else None  # tool_choice "none": plain
        reasoning = options.reasoning(text, fmt.template, self.tokenizer)
        if images:
            return self.image_ids(text, images, fmt), list(fmt.stop_texts), tools, reasoning
        return self.tokenize(text, add_special=not fmt.adds_bos), list(fmt.stop_texts), tools, reasoning

    def image_part(self, part, where, images) -> str:
        """An image_url part: its bytes (data: URLs only) appended to images,
        the marker the chat template renders in its place returned."""
        from llminfer.vision.prompt import MARKER, image_source

        if self.vision is None:
            raise bad_request(f"{where}: this model takes no images (the server was started without --mmproj)",
                       "messages")
        if len(images) >= MAX_IMAGES:
            raise bad_request(f"at most {MAX_IMAGES} images in one request", "messages")
        try:
            images.append(image_source(part, where, allow_files=False))
        except LLMInferError as e:
            raise bad_request(str(e), "messages") from None
        return MARKER

    def image_ids(self, text, images, fmt):
        """The PromptIds of a rendered chat with images (llminfer.vision.prompt)."""
        from llminfer.vision.prompt import lay_out

        try:
            ids = lay_out(text, images, self.vision, lambda t, bos: self.tokenize(t, add_special=bos),
                          self.image_rows, not fmt.adds_bos)
        except LLMInferError as e:
            raise bad_request(f"an image cannot be used: {e}", "messages") from None
        big = [len(s.rows) for s in ids.images if len(s.rows) > self.args.max_batch_tokens]
        if big and self.vision.non_causal:
            raise bad_request(f"an image of {big[0]} positions runs in one pass, and --max-batch-tokens is "
                       f"{self.args.max_batch_tokens}", "messages")
        return ids

    def embed_ids(self, body) -> list:
        """The token ids of an embeddings request's input: a string, a list of
        token ids, or a list of either (at most MAX_EMBED_INPUTS)."""
        x = body.get("input")
        if isinstance(x, str) or (isinstance(x, list) and x and all(isinstance(t, int) for t in x)):
            x = [x]
        if not isinstance(x, list) or not x:
            raise bad_request("input must be a string, a list of token ids, or a non-empty list of either", "input")
        if len(x) > MAX_EMBED_INPUTS:
            raise bad_request(f"at most {MAX_EMBED_INPUTS} inputs in one request, got {len(x)}", "input")
        out = []
        for item in x:
            if isinstance(item, str):
                try:
                    ids = self.tokenizer.encode(item, add_bos=True, special=False)
                except LLMInferError as e:
                    raise bad_request(f"cannot tokenize the input: {e}", "input") from None
            elif isinstance(item, list) and not any(isinstance(t, bool) for t in item):
                ids = self.check_ids(item, "input")
            else:
                raise bad_request("input must be a string, a list of token ids, or a non-empty list of either", "input")
            if not ids:
                raise bad_request("an empty input has no embedding", "input")
            if len(ids) > self.n_ctx:
                raise bad_request(f"an input has {len(ids)} tokens; this model's context is {self.n_ctx}", "input",
                           "context_length_exceeded")
            out.append(ids)
        return out

    @property
    def pooling(self) -> str:
        """How the model's GGUF says to pool token vectors (mean when it says nothing)."""
        if self.embedder is not None:
            return self.embedder.pooling
        return declared_pooling(self.engine.gguf.metadata, self.engine.gguf.architecture)

    def check_length(self, ids, max_tokens) -> int:
        if not ids:
            raise bad_request("the prompt is empty", "prompt")
        if max_tokens == 0:  # echo alone: the prompt may fill the context
            if len(ids) > self.n_ctx:
                raise bad_request(f"the prompt has {len(ids)} tokens; this model's context is {self.n_ctx} tokens",
                           "prompt", "context_length_exceeded")
            return 0
        room = self.n_ctx - len(ids)
        if room < 1:
            raise bad_request(f"the prompt has {len(ids)} tokens; this model's context is {self.n_ctx} tokens, "
                       f"and at least one must be left to generate", "prompt", "context_length_exceeded")
        if max_tokens is None:
            return min(room, self.max_tokens_limit)
        if max_tokens > room:
            raise bad_request(f"the prompt has {len(ids)} tokens and max_tokens is {max_tokens}: more than this "
                       f"model's context of {self.n_ctx} tokens", "max_tokens", "context_length_exceeded")
        return max_tokens


class _Tools:
    """A chat request's tools: the functions offered, the reply's format, the
    grammar of a required call (or None) and tool_choice. A reply is parsed
    with its special tokens written out, as the library's tools._parse reads
    it (tokenizer.decode(..., skip_special=False))."""

    def __init__(self, offered, fmt, grammar, choice):
        self.offered, self.fmt, self.grammar, self.choice = offered, fmt, grammar, choice


def _dispatch(events):
    for req, ev in events:
        q = req.out
        if q is not None:
            q.put_nowait((req, ev))


# ---- generation ----

class Job:
    """The engine requests of one HTTP request (prompts x n choices) and the
    queue their events arrive on."""

    def __init__(self, server: Server, prompts, params, max_tokens, n, stops, ignore_eos, logprobs, grammar=None,
                 reasoning=None, lora="global"):
        """lora: the LoRA scales the requests run with (Server.request_lora), or
        "global": the server's current ones."""
        self.server = server
        lora = server.lora_global if isinstance(lora, str) else lora
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reqs = []
        for i, ids in enumerate(prompts):
            for j in range(n):
                p = params if params.seed is None or j == 0 else params.replace(seed=params.seed + j)
                r = Request(ids, p, max_tokens[i], stops=stops, ignore_eos=ignore_eos, logprobs=logprobs,
                            grammar=grammar, reasoning=reasoning, out=self.queue,
                            non_causal=bool(getattr(ids, "images", ())) and server.vision.non_causal, lora=lora)
                r.index = i * n + j
                r.prompt_index = i
                r.first_of_prompt = j == 0
                self.reqs.append(r)
        self.open = len(self.reqs)
        self.finish: dict = {}
        self.tools = None  # a chat's _Tools: its replies are parsed for calls
        self.echoes = None  # with echo, each prompt's _Echo
        self.reasoning = reasoning  # a chat's with a thinking model

    def submit(self):
        sched = self.server.scheduler
        if not sched.alive:
            raise APIError(503, "the engine is not running")
        for k, r in enumerate(self.reqs):
            if not sched.submit(r):
                for q in self.reqs[:k]:
                    sched.cancel(q)
                raise APIError(429, "the server's queue is full; try again later", code="queue_full")

    def cancel(self):
        for r in self.reqs:
            if r.index not in self.finish:
                self.server.scheduler.cancel(r)

    async def events(self):
        """(request, event) pairs until every request has finished."""
        while self.open:
            req, ev = await self.queue.get()
            if isinstance(ev, FinishEvent):
                self.finish[req.index] = ev
                self.open -= 1
            yield req, ev

    def usage(self) -> dict:
        fins = [self.finish[r.index] for r in self.reqs if r.index in self.finish]
        prompt = sum(f.prompt_tokens for r, f in zip(self.reqs, fins) if r.first_of_prompt)
        cached = sum(f.cached_tokens for r, f in zip(self.reqs, fins) if r.first_of_prompt)
        completion = sum(f.completion_tokens for f in fins)
        return oai.usage(prompt, completion, cached)

    def error(self) -> APIError | None:
        for ev in self.finish.values():
            if ev.reason == "error":
                e = ev.error
                if isinstance(e, (InvalidArgumentError, ValueError)):
                    return bad_request(str(e))
                return APIError(500, f"the engine failed: {type(e).__name__}: {e}")
        return None


def _reason(ev: FinishEvent) -> str:
    return ev.reason if ev.reason in ("stop", "length") else "abort"


class _Logprobs:
    """One choice's logprobs, in the completions or the chat shape."""

    def __init__(self, server, chat: bool):
        self.server = server
        self.chat = chat
        self.tokens, self.lps, self.tops, self.offsets = [], [], [], []
        self.content = []
        self.offset = 0

    def _piece(self, t):
        return self.server.tokenizer.token_bytes(t)

    def add(self, ev: TokenEvent) -> dict:
        """Record a token; returns its part of a stream chunk."""
        b = self._piece(ev.token)
        if self.chat:
            item = oai.chat_logprob_item(b, ev.logprob, [(self._piece(t), lp) for t, lp in ev.top])
            self.content.append(item)
            return {"content": [item]}
        text = b.decode("utf-8", errors="replace")
        # an echoed first token has no logprob, and no alternatives
        top = oai.legacy_top(text, ev.logprob, [(self._piece(t).decode("utf-8", errors="replace"), lp)
                                                for t, lp in ev.top or ()])
        part = {"tokens": [text], "token_logprobs": [ev.logprob], "top_logprobs": [top],
                "text_offset": [self.offset]}
        self.tokens.append(text)
        self.lps.append(ev.logprob)
        self.tops.append(top)
        self.offsets.append(self.offset)
        self.offset += len(text)
        return part

    def result(self) -> dict:
        if self.chat:
            return {"content": self.content}
        return {"tokens": self.tokens, "token_logprobs": self.lps,
                "top_logprobs": self.tops if any(self.tops) else None, "text_offset": self.offsets}


async def _run_job(server: Server, request: HTTPRequest, body: dict, chat: bool):
    params, max_tokens, n, stops, ignore_eos, logprobs, grammar, echo = await run_in_threadpool(
        server.sampling, body, chat)
    lora = server.request_lora(body.get("lora"))
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    include_usage = bool((opts or {}).get("include_usage", False))
    tools = reasoning = None
    if chat:
        ids, chat_stops, tools, reasoning = await run_in_threadpool(server.chat_ids, body)
        prompts = [ids]
        stops = chat_stops + stops
        if tools is not None and tools.grammar is not None:
            if grammar is not None:
                raise bad_request(f"response_format, json_schema and grammar cannot be combined with "
                           f"tool_choice={tools.choice!r}", "tool_choice")
            grammar = tools.grammar
    else:
        prompts = await run_in_threadpool(server.prompt_ids, body)
    if len(prompts) * n > MAX_PROMPTS:
        raise bad_request(f"{len(prompts)} prompts x n={n} choices is more than {MAX_PROMPTS} generations", "n")
    limits = [server.check_length(p, max_tokens) for p in prompts]
    env = oai.Envelope(server.model_name, chat)
    echoes = await _echoes(server, body, prompts, logprobs, lora) if echo else None
    if max_tokens == 0:
        return _echo_only(server, env, echoes, prompts, n, stream, include_usage)
    job = Job(server, prompts, params, limits, n, stops, ignore_eos, logprobs, grammar, reasoning, lora)
    job.tools = tools
    job.echoes = echoes
    job.submit()
    if stream:
        return _SSEResponse(_stream(server, job, env, chat, include_usage), job.cancel)
    return await _collect(server, request, job, env, chat)


class _Echo:
    """A prompt given back before its completion (echo): its text, and when
    logprobs are asked, an event per prompt token (the first has no
    logprob: nothing comes before it)."""

    def __init__(self, text, events):
        self.text, self.events = text, events

    def logprobs(self, server) -> _Logprobs | None:
        if self.events is None:
            return None
        lp = _Logprobs(server, chat=False)
        for ev in self.events:
            lp.add(ev)
        return lp


async def _echoes(server, body, prompts, logprobs, lora=None) -> list:
    """Each prompt's _Echo. Its log-probabilities come from its logits on
    the engine thread, in a sequence of its own, 256 positions a pass (the
    logits of a whole long prompt at once would be n_vocab floats a token)."""
    p = body.get("prompt")
    texts = [p] if isinstance(p, str) else list(p) if isinstance(p, list) and all(isinstance(x, str) for x in p) \
        else [server.tokenizer.decode(ids) for ids in prompts]
    if logprobs is None:
        return [_Echo(t, None) for t in texts]

    def entries(ids):
        def run(eng):
            seq = eng.new_sequence()
            seq.lora = lora  # the request's LoRA scales
            events = [TokenEvent(ids[0], "", None, [])]
            try:
                for a in range(0, len(ids), 256):
                    chunk = ids[a:a + 256]
                    rows = eng.decode([(seq, chunk, "all")])[0]
                    for i in range(len(chunk)):
                        if a + i + 1 < len(ids):
                            tok = ids[a + i + 1]
                            lp, top = token_logprobs(rows[i], tok, logprobs)
                            events.append(TokenEvent(tok, "", lp, top))
            finally:
                eng.free(seq)
            return events
        return run

    events = await on_engine(server, prompts, entries, "prompt")
    return [_Echo(t, ev) for t, ev in zip(texts, events)]


async def on_engine(server, items, work, what: str) -> list:
    """[work(ids)(engine) for ids in items], each run on the engine thread
    between two batching steps (Scheduler.call: one a step, so the streams
    go on between them) with the blocks of its ids to hold; a pool with no
    room for them now is a 503."""
    bs = server.engine.block_size
    futures = [server.scheduler.call(work(ids), -(-len(ids) // bs)) for ids in items]
    try:
        return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    except KVCacheFullError:
        raise APIError(503, f"the KV pool has no room for this {what} now; try again later",
                       code="kv_pool_full") from None


def _echo_only(server, env, echoes, prompts, n, stream, include_usage):
    """max_tokens 0 with echo: each prompt (n times) and its logprobs, nothing generated."""
    choices = []
    for i, e in enumerate(echoes):
        lp = e.logprobs(server)
        for j in range(n):
            choices.append(oai.text_choice(i * n + j, e.text, lp.result() if lp else None, "length"))
    usage = oai.usage(sum(len(ids) for ids in prompts), 0)
    if not stream:
        return JSONResponse(env.whole(choices, usage))

    async def chunks():
        for c in choices:
            yield _sse(env.text_chunk(c["text"], c["index"], c["logprobs"]))
            yield _sse(env.text_chunk("", c["index"], finish_reason="length"))
        if include_usage:
            yield _sse(env.chunk([], usage))
        yield b"data: [DONE]\n\n"
    return _SSEResponse(chunks(), lambda: None)


async def _collect(server, request, job: Job, env, chat) -> Response:
    texts = {r.index: [] for r in job.reqs}
    tokens = {r.index: [] for r in job.reqs}
    lps = _choice_logprobs(server, job, chat)

    async def gather():
        async for req, ev in job.events():
            if isinstance(ev, TokenEvent):
                texts[req.index].append(ev.text)
                tokens[req.index].append(ev.token)
                if req.index in lps:
                    lps[req.index].add(ev)
            else:
                texts[req.index].append(ev.text)

    try:
        done = await until_disconnect(gather(), request.receive)
    except BaseException:  # cancelled (the server shutting down) or failed: the requests stop too
        job.cancel()
        raise
    if not done:
        job.cancel()
        return Response(status_code=499)
    err = job.error()
    if err is not None:
        return err.response()
    choices = []
    for r in job.reqs:
        text = "".join(texts[r.index])
        lp = lps[r.index].result() if r.index in lps else None
        reason = _reason(job.finish[r.index])
        if chat:
            message, calls = oai.chat_message(
                text, job.reasoning, job.tools.fmt if job.tools is not None else None,
                lambda i=r.index: server.tokenizer.decode(tokens[i], skip_special=False))
            if calls:
                reason = "tool_calls"
            choices.append(oai.chat_choice(r.index, message, lp, reason))
        else:
            if job.echoes is not None:
                text = job.echoes[r.prompt_index].text + text
            choices.append(oai.text_choice(r.index, text, lp, reason))
    return JSONResponse(env.whole(choices, job.usage()))


def _choice_logprobs(server, job, chat) -> dict:
    """Each choice's _Logprobs (those that asked), starting with its prompt's
    when it is echoed."""
    out = {}
    for r in job.reqs:
        if r.logprobs is not None:
            echoed = job.echoes[r.prompt_index].logprobs(server) if job.echoes is not None else None
            out[r.index] = echoed or _Logprobs(server, chat)
    return out


async def until_disconnect(coro, receive) -> bool:
    """Run coro unless the client disconnects first (receive: the request's
    ASGI receive); True when it finished, its exception raised if it failed."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if work.done() and not work.cancelled():
        work.result()
        return True
    return False


async def _wait_disconnect(receive):
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _stream(server, job: Job, env, chat, include_usage):
    lps = _choice_logprobs(server, job, chat)
    if job.echoes is not None:  # the prompt first, with its logprobs
        for r in job.reqs:
            lp = lps[r.index].result() if r.index in lps else None
            yield _sse(env.text_chunk(job.echoes[r.prompt_index].text, r.index, lp))
    fmt = job.tools.fmt if job.tools is not None else None
    deltas = {r.index: oai.ChatDeltas(job.reasoning, fmt) for r in job.reqs} if chat else {}
    tokens = {r.index: [] for r in job.reqs}
    if chat:
        for r in job.reqs:
            yield _sse(env.delta_chunk({"role": "assistant", "content": ""}, r.index))
    async for req, ev in job.events():
        if isinstance(ev, TokenEvent):
            lp = lps[req.index].add(ev) if req.index in lps else None
            tokens[req.index].append(ev.token)
            if chat:
                delta = deltas[req.index].feed(ev.text)
                if delta or lp is not None:
                    yield _sse(env.delta_chunk(delta or {"content": ""}, req.index, lp))
            elif ev.text or lp is not None:
                yield _sse(env.text_chunk(ev.text, req.index, lp))
            continue
        if ev.reason == "error":
            err = job.error()
            yield _sse(err.body())
            job.cancel()
            break
        last = job.open == 0
        reason = _reason(ev)
        if chat:
            delta, calls = deltas[req.index].finish(
                lambda: server.tokenizer.decode(tokens[req.index], skip_special=False), ev.text)
            for d in oai.tool_call_deltas(calls):
                yield _sse(env.delta_chunk(d, req.index))
            if calls:
                reason = "tool_calls"
            chunk = env.delta_chunk(delta, req.index, finish_reason=reason)
        else:
            chunk = env.text_chunk(ev.text, req.index, finish_reason=reason)
        if last and not include_usage:
            chunk["usage"] = job.usage()
        yield _sse(chunk)
    else:
        if include_usage:
            yield _sse(env.chunk([], job.usage()))
    yield b"data: [DONE]\n\n"


async def _ended(chunks):
    """chunks, and when making them fails, an error event in OpenAI's shape
    and [DONE]: a stream never just stops, whatever goes wrong in it."""
    try:
        async for data in chunks:
            yield data
    except Exception as e:  # noqa: BLE001 - the client gets a shaped error, the log the traceback
        log.exception("a stream failed")
        yield _sse(_api_error(e).body())
        yield b"data: [DONE]\n\n"


class _SSEResponse:
    """A server-sent-event stream that cancels its job when the client goes
    away (or the stream ends any other way before the job is done), and
    ends with an error event and [DONE] when making its chunks fails."""

    def __init__(self, chunks, on_close):
        self.chunks = _ended(chunks)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})

        async def pump():
            async for data in self.chunks:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await until_disconnect(pump(), receive)
        except OSError:
            pass  # the connection broke mid-write: as good as a disconnect
        finally:
            self.on_close()


# ---- endpoints ----

def openai_endpoint(server: Server, fn, auth=True):
    async def handle(request: HTTPRequest):
        try:
            if auth:
                server.check_auth(request)
            return await fn(server, request)
        except Exception as e:  # noqa: BLE001 - a bug here is a 500 in OpenAI's shape, not a dropped connection
            if not isinstance(e, (APIError, ValueError)):
                log.exception("%s %s failed", request.method, request.url.path)
            return _api_error(e).response()
    return handle


def _api_error(e: Exception) -> APIError:
    """The APIError a failed request answers: its own, 400 for a bad value
    (InvalidArgumentError is a ValueError), else 500 naming the type alone."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ValueError):
        return bad_request(str(e))
    return APIError(500, f"internal error: {type(e).__name__}")


async def completions(server: Server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    server.check_generates()
    return await _run_job(server, request, body, chat=False)


async def chat_completions(server: Server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    server.check_generates()
    return await _run_job(server, request, body, chat=True)


async def models(server: Server, request: HTTPRequest):
    return JSONResponse({"object": "list", "data": [server.model_card()]})


async def model(server: Server, request: HTTPRequest):
    """One model by any of its names (the listed id, the name or path it was
    served from): 404 for another, as /v1/models does not list it."""
    name = request.path_params["name"]
    if name not in server.model_aliases:
        raise APIError(404, f"the model '{name[:200]}' does not exist; this server has '{server.model_name}'",
                       "model", "model_not_found")
    return JSONResponse(server.model_card())


async def tokenize(server: Server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    add_special = _bool(body, "add_special_tokens", True)
    if "messages" in body:
        ids = (await run_in_threadpool(server.chat_ids, body))[0]
    else:
        text = body.get("prompt", body.get("content"))
        if not isinstance(text, str):
            raise bad_request("prompt must be a string", "prompt")
        ids = await run_in_threadpool(server.tokenize, text, add_special)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": server.n_ctx})


async def detokenize(server: Server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise bad_request("tokens must be a list of token ids", "tokens")
    ids = server.check_ids(ids, "tokens")
    return JSONResponse({"prompt": server.tokenizer.decode(ids)})


async def embeddings(server: Server, request: HTTPRequest):
    """OpenAI's embeddings: the model's final normed hidden states, pooled as
    its GGUF declares (mean when it declares none) and scaled to unit L2
    norm, as LLM.embed gives them. Each input runs on the engine thread in
    a sequence of its own, between two batching steps (one input a step,
    so the streams go on between them)."""
    body = await server.read_json(request)
    server.check_model(body)
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("encoding_format must be 'float' or 'base64'", "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and dims != server.n_embd:
        raise bad_request(f"this model's embeddings have {server.n_embd} dimensions; dimensions cannot change that",
                   "dimensions")
    items = await run_in_threadpool(server.embed_ids, body)
    n = sum(len(ids) for ids in items)
    if server.embedder is not None:  # an encoder: its own lock, off the event loop
        vecs = await run_in_threadpool(server.embedder.embed, items)
        return _embeddings_response(server, vecs, fmt, n)
    pooling = server.pooling

    def work(ids):
        return lambda eng: l2_normalize(pool(engine_hidden(eng, ids), pooling))

    vecs = await on_engine(server, items, work, "input")
    return _embeddings_response(server, vecs, fmt, n)


def _embeddings_response(server, vecs, fmt, n_tokens) -> JSONResponse:
    data = []
    for i, v in enumerate(vecs):
        v = np.asarray(v, dtype="<f4")
        emb = base64.b64encode(v.tobytes()).decode() if fmt == "base64" else v.tolist()
        data.append({"object": "embedding", "embedding": emb, "index": i})
    return JSONResponse({"object": "list", "data": data, "model": server.model_name,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


def _lora_list(value, what="lora") -> dict:
    """llama-server's [{"id": i, "scale": s}, ...] as {id: scale} (unlisted adapters: 0)"""
    if not isinstance(value, list):
        raise bad_request(f"{what} must be an array of {{id, scale}} objects, got {shown(value)}", "lora")
    out = {}
    for entry in value:
        if not isinstance(entry, dict) or "id" not in entry:
            raise bad_request(f"each {what} entry must be an object with an id and a scale, got {shown(entry)}",
                              "lora")
        i, scale = entry["id"], entry.get("scale", 0.0)
        if isinstance(i, bool) or not isinstance(i, int):
            raise bad_request(f"a LoRA adapter id must be an integer, got {shown(i)}", "lora")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise bad_request(f"LoRA adapter {i}'s scale must be a finite number, got {shown(scale)}", "lora")
        out[i] = float(scale)
    return out


async def lora_adapters(server: Server, request: HTTPRequest):
    """llama-server's GET /lora-adapters: [{id, path, scale}] with the global scales (float32 scales as
    their shortest decimal: 0.8, not 0.800000011920929)."""
    eng, scales = server.engine, server.lora_global
    loras = eng.loras if eng is not None else []
    return JSONResponse([{"id": i, "path": a.path, "scale": float(str(scales[i])) if scales is not None else 0.0,
                          "task_name": "", "prompt_prefix": ""} for i, a in enumerate(loras)])


async def set_lora_adapters(server: Server, request: HTTPRequest):
    """llama-server's POST /lora-adapters: [{id, scale}] become the global
    scales (adapters left out: 0) for the requests that come after and name
    none of their own."""
    body = await server.read_json(request, array=True)
    server.lora_global = server.request_lora(body) if body else None
    return JSONResponse({"success": True})


async def health(server: Server, request: HTTPRequest):
    if not server.alive:
        return APIError(503, "the engine is not running").response()
    return JSONResponse({"status": "ok"})


async def metrics(server: Server, request: HTTPRequest):
    return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def openai_routes(server: Server) -> list:
    """The routes of the OpenAI API and the server's own (tokenize, health, metrics)."""
    return [
        Route("/v1/completions", openai_endpoint(server, completions), methods=["POST"]),
        Route("/v1/chat/completions", openai_endpoint(server, chat_completions), methods=["POST"]),
        Route("/v1/models", openai_endpoint(server, models), methods=["GET"]),
        Route("/v1/models/{name:path}", openai_endpoint(server, model), methods=["GET"]),
        Route("/v1/embeddings", openai_endpoint(server, embeddings), methods=["POST"]),
        Route("/tokenize", openai_endpoint(server, tokenize), methods=["POST"]),
        Route("/detokenize", openai_endpoint(server, detokenize), methods=["POST"]),
        Route("/lora-adapters", openai_endpoint(server, lora_adapters), methods=["GET"]),
        Route("/lora-adapters", openai_endpoint(server, set_lora_adapters), methods=["POST"]),
        Route("/health", openai_endpoint(server, health, auth=False), methods=["GET"]),
        Route("/metrics", openai_endpoint(server, metrics, auth=False), methods=["GET"]),
    ]


async def not_found(request, exc):
    """404 and 405 in OpenAI's error shape."""
    status = getattr(exc, "status_code", 404)
    msg = f"no route {request.method} {request.url.path}" if status != 405 else \
        f"{request.url.path} does not take {request.method}"
    return APIError(status, msg, type_="invalid_request_error").response()
