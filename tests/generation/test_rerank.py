"""Reranking (llminfer.generation.rerank, Embedder.rank, LLM.rank, /v1/rerank): a tiny
random bert cross-encoder with a classifier head (pooling_type 4) and a tiny
random Qwen3-Reranker-style decoder, scored against a float64 reference of
the model and head, the (query, document) input as llama.cpp's server
builds it, the Python and HTTP shapes and their errors, and (peer_tools)
llama.cpp's llama-server --rerank on the same files."""

import glob
import os
import shutil
import socket
import subprocess
import time

import gguf
import numpy as np
import pytest

try:
    import httpx
except ImportError:  # the HTTP tests skip
    httpx = None

from llminfer import LLM, Embedder
from llminfer.compat.llama import Llama
from llminfer.errors import ContextFullError, InvalidArgumentError, UnsupportedModelError
from reference import ReferenceModel
from tiny_models import QWEN3_RERANK_TEMPLATE, write_decoder_reranker, write_encoder

QUERY = "Is the cat on the mat?"
DOCS = ["The cat sat on the mat.", "a good dog ran", "", "Is the mat good? 42", "cats and mats"]

# a score is a dot product over n_embd of the head's input; the hidden
# states' tolerance (tests/generation/test_embeddings.py: 3e-3 F32, 0.1 Q8_0) grows
# through it
TOL = {"F32": 2e-2, "Q8_0": 0.3}


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerankers")
    out = {}
    for qtype in ("F32", "Q8_0"):
        out["full", qtype] = write_encoder(d / f"rr-{qtype}.gguf", qtype=qtype, pooling=4, rank_head="full",
                                           seed=3)
    out["dense", "F32"] = write_encoder(d / "rr-dense.gguf", qtype="F32", pooling=4, rank_head="dense", seed=4)
    out["out", "F32"] = write_encoder(d / "rr-out.gguf", qtype="F32", pooling=4, rank_head="out", n_labels=2,
                                      seed=5)
    out["headless"] = write_encoder(d / "rr-headless.gguf", pooling=4, seed=6)
    out["embedder"] = write_encoder(d / "plain.gguf", seed=7)
    for qtype in ("F32", "Q8_0"):
        out["qwen3", qtype] = write_decoder_reranker(d / f"qwen3-rr-{qtype}.gguf", qtype=qtype)
    out["qwen3-plain"] = write_decoder_reranker(d / "qwen3.gguf", rank=False)
    return out


def reference_scores(path, ids_list) -> list:
    """The first token's float64 hidden state through the head (a decoder:
    the last token's final normed state through cls.output, softmax), the
    head's tensors read with gguf-py."""
    ref = ReferenceModel(path)
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in gguf.GGUFReader(path).tensors
         if x.name.startswith("cls.")}
    out = []
    for ids in ids_list:
        if ref.arch == "qwen3":
            z = t["cls.output.weight"] @ ref.hidden(ids)[-1].astype(np.float64)
            z = np.exp(z - z.max())
            out.append(float(z[0] / z.sum()))
            continue
        x = ref.encoder(ids)[0].astype(np.float64)
        if "cls.weight" in t:
            x = np.tanh(t["cls.weight"] @ x + t["cls.bias"])
        if "cls.output.weight" in t:
            x = t["cls.output.weight"] @ x + t["cls.output.bias"]
        out.append(float(x[0]))
    return out


@pytest.mark.parametrize("head,qtype", [("full", "F32"), ("full", "Q8_0"), ("dense", "F32"), ("out", "F32")])
def test_scores_match_reference(rerankers, head, qtype):
    path = rerankers[head, qtype]
    with Embedder(path, n_threads=2) as e:
        assert e.is_reranker
        items = e.rank_ids(QUERY, DOCS)
        got = e.rank(QUERY, DOCS)
        want = reference_scores(path, items)
        np.testing.assert_allclose(got, want, atol=TOL[qtype], rtol=0)
        assert len(set(np.round(want, 3))) == len(DOCS)  # the documents are told apart
        if qtype == "F32":  # the order follows (the scores are further apart than the tolerance)
            assert np.argsort(got).tolist() == np.argsort(want).tolist()
        # a document as {"text": ...} is the same document
        assert e.rank(QUERY, [{"text": d} for d in DOCS]) == got


def test_pair_is_laid_out_as_llama_cpp_does(rerankers):
    """Without a rerank template, a WordPiece vocabulary's pair is
    [CLS] query [SEP] document: add_bos, add_sep, no add_eos (llama.cpp's
    format_prompt_rerank)."""
    with Embedder(rerankers["full", "F32"], n_threads=1) as e:
        tok = e.tokenizer
        q, d = tok.encode(QUERY, add_bos=False), tok.encode(DOCS[0], add_bos=False)
        assert e.rank_ids(QUERY, DOCS[:1]) == [[101] + q + [102] + d]
        assert e.rank_ids(QUERY, [""]) == [[101] + q + [102]]


def test_create_rerank_shape(rerankers):
    with Embedder(rerankers["full", "F32"], n_threads=1) as e:
        scores = e.rank(QUERY, DOCS)
        order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
        r = e.create_rerank(QUERY, DOCS, model="m")
        assert r["model"] == "m" and r["object"] == "list"
        assert [x["index"] for x in r["results"]] == order
        assert [x["relevance_score"] for x in r["results"]] == [scores[i] for i in order]
        assert all("document" not in x for x in r["results"])
        n = sum(len(ids) for ids in e.rank_ids(QUERY, DOCS))
        assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}
        top = e.create_rerank(QUERY, DOCS, top_n=2, return_documents=True)["results"]
        assert [x["index"] for x in top] == order[:2]
        assert [x["document"] for x in top] == [{"text": DOCS[i]} for i in order[:2]]


def test_rank_errors(rerankers):
    with Embedder(rerankers["full", "F32"], n_threads=1) as e:
        with pytest.raises(InvalidArgumentError, match="documents"):
            e.rank(QUERY, [])
        with pytest.raises(InvalidArgumentError, match="documents"):
            e.rank(QUERY, "a document, not a list")
        with pytest.raises(InvalidArgumentError, match="document"):
            e.rank(QUERY, ["ok", 3])
        with pytest.raises(InvalidArgumentError, match="query"):
            e.rank(None, ["ok"])
        with pytest.raises(ContextFullError, match="document 1"):
            e.rank(QUERY, ["ok", "word " * 80])
        with pytest.raises(InvalidArgumentError, match="top_n"):
            e.create_rerank(QUERY, DOCS, top_n=0)
    with Embedder(rerankers["embedder"], n_threads=1) as e:
        assert not e.is_reranker
        with pytest.raises(UnsupportedModelError, match="not a reranker"):
            e.rank(QUERY, DOCS)
    with pytest.raises(UnsupportedModelError, match="classifier head"):
        Embedder(rerankers["headless"], n_threads=1)


def test_reranker_still_embeds(rerankers):
    """A reranker's embeddings are its first token's state (pooling cls)."""
    path = rerankers["full", "F32"]
    with Embedder(path, n_threads=1) as e:
        assert e.pooling == "cls"
        ids = e.tokenizer.encode(QUERY)
        h = ReferenceModel(path).encoder(ids)[0]
        v = np.array(e.embed(QUERY))
        assert float(v @ (h / np.linalg.norm(h))) > 0.9999


# ---- decoder rerankers (Qwen3-Reranker) ----

# P(yes) of the tiny model lies near 0.1; the final hidden states' tolerance
# (tests/models/test_forward.py) through a head of scale 2/sqrt(n_embd)
TOL_DECODER = {"F32": 1e-4, "Q8_0": 5e-3}


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_decoder_scores_match_reference(rerankers, qtype):
    path = rerankers["qwen3", qtype]
    with Embedder(path, n_threads=2) as e:
        assert e.is_reranker and e.pooling == "last"
        items = e.rank_ids(QUERY, DOCS)
        got = e.rank(QUERY, DOCS)
        want = reference_scores(path, items)
        np.testing.assert_allclose(got, want, atol=TOL_DECODER[qtype], rtol=0)
        assert len(set(np.round(want, 4))) == len(DOCS) and all(0 < w < 1 for w in want)
        # the prompt is the GGUF's rerank template, its special tokens read, none added
        text = QWEN3_RERANK_TEMPLATE.replace("{query}", QUERY).replace("{document}", DOCS[0])
        assert items[0] == e.tokenizer.encode(text, add_bos=False, special=True)
        assert items[0][0] == e.tokenizer.token_id("<|im_start|>")
    llm = LLM(path, n_ctx=512, n_threads=2)
    try:
        assert llm.rank(QUERY, DOCS) == got
        assert llm.create_rerank(QUERY, DOCS, top_n=1)["results"][0]["index"] == int(np.argmax(got))
    finally:
        llm.close()
    peer_like = Llama(path, n_ctx=512, n_threads=2, embedding=True, verbose=False)
    try:
        assert peer_like.rank(QUERY, DOCS) == got
    finally:
        peer_like.close()


def test_decoder_not_a_reranker(rerankers):
    with Embedder(rerankers["qwen3-plain"], n_threads=1) as e:
        assert not e.is_reranker
        with pytest.raises(UnsupportedModelError, match="not a reranker"):
            e.rank(QUERY, DOCS)
    llm = LLM(rerankers["qwen3-plain"], n_ctx=256, n_threads=1)
    try:
        with pytest.raises(UnsupportedModelError, match="not a reranker"):
            llm.rank(QUERY, DOCS)
    finally:
        llm.close()


# ---- over HTTP ----

@pytest.fixture(scope="module")
def served(rerankers):
    pytest.importorskip("starlette", reason="the server needs starlette")
    pytest.importorskip("uvicorn", reason="the server needs uvicorn")
    pytest.importorskip("httpx", reason="the server tests speak through httpx")
    from llminfer.server import ServeArgs
    from servers import ServerThread

    s = ServerThread(ServeArgs(model=rerankers["full", "F32"], n_ctx=64, n_threads=1))
    plain = ServerThread(ServeArgs(model=rerankers["embedder"], n_ctx=64, n_threads=1))
    yield s, plain
    s.stop()
    plain.stop()


@pytest.fixture(scope="module")
def served_decoders(rerankers, served):
    from llminfer.server import ServeArgs
    from servers import ServerThread

    s = ServerThread(ServeArgs(model=rerankers["qwen3", "F32"], n_ctx=512, n_threads=1))
    plain = ServerThread(ServeArgs(model=rerankers["qwen3-plain"], n_ctx=512, n_threads=1))
    yield s, plain
    s.stop()
    plain.stop()


def test_server_rerank_decoder(served_decoders, rerankers):
    s, plain = served_decoders
    with Embedder(rerankers["qwen3", "F32"], n_threads=1) as e:
        scores = e.rank(QUERY, DOCS)
        n = sum(len(ids) for ids in e.rank_ids(QUERY, DOCS))
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    r = httpx.post(s.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 3,
                                               "return_documents": True}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["index"] for x in body["results"]] == order[:3]
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], [scores[i] for i in order[:3]],
                               rtol=0, atol=1e-6)
    assert [x["document"]["text"] for x in body["results"]] == [DOCS[i] for i in order[:3]]
    assert body["usage"]["prompt_tokens"] == n
    r = httpx.post(s.url + "/v1/rerank", json={"query": QUERY, "documents": ["x " * 400]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(plain.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_reranker"


def test_server_rerank(served, rerankers):
    s, _ = served
    with Embedder(rerankers["full", "F32"], n_threads=1) as e:
        scores = e.rank(QUERY, DOCS)
        n = sum(len(ids) for ids in e.rank_ids(QUERY, DOCS))
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking"):
        r = httpx.post(s.url + path, json={"model": "anything", "query": QUERY, "documents": DOCS}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"]
        assert [x["index"] for x in body["results"]] == order
        np.testing.assert_allclose([x["relevance_score"] for x in body["results"]], [scores[i] for i in order],
                                   rtol=0, atol=1e-6)
        assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    r = httpx.post(s.url + "/v1/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                               "top_n": 2, "return_documents": True}, timeout=60).json()
    assert [x["index"] for x in r["results"]] == order[:2]
    assert [x["document"] for x in r["results"]] == [{"text": DOCS[i]} for i in order[:2]]
    # TEI's shape
    r = httpx.post(s.url + "/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}, timeout=60).json()
    assert [x["index"] for x in r] == order and [x["text"] for x in r] == [DOCS[i] for i in order]
    assert all(set(x) == {"index", "score", "text"} for x in r)


@pytest.mark.parametrize("body,param", [
    ({"documents": DOCS}, "query"),
    ({"query": 3, "documents": DOCS}, "query"),
    ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": "one"}, "documents"),
    ({"query": QUERY, "documents": ["a", {"txt": "b"}]}, "documents"),
    ({"query": QUERY, "documents": ["a"] * 257}, "documents"),
    ({"query": QUERY, "documents": ["a", "word " * 80]}, "documents"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents"),
    ({"query": QUERY, "documents": DOCS, "model": 5}, "model"),
])
def test_server_rerank_bad_requests(served, body, param):
    s, _ = served
    r = httpx.post(s.url + "/v1/rerank", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    if param == "documents" and isinstance(body.get("documents"), list) and len(body["documents"]) == 2 \
            and isinstance(body["documents"][1], str):
        assert err["code"] == "context_length_exceeded"


def test_server_rerank_needs_a_reranker(served):
    _, plain = served
    r = httpx.post(plain.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "model_not_reranker"


# ---- llama.cpp's llama-server ----

def find_llama_server():
    exe = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if exe:
        return exe
    found = sorted(glob.glob("/work/peer/*/vendor/llama.cpp/build/bin/llama-server"))
    return found[0] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.peer_tools
@pytest.mark.parametrize("head,qtype", [("full", "F32"), ("full", "Q8_0"), ("dense", "F32"), ("out", "F32"),
                                        ("qwen3", "F32"), ("qwen3", "Q8_0")])
def test_llama_server_rerank_agrees(rerankers, tmp_path, head, qtype):
    exe = find_llama_server()
    if httpx is None:
        pytest.skip("httpx is not installed")
    if exe is None:
        pytest.skip("llama.cpp's llama-server is not found ($LLAMA_SERVER, PATH, /work/peer)")
    path = rerankers[head, qtype]
    port = _free_port()
    ctx = "512" if head == "qwen3" else "64"
    # -np 1: one document a batch. With several in one batch, llama.cpp reads
    # n_cls_out floats at n_cls_out * seq_idx of the pooled rows, which for a
    # head without cls.output (rows of n_embd) are the first document's
    log = open(tmp_path / "llama-server.log", "w")
    proc = subprocess.Popen([exe, "-m", path, "--rerank", "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                             "-c", ctx, "-b", ctx, "-ub", ctx, "-np", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "llama-server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "llama-server did not start"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        theirs = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=120).json()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    with Embedder(path, n_threads=2) as e:
        ours = e.create_rerank(QUERY, DOCS)
    assert ours["usage"] == theirs["usage"]  # the same tokens
    t = {x["index"]: x["relevance_score"] for x in theirs["results"]}
    o = {x["index"]: x["relevance_score"] for x in ours["results"]}
    assert set(t) == set(o) == set(range(len(DOCS)))
    diff = max(abs(t[i] - o[i]) for i in t)
    print(f"{head} {qtype}: max |ours - llama-server| = {diff:.2e} over {len(DOCS)} documents")
    assert diff < (TOL_DECODER if head == "qwen3" else TOL)[qtype]
    if qtype == "F32":
        assert [x["index"] for x in ours["results"]] == [x["index"] for x in theirs["results"]]


def test_router_serves_rerankers(served, rerankers, tmp_path):
    """With --models-dir, /v1/rerank goes to the model the request names: a
    cross-encoder and a decoder reranker side by side."""
    from llminfer.server import ServeArgs
    from servers import ServerThread

    shutil.copy(rerankers["full", "F32"], tmp_path / "cross.gguf")
    shutil.copy(rerankers["qwen3", "F32"], tmp_path / "decoder.gguf")
    s = ServerThread(ServeArgs(models_dir=str(tmp_path), n_ctx=512, n_threads=1))
    try:
        for name, key in (("cross", ("full", "F32")), ("decoder", ("qwen3", "F32"))):
            with Embedder(rerankers[key], n_threads=1) as e:
                want = e.rank(QUERY, DOCS)
            r = httpx.post(s.url + "/v1/rerank", json={"model": name, "query": QUERY, "documents": DOCS},
                           timeout=120)
            assert r.status_code == 200, r.text
            got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
            np.testing.assert_allclose([got[i] for i in range(len(DOCS))], want, rtol=0, atol=1e-6)
            assert r.json()["model"] == name
    finally:
        s.stop()
