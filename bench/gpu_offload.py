"""Decode and prefill speed with 0, half and all layers on the GPU, beside
llama.cpp's CUDA build (llama-bench) at the same offloads.

For each model and offload, llminfer runs in a fresh process: load with
n_gpu_layers, evaluate an n_prompt-token prompt in one batch (prefill, pp),
then n_gen tokens one at a time (decode, tg), repeated -r times; medians.
llama-bench (of a build with -DGGML_CUDA=ON, in --llama-cpp BIN_DIR, else in
$LLMINFER_LLAMA_CPP, else on the PATH; --llama-bench, the older flag, also
takes the binary) runs the same pp/tg sizes with -ngl 0, half and 99; without
one the llama.cpp columns show "-". The table shows tok/s and the ratio
llminfer / llama.cpp (above 1: llminfer faster).

    PYTHONPATH=. python bench/gpu_offload.py -m llama1b-q4_k_m.gguf \\
        -m ~/.cache/llminfer/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --llama-cpp /path/to/llama.cpp/build-cuda/bin
    PYTHONPATH=. python bench/gpu_offload.py -m model.gguf -p 64 -n 16 -r 1   # a quick look
(llama1b-q4_k_m.gguf: bench/make_model.py's random Llama-3.2-1B, quantized
with llama-quantize.)
Needs a GPU build of llminfer (LLMINFER_CUDA=1 pip install .) and a device;
without one it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import peer


def worker(path, ngl, n_prompt, n_gen, threads):
    import numpy as np

    from llminfer.runtime.engine import Engine

    eng = Engine(path, n_ctx=n_prompt + n_gen + 8, n_batch=max(n_prompt, 1), n_threads=threads, n_gpu_layers=ngl)
    ids = np.random.default_rng(0).integers(0, eng.n_vocab, n_prompt).tolist()
    seq = eng.new_sequence()
    t = time.perf_counter()
    out = eng.decode([(seq, ids, "last")])[0]
    pp = n_prompt / (time.perf_counter() - t)
    tok = int(np.argmax(out))
    t = time.perf_counter()
    for _ in range(n_gen):
        tok = int(np.argmax(eng.decode([(seq, [tok], "last")])[0]))
    tg = n_gen / (time.perf_counter() - t)
    print(json.dumps({"pp": pp, "tg": tg}))


def run_llminfer(path, ngl, a):
    cmd = [sys.executable, __file__, "--worker", path, str(ngl), str(a.n_prompt), str(a.n_gen), str(a.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "worker failed")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_llama_bench(binary, path, ngl, a):
    """(pp tok/s, tg tok/s) from llama-bench, or None without one or when it
    fails (said on stderr)."""
    if not binary:
        return None
    try:
        res, _ = peer.llama_bench(binary, path, a.threads, a.n_prompt, a.n_gen, reps=a.repetitions,
                                  n_gpu_layers=99 if ngl == -1 else ngl)
    except (RuntimeError, ValueError) as e:
        print(f"llama-bench: {e}", file=sys.stderr)
        return None
    return res.get("pp"), res.get("tg")


def n_layers(path):
    from llminfer.core.gguf_file import GGUFFile
    from llminfer.models import build_spec

    g = GGUFFile(path)
    try:
        return build_spec(g).n_layer
    finally:
        g.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        path, ngl, p, n, t = sys.argv[2:7]
        worker(path, int(ngl), int(p), int(n), int(t))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF model (repeatable)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    peer.add_llama_cpp_arg(ap, "--llama-bench", help_extra="; a CUDA build's")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from llminfer.core import gpu

    info = gpu.info()
    if not info["available"]:
        sys.exit(f"no usable GPU: {info['reason']}")
    try:
        bench = peer.llama_cpp_tool("llama-bench", a.llama_cpp)
    except SystemExit as e:
        if a.llama_cpp:  # asked for and not there: an error; otherwise the llama.cpp columns stay empty
            raise
        print(f"{e}: llminfer only", file=sys.stderr)
        bench = None
    rows = []
    for path in a.model:
        nl = n_layers(path)
        for ngl in (0, nl // 2, -1):
            runs = [run_llminfer(path, ngl, a) for _ in range(a.repetitions)]
            pp = statistics.median(r["pp"] for r in runs)
            tg = statistics.median(r["tg"] for r in runs)
            peer_ts = run_llama_bench(bench, path, ngl, a)
            rows.append({"model": os.path.basename(path), "ngl": ngl, "pp": pp, "tg": tg,
                         "peer_pp": peer_ts[0] if peer_ts else None, "peer_tg": peer_ts[1] if peer_ts else None})
    if a.json:
        print(json.dumps({"device": info["devices"], "rows": rows}, indent=1))
        return
    dev = info["devices"][0]["name"] if info["devices"] else "?"
    print(f"device: {dev}; pp{a.n_prompt} / tg{a.n_gen}, tok/s (median of {a.repetitions})")
    print(f"{'model':40} {'ngl':>4} {'pp':>9} {'llama.cpp':>9} {'ratio':>6} {'tg':>8} {'llama.cpp':>9} {'ratio':>6}")
    for r in rows:
        def ratio(x, y):
            return f"{x / y:6.2f}" if y else "     -"
        pp_peer = f"{r['peer_pp']:9.1f}" if r["peer_pp"] else "        -"
        tg_peer = f"{r['peer_tg']:9.1f}" if r["peer_tg"] else "        -"
        print(f"{r['model'][:40]:40} {r['ngl']:>4} {r['pp']:9.1f} {pp_peer} {ratio(r['pp'], r['peer_pp'])} "
              f"{r['tg']:8.1f} {tg_peer} {ratio(r['tg'], r['peer_tg'])}")


if __name__ == "__main__":
    main()
