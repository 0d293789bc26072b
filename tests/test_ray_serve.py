"""llminfer behind Ray Serve: a local Ray cluster on loopback (2 CPUs), two
replicas of one thread each, the real `openai` client.

Checked: answers through the router are the ones one server gives alone;
requests sharing a prefix land where it is cached (prefix-cache hits); a
replica killed under load is restarted, every request in flight either
completes or ends with a clear retryable error, and the service keeps
answering. Skipped where Ray Serve or the openai client is not installed.
"""

from __future__ import annotations

import concurrent.futures as cf
import socket
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'llminfer[ray]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'llminfer[ray]')")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
pytest.importorskip("llminfer.server", reason="llminfer's server is not in this build")

from llminfer.integrations import ray_serve as rs  # noqa: E402

pytestmark = pytest.mark.timeout(600) if hasattr(pytest.mark, "timeout") else []

SYSTEMS = [
    "You are a helpful assistant who answers in one short sentence about geography and nothing else. " * 3,
    "You are a pirate who answers every question with a nautical metaphor and a short rhyme at the end. " * 3,
]
QUESTIONS = ["What is the capital of France?", "Name a large river.", "Where is Mount Fuji?",
             "What ocean lies west of Portugal?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=False, log_to_driver=False,
             configure_logging=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


def _deploy(model_path, port, routing):
    app = rs.build(model=str(model_path), replicas=2, threads=1, routing=routing, n_ctx=1024,
                   kv_pool_tokens=4096)
    serve.run(app, name="llminfer", route_prefix="/", blocking=False)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        st = serve.status().applications.get("llminfer")
        if st is not None and st.status == "RUNNING":
            return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                 timeout=120)
        time.sleep(1)
    raise AssertionError(f"the Serve application did not start: {serve.status()}")


def _chat(client, system, question, max_tokens=12, stream=False):
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    if not stream:
        r = client.chat.completions.create(model="llminfer", messages=msgs, max_tokens=max_tokens, temperature=0)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = [], None
    for ev in client.chat.completions.create(model="llminfer", messages=msgs, max_tokens=max_tokens,
                                             temperature=0, stream=True):
        if ev.choices:
            text.append(ev.choices[0].delta.content or "")
            finish = ev.choices[0].finish_reason or finish
    return "".join(text), finish


def test_routing_key_and_chunks():
    body = b'{"messages": [{"role": "system", "content": "abc"}, {"role": "user", "content": "d"}]}'
    key = rs.routing_key("/v1/chat/completions", body)
    assert key == "<system>abc<user>d"
    assert rs.routing_key("/v1/completions", b'{"prompt": "hello"}') == "hello"
    assert rs.routing_key("/v1/completions", b"not json") == ""
    assert rs.routing_key("/v1/models", b"") == ""
    a, b = rs.chunk_hashes("x" * 300 + "A", 128), rs.chunk_hashes("x" * 300 + "B", 128)
    assert len(a) == 2 and a == b  # the differing character is past the last whole chunk
    c = rs.chunk_hashes("y" + "x" * 299, 128)
    assert c[0] != a[0] and c[1] != a[1]  # a chain: an early difference changes every later hash


def test_app_builder_validates_arguments():
    with pytest.raises(rs.InvalidArgumentError, match="model"):
        rs.app({})
    with pytest.raises(rs.InvalidArgumentError, match="replicas"):
        rs.app({"model": "x", "replicas": "many"})
    with pytest.raises(rs.InvalidArgumentError, match="routing"):
        rs.build(model="x", routing="round-robin")
    with pytest.raises(rs.InvalidArgumentError, match="unknown server options"):
        rs.build(model="x", n_gpu_layerz=3)


def test_served_answers_prefix_affinity_and_replica_loss(cluster, smollm2_path):
    client = _deploy(smollm2_path, cluster, routing="prefix")
    try:
        # one request at a time: what each question gets alone
        alone = {(s, q): _chat(client, s, q)[0] for s in SYSTEMS for q in QUESTIONS[:2]}
        # concurrent chats sharing the two system prompts get exactly the same text
        jobs = [(s, q) for s in SYSTEMS for q in QUESTIONS[:2]] * 3
        with cf.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda sq: _chat(client, *sq), jobs))
        for (s, q), (text, _) in zip(jobs, got):
            assert text == alone[(s, q)]

        stats = rs.cluster_stats("llminfer")
        assert stats["replicas"] == 2
        assert stats["prefix_queries"] > 0
        # every request after a system prompt's first went where that prompt's blocks are
        assert stats["prefix_hits"] / stats["prefix_queries"] > 0.5, stats

        # a replica killed under load
        replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                    if "LLMServer" in a["name"]]
        assert len(replicas) == 2, replicas
        outcomes = []

        def one(i):
            s, q = SYSTEMS[i % 2], QUESTIONS[i % len(QUESTIONS)]
            try:
                text, finish = _chat(client, s, q, max_tokens=24, stream=bool(i % 2))
                return ("ok", finish, text)
            except openai.APIStatusError as exc:
                return ("error", exc.status_code, str(exc))
            except openai.APIError as exc:  # a stream ended by the router's error event
                return ("error", None, str(exc))

        with cf.ThreadPoolExecutor(12) as ex:
            futs = [ex.submit(one, i) for i in range(24)]
            time.sleep(1.5)
            victim = ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"])
            ray.kill(victim, no_restart=False)
            for f in futs:
                outcomes.append(f.result(timeout=300))  # none hangs
        for kind, code, detail in outcomes:
            if kind == "ok":
                assert code in ("stop", "length"), detail
            else:
                # clear and retryable: 503 with the router's message, or the stream's error event
                assert code in (503, None) and ("replica" in detail), detail
        assert sum(k == "ok" for k, _, _ in outcomes) > 0

        # the service keeps answering, and Ray brings the replica back
        assert _chat(client, SYSTEMS[0], QUESTIONS[0])[0] == alone[(SYSTEMS[0], QUESTIONS[0])]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            dep = serve.status().applications["llminfer"].deployments["LLMServer"]
            if dep.status == "HEALTHY" and dep.replica_states.get("RUNNING", 0) == 2:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"the killed replica was not restarted: {serve.status()}")
        assert rs.cluster_stats("llminfer")["replicas"] == 2
    finally:
        serve.delete("llminfer")
