"""llminfer replicas behind Ray Serve on one machine: aggregate throughput for
1 and 2 replicas, and the prefix-cache hit rate with and without the
router's prefix affinity.

    python bench/ray_serve_load.py -m MODEL.gguf [--cpus 2] [--threads 1]

Starts a local Ray cluster (--cpus CPUs), and for each setting deploys the
application of llminfer.integrations.ray_serve, drives it with the openai
client, then deletes it:

- throughput: --clients concurrent clients, each a distinct short prompt,
  --tokens completion tokens at temperature 0 (ignore_eos), replicas 1 and 2;
- prefix reuse: --systems system prompts of ~600 characters, each asked
  --questions questions in a shuffled order by 1 and by --clients clients, routing
  "prefix" and "load" (power of two choices), 2 replicas; the hit rate is
  prefix-cache hits over prompt tokens looked up, summed over the replicas.

Nothing else should run while this does: the replicas share the cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import random
import socket
import sys
import tempfile
import time


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(rs, serve, openai, model, port, replicas, threads, routing):
    serve.run(rs.build(model=model, replicas=replicas, threads=threads, routing=routing, n_ctx=2048,
                       served_model_name="llminfer"),
              name="bench", route_prefix="/", blocking=False)
    while True:
        st = serve.status().applications.get("bench")
        if st is not None and st.status == "RUNNING":
            break
        if st is not None and st.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            sys.exit(f"deployment failed: {st}")
        time.sleep(0.5)
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)


def throughput(client, clients, tokens):
    def one(i):
        r = client.completions.create(model="llminfer", prompt=f"Story number {i}: once upon a time, a",
                                      max_tokens=tokens, temperature=0, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    one(-1)  # warm-up
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as ex:
        n = sum(ex.map(one, range(clients * 2)))
    return n / (time.perf_counter() - t0)


def prefix_reuse(client, rs, systems, questions, clients):
    sys_prompts = [f"System {k}. " + ("You answer briefly and precisely, citing one fact. " * 12)
                   for k in range(systems)]
    jobs = [(s, q) for s in sys_prompts for q in range(questions)]
    random.Random(0).shuffle(jobs)
    before = rs.cluster_stats("bench")

    def one(job):
        s, q = job
        client.chat.completions.create(model="llminfer", max_tokens=4, temperature=0, messages=[
            {"role": "system", "content": s}, {"role": "user", "content": f"Question {q}: name a colour."}])

    with cf.ThreadPoolExecutor(clients) as ex:
        list(ex.map(one, jobs))
    after = rs.cluster_stats("bench")
    q = after["prefix_queries"] - before["prefix_queries"]
    return (after["prefix_hits"] - before["prefix_hits"]) / q if q else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="engine threads per replica")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--systems", type=int, default=8)
    ap.add_argument("--questions", type=int, default=6)
    a = ap.parse_args()

    import openai
    import ray
    from ray import serve

    from llminfer.integrations import ray_serve as rs

    if os.path.exists(a.model):
        a.model = os.path.abspath(a.model)
    # Ray's workers start in this working directory and import from it first:
    # away from a source checkout, they import the installed package
    os.chdir(tempfile.mkdtemp(prefix="llminfer-ray-"))
    ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False)
    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rows = []
    try:
        for replicas in (1, 2):
            client = deploy(rs, serve, openai, a.model, port, replicas, a.threads, "prefix")
            tps = throughput(client, a.clients, a.tokens)
            rows.append(("throughput", f"{replicas} replica(s) x {a.threads} thread(s)", f"{tps:.1f} tok/s"))
            print(*rows[-1], sep="  |  ", flush=True)
            serve.delete("bench")
        for clients in (1, a.clients):  # a fresh deployment (empty caches) for each row
            for routing in ("prefix", "load"):
                client = deploy(rs, serve, openai, a.model, port, 2, a.threads, routing)
                rate = prefix_reuse(client, rs, a.systems, a.questions, clients)
                rows.append(("prefix hit rate", f"2 replicas, {clients} client(s), routing={routing}", f"{rate:.1%}"))
                print(*rows[-1], sep="  |  ", flush=True)
                serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()
    print("\n| measure | setting | value |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
