"""Reranking over HTTP: POST /v1/rerank (and llama-server's aliases
/rerank, /reranking, /v1/reranking), in llama-server's shape, which is
Jina's and Cohere's:

    {"model": "any", "query": "what is a panda?", "documents": ["hi", "The giant panda is a bear."],
     "top_n": 1, "return_documents": true}
    -> {"model": ..., "object": "list",
        "results": [{"index": 1, "relevance_score": 4.2, "document": {"text": "The giant panda ..."}}],
        "usage": {"prompt_tokens": 21, "total_tokens": 21}}

results are best first, top_n of them (all by default); a document is a
string or {"text": ...}; return_documents (default false, as llama-server
answers) echoes each as {"text": ...}. With `texts` in place of
`documents`, the answer is TEI's: a bare list of {index, score[, text]}
(text with return_text). The scores are the reranker's raw outputs
(llminfer.generation.rerank), as llama-server gives them. The model must be a
reranker (a GGUF whose pooling_type is rank): a cross-encoder runs on its
Embedder, a decoder reranker (Qwen3-Reranker) on the engine thread between
batching steps, one document a step, as embeddings do. Others get a 400.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

from llminfer.generation import rerank
from llminfer.errors import ContextFullError, InvalidArgumentError, LLMInferError
from llminfer.generation.embeddings import engine_hidden
from llminfer.server.app import bad_request, on_engine, openai_endpoint

MAX_RERANK_DOCUMENTS = 256  # documents of one request
PATHS = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")


def _request(body) -> tuple:
    """(query, document texts, top_n, return_documents, tei) of a rerank request."""
    query = body.get("query")
    if query is None:
        raise bad_request("query must be given", "query")
    if not isinstance(query, str):
        raise bad_request("query must be a string", "query")
    tei = "documents" not in body and "texts" in body
    key = "texts" if tei else "documents"
    docs = body.get(key)
    if docs is None:
        raise bad_request(f"{key} must be given: a non-empty list of strings", key)
    try:
        texts = rerank.documents_texts(docs)
    except InvalidArgumentError as e:
        raise bad_request(str(e), key) from None
    if not texts:
        raise bad_request(f"{key} must be a non-empty list of strings", key)
    if len(texts) > MAX_RERANK_DOCUMENTS:
        raise bad_request(f"at most {MAX_RERANK_DOCUMENTS} documents in one request, got {len(texts)}", key)
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise bad_request("top_n must be a positive integer", "top_n")
    flag = "return_text" if tei else "return_documents"
    ret = body.get(flag, False)
    if not isinstance(ret, bool):
        raise bad_request(f"{flag} must be a boolean", flag)
    return query, texts, top_n, ret, tei


def _not_reranker(server):
    return bad_request(f"{server.model_name} is not a reranker: /v1/rerank needs a GGUF whose pooling_type is "
                f"rank (4), with a classifier head", "model", "model_not_reranker")


class _DecoderRanker:
    """A decoder reranker served by the engine: the pair's ids here, the
    scores on the engine thread."""

    def __init__(self, server):
        self.server = server
        gguf = server.engine.gguf
        self.metadata = gguf.metadata
        self.head = rerank.read_head(gguf, server.n_embd, decoder=True)

    def rank_ids(self, query, texts) -> list:
        out = []
        for i, d in enumerate(texts):
            ids = rerank.pair_ids(self.server.tokenizer, self.metadata, query, d)
            rerank.check_length(ids, self.server.n_ctx, i)
            out.append(ids)
        return out

    async def scores(self, items) -> list:
        head = self.head

        def work(ids):
            return lambda eng: head.score(engine_hidden(eng, ids)[head.row])

        return await on_engine(self.server, items, work, "rerank request")


def _ranker(server):
    """What scores this server's documents: its Embedder (a cross-encoder),
    or the engine (a decoder reranker)."""
    emb = server.embedder
    if emb is not None:
        if not emb.is_reranker:
            raise _not_reranker(server)
        return emb
    ranker = getattr(server, "_decoder_ranker", None)
    if ranker is None:
        gguf = server.engine.gguf
        if not rerank.declares_rank(gguf.metadata, gguf.architecture):
            raise _not_reranker(server)
        ranker = server._decoder_ranker = _DecoderRanker(server)
    return ranker


async def rerank_endpoint(server, request: HTTPRequest):
    body = await server.read_json(request)
    server.check_model(body)
    query, texts, top_n, ret, tei = _request(body)
    ranker = _ranker(server)
    try:
        items = await run_in_threadpool(ranker.rank_ids, query, texts)
    except ContextFullError as e:
        raise bad_request(str(e), "documents", "context_length_exceeded") from None
    except LLMInferError as e:
        raise bad_request(f"cannot tokenize the request: {e}", "documents") from None
    if isinstance(ranker, _DecoderRanker):
        scores = await ranker.scores(items)
    else:
        scores = await run_in_threadpool(ranker.rank_scores, items)
    results = rerank.ranked(scores, texts, top_n, ret)
    if tei:
        return JSONResponse([{"index": r["index"], "score": r["relevance_score"],
                              **({"text": r["document"]["text"]} if ret else {})} for r in results])
    n = sum(len(ids) for ids in items)
    return JSONResponse({"model": server.model_name, "object": "list", "results": results,
                         "usage": {"prompt_tokens": n, "total_tokens": n}})


def routes(server) -> list:
    from starlette.routing import Route

    return [Route(p, openai_endpoint(server, rerank_endpoint), methods=["POST"]) for p in PATHS]
