"""The ASGI app of `llminfer serve`: the OpenAI routes (llminfer.server.app),
Anthropic's Messages API (llminfer.server.anthropic) and OpenAI's Responses
API (llminfer.server.responses) over one Server. The top floor of the
server package: the modules it joins build on app, none on this one.

    from llminfer.server import ServeArgs, create_app
    app = create_app(ServeArgs(model="smollm2-135m-instruct"))
    # uvicorn.run(app, host="127.0.0.1", port=8000), or mount it in another app
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from llminfer.server import anthropic, responses
from llminfer.server.app import Server, not_found, openai_routes
from llminfer.server.args import ServeArgs


def create_app(engine_args: ServeArgs | dict) -> Starlette:
    """The ASGI app of `llminfer serve`. engine_args: a ServeArgs, or a dict
    of its fields. The model loads here (errors surface at once); the engine
    thread starts with the app's lifespan and stops with it."""
    args = engine_args if isinstance(engine_args, ServeArgs) else ServeArgs(**engine_args)
    server = Server(args)

    @asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            await run_in_threadpool(server.stop)

    routes = openai_routes(server) + anthropic.routes(server) + responses.routes(server)
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.server = server
    return app
