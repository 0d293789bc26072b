"""The ASGI app of `llminfer serve`: every model-serving route
(llminfer.server.routes: OpenAI's, Anthropic's, the Responses API) over one
Server. The top floor of the server package: nothing imports it but the
package's create_app.

    from llminfer.server import ServeArgs, create_app
    app = create_app(ServeArgs(model="smollm2-135m-instruct"))
    # uvicorn.run(app, host="127.0.0.1", port=8000), or mount it in another app
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from llminfer.server import page
from llminfer.server.app import Server, not_found
from llminfer.server.args import ServeArgs
from llminfer.server.routes import routes


def create_app(engine_args: ServeArgs | dict) -> Starlette:
    """The ASGI app of `llminfer serve`. engine_args: a ServeArgs, or a dict
    of its fields. The model loads here (errors surface at once); the engine
    thread starts with the app's lifespan and stops with it. With
    models_dir or models_config, many models, each loaded when first asked
    for (llminfer.server.router). The chat page and /docs come with it
    (llminfer.server.page)."""
    args = engine_args if isinstance(engine_args, ServeArgs) else ServeArgs(**engine_args)
    if args.multi_model:  # many models, each loaded when first asked for
        from llminfer.server import router

        return router.create_app(args)
    server = Server(args)

    @asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            await run_in_threadpool(server.stop)

    app = Starlette(routes=routes(server) + page.routes(), lifespan=lifespan,
                    exception_handlers={404: not_found, 405: not_found})
    app.state.server = server
    return app
