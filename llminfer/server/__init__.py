"""`llminfer serve`: an OpenAI-compatible HTTP server with continuous
batching and prefix caching over one Engine.

    llminfer serve -m smollm2-135m-instruct --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")

Layers: app (HTTP, validation, SSE) over scheduler (one engine thread,
continuous batching, preemption) over prefix_cache (blocks by hash chain)
over llminfer.runtime.engine / llminfer.runtime.kv_cache; metrics renders Prometheus text.
router serves many models (--models-dir, --models-config), each its own
app.Server loaded on first use.
anthropic (/v1/messages) and responses (/v1/responses) translate their wire
formats into app's chat path through chatrun, one internal chat run.
Needs the `serve` extra: pip install 'llminfer[serve]'.
"""

from __future__ import annotations

from llminfer.server.args import ServeArgs

__all__ = ["ServeArgs", "create_app", "serve"]


def _need_deps():
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        from llminfer.errors import LLMInferError

        raise LLMInferError(f"the server needs the 'serve' extra ({e.name} is missing): "
                            f"pip install 'llminfer[serve]'") from None


def create_app(engine_args):
    """The ASGI app (see llminfer.server.asgi.create_app)."""
    _need_deps()
    from llminfer.server.asgi import create_app as make

    return make(engine_args)


def bind(host: str, port: int):
    """A TCP socket bound to (host, port), with SO_REUSEADDR as uvicorn
    binds it; an LLMInferError saying why when the address cannot be had
    (taken by another program, a privileged port, an unknown host)."""
    import errno
    import socket

    from llminfer.errors import LLMInferError

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise LLMInferError(f"cannot listen on {host}:{port}: {host!r} is not an address of this machine "
                            f"({e})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = {errno.EADDRINUSE: "the port is in use (another server?); choose another with --port",
               errno.EACCES: "ports below 1024 need privileges; choose another with --port",
               errno.EADDRNOTAVAIL: f"{host} is not an address of this machine"}.get(e.errno, e.strerror)
        raise LLMInferError(f"cannot listen on {host}:{port}: {why}") from None
    return sock


def _url(host, port) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(engine_args, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", log=None):
    """Take the port, then load the model (a port in use fails at once, not
    after the load), say what is served where (log(line); default: stderr),
    and serve it with uvicorn until interrupted."""
    _need_deps()
    import sys

    import uvicorn

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    sock = bind(host, port)
    try:
        app = create_app(engine_args)
        url = _url(host, port)
        router = getattr(app.state, "router", None)
        if router is not None:
            log(f"llminfer serve: {len(router.entries)} models, each loaded when a request names it: "
                + ", ".join(sorted(router.entries)))
            args = router.args
            log(f"  at most {args.models_max_loaded or 'any number of'} loaded at once"
                + (f", within {args.models_memory_gib} GiB" if args.models_memory_gib else "")
                + (f"; unloaded after {args.models_idle_timeout:g} s idle" if args.models_idle_timeout else ""))
        else:
            server = app.state.server
            worker = server.engine if server.engine is not None else server.embedder
            log(f"llminfer serve: model {worker.model_path} (clients name it {server.model_name!r})")
            pool = server.args.kv_pool_tokens or 4 * server.args.n_ctx  # as Server sizes it
            log(f"  context: {server.n_ctx} tokens per request"
                + (f", a KV pool of {pool} tokens for all of them" if server.engine is not None else ""))
            log(f"  threads: {worker.n_threads}")
        log(f"  listening on {url} (OpenAI API: {url}/v1, chat page: {url}/)")
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
