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
import json
import os
import socket
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'llminfer[ray]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'llminfer[ray]')")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
pytest.importorskip("llminfer.server", reason="llminfer's server is not in this build")

from llminfer.integrations import ray_serve as rs  # noqa: E402


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
def cluster(tmp_path_factory):
    # Ray's workers start in the driver's working directory and put it first
    # on their path: outside the checkout, they import the installed package
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray"))
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=False, log_to_driver=False,
             configure_logging=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
        os.chdir(here)


def _deploy(model_path, port, routing):
    app = rs.build(model=str(model_path), replicas=2, threads=1, routing=routing, n_ctx=1024,
                   served_model_name="llminfer",
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


def _chat(client, system, question, max_tokens=12, stream=False, failovers=None):
    """(text, finish_reason); failovers (a list) gets the router's failover count."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    raw = client.chat.completions.with_raw_response.create(model="llminfer", messages=msgs, max_tokens=max_tokens,
                                                           temperature=0, stream=stream)
    if failovers is not None:
        failovers.append(int(raw.headers.get(rs.FAILOVER_HEADER, "0")))
    r = raw.parse()
    if not stream:
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = [], None
    for ev in r:
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
    # nested thousands deep: no key (the replica answers 400), not a RecursionError in the ingress
    assert rs.routing_key("/v1/completions", b'{"prompt": "a", "x": ' + b"[" * 50000 + b"]" * 50000 + b"}") == ""
    assert rs.routing_key("/v1/chat/completions", b'{"messages": [{"role": "user", "content": '
                          + b"[" * 5000 + b"]" * 5000 + b"}]}") == ""
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
        # at most 4 in flight: the router sends a request to its prefix's
        # replica unless that queue is more than imbalanced_threshold (4)
        # longer than the shortest, so every request here follows its
        # prefix. With 8, a burst could overflow to the other replica, cold
        # for that prompt, and the hit ratio below fell to 0.47 in one CI run
        # on 2 loaded cores (0.5+ in others): a test of timing, not routing.
        with cf.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda sq: _chat(client, *sq), jobs))
        for (s, q), (text, _) in zip(jobs, got):
            assert text == alone[(s, q)]

        # the server's other endpoints pass through the Ingress as they are
        vec = client.embeddings.create(model="llminfer", input=["a cat", "a dog"])
        assert [d.index for d in vec.data] == [0, 1] and len(vec.data[0].embedding) == 576
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["n"], "additionalProperties": False}
        out = client.chat.completions.create(
            model="llminfer", messages=[{"role": "user", "content": "A number?"}], max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        assert 0 <= json.loads(out.choices[0].message.content)["n"] <= 9

        stats = rs.cluster_stats("llminfer")
        assert stats["replicas"] == 2
        assert stats["prefix_queries"] > 0
        # every request after a system prompt's first went where that prompt's blocks are
        assert stats["prefix_hits"] / stats["prefix_queries"] > 0.5, stats

        # a replica killed under load, while it holds requests
        replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                    if "LLMServer" in a["name"]]
        assert len(replicas) == 2, replicas
        outcomes, failovers = [], []

        def one(i):
            s, q = SYSTEMS[i % 2], QUESTIONS[i % len(QUESTIONS)]
            try:
                text, finish = _chat(client, s, q, max_tokens=24, stream=bool(i // 2 % 2),
                                     failovers=failovers)
                return ("ok", finish, text)
            except openai.APIStatusError as exc:
                return ("error", exc.status_code, str(exc))
            except openai.APIError as exc:  # a stream ended by the router's error event
                return ("error", None, str(exc))

        with cf.ThreadPoolExecutor(12) as ex:
            futs = [ex.submit(one, i) for i in range(24)]
            deadline, busy = time.monotonic() + 60, None
            while busy is None and time.monotonic() < deadline:
                busy = next((r["replica"] for r in rs.replica_stats("llminfer") if r["running"] >= 2), None)
            assert busy is not None, "no replica ever held two requests"
            victim = next(a for a in replicas if a["name"].endswith("#" + busy))
            ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=False)
            for f in futs:
                outcomes.append(f.result(timeout=300))  # none hangs
        for kind, code, detail in outcomes:
            if kind == "ok":
                assert code in ("stop", "length"), detail
            else:
                # clear and retryable: 503 with the router's message, or the stream's error event
                assert code in (503, None) and ("replica" in detail), detail
        errors = [(c, d[:100]) for k, c, d in outcomes if k != "ok"]
        # the killed replica held requests: each was failed over or ended with the error
        assert sum(failovers) + len(errors) >= 1, (failovers, errors)
        print(f"\nreplica kill: {len(outcomes) - len(errors)} of {len(outcomes)} completed "
              f"({sum(f > 0 for f in failovers)} after failing over), errors: {errors}; prefix stats: {stats}")

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
        while True:  # the handle's replica list catches up with the restart
            try:
                if rs.cluster_stats("llminfer", timeout_s=10)["replicas"] == 2:
                    break
            except ray.exceptions.RayError:
                pass
            assert time.monotonic() < deadline, "the restarted replica never answered"
            time.sleep(1)
    finally:
        serve.delete("llminfer")


def test_queue_autoscaling_policy_follows_the_servers_queue():
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

    def ctx(running, waiting, lo=1, hi=4):
        ids = [f"r{i}" for i in range(len(running))]
        return AutoscalingContext(
            deployment_id=None, deployment_name="LLMServer", app_name="llminfer",
            current_num_replicas=len(ids), target_num_replicas=len(ids), running_replicas=ids,
            total_num_requests=0.0, total_queued_requests=0.0,
            aggregated_metrics={"running": dict(zip(ids, running)), "waiting": dict(zip(ids, waiting))},
            raw_metrics=None, capacity_adjusted_min_replicas=lo, capacity_adjusted_max_replicas=hi,
            policy_state={}, last_scale_up_time=None, last_scale_down_time=None, current_time=None,
            config=AutoscalingConfig(min_replicas=lo, max_replicas=hi, target_ongoing_requests=8))

    assert rs.queue_autoscaling_policy(ctx([0, 0], [0, 0]))[0] == 1     # idle: the minimum
    assert rs.queue_autoscaling_policy(ctx([8, 8], [0, 0]))[0] == 2     # 16 held at 8 a replica
    assert rs.queue_autoscaling_policy(ctx([8, 8], [9, 0]))[0] == 4     # 25 held: 4
    assert rs.queue_autoscaling_policy(ctx([64, 64], [64, 0]))[0] == 4  # capped at the maximum


# ---- the Ingress's failover, replicas lost at chosen points ----

class _ScriptedHandle:
    """Stands in for the LLMServer deployment handle in front of the Ingress's
    app: call i's replica yields scripts[i] (a head dict, then body bytes), and
    raises an exception found there, as a lost replica's stream raises Ray's."""

    def __init__(self, scripts):
        self.scripts, self.calls = list(scripts), 0

    def options(self, **kwargs):
        return self

    @property
    def handle_http(self):
        return self

    def remote(self, req):
        script = self.scripts[self.calls]
        self.calls += 1

        async def stream():
            for part in script:
                if isinstance(part, BaseException):
                    raise part
                yield part
        return stream()


def _through_ingress(scripts):
    import asyncio

    import httpx

    handle = _ScriptedHandle(scripts)
    app = rs.build_ingress_app(handle, retries=2)

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
            return await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    return asyncio.run(go()), handle.calls


def _json_head(body):
    return {"status": 200, "headers": [("content-type", "application/json"), ("content-length", str(len(body)))]}


def test_ingress_fails_over_until_an_answer_is_whole():
    lost = ray.exceptions.ActorDiedError
    answer = b'{"choices": [{"message": {"content": "Paris"}}]}'
    # the whole answer, then the replica lost before its stream's end: the answer stands
    r, calls = _through_ingress([[_json_head(answer), answer, lost()]])
    assert (r.status_code, r.content, calls) == (200, answer, 1)
    assert r.headers[rs.FAILOVER_HEADER] == "0"
    # lost halfway through the body: nothing went out, the next replica answers
    r, calls = _through_ingress([[_json_head(answer), answer[:10], lost()], [_json_head(answer), answer]])
    assert (r.status_code, r.content, calls) == (200, answer, 2)
    assert r.headers[rs.FAILOVER_HEADER] == "1"
    # every replica lost before answering: 503, retryable
    r, calls = _through_ingress([[lost()]] * 3)
    assert (r.status_code, calls) == (503, 3)
    assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "replica_unavailable"
    # a replica whose app ends without starting a response: 502, named
    r, calls = _through_ingress([[]])
    assert (r.status_code, calls) == (502, 1) and r.json()["error"]["code"] == "replica_no_answer"


def test_ingress_ends_a_stream_whose_replica_is_lost_with_an_error_event():
    lost = ray.exceptions.ActorDiedError
    head = {"status": 200, "headers": [("content-type", "text/event-stream")]}
    event = b'data: {"choices": [{"delta": {"content": "Pa"}}]}\n\n'
    r, calls = _through_ingress([[head, event, event, lost()]])
    assert (r.status_code, calls) == (200, 1)
    events = [e for e in r.content.split(b"\n\n") if e]
    assert events[:2] == [event.strip()] * 2
    assert b'"replica_lost"' in events[2] and len(events) == 3
    # lost before its first event: failed over
    r, calls = _through_ingress([[head, lost()], [head, event]])
    assert (r.status_code, r.content, calls) == (200, event, 2)
