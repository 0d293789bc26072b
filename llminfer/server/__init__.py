"""`llminfer serve`: an OpenAI-compatible HTTP server with continuous
batching and prefix caching over one Engine.

    llminfer serve -m smollm2-135m-instruct --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")

Layers: app (HTTP, validation, SSE) over scheduler (one engine thread,
continuous batching, preemption) over prefix_cache (blocks by hash chain)
over llminfer.engine / llminfer.kv_cache; metrics renders Prometheus text.
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
    """The ASGI app (see llminfer.server.app.create_app)."""
    _need_deps()
    from llminfer.server.app import create_app as make

    return make(engine_args)


def serve(engine_args, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
    """Load the model and serve it with uvicorn until interrupted."""
    _need_deps()
    import uvicorn

    app = create_app(engine_args)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
