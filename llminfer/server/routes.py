"""Every model-serving route of one Server: OpenAI's (llminfer.server.app),
Anthropic's Messages API (llminfer.server.anthropic), OpenAI's Responses
API (llminfer.server.responses), Ollama's API (llminfer.server.ollama) and reranking
(llminfer.server.rerank). Above them all, so none imports another that imports it back."""

from __future__ import annotations

from llminfer.server import anthropic, ollama, rerank, responses
from llminfer.server.app import Server, openai_routes


def routes(server: Server) -> list:
    return (openai_routes(server) + anthropic.routes(server) + responses.routes(server) + ollama.routes(server) +
            rerank.routes(server))
