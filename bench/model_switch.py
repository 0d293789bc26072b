"""Model switch latency of `llminfer serve --models-dir` beside llama-server's
router mode (`llama-server --models-dir`).

Two GGUFs in one folder, a server over it allowing one loaded model at a
time (--models-max-loaded 1 / --models-max 1), so that every request for
the other model unloads one and loads the other. Each round asks, one
request at a time, for a one-token completion of a short prompt:

    A (cold: loads A)   A (warm)   B (switch: unloads A, loads B)   B (warm)

and the table gives, per server, the median wall time of each kind of
request over the rounds (the first round's cold A is left out: it is the
only one that finds nothing loaded). Then the same with both models allowed
at once (--models-max-loaded 2), where a switch after both were loaded is
a warm request.

    python bench/model_switch.py A.gguf B.gguf -t 2 --llama-cpp /path/to/llama.cpp/build/bin

Run on a quiet machine; the page cache holds the files after the first
load, so the figures are load times from memory, not from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not answer /health in time")


def ask(url: str, model: str) -> float:
    """Wall seconds of one one-token completion for `model`."""
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
    t = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=600.0)
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"{model}: HTTP {r.status_code}: {r.text[:300]}")
    return dt


def run_server(name: str, argv: list[str], port: int, names: tuple[str, str], rounds: int, log: Path) -> dict:
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc)
            a, b = names
            kinds: dict[str, list[float]] = {"cold A": [], "warm A": [], "switch to B": [], "warm B": []}
            for i in range(rounds):
                t = ask(url, a)
                if i > 0:
                    kinds["cold A"].append(t)
                kinds["warm A"].append(ask(url, a))
                kinds["switch to B"].append(ask(url, b))
                kinds["warm B"].append(ask(url, b))
            return {k: statistics.median(v) for k, v in kinds.items() if v}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs=2, help="two GGUF files")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--max-loaded", default="1,2", help="comma-separated models allowed at once")
    ap.add_argument("--llama-cpp", default=None, metavar="BIN_DIR", help="llama.cpp's build/bin, for llama-server")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        names = []
        for i, m in enumerate(args.models):
            stem = f"m{i}-{Path(m).stem}"
            os.symlink(os.path.abspath(m), folder / f"{stem}.gguf")
            names.append(stem)
        results = []
        for k in [int(x) for x in args.max_loaded.split(",") if x]:
            port = free_port()
            ours = [sys.executable, "-m", "llminfer", "serve", "--models-dir", str(folder), "--models-max-loaded",
                    str(k), "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads)]
            row = {"server": "llminfer", "max_loaded": k,
                   **run_server("llminfer", ours, port, tuple(names), args.rounds, Path(tmp) / f"ours{k}.log")}
            results.append(row)
            print(json.dumps(row), flush=True)
            if args.no_peer:
                continue
            bin_dir = args.llama_cpp or os.environ.get("LLMINFER_LLAMA_CPP")
            if not bin_dir:
                print("llama-server: give --llama-cpp BIN_DIR (or --no-peer)", file=sys.stderr)
                return 2
            port = free_port()
            env_lib = dict(os.environ, LD_LIBRARY_PATH=bin_dir)
            peer = [str(Path(bin_dir) / "llama-server"), "--models-dir", str(folder), "--models-max", str(k),
                    "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads), "-c", "4096"]
            os.environ.update(env_lib)
            row = {"server": "llama-server", "max_loaded": k,
                   **run_server("llama-server", peer, port, tuple(names), args.rounds, Path(tmp) / f"peer{k}.log")}
            results.append(row)
            print(json.dumps(row), flush=True)

    print()
    print("| server | models at once | cold A (s) | warm A (s) | switch to B (s) | warm B (s) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['server']} | {r['max_loaded']} | {r.get('cold A', float('nan')):.3f} | {r['warm A']:.3f} | "
              f"{r['switch to B']:.3f} | {r['warm B']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
