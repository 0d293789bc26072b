"""The server's pages: a chat page at / (static HTML, JS and CSS shipped in
the package, no build step, no network but this server), /docs (the routes,
read from /openapi.json) and /openapi.json (llminfer.server.openapi, over
the routes of the app it is served from). None of them needs the API key:
they hold no data; the page sends the key the user gives it."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

STATIC = {"chat.js": "text/javascript", "chat.css": "text/css", "docs.js": "text/javascript", "docs.css": "text/css",
          "index.html": "text/html", "docs.html": "text/html"}
# the page runs nothing from elsewhere: scripts and styles from here only
_HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'",
            "x-content-type-options": "nosniff", "cache-control": "no-cache"}


def _file(name: str) -> Response:
    data = resources.files("llminfer.server").joinpath("static", name).read_bytes()
    kind = STATIC[name]
    return Response(data, media_type=f"{kind}; charset=utf-8", headers=_HEADERS)


async def index(request: HTTPRequest):
    return _file("index.html")


async def docs(request: HTTPRequest):
    return _file("docs.html")


async def static(request: HTTPRequest):
    name = request.path_params["name"]
    if name not in STATIC:
        from llminfer.server.app import APIError

        return APIError(404, f"no file /static/{name[:100]}", type_="invalid_request_error").response()
    return _file(name)


async def openapi_json(request: HTTPRequest):
    from llminfer.server.openapi import document

    return JSONResponse(document(request.app.routes))


def routes() -> list:
    return [Route("/", index, methods=["GET"]), Route("/docs", docs, methods=["GET"]),
            Route("/static/{name}", static, methods=["GET"]),
            Route("/openapi.json", openapi_json, methods=["GET"])]
