"""Many models in one `llminfer serve` (llama-server's router mode, Ollama's
model store): a catalog of named GGUFs, each loaded into its own Server
(engine + scheduler) on the first request that names it, and unloaded when
idle or to make room.

    llminfer serve --models-dir ~/models --models-max-loaded 2 --models-idle-timeout 600
    llminfer serve --models-config models.toml --models-memory 24

The catalog: each *.gguf in models_dir under its file stem (a subfolder
holding one model: under the folder's name), then models_config, a JSON or
TOML file of name -> path or {"path": ..., per-model options}, whose entries
win over the folder's. Projector files (mmproj, clip) and the parts of a
split GGUF are not served (join a split model first: llama-gguf-split
--merge).

Every POST route of the one-model server (chat, completions, embeddings,
tokenize, Anthropic's messages, responses, Ollama's chat, generate and
show) reads the request's `model`,
takes hold of that model (loading it, off the event loop, when needed;
requests for a model being loaded wait for that load) and hands the request
to the model's own routes (app.routes), letting go of it when the response
has been sent, streams included. A model held by a request is never
unloaded. Room is made least recently used first, among models no request
holds, to keep at most models_max_loaded models and their estimated memory
(the file's size + its KV pool) within models_memory_gib; when even that
leaves no room, the request gets 503 with Retry-After. An unknown model is a
404 naming the known ones. Ollama's GET /api/tags lists every model known,
/api/ps those loaded.

All bookkeeping runs on the event loop, so it needs no lock: a decision and
the state it changes happen between two awaits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from llminfer.text import jsonlimits
from llminfer.errors import InvalidArgumentError, LLMInferError, ModelNotFoundError
from llminfer.core.gguf_file import GGUFFile
from llminfer.server import app as single
from llminfer.server.routes import routes as model_routes
from llminfer.server import page
from llminfer.server.app import APIError, bad_request
from llminfer.server.args import ServeArgs

log = logging.getLogger("llminfer.server")

RETRY_AFTER_S = 2  # what a 503 for a full server suggests: running requests finish in seconds

# ServeArgs fields a models_config entry may set for its model
PER_MODEL = ("n_ctx", "n_threads", "kv_pool_tokens", "kv_type", "n_gpu_layers", "max_batch_tokens", "max_running",
             "max_waiting", "prefix_caching", "chat_template", "chat_format", "max_tokens_limit", "mmproj")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_KV_ELEMENT_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
_GIB = 1 << 30


# ---- the catalog ----

@dataclass
class ModelEntry:
    """One servable model and its state: "unloaded", "loading", "loaded" or
    "unloading". users: requests holding it (and waiting for it to load);
    task: the load or unload under way; estimate: bytes it takes loaded
    (measured once it is)."""

    name: str
    path: str
    options: dict = field(default_factory=dict)
    estimate: int = 0
    state: str = "unloaded"
    users: int = 0
    last_used: float = 0.0
    server: object = None  # app.Server while loaded
    routes: Router | None = None
    task: asyncio.Task | None = None
    error: str | None = None  # why the last load failed

    def n_ctx(self, args: ServeArgs) -> int:
        return self.options.get("n_ctx", args.n_ctx)


def _is_projector(path: Path, meta: dict) -> bool:
    return "mmproj" in path.name.lower() or meta.get("general.architecture") == "clip"


def _header(path: Path) -> dict | None:
    """The GGUF's metadata, None (with a warning) when it cannot be read."""
    try:
        with GGUFFile(path) as f:
            return dict(f.metadata)
    except LLMInferError as e:
        log.warning("models: skipping %s: %s", path, e)
        return None


def _estimate(path: Path, meta: dict, args: ServeArgs, options: dict) -> int:
    """Bytes a model takes loaded: its file, and for a decoder its KV pool
    (positions x layers x (keys + values) x bytes an element)."""
    size = path.stat().st_size
    arch = meta.get("general.architecture", "")

    def most(key, default):  # a per-layer array counts at its largest
        x = meta.get(f"{arch}.{key}", default)
        return int(max(x, default=0) if hasattr(x, "__len__") else x or 0)

    n_layer = most("block_count", 0)
    n_head = max(most("attention.head_count", 1), 1)
    n_kv = most("attention.head_count_kv", n_head)
    head = most("embedding_length", 0) // n_head
    k, v = most("attention.key_length", head), most("attention.value_length", head)
    n_ctx = options.get("n_ctx", args.n_ctx)
    pool = options.get("kv_pool_tokens", args.kv_pool_tokens) or 4 * n_ctx
    per = _KV_ELEMENT_BYTES.get(options.get("kv_type", args.kv_type), 2.0)
    return int(size + pool * n_layer * n_kv * (k + v) * per)


def _dir_models(root: Path) -> dict:
    """{name: path} of the models in a folder: each *.gguf under its stem,
    each subfolder holding exactly one servable GGUF under the folder's name."""
    if not root.is_dir():
        raise ModelNotFoundError(f"--models-dir {root}: no such folder")
    found = {}

    def servable(p: Path) -> bool:
        if _SPLIT.search(p.name):
            log.warning("models: skipping %s: a part of a split GGUF (join the parts with "
                        "llama-gguf-split --merge)", p)
            return False
        if "mmproj" in p.name.lower():
            return False
        return True

    for p in sorted(root.iterdir()):
        if p.is_file() and p.suffix.lower() == ".gguf" and servable(p):
            found.setdefault(p.stem, p)
        elif p.is_dir():
            inner = [q for q in sorted(p.glob("*.gguf")) if servable(q)]
            if len(inner) == 1:
                found.setdefault(p.name, inner[0])
            elif inner:
                log.warning("models: skipping %s: it holds %d models; name them in --models-config", p, len(inner))
    return found


def _read_config(path: Path) -> dict:
    """{name: (path, options)} of a models_config file (JSON, or TOML by its .toml suffix)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ModelNotFoundError(f"--models-config {path}: {e.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        raise InvalidArgumentError(f"--models-config {path}: not valid {path.suffix.lstrip('.') or 'JSON'}: "
                                   f"{e}") from None
    if isinstance(data, dict) and isinstance(data.get("models"), dict):
        data = data["models"]
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"--models-config {path}: must map model names to paths or "
                                   f"{{\"path\": ..., options}}")
    types = {f.name: f.type for f in fields(ServeArgs)}
    out = {}
    for name, spec in data.items():
        where = f"--models-config {path}: model {name!r}"
        if isinstance(spec, str):
            spec = {"path": spec}
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
            raise InvalidArgumentError(f"{where} needs a path")
        options = {k: v for k, v in spec.items() if k != "path"}
        for k, v in options.items():
            if k not in PER_MODEL:
                raise InvalidArgumentError(f"{where}: unknown option {k!r} (a model may set {', '.join(PER_MODEL)})")
            want = types[k]
            ok = (isinstance(v, bool) if "bool" in want else isinstance(v, str) if "str" in want
                  else isinstance(v, int) and not isinstance(v, bool) and v > (-2 if k == "n_gpu_layers" else 0))
            if not ok:
                raise InvalidArgumentError(f"{where}: {k} = {v!r} is not a valid {want}")
        p = Path(spec["path"]).expanduser()
        if not p.is_absolute():
            p = path.parent / p
        if not p.is_file():
            raise ModelNotFoundError(f"{where}: no such file: {p}")
        if "mmproj" in options:  # the vision tower, relative to the config file as the model is
            mm = Path(options["mmproj"]).expanduser()
            mm = mm if mm.is_absolute() else path.parent / mm
            if not mm.is_file():
                raise ModelNotFoundError(f"{where}: no such mmproj file: {mm}")
            options["mmproj"] = str(mm)
        out[str(name)] = (p, options)
    return out


def catalog(args: ServeArgs) -> dict:
    """{name: ModelEntry} of everything models_dir and models_config name."""
    specs = {}
    if args.models_dir:
        specs.update({name: (p, {}) for name, p in _dir_models(Path(args.models_dir).expanduser()).items()})
    if args.models_config:
        specs.update(_read_config(Path(args.models_config).expanduser()))
    out = {}
    for name, (p, options) in specs.items():
        meta = _header(p)
        if meta is None or _is_projector(p, meta):
            continue
        out[name] = ModelEntry(name, str(p), options, _estimate(p, meta, args, options))
    if not out:
        where = " and ".join(x for x in (args.models_dir and f"--models-dir {args.models_dir}",
                                          args.models_config and f"--models-config {args.models_config}") if x)
        raise ModelNotFoundError(f"{where}: no GGUF model to serve")
    return out


# ---- loading, holding and unloading ----

class ModelRouter:
    """The catalog and what is loaded, on the event loop."""

    def __init__(self, args: ServeArgs):
        if args.models_max_loaded is not None and args.models_max_loaded < 1:
            raise InvalidArgumentError(f"models_max_loaded must be at least 1, got {args.models_max_loaded}")
        if args.models_memory_gib is not None and not args.models_memory_gib > 0:
            raise InvalidArgumentError(f"models_memory_gib must be positive, got {args.models_memory_gib}")
        if args.models_idle_timeout is not None and not args.models_idle_timeout > 0:
            raise InvalidArgumentError(f"models_idle_timeout must be positive, got {args.models_idle_timeout}")
        self.args = args
        self.entries = catalog(args)
        self.budget = int(args.models_memory_gib * _GIB) if args.models_memory_gib else None
        self.created = int(time.time())
        self._reaper = None

    # ---- lookup ----

    def names(self) -> str:
        return ", ".join(f"'{n}'" for n in sorted(self.entries))

    def entry(self, name) -> ModelEntry:
        """The entry a request's model names: 404 naming the known ones for
        another; a request that names none is served when only one is known."""
        if name is None:
            if len(self.entries) == 1:
                return next(iter(self.entries.values()))
            raise bad_request(f"name the model: this server has {self.names()}", "model", "model_required")
        if not isinstance(name, str):
            raise bad_request("model must be a string", "model")
        e = self.entries.get(name) or self.entries.get(name[:-5] if name.endswith(".gguf") else None)
        if e is None:
            raise APIError(404, f"the model '{name[:200]}' does not exist; this server has {self.names()}",
                           "model", "model_not_found")
        return e

    # ---- holding ----

    async def acquire(self, e: ModelEntry) -> ModelEntry:
        """Hold e, loaded: load it when it is not (making room first), wait
        for a load or unload under way. Release it with release(e)."""
        e.users += 1
        try:
            while e.state != "loaded":
                if e.state == "unloaded":
                    self._start_load(e)
                await asyncio.shield(e.task)
        except BaseException:
            self.release(e)
            raise
        e.last_used = time.monotonic()
        return e

    def release(self, e: ModelEntry):
        e.users -= 1
        e.last_used = time.monotonic()

    def _active(self) -> list:
        return [x for x in self.entries.values() if x.state in ("loading", "loaded")]

    def _start_load(self, e: ModelEntry):
        """Choose what to unload to make room for e (least recently used
        first, among models nobody holds), start those unloads and e's load;
        a 503 when no choice makes room."""
        limit, budget = self.args.models_max_loaded, self.budget
        if budget is not None and e.estimate > budget:
            raise APIError(503, f"the model '{e.name}' needs about {e.estimate / _GIB:.2f} GiB (its file and KV "
                           f"pool), more than this server's budget of {budget / _GIB:.2f} GiB (--models-memory)",
                           code="model_too_large")
        active = self._active()
        victims = []

        def fits():
            kept = [x for x in active if x not in victims]
            return ((limit is None or len(kept) + 1 <= limit)
                    and (budget is None or sum(x.estimate for x in kept) + e.estimate <= budget))

        for x in sorted((x for x in active if x.state == "loaded" and x.users == 0), key=lambda x: x.last_used):
            if fits():
                break
            victims.append(x)
        if not fits():
            busy = ", ".join(f"'{x.name}'" for x in active)
            bounds = [f"{limit} models" if limit is not None else "",
                      f"{budget / _GIB:.2f} GiB" if budget is not None else ""]
            raise APIError(503, f"no room to load the model '{e.name}': the loaded models ({busy}) are all in "
                           f"use and the server holds at most {' and '.join(b for b in bounds if b)}; "
                           f"try again shortly", code="models_busy")
        waits = [self._start_unload(x) for x in victims]
        waits += [x.task for x in self.entries.values() if x.state == "unloading" and x.task not in waits]
        e.state = "loading"
        e.error = None
        e.task = asyncio.ensure_future(self._load(e, waits))

    async def _load(self, e: ModelEntry, waits: list):
        """e's load: after the unloads it waits for (their memory back), its
        Server built on a worker thread, started on the loop."""
        try:
            await asyncio.gather(*waits, return_exceptions=True)
            options = {f.name: getattr(self.args, f.name) for f in fields(ServeArgs)}
            options.update(model=e.path, served_model_name=e.name, models_dir=None, models_config=None)
            options.update(e.options)
            log.info("models: loading '%s' (%s)", e.name, e.path)
            t0 = time.monotonic()
            server = await run_in_threadpool(single.Server, ServeArgs(**options))
            try:
                server.start()
            except BaseException:
                await run_in_threadpool(server.stop)
                raise
        except BaseException as err:
            e.state = "unloaded"
            e.error = str(err)
            log.warning("models: cannot load '%s': %s", e.name, err)
            if isinstance(err, LLMInferError):
                raise APIError(500, f"the model '{e.name}' cannot be loaded: {err}", "model",
                               "model_load_failed") from None
            raise
        if server.engine is not None:  # measured now: the file and the pool as allocated
            e.estimate = os.path.getsize(e.path) + sum(server.engine.kv_cache_bytes())
        e.server, e.routes = server, Router(routes=model_routes(server))
        e.state = "loaded"
        e.last_used = time.monotonic()
        log.info("models: '%s' loaded in %.1f s", e.name, e.last_used - t0)

    def _start_unload(self, e: ModelEntry) -> asyncio.Task:
        """Unload e: only a model no request holds, but at shutdown, any."""
        e.state = "unloading"
        e.task = asyncio.ensure_future(self._unload(e))
        return e.task

    async def _unload(self, e: ModelEntry):
        server, e.server, e.routes = e.server, None, None
        log.info("models: unloading '%s'", e.name)
        try:
            await run_in_threadpool(server.stop)
        finally:
            e.state = "unloaded"

    # ---- lifetime ----

    async def _reap(self, timeout: float):
        """Unload each model nobody has used for timeout seconds."""
        while True:
            await asyncio.sleep(max(0.05, min(1.0, timeout / 4)))
            now = time.monotonic()
            for e in self.entries.values():
                if e.state == "loaded" and e.users == 0 and now - e.last_used >= timeout:
                    self._start_unload(e)

    def start(self):
        if self.args.models_idle_timeout:
            self._reaper = asyncio.ensure_future(self._reap(self.args.models_idle_timeout))

    async def stop(self):
        if self._reaper is not None:
            self._reaper.cancel()
        tasks = [e.task for e in self.entries.values() if e.task is not None and not e.task.done()]
        await asyncio.gather(*tasks, return_exceptions=True)
        for e in self.entries.values():
            if e.state == "loaded":
                self._start_unload(e)
        await asyncio.gather(*(e.task for e in self.entries.values() if e.state == "unloading"),
                             return_exceptions=True)

    # ---- what the listing shows ----

    def card(self, e: ModelEntry) -> dict:
        """An OpenAI model object, with the model's state as llama-server's
        router lists it (status.value) and what Ollama's /api/ps shows."""
        card = {"id": e.name, "object": "model", "created": self.created, "owned_by": "llminfer",
                "max_model_len": e.server.n_ctx if e.server is not None else e.n_ctx(self.args),
                "status": {"value": e.state, "requests": e.users, "size_bytes": e.estimate}}
        if e.error is not None and e.state == "unloaded":
            card["status"]["failed"] = e.error
        return card


# ---- HTTP ----

def _error(e: APIError, path: str) -> Response:
    """e in the shape of the API the path belongs to, with Retry-After on a 503."""
    headers = {"retry-after": str(RETRY_AFTER_S)} if e.status == 503 and e.code == "models_busy" else None
    if path.startswith("/v1/messages"):
        from llminfer.server.anthropic import error_body

        return JSONResponse(error_body(e), status_code=e.status, headers=headers)
    if path.startswith("/api/"):
        from llminfer.server.ollama import error_body

        return JSONResponse(error_body(e), status_code=e.status, headers=headers)
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _check_key(args: ServeArgs, request: HTTPRequest):
    """The API key, as Bearer or (Anthropic's) x-api-key, before a model is loaded for the request."""
    key = args.api_key
    if not key:
        return
    given = request.headers.get("x-api-key")
    if given is None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(given.encode(), key.encode()):
        how = "'x-api-key: KEY' (or 'Authorization: Bearer KEY')" if request.url.path.startswith("/v1/messages") \
            else "'Authorization: Bearer KEY'"
        raise APIError(401, f"a valid API key is needed: send {how}", code="invalid_api_key")


async def _read_body(args: ServeArgs, receive) -> bytes:
    limit = args.max_body_bytes
    data = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionAbortedError
        data += msg.get("body", b"")
        if len(data) > limit:
            raise APIError(413, f"the request body is more than the {limit} bytes this server takes")
        if not msg.get("more_body", False):
            return bytes(data)


class _Dispatch:
    """An ASGI app for one POST path: read the body, hold the model it names,
    and hand the request (its body replayed) to that model's routes."""

    def __init__(self, router: ModelRouter):
        self.router = router

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        router = self.router
        try:
            _check_key(router.args, HTTPRequest(scope))
            body = await _read_body(router.args, receive)
            try:
                parsed = jsonlimits.loads(body, "the request body")
            except InvalidArgumentError as err:
                raise bad_request(str(err)) from None
            if not isinstance(parsed, dict):
                raise bad_request("the request body must be a JSON object")
            entry = await router.acquire(router.entry(parsed.get("model")))
        except ConnectionAbortedError:
            return
        except Exception as err:  # noqa: BLE001 - shaped, whatever failed
            if not isinstance(err, APIError):
                log.exception("%s %s failed", scope["method"], path)
                err = APIError(500, f"internal error: {type(err).__name__}")
            await _error(err, path)(scope, receive, send)
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            await entry.routes(scope, replay, send)
        finally:
            router.release(entry)


def _endpoint(router: ModelRouter, fn, auth=True):
    async def handle(request: HTTPRequest):
        try:
            if auth:
                _check_key(router.args, request)
            return await fn(router, request)
        except APIError as e:
            return _error(e, request.url.path)
    return handle


async def _models(router: ModelRouter, request):
    return JSONResponse({"object": "list", "data": [router.card(e) for e in router.entries.values()]})


async def _model(router: ModelRouter, request):
    return JSONResponse(router.card(router.entry(request.path_params["name"])))


async def _ollama_tags(router: ModelRouter, request):
    """Ollama's /api/tags (every model known) or /api/ps (those loaded)."""
    from llminfer.server import ollama

    loaded_only = request.url.path == "/api/ps"
    out = []
    for e in list(router.entries.values()):
        if loaded_only and e.state != "loaded":
            continue
        try:
            d = await run_in_threadpool(ollama.describe_file, e.path, bool(e.options.get("mmproj")))
        except (OSError, LLMInferError):
            continue  # a file gone or broken since the catalog was read: not listed
        out.append(ollama.running(e.name, d, e.n_ctx(router.args)) if loaded_only else ollama.listed(e.name, d))
    return JSONResponse({"models": out})


async def _ollama_version(router: ModelRouter, request):
    import llminfer

    return JSONResponse({"version": llminfer.__version__})


async def _health(router: ModelRouter, request):
    loaded = sum(e.state == "loaded" for e in router.entries.values())
    return JSONResponse({"status": "ok", "models": len(router.entries), "loaded": loaded})


async def _metrics(router: ModelRouter, request):
    return Response(render_metrics(router), media_type="text/plain; version=0.0.4; charset=utf-8")


def render_metrics(router: ModelRouter) -> str:
    """Each loaded model's metrics (labelled model_name) merged family by
    family, so each HELP and TYPE appears once, and llminfer:model_loaded,
    1 or 0 for every model known."""
    from llminfer.server.metrics import PREFIX, labels_text

    order, families = [], {}
    head = f"{PREFIX}model_loaded"
    families[head] = ([f"# HELP {head} Whether the model is loaded (1) or not (0).", f"# TYPE {head} gauge"],
                      [f"{head}{labels_text({'model_name': e.name})} {int(e.state == 'loaded')}"
                       for e in router.entries.values()])
    order.append(head)
    for e in router.entries.values():
        if e.state != "loaded":
            continue
        current = None
        for line in e.server.metrics.render().splitlines():
            if line.startswith("# HELP "):
                current = line.split()[2]
                if current not in families:
                    families[current] = ([line], [])
                    order.append(current)
            elif line.startswith("# TYPE "):
                if len(families[current][0]) == 1:
                    families[current][0].append(line)
            elif line:
                families[current][1].append(line)
    return "\n".join(line for name in order for part in families[name] for line in part) + "\n"


def create_app(args: ServeArgs) -> Starlette:
    """The ASGI app of a many-model server. The catalog is read here (errors
    surface at once); no model loads before a request names it."""
    router = ModelRouter(args)

    @asynccontextmanager
    async def lifespan(app):
        router.start()
        try:
            yield
        finally:
            await router.stop()

    # the POST paths of one model's routes, each dispatched by the model its body names
    probe = [r for r in model_routes(_NoServer()) if "POST" in (r.methods or ())]
    dispatch = _Dispatch(router)
    routes = [
        Route("/v1/models", _endpoint(router, _models), methods=["GET"]),
        Route("/v1/models/{name:path}", _endpoint(router, _model), methods=["GET"]),
        Route("/api/tags", _endpoint(router, _ollama_tags), methods=["GET"]),
        Route("/api/ps", _endpoint(router, _ollama_tags), methods=["GET"]),
        Route("/api/version", _endpoint(router, _ollama_version), methods=["GET"]),
        Route("/health", _endpoint(router, _health, auth=False), methods=["GET"]),
        Route("/metrics", _endpoint(router, _metrics, auth=False), methods=["GET"]),
    ] + [Route(r.path, dispatch, methods=["POST"]) for r in probe] + page.routes()
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: single.not_found, 405: single.not_found})
    app.state.server = None
    app.state.router = router
    return app


class _NoServer:
    """Stands for a _Server when only the paths of its routes are wanted."""
