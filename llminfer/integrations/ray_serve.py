"""llminfer servers as Ray Serve replicas, behind a prefix-aware router.

    pip install "llminfer[ray]"
    ray start --head --num-cpus 4
    serve run llminfer.integrations.ray_serve:app model=smollm2 replicas=2 threads=2

Two deployments make one application:

- ``LLMServer``: one llminfer engine per replica: the HTTP app of
  ``llminfer serve`` (``llminfer.server.create_app``), run in-process with
  its lifespan, takes the requests the Ingress forwards (Serve allows one
  ``@serve.ingress`` deployment per application, and the router must see a
  request's prompt before it picks a replica). Its thread count is the
  replica's CPUs
  (``ray_actor_options={"num_cpus": threads}``). Ray's health check calls
  the app's ``/health``; autoscaling reads the running and waiting requests
  the app reports in ``/metrics`` (``record_autoscaling_stats`` and
  ``queue_autoscaling_policy``).
- ``Ingress``: the application's HTTP entry (``@serve.ingress``, no CPUs of
  its own). It reads
  each request's body, takes its prompt (the completion prompt, or the chat
  messages in order) as a routing key, and forwards the request to an
  ``LLMServer`` replica through a deployment handle whose request router is
  ``PrefixAffinityRouter``: requests that share a prompt prefix go to the
  replica that served it last (its prefix cache holds the KV), with the
  replicas' queue lengths as the tie-breaker and the bound on imbalance.

Faults: a replica that dies is restarted by Ray. A request it held fails
over to another replica when nothing of its answer has reached the client:
the Ingress holds a non-streamed answer until it is whole (so it fails over
wherever its replica is lost, and the client never gets half a document), and
a stream fails over before its first event. A stream already under way ends
with an OpenAI-shaped error event whose code is ``replica_lost``
(retryable), and a request no replica can take gets 503 with
``Retry-After``. No request is left without an answer.

The routing key is the prompt's text; the router hashes it in chunks of
``chunk_chars`` characters as a chain (each chunk's hash covers all text
before it), so the longest shared chunk prefix finds its replica the way
the server's prefix cache finds its blocks by token chains.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import time
from collections import OrderedDict
from typing import Any

try:
    import ray
    from ray import serve
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig
    from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('llminfer.integrations.ray_serve needs Ray Serve: pip install "llminfer[ray]"') from exc

from llminfer.text import jsonlimits
from llminfer.errors import InvalidArgumentError

logger = logging.getLogger("llminfer.ray_serve")

# Headers the replica's own HTTP layer sets again; the rest pass through.
_HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
# Response header: how many replicas failed the request before this one answered.
FAILOVER_HEADER = "x-llminfer-failovers"
# Paths whose body carries a prompt to route by.
_PROMPT_PATHS = ("/v1/completions", "/v1/chat/completions")


# ---- the routing key and its chain of chunk hashes ----

def routing_key(path: str, body: bytes) -> str:
    """The text a request's prompt starts with: a completion's prompt, or a
    chat's messages (role and content, in order). '' when the body is not a
    prompt request or not JSON (the replica answers those itself)."""
    if path not in _PROMPT_PATHS or not body:
        return ""
    try:  # a body that is not JSON, or nests too deep, is the replica's to refuse
        req = jsonlimits.loads(body, "the request body", default=None)
    except InvalidArgumentError:
        return ""
    if not isinstance(req, dict):
        return ""
    if path.endswith("/chat/completions"):
        parts = []
        for m in req.get("messages") or []:
            if isinstance(m, dict):
                content = m.get("content")
                if not isinstance(content, str):
                    content = json.dumps(content, sort_keys=True)
                parts.append(f"<{m.get('role', '')}>{content}")
        return "".join(parts)
    prompt = req.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if len(prompt) == 1 else json.dumps(prompt)
    return prompt if isinstance(prompt, str) else ""


def chunk_hashes(key: str, chunk_chars: int) -> list:
    """Hashes of the whole chunks of key, each covering everything before it
    (a chain): equal hashes at index i mean the first (i + 1) * chunk_chars
    characters are equal."""
    out, h = [], b""
    for i in range(len(key) // chunk_chars):
        h = hashlib.blake2b(h + key[i * chunk_chars:(i + 1) * chunk_chars].encode("utf-8", "surrogatepass"),
                            digest_size=16).digest()
        out.append(h)
    return out


# ---- the router ----

class PrefixAffinityRouter(RequestRouter):
    """Routes a request to the replica that last served the longest chunk
    prefix of its prompt, unless that replica's queue is longer than the
    shortest by more than `imbalanced_threshold`; otherwise (or with no
    prefix known) to the shorter queue of two replicas drawn at random.

    The map from chunk hashes to replicas is an LRU of `max_entries`; a
    replica that leaves (dies, scales down) loses its entries."""

    def initialize_state(self, chunk_chars: int = 128, imbalanced_threshold: int = 4,
                         max_entries: int = 100_000, affinity: bool = True):
        if chunk_chars < 1 or imbalanced_threshold < 0 or max_entries < 1:
            raise InvalidArgumentError(f"PrefixAffinityRouter: chunk_chars {chunk_chars}, imbalanced_threshold "
                                       f"{imbalanced_threshold} and max_entries {max_entries} must be positive")
        self.chunk_chars = chunk_chars
        self.imbalanced_threshold = imbalanced_threshold
        self.max_entries = max_entries
        self.affinity = affinity
        self.owner: OrderedDict = OrderedDict()  # chunk hash -> ReplicaID
        self.routed_by_prefix = 0
        self.routed_by_load = 0

    def _queue(self, r: RunningReplica) -> int:
        q = self.replica_queue_len_cache.get(r.replica_id)
        return 0 if q is None else q

    def _hashes(self, pending_request: PendingRequest | None) -> list:
        if pending_request is None or not pending_request.args:
            return []
        req = pending_request.args[0]
        key = req.get("route_key", "") if isinstance(req, dict) else ""
        return chunk_hashes(key, self.chunk_chars) if key else []

    async def choose_replicas(self, candidate_replicas: list, pending_request: PendingRequest | None = None):
        if not candidate_replicas:
            return []
        by_id = {r.replica_id: r for r in candidate_replicas}
        shortest = min(self._queue(r) for r in candidate_replicas)
        if self.affinity:
            for h in reversed(self._hashes(pending_request)):
                rid = self.owner.get(h)
                if rid in by_id:
                    r = by_id[rid]
                    if self._queue(r) <= shortest + self.imbalanced_threshold:
                        self.routed_by_prefix += 1
                        rest = [x for x in candidate_replicas if x.replica_id != rid]
                        return [[r], rest] if rest else [[r]]
                    break
        self.routed_by_load += 1
        pair = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        pair.sort(key=self._queue)
        rest = [x for x in candidate_replicas if x not in pair]
        return [pair, rest] if rest else [pair]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        for h in self._hashes(pending_request):
            self.owner[h] = replica_id
            self.owner.move_to_end(h)
        while len(self.owner) > self.max_entries:
            self.owner.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        for h in [h for h, rid in self.owner.items() if rid == replica_id]:
            del self.owner[h]


# ---- autoscaling on the queue the server reports ----

def queue_autoscaling_policy(ctx) -> tuple:
    """Replicas wanted for the requests the servers hold (running plus
    waiting, from record_autoscaling_stats), at `target_ongoing_requests`
    a replica, within the configured bounds."""
    metrics = ctx.aggregated_metrics or {}
    total = 0.0
    for name in ("running", "waiting"):
        total += sum((metrics.get(name) or {}).values())
    per = (ctx.config.target_ongoing_requests if ctx.config else None) or 8
    want = max(1, math.ceil(total / per))
    lo, hi = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
    return min(max(want, lo), hi), {}


def _gauge(text: str, name: str) -> float:
    """The value of an unlabelled or single-sample gauge in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return 0.0
    return 0.0


# ---- calling an ASGI app in-process ----

async def asgi_stream(app, method: str, path: str, query: bytes, headers: list, body: bytes):
    """Run one HTTP request through the ASGI app in this process, yielding
    {"status", "headers"} first and then the body's chunks as they are sent.
    When the consumer stops early (its client went away), the app sees
    http.disconnect, as it would from a real server."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode("latin-1"),
        "query_string": query, "root_path": "", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }
    messages: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        await messages.put(message)

    task = asyncio.ensure_future(app(scope, receive, send))
    try:
        while True:
            get = asyncio.ensure_future(messages.get())
            done, _ = await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                if messages.empty():
                    task.result()  # raises what the app raised
                    return
                msg = messages.get_nowait()
            else:
                msg = get.result()
            if msg["type"] == "http.response.start":
                yield {"status": msg["status"],
                       "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.get("headers", [])]}
            elif msg["type"] == "http.response.body":
                if msg.get("body"):
                    yield msg["body"]
                if not msg.get("more_body", False):
                    return
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, timeout=10)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - closing down
                task.cancel()


async def asgi_call(app, method: str, path: str, body: bytes = b"") -> tuple:
    """(status, body bytes) of one in-process request."""
    status, chunks = 500, []
    async for part in asgi_stream(app, method, path, b"", [], body):
        if isinstance(part, dict):
            status = part["status"]
        else:
            chunks.append(part)
    return status, b"".join(chunks)


# ---- the replica ----

def _replica_threads(default: int) -> int:
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - outside a Ray worker
        cpus = None
    return max(1, int(cpus)) if cpus else default


class _Lifespan:
    """The ASGI lifespan of an app run in-process: startup awaited at start(),
    shutdown at stop() (llminfer's app starts its engine thread there)."""

    def __init__(self, app):
        self.app = app
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.failed = None
        self.task = None

    async def _send(self, message):
        kind = message["type"]
        if kind.endswith(".failed"):
            self.failed = message.get("message", kind)
        if kind.startswith("lifespan.startup"):
            self.started.set()
        elif kind.startswith("lifespan.shutdown"):
            self.stopped.set()

    async def start(self):
        self.task = asyncio.ensure_future(self.app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                                   self.inbox.get, self._send))
        await self.inbox.put({"type": "lifespan.startup"})
        await self.started.wait()
        if self.failed:
            raise RuntimeError(f"llminfer server failed to start: {self.failed}")

    async def stop(self):
        if self.task is not None and not self.task.done():
            await self.inbox.put({"type": "lifespan.shutdown"})
            await asyncio.wait_for(self.stopped.wait(), timeout=60)


class LLMServer:
    """One llminfer engine and its HTTP app (`llminfer serve`'s create_app)
    per replica, run in-process: the Ingress forwards requests to it."""

    async def __init__(self, server_args: dict):
        from llminfer.server import ServeArgs, create_app

        args = dict(server_args)
        args["n_threads"] = _replica_threads(int(args.get("n_threads") or 1))
        self.n_threads = args["n_threads"]
        self.app = create_app(ServeArgs(**args))
        self.lifespan = _Lifespan(self.app)
        await self.lifespan.start()
        logger.info("llminfer replica up: %s, %d threads", args.get("model"), self.n_threads)

    async def __del__(self):
        await self.lifespan.stop()

    async def handle_http(self, req: dict):
        """A request forwarded by the Ingress: streamed back as a head
        ({"status", "headers"}) and body chunks."""
        async for part in asgi_stream(self.app, req["method"], req["path"], req.get("query", b""),
                                      req.get("headers", []), req.get("body", b"")):
            yield part

    async def stats(self) -> dict:
        """The server's running and waiting requests and prefix-cache
        counters, from its own /metrics."""
        _, text = await asgi_call(self.app, "GET", "/metrics")
        t = text.decode("utf-8", "replace")
        return {"replica": serve.get_replica_context().replica_id.unique_id} | {name: _gauge(t, "llminfer:" + metric) for name, metric in (
            ("running", "num_requests_running"), ("waiting", "num_requests_waiting"),
            ("prefix_queries", "prefix_cache_queries_total"), ("prefix_hits", "prefix_cache_hits_total"),
            ("generation_tokens", "generation_tokens_total"), ("kv_usage", "kv_cache_usage_perc"))}

    async def record_autoscaling_stats(self) -> dict:
        s = await self.stats()
        return {"running": s["running"], "waiting": s["waiting"]}

    async def check_health(self):
        status, body = await asgi_call(self.app, "GET", "/health")
        if status != 200:
            raise RuntimeError(f"llminfer server unhealthy: {status} {body[:200]!r}")


# ---- the ingress ----

_RAY_LOST = None


def _lost_errors() -> tuple:
    """Exceptions that mean the replica (not the request) failed."""
    global _RAY_LOST
    if _RAY_LOST is None:
        from ray import exceptions as rx
        from ray.serve import exceptions as sx

        names = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                 "NodeDiedError", "ObjectLostError", "OwnerDiedError")
        errs = [getattr(rx, n) for n in names if hasattr(rx, n)]
        errs += [getattr(sx, n) for n in ("BackPressureError", "DeploymentUnavailableError") if hasattr(sx, n)]
        _RAY_LOST = tuple(errs)
    return _RAY_LOST


def _openai_error(message: str, code: str, status: int) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error" if status >= 500 else
                                 "invalid_request_error", "param": None, "code": code}}).encode()


def build_ingress_app(server, retries: int = 2):
    """The Ingress's ASGI app: every path forwarded to an LLMServer replica
    through `server` (a deployment handle), failing over while nothing has
    reached the client."""
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    stream_handle = server.options(stream=True)

    def is_sse(head) -> bool:
        return any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in head["headers"])

    def complete(head, body: bytes) -> bool:
        """Whether body is all of the answer its head announced (content-length)."""
        for k, v in head["headers"]:
            if k.lower() == "content-length":
                return v.strip().isdigit() and int(v) == len(body)
        return False

    async def forward(request):
        body = await request.body()
        path = request.url.path
        req = {"method": request.method, "path": path, "query": request.url.query.encode("latin-1"),
               "headers": [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS],
               "body": body, "route_key": routing_key(path, body)}
        last = None
        for attempt in range(retries + 1):
            gen = stream_handle.handle_http.remote(req)
            head, chunks, sse = None, [], False
            try:
                head = await gen.__anext__()
                sse = is_sse(head)
                if sse:
                    chunks.append(await gen.__anext__())  # failover stays possible until a byte is out
                else:
                    # a whole answer (JSON, an error) is held until its end:
                    # a replica lost anywhere before that fails over, and
                    # the client never sees half a document
                    async for chunk in gen:
                        chunks.append(chunk)
            except StopAsyncIteration:
                pass
            except _lost_errors() as exc:
                if head is None or sse or not complete(head, b"".join(chunks)):
                    last = exc
                    logger.warning("replica lost before answering (attempt %d): %s", attempt + 1, exc)
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                # the answer arrived whole, only the stream's end was lost
            if head is None:  # the replica's app ended without starting a response
                return Response(_openai_error("the llminfer replica ended the request without an answer",
                                              "replica_no_answer", 502), status_code=502,
                                media_type="application/json")
            headers = dict(head["headers"])
            headers[FAILOVER_HEADER] = str(attempt)
            if not sse:
                headers.pop("content-length", None)  # Response sets it from the body
                return Response(b"".join(chunks), status_code=head["status"], headers=headers)
            return StreamingResponse(_rest(gen, chunks[0] if chunks else b""), status_code=head["status"],
                                     headers=headers)
        return Response(_openai_error(f"no llminfer replica could take the request ({type(last).__name__}); "
                                      f"retry", "replica_unavailable", 503),
                        status_code=503, media_type="application/json", headers={"Retry-After": "1"})

    async def _rest(gen, first):
        """The rest of an event stream; a replica lost mid-stream ends it with
        an OpenAI-shaped error event (the client has the events before it)."""
        if first:
            yield first
        try:
            async for chunk in gen:
                yield chunk
        except _lost_errors() as exc:
            logger.warning("replica lost mid-stream: %s", exc)
            yield b"data: " + _openai_error("the llminfer replica serving this stream was lost; the answer "
                                            "is incomplete: retry the request", "replica_lost", 503) + b"\n\n"

    methods = ["GET", "POST", "PUT", "DELETE", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


@serve.ingress()
class Ingress:
    """The application's HTTP entry: forwards to LLMServer replicas."""

    def __init__(self, server, retries: int = 2):
        self._asgi = build_ingress_app(server, retries)

    def __serve_build_asgi_app__(self):
        return self._asgi


# ---- building the application ----

_SERVER_KEYS = {"n_ctx", "kv_pool_tokens", "kv_type", "max_batch_tokens", "max_running", "max_waiting",
                "prefix_caching", "api_key", "chat_template", "chat_format", "served_model_name",
                "max_body_bytes", "max_tokens_limit"}


def build(model: str, replicas: int | str = 1, threads: int | str = 1, *, autoscale: bool = False,
          min_replicas: int = 1, max_replicas: int | None = None, target_ongoing_requests: int = 8,
          routing: str = "prefix", chunk_chars: int = 128, imbalanced_threshold: int = 4,
          max_ongoing_requests: int = 64, **server_args):
    """The Ray Serve application: Ingress -> LLMServer replicas.

    model: a GGUF path or a model name llminfer can pull; replicas: fixed
    replica count (or, with autoscale, the initial one); threads: CPUs and
    engine threads per replica; routing: "prefix" (PrefixAffinityRouter) or
    "load" (the same router without affinity: power of two choices);
    server_args: llminfer serve's options (n_ctx, kv_pool_tokens, ...)."""
    replicas, threads = int(replicas), int(threads)
    if replicas < 1 or threads < 1:
        raise InvalidArgumentError(f"replicas {replicas} and threads {threads} must be at least 1")
    if routing not in ("prefix", "load"):
        raise InvalidArgumentError(f"routing must be 'prefix' or 'load', not {routing!r}")
    unknown = set(server_args) - _SERVER_KEYS
    if unknown:
        raise InvalidArgumentError(f"unknown server options {sorted(unknown)}; known: {sorted(_SERVER_KEYS)}")
    router = RequestRouterConfig(
        request_router_class=PrefixAffinityRouter,
        request_router_kwargs={"chunk_chars": int(chunk_chars), "imbalanced_threshold": int(imbalanced_threshold),
                               "affinity": routing == "prefix"},
        request_routing_stats_period_s=2, request_routing_stats_timeout_s=10)
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": threads},
        "max_ongoing_requests": int(max_ongoing_requests),
        "health_check_period_s": 5, "health_check_timeout_s": 30,
        "request_router_config": router,
    }
    if autoscale:
        options["autoscaling_config"] = AutoscalingConfig(
            min_replicas=int(min_replicas), initial_replicas=replicas,
            max_replicas=int(max_replicas or max(replicas, min_replicas) * 2),
            target_ongoing_requests=int(target_ongoing_requests),
            policy=AutoscalingPolicy(policy_function=queue_autoscaling_policy))
    else:
        options["num_replicas"] = replicas
    server_cls = serve.deployment(LLMServer, name="LLMServer", **options)
    args = {"model": model, "n_threads": threads, **server_args}
    ingress_cls = serve.deployment(Ingress, name="Ingress", ray_actor_options={"num_cpus": 0},
                                   max_ongoing_requests=4 * int(max_ongoing_requests) * replicas)
    return ingress_cls.bind(server_cls.bind(args))


def app(args: dict):
    """Application builder for `serve run llminfer.integrations.ray_serve:app
    model=... replicas=... threads=...` and for Serve config files
    (import_path with an args mapping). Values from the command line arrive
    as strings; numbers and booleans are converted here."""
    args = dict(args)
    if "model" not in args:
        raise InvalidArgumentError("the llminfer Ray Serve app needs model=PATH_OR_NAME")
    conv = {"replicas": int, "threads": int, "min_replicas": int, "max_replicas": int,
            "target_ongoing_requests": int, "chunk_chars": int, "imbalanced_threshold": int,
            "max_ongoing_requests": int, "n_ctx": int, "kv_pool_tokens": int, "max_batch_tokens": int,
            "max_running": int, "max_waiting": int, "max_body_bytes": int, "max_tokens_limit": int,
            "prefix_caching": lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes"),
            "autoscale": lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")}
    for k, f in conv.items():
        if k in args and args[k] is not None:
            try:
                args[k] = f(args[k])
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(f"{k}={args[k]!r} is not a valid value") from exc
    return build(**args)


def replica_stats(app_name: str = "default", timeout_s: float = 30.0) -> list:
    """Each LLMServer replica's stats ("replica": its id; running, waiting,
    prefix-cache queries and hits, tokens generated), by a broadcast."""
    handle = serve.get_deployment_handle("LLMServer", app_name=app_name)
    return handle.broadcast("stats").results(timeout_s=timeout_s)


def cluster_stats(app_name: str = "default", timeout_s: float = 30.0) -> dict:
    """The replicas' stats summed; "replicas" is how many answered."""
    per = replica_stats(app_name, timeout_s)
    total: dict = {"replicas": len(per)}
    for s in per:
        for k, v in s.items():
            if k != "replica":
                total[k] = total.get(k, 0.0) + v
    return total
