"""Load test of `llminfer serve` against llama.cpp's llama-server.

N clients at once on loopback, each streaming one completion of a distinct
~15-token prompt (64 tokens, temperature 0 unless --temperature, ignore_eos), for N = 1, 2, 4, 8,
16, 32. Reported per server and N: aggregate completion tokens per second
(all tokens over the wall time of the round), and the p50 / p99 time to
first token and inter-token latency over every client's stream.

    python bench/serve_load.py -m llama1b-q4_k_m.gguf -t 2 --llama-cpp /path/to/llama.cpp/build/bin
    python bench/serve_load.py -m smollm2-135m-instruct -n 1,2 --no-peer

llama-server is found in --llama-cpp BIN_DIR (--peer, the older flag, takes
the binary itself), else in $LLMINFER_LLAMA_CPP, else on the PATH.
(llama1b-q4_k_m.gguf: bench/make_model.py's random Llama-3.2-1B, quantized
with llama-quantize.)

Each server runs alone (started, measured, stopped), on the same GGUF, with
the same thread count; llama-server with -np 32 (32 parallel slots) and
continuous batching. Run on a quiet machine: the clients share its cores.
Needs httpx (pip install 'llminfer[test]').
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import peer
SUBJECTS = ["rivers", "bread", "owls", "trains", "glass", "tides", "maps", "bees", "salt", "clocks", "moss",
            "kites", "ink", "wolves", "copper", "fog"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt(i: int, n: int) -> str:
    """A distinct prompt of about 15 tokens for client i of a round of n."""
    return f"Note {n}.{i}: three facts about {SUBJECTS[i % len(SUBJECTS)]} and the number {7 * i + n} are"


class Server:
    """A server process on a free loopback port, ready once /health answers 200."""

    def __init__(self, name, argv, port, log):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.argv, self.log_path = argv, log
        self.log = self.proc = None

    def start(self):
        """Start the process (each server only when its turn comes: a second one
        loading beside the first took CPU from its measurement)."""
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=600):
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not ready after {timeout} s; see {self.log.name}")

    def stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def one_stream(client, url, text, max_tokens, temperature=0.0, seed=0):
    """(completion tokens, time to first token, [inter-token gaps]) of one streamed completion."""
    body = {"prompt": text, "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if temperature > 0:
        body["seed"] = seed
    t0 = time.perf_counter()
    times, usage = [], None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                times.append(time.perf_counter())
    if not times and not usage:
        raise RuntimeError("the stream carried no text and no usage")
    if not times:  # a random-weight model's tokens may all be unused entries that print as nothing
        times.append(time.perf_counter())
    n = usage["completion_tokens"] if usage else len(times)
    return n, times[0] - t0, list(np.diff(times))


async def round_of(url, n, max_tokens, temperature=0.0):
    import httpx

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_stream(client, url, prompt(i, n), max_tokens, temperature, i)
                                         for i in range(n)))
        wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    ttft = [r[1] for r in results]
    itl = [g for r in results for g in r[2]]
    return {"clients": n, "tokens": tokens, "seconds": wall, "tok_s": tokens / wall,
            "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "itl_p50": float(np.percentile(itl, 50)) if itl else float("nan"),
            "itl_p99": float(np.percentile(itl, 99)) if itl else float("nan")}


def measure(server: Server, clients, max_tokens, temperature=0.0):
    server.start()
    server.wait_ready()
    asyncio.run(round_of(server.url, 1, 8))  # warm-up: first-touch of weights and pools
    out = []
    for n in clients:
        r = asyncio.run(round_of(server.url, n, max_tokens, temperature))
        r["server"] = server.name
        out.append(r)
        print(f"  {server.name:>12} N={n:<3} {r['tok_s']:8.1f} tok/s  TTFT p50 {r['ttft_p50'] * 1e3:7.0f} ms "
              f"p99 {r['ttft_p99'] * 1e3:7.0f} ms  ITL p50 {r['itl_p50'] * 1e3:6.1f} ms "
              f"p99 {r['itl_p99'] * 1e3:6.1f} ms", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="GGUF path or known model name")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--clients", default="1,2,4,8,16,32", help="comma-separated client counts")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="each stream's (OpenAI's other defaults: top-p 1, no top-k); above 0, client i sends seed i")
    ap.add_argument("--ctx", type=int, default=4096, help="llama-server's -c (shared by its 32 slots)")
    peer.add_llama_cpp_arg(ap, "--peer")
    ap.add_argument("--no-peer", action="store_true", help="measure llminfer only")
    ap.add_argument("--no-ours", action="store_true", help="measure llama-server only")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--logs", default=".", help="folder for the servers' logs")
    a = ap.parse_args(argv)
    clients = [int(x) for x in a.clients.split(",") if x.strip()]
    try:
        server = None if a.no_peer else peer.llama_cpp_tool("llama-server", a.llama_cpp)
    except SystemExit as e:
        raise SystemExit(f"{e}; or measure llminfer alone with --no-peer") from None
    from llminfer import hub

    model = str(hub.resolve(a.model))
    slots = max(32, max(clients))
    runs = []
    if not a.no_ours:
        port = free_port()
        runs.append(Server("llminfer", [sys.executable, "-m", "llminfer", "serve", "-m", model, "-t", str(a.threads),
                                        "-c", "1024", "--kv-pool-tokens", str(max(8192, slots * 256)),
                                        "--max-running", str(slots), "--port", str(port),
                                        "--log-level", "warning"], port, os.path.join(a.logs, "serve_llminfer.log")))
    if server:
        port = free_port()
        runs.append(Server("llama-server", [server, "-m", model, "-t", str(a.threads), "-tb", str(a.threads),
                                            "-np", str(slots), "-c", str(max(a.ctx, slots * 128)),
                                            "--host", "127.0.0.1", "--port", str(port)],
                           port, os.path.join(a.logs, "serve_llama_server.log")))
    results = []
    for srv in runs:
        # one server at a time: each gets the machine to itself
        try:
            results += measure(srv, clients, a.max_tokens, a.temperature)
        finally:
            srv.stop()
    print(f"\nmodel {Path(model).name}, {a.threads} threads, {a.max_tokens} tokens per client, "
          f"temperature {a.temperature:g}\n")
    print(f"| {'server':<12} | {'N':>3} | {'tok/s':>8} | {'TTFT p50':>9} | {'TTFT p99':>9} | {'ITL p50':>8} | "
          f"{'ITL p99':>8} |")
    print(f"|{'-' * 14}|{'-' * 5}|{'-' * 10}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 10}|")
    for r in results:
        print(f"| {r['server']:<12} | {r['clients']:>3} | {r['tok_s']:>8.1f} | {r['ttft_p50'] * 1e3:>6.0f} ms | "
              f"{r['ttft_p99'] * 1e3:>6.0f} ms | {r['itl_p50'] * 1e3:>5.1f} ms | {r['itl_p99'] * 1e3:>5.1f} ms |")
    by = {(r["server"], r["clients"]): r["tok_s"] for r in results}
    if any(k[0] == "llama-server" for k in by) and any(k[0] == "llminfer" for k in by):
        print("\nllminfer / llama-server aggregate throughput: " + ", ".join(
            f"N={n}: {by[('llminfer', n)] / by[('llama-server', n)]:.2f}x" for n in clients
            if ("llminfer", n) in by and ("llama-server", n) in by))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
