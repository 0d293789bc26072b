"""llminfer against llama.cpp (through llama-cpp-python), side by side.

For each model and thread count, each engine runs in a fresh process (so load
time and peak RSS are its own): load the model, evaluate a 512-token prompt
(pp512), then generate 128 tokens greedily one at a time (tg128). Runs
alternate between the engines, at least 3 each, and the table shows medians
and the ratio llminfer / llama.cpp (above 1 is better for speeds; below 1 is
better for times and memory).

Both engines are driven through their lowest-overhead paths: llminfer's
native forward pass, llama.cpp's llama_decode through the low-level API
(logits read in place), with greedy picks by numpy argmax for both.

For generation the table also shows the bytes read per generated token
(weights, plus the KV cache at the average position) and the read bandwidth
that implies, beside the machine's measured read bandwidth.

    PYTHONPATH=. python bench/compare.py                      # the issue's rows
    PYTHONPATH=. python bench/compare.py -m model.gguf -t 2 -r 5 --json
Needs llminfer importable here, and llama-cpp-python in the Python given by
--peer-python or $LLMINFER_PEER_PYTHON, or else in this one.

--llama-bench compares against llama.cpp's own C++ harness instead,
with no Python loop on its side: `llminfer bench` and `llama-bench` (pp512,
tg128, one repetition per process, fresh processes interleaved, medians),
on a random-weight Llama-3.2-1B-shaped model that it writes and quantizes
with llama-quantize (Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS), and on
SmolLM2 and Gemma 3; each child's peak RSS from its rusage; the bytes a
generated token reads (weights and KV cache) times each engine's tg speed,
as a fraction of the read bandwidth measured just before and just after that
run (bench_read at the run's thread count; median over the runs whose two
probes agree: within 15% of each other, and the team barrier's cost on the
same side of --far-ns, which tells whether the host moved the CPUs during the
run; a run whose probes disagree is run again, up to --retries times; then
the same median for each placement the runs found, near and far); and
the load + first-token time of a fresh process on the first 1B file.
llama-bench and llama-quantize are found in --llama-cpp BIN_DIR (llama.cpp's
build/bin), else in $LLMINFER_LLAMA_CPP, else on the PATH:

    python bench/compare.py --llama-bench --llama-cpp /path/to/llama.cpp/build/bin -r 3
    LLMINFER_LLAMA_CPP=/path/to/llama.cpp/build/bin python bench/compare.py --llama-bench -r 3

-d N runs every test at a context of N tokens (llama-bench's -d: a random
prompt of N tokens first, untimed), for decode over a long cache:

    python bench/compare.py --llama-bench -m model.gguf -d 4096 -p 512 -n 32
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, when this file is loaded by its path
import peer  # noqa: E402

N_PROMPT = 512
N_GEN = 128


# ---- workers (run in a child process) ----

def worker_llminfer(path, threads):
    t0 = time.perf_counter()
    import llminfer

    llm = llminfer.LLM(path, n_ctx=N_PROMPT + N_GEN + 8, n_threads=threads, n_batch=N_PROMPT)
    load = time.perf_counter() - t0
    ids = np.random.default_rng(0).integers(0, llm.n_vocab, N_PROMPT).astype(np.int32)
    t = time.perf_counter()
    llm._forward(ids, logits_all=False)
    tok = np.array([int(np.argmax(llm._last_logits))], dtype=np.int32)
    ttft = time.perf_counter() - t
    pp = N_PROMPT / ttft
    t = time.perf_counter()
    for _ in range(N_GEN):
        llm._forward(tok, logits_all=False)
        tok[0] = int(np.argmax(llm._last_logits))
    tg = N_GEN / (time.perf_counter() - t)
    spec = llm.spec
    kv = kv_bytes_per_token(spec)
    return {"load": load, "pp": pp, "tg": tg, "ttft": ttft, "weights": spec.weight_bytes(), "kv": kv}


def kv_bytes_per_token(spec, kv_elt=2, pos=N_PROMPT + N_GEN / 2):
    """KV bytes read for one generated token at position pos (by default the
    average position of tg128 after a pp512 prompt)."""
    total = 0
    for L in spec.layers:
        span = min(pos, L.sliding_window) if L.sliding_window else pos
        total += span * spec.n_head_kv * (spec.head_dim + spec.head_dim_v) * kv_elt
    return int(total)


def worker_llamacpp(path, threads):
    t0 = time.perf_counter()
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx = N_PROMPT + N_GEN + 8
    cp.n_batch = N_PROMPT
    cp.n_ubatch = N_PROMPT
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    load = time.perf_counter() - t0

    def logits():
        ptr = L.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,))

    ids = np.random.default_rng(0).integers(0, n_vocab, N_PROMPT).astype(np.int32)
    arr = (L.llama_token * N_PROMPT)(*ids.tolist())
    t = time.perf_counter()
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, N_PROMPT)) != 0:
        raise RuntimeError("llama_decode failed")
    tok = int(np.argmax(logits()))
    ttft = time.perf_counter() - t
    pp = N_PROMPT / ttft
    one = (L.llama_token * 1)()
    t = time.perf_counter()
    for _ in range(N_GEN):
        one[0] = tok
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            raise RuntimeError("llama_decode failed")
        tok = int(np.argmax(logits()))
    tg = N_GEN / (time.perf_counter() - t)
    return {"load": load, "pp": pp, "tg": tg, "ttft": ttft}


def peak_rss_mb():
    """This process's peak resident memory. On Linux VmHWM, which exec resets;
    ru_maxrss would also count the parent's peak from before the fork."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KiB elsewhere
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def worker_main(engine, path, threads):
    fn = worker_llminfer if engine == "llminfer" else worker_llamacpp
    out = fn(path, threads)
    out["rss_mb"] = peak_rss_mb()
    print(json.dumps(out))


# ---- driver ----

def read_bandwidth(threads, buf, reps=5):
    """GB/s reading buf with llminfer's probe (median of reps); ProbeProcess
    runs it, away from the benchmark children."""
    from llminfer import _core

    times = []
    for _ in range(reps):
        t = time.perf_counter()
        _core.bench_read(buf, threads)
        times.append(time.perf_counter() - t)
    return buf.nbytes / statistics.median(times) / 1e9


def tg_bytes_per_token(path, n_gen, n_depth=0):
    """What one generated token of llama-bench's tg test reads: the weights
    (the embedding row aside) and the KV cache at the test's average position
    (it starts from a context of n_depth tokens, -d)."""
    from llminfer.core.gguf_file import GGUFFile
    from llminfer.models import build_spec

    spec = build_spec(GGUFFile(path))
    return spec.weight_bytes() + kv_bytes_per_token(spec, pos=n_depth + n_gen / 2)


class ProbeProcess:
    """The read probe and the bytes-per-token sums, in a process of their
    own. In the driver, a probe buffer of hundreds of MB
    (or a parsed vocabulary) would count in every benchmark child's peak RSS:
    Linux carries the high-water mark from the fork into the exec'd program."""

    CODE = (
        "import sys, numpy as np\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import compare\n"
        "buf = np.ones(int(sys.argv[2]) << 20, dtype=np.uint8)\n"
        "for line in sys.stdin:\n"
        "    what, arg, n, d = line.rstrip('\\n').split('\\t')\n"
        "    if what == 'read':\n"
        "        compare.read_bandwidth(int(arg), buf, reps=1)  # a warm-up read\n"
        "        print(compare.read_bandwidth(int(arg), buf, reps=int(n)), flush=True)\n"
        "    elif what == 'sync':\n"
        "        from llminfer import _core\n"
        "        print(_core.bench_sync(int(arg), 20000) * 1e9, flush=True)\n"
        "    else:\n"
        "        print(compare.tg_bytes_per_token(arg, int(n), int(d)), flush=True)\n"
    )

    def __init__(self, env, mib=512):
        here = os.path.dirname(os.path.abspath(__file__))
        # run from bench/: `-c` puts the working folder first on sys.path, and a
        # checkout's uncompiled llminfer/ there would shadow the installed one
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, here, str(mib)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=here)

    def _ask(self, what, arg, n, d=0):
        try:
            self.proc.stdin.write(f"{what}\t{arg}\t{n}\t{d}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError("the probe process ended") from None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the probe process ended")
        return float(line)

    def read_gbs(self, threads, reps=3):
        """GB/s of the probe at this thread count (median of reps)."""
        return self._ask("read", threads, reps)

    def sync_ns(self, threads=2):
        """Nanoseconds per pass of the engine's team barrier at this thread
        count: a cache line's trip between the team's cores, which tells
        where the host has put them (on this VM, about 30-90 ns when its two
        CPUs are one core's hyperthreads, about 300 ns when they are cores
        apart)."""
        return self._ask("sync", threads, 0)

    def bracket(self, threads):
        """(read GB/s at this thread count, barrier ns at two threads)."""
        return self.read_gbs(threads), self.sync_ns(2)

    def bytes_per_token(self, path, n_gen, n_depth=0):
        return int(self._ask("bytes", path, n_gen, n_depth))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def probe_bracket(before, after, res, per_token, far_ns):
    """One tg run against the probes taken just before and just after it:
    the brackets agree when both put the team's cores on the same side of
    far_ns and their read bandwidths are within 15% of each other. host is
    "near" or "far" (both sides), or "moved"."""
    (bw0, ns0), (bw1, ns1) = before, after
    sides = {ns0 >= far_ns, ns1 >= far_ns}
    host = "moved" if len(sides) > 1 else ("far" if True in sides else "near")
    agree = host != "moved" and abs(bw0 - bw1) <= 0.15 * max(bw0, bw1)
    bw = (bw0 + bw1) / 2
    return {"gbs": [round(bw0, 1), round(bw1, 1)], "sync_ns": [round(ns0), round(ns1)], "host": host,
            "agree": agree, "of_probe": res["tg"] * per_token / 1e9 / bw if res.get("tg") else None}


def run_worker(python, engine, path, threads, env):
    cmd = [python, os.path.abspath(__file__), "--worker", engine, str(path), str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{engine} worker failed on {path}:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def default_models():
    from llminfer import hub

    smol = hub.pull("smollm2-135m-instruct")
    qdir = os.path.join(hub.cache_dir(), "models")
    models = []
    for preset in ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M"):
        if preset == "Q4_1":
            models.append(str(smol))
            continue
        out = os.path.join(qdir, f"SmolLM2-135M-Instruct.{preset}.gguf")
        if not os.path.exists(out):
            from llminfer.core.quantize_model import quantize_model

            print(f"making {out} with llminfer's quantizer", file=sys.stderr)
            quantize_model(smol, out, preset, allow_requantize=True)
        models.append(out)
    models.append(str(hub.pull("gemma3-270m")))
    return models


# ---- --llama-bench: llminfer's own `bench` against llama.cpp's llama-bench ----

LB_PRESETS = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS")


def of_probe_summary(brackets):
    """(fraction, by_host) from each engine's brackets (probe_bracket's):
    the median fraction of the probe over the runs whose brackets agree, and
    the same for each placement those runs found ("near", "far"), with how
    many runs each median is over. The two placements read at different
    rates, and a model's fixed costs per token weigh more the faster its
    weights are read, so one median over both says little about either."""
    frac = {}
    for w, bs in brackets.items():
        v = [b["of_probe"] for b in bs if b["agree"]]
        frac[w] = statistics.median(v) if v else None
    by_host = {}
    for h in ("near", "far"):
        v = {w: [b["of_probe"] for b in bs if b["agree"] and b["host"] == h] for w, bs in brackets.items()}
        if any(v.values()):
            by_host[h] = {w: statistics.median(x) if x else None for w, x in v.items()}
            by_host[h]["runs"] = {w: len(x) for w, x in v.items()}
    return frac, by_host


def fmt(v, spec):
    """v formatted, or "-" for a test left out"""
    return "-" if v is None else format(v, spec)


def llminfer_bench_once(path, threads, n_prompt, n_gen, env, n_depth=0):
    cmd = [sys.executable, "-m", "llminfer", "bench", "-m", path, "-t", str(threads), "-p", str(n_prompt),
           "-n", str(n_gen), "-d", str(n_depth), "-r", "1", "-o", "json"]
    out, rss = peer.run_child(cmd, env)
    res = {}
    for row in json.loads(out)["results"]:
        key = "pp" if row["n_prompt"] and not row["n_gen"] else "tg"
        res[key] = row["avg_ts"]
    return res, rss


def first_token_seconds(path, threads, env):
    """Wall time from a fresh process's `import llminfer` to the first
    generated token of a 1-token prompt (load + one forward pass)."""
    code = ("import time; t = time.perf_counter(); import llminfer; "
            f"llm = llminfer.LLM({path!r}, n_ctx=512, n_threads={threads}); "
            "llm.complete('Hi', max_tokens=1, temperature=0); print(time.perf_counter() - t)")
    out, _ = peer.run_child([sys.executable, "-c", code], env)
    return float(out.strip().splitlines()[-1])


def make_laptop_models(quantize, work, presets):
    """The issue's laptop-scale files: a random Llama-3.2-1B-shaped F16 GGUF
    (bench/make_model.py), quantized by llama-quantize (the path quantize)
    to each preset."""
    os.makedirs(work, exist_ok=True)
    f16 = os.path.join(work, "llama1b-f16.gguf")
    if not os.path.exists(f16):
        print(f"writing {f16} (random weights, Llama-3.2-1B shape)", file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_model.py"),
                        "-o", f16], check=True)
    paths = []
    for preset in presets:
        out = os.path.join(work, f"llama1b-{preset.lower()}.gguf")
        if not os.path.exists(out):
            print(f"quantizing {out}", file=sys.stderr)
            subprocess.run([quantize, f16, out, preset],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        paths.append(out)
    return paths


def llama_bench_mode(a):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    threads = [int(t) for t in a.threads.split(",")]
    presets = [p.strip() for p in a.presets.split(",") if p.strip()]
    bin_dir = a.llama_cpp or a.llama_bench or None
    exe = peer.llama_cpp_tool("llama-bench", bin_dir)
    models = a.model or make_laptop_models(peer.llama_cpp_tool("llama-quantize", bin_dir), a.work, presets)
    if not a.model and not a.no_small:
        from llminfer import hub
        models += [str(hub.pull("smollm2-135m-instruct")), str(hub.pull("gemma3-270m"))]
    rows = []
    # The read probe brackets every run: this host's read bandwidth moved
    # between about 30 and 60 GB/s from one minute to the next, so a figure
    # taken once would set each run against another machine. The bandwidth
    # follows where the VM's two CPUs sit (one core's two hyperthreads, or
    # two cores apart), which the team barrier's cost shows; a run whose
    # brackets disagree (the host moved during it) is run again, up to
    # --retries times, and only runs with agreeing brackets count in the
    # fraction of the probe.
    probe = ProbeProcess(env) if a.n_gen > 0 else None
    at = f" @ d{a.n_depth}" if a.n_depth else ""
    print(f"| model | threads | pp{a.n_prompt}{at} ours | pp{a.n_prompt}{at} llama.cpp | pp x | tg{a.n_gen}{at} ours | "
          f"tg{a.n_gen}{at} llama.cpp | tg x | tg bytes/s of read probe, ours / llama.cpp (all runs; by placement) | "
          f"peak RSS MB ours / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in models:
        per_token = probe.bytes_per_token(path, a.n_gen, a.n_depth) if probe else 0
        for t in threads:
            runs = {"ours": [], "peer": []}
            rss = {"ours": [], "peer": []}
            brackets = {"ours": [], "peer": []}
            for r in range(a.runs):  # interleaved, the order alternating
                order = ("ours", "peer") if r % 2 == 0 else ("peer", "ours")
                for who in order:
                    for attempt in range(a.retries + 1):
                        before = probe.bracket(t) if probe else None
                        if who == "ours":
                            res, m = llminfer_bench_once(path, t, a.n_prompt, a.n_gen, env, a.n_depth)
                        else:
                            res, m = peer.llama_bench(exe, path, t, a.n_prompt, a.n_gen, a.n_depth)
                        b = probe_bracket(before, probe.bracket(t), res, per_token, a.far_ns) if probe else None
                        if not b or b["agree"]:
                            break
                    runs[who].append(res)
                    rss[who].append(m)
                    if b:
                        brackets[who].append(b)
            tests = [k for k, n in (("pp", a.n_prompt), ("tg", a.n_gen)) if n > 0]  # -p 0 / -n 0 leave one out
            med = {w: {k: statistics.median(x[k] for x in rs) if k in tests else None for k in ("pp", "tg")}
                   for w, rs in runs.items()}
            ratio = {k: med["ours"][k] / med["peer"][k] if k in tests else None for k in ("pp", "tg")}
            frac, by_host = of_probe_summary(brackets)
            probes = [g for bs in brackets.values() for b in bs for g in b["gbs"]]
            hosts = collections.Counter(b["host"] for bs in brackets.values() for b in bs)
            row = {"model": os.path.basename(path), "threads": t, "n_depth": a.n_depth, "ours": med["ours"],
                   "peer": med["peer"],
                   "pp_ratio": ratio["pp"], "tg_ratio": ratio["tg"],
                   "rss_mb_ours": max(rss["ours"]), "rss_mb_peer": max(rss["peer"]),
                   "tg_bytes_per_token": per_token or None, "tg_of_probe_ours": frac["ours"],
                   "tg_of_probe_peer": frac["peer"], "tg_of_probe_by_host": by_host,
                   "probe_gbs": [round(b, 1) for b in probes],
                   "brackets": brackets}
            rows.append(row)
            probe_range = ""
            if probes:
                host = ", ".join(f"{n} {h}" for h, n in sorted(hosts.items()))
                places = "".join(f"; {h} {fmt(f['ours'], '.2f')} / {fmt(f['peer'], '.2f')} "
                                 f"({f['runs']['ours']} / {f['runs']['peer']})" for h, f in by_host.items())
                probe_range = f" ({min(probes):.0f}-{max(probes):.0f} GB/s; runs of both: {host}{places})"
            print(f"| {row['model']} | {t} | {fmt(med['ours']['pp'], '.1f')} | {fmt(med['peer']['pp'], '.1f')} | "
                  f"{fmt(ratio['pp'], '.2f')} | {fmt(med['ours']['tg'], '.1f')} | {fmt(med['peer']['tg'], '.1f')} | "
                  f"{fmt(ratio['tg'], '.2f')} | {fmt(frac['ours'], '.2f')} / {fmt(frac['peer'], '.2f')}{probe_range} | "
                  f"{row['rss_mb_ours']:.0f} / {row['rss_mb_peer']:.0f} |", flush=True)
    if probe:
        probe.close()
    first = cold = None
    if not a.model and a.runs:
        # The first run finds the file as the page cache left it (on a VM whose
        # balloon reclaims cache, often on disk: this host dropped a 630 MB
        # file within a minute); the three after it read it from the cache,
        # as a model used a moment ago is read. Both are reported.
        cold = first_token_seconds(models[0], threads[-1], env)
        f1 = [first_token_seconds(models[0], threads[-1], env) for _ in range(3)]
        first = statistics.median(f1)
        print(f"\nload + first token of {os.path.basename(models[0])} ({threads[-1]} threads, fresh process, "
              f"median of 3 with the file in the page cache): {first:.2f} s; the run before them, the file as "
              f"the page cache had it: {cold:.2f} s")
    if a.json:
        print(json.dumps({"runs_per_engine": a.runs, "rows": rows, "load_first_token_s": first,
                          "load_first_token_as_found_s": cold}, indent=2))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bench", nargs="?", const="", metavar="BIN_DIR",
                   help="compare `llminfer bench` with llama.cpp's llama-bench on the laptop-scale rows (made here "
                        "with llama-quantize if absent) and SmolLM2 and Gemma 3; BIN_DIR, if given, is --llama-cpp's")
    peer.add_llama_cpp_arg(p, help_extra="; given, it selects --llama-bench")
    p.add_argument("--work", default=os.path.expanduser("~/.cache/llminfer/bench"),
                   help="--llama-bench: where the made 1B models are kept")
    p.add_argument("--presets", default=",".join(LB_PRESETS), help="--llama-bench: llama-quantize presets of the 1B rows")
    p.add_argument("--no-small", action="store_true", help="--llama-bench: leave out the SmolLM2 and Gemma 3 rows")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="--llama-bench: prompt tokens")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="--llama-bench: generated tokens")
    p.add_argument("-d", "--n-depth", type=int, default=0,
                   help="--llama-bench: context length each test starts at (llama-bench's -d; untimed)")
    p.add_argument("--worker", nargs=3, metavar=("ENGINE", "MODEL", "THREADS"), help=argparse.SUPPRESS)
    p.add_argument("-m", "--model", action="append", help="GGUF file (repeatable; default: the issue's rows)")
    p.add_argument("-t", "--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("-r", "--runs", type=int, default=3, help="runs per engine per row (interleaved)")
    p.add_argument("--retries", type=int, default=2,
                   help="--llama-bench: runs again, at most this many times, a run whose read-probe brackets "
                        "disagree (the host moved during it)")
    p.add_argument("--far-ns", type=float, default=200.0,
                   help="--llama-bench: a two-thread barrier at least this slow (ns) puts the team's cores "
                        "apart ('far'), below it near (on this VM: one core's hyperthreads)")
    peer.add_peer_python_arg(p)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.worker:
        worker_main(a.worker[0], a.worker[1], int(a.worker[2]))
        return 0
    if a.llama_bench is not None or a.llama_cpp:
        return llama_bench_mode(a)
    peer_python = peer.peer_python(a.peer_python)

    models = a.model or default_models()
    threads = [int(t) for t in a.threads.split(",")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    probe = ProbeProcess(env)
    bw = {t: probe.read_gbs(t, reps=5) for t in threads}
    probe.close()
    rows = []
    for path in models:
        for t in threads:
            runs = {"llminfer": [], "llama.cpp": []}
            for r in range(a.runs):
                order = ("llminfer", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "llminfer")
                for engine in order:
                    python = sys.executable if engine == "llminfer" else peer_python
                    runs[engine].append(run_worker(python, "llminfer" if engine == "llminfer" else "llamacpp",
                                                   path, t, env))
            med = {e: {k: statistics.median(r[k] for r in rs) for k in ("load", "pp", "tg", "ttft", "rss_mb")}
                   for e, rs in runs.items()}
            ours = runs["llminfer"][0]
            per_token = ours["weights"] + ours["kv"]
            rows.append({"model": os.path.basename(path), "threads": t, "ours": med["llminfer"],
                         "peer": med["llama.cpp"], "bytes_per_token": per_token,
                         "bandwidth_gbs": bw[t],
                         "implied_gbs_ours": per_token * med["llminfer"]["tg"] / 1e9,
                         "implied_gbs_peer": per_token * med["llama.cpp"]["tg"] / 1e9})
            print_row(rows[-1], header=len(rows) == 1, json_out=a.json)
    if a.json:
        print(json.dumps({"runs_per_engine": a.runs, "rows": rows}, indent=2))
    return 0


def print_row(r, header, json_out):
    if json_out:
        return
    if header:
        print(f"{'model':<34} {'thr':>3} | {'pp512 t/s (ours/peer = x)':>28} | {'tg128 t/s (ours/peer = x)':>27} | "
              f"{'TTFT ms (ours/peer)':>20} | {'load ms':>13} | {'peak RSS MB':>15} | "
              f"{'MB/token':>8} {'GB/s ours/peer of bw':>22}")
    o, q = r["ours"], r["peer"]
    print(f"{r['model'][:34]:<34} {r['threads']:>3} | "
          f"{o['pp']:>8.1f} / {q['pp']:>8.1f} = {o['pp'] / q['pp']:>4.2f} | "
          f"{o['tg']:>7.1f} / {q['tg']:>7.1f} = {o['tg'] / q['tg']:>4.2f} | "
          f"{o['ttft'] * 1e3:>8.0f} / {q['ttft'] * 1e3:>8.0f} | "
          f"{o['load'] * 1e3:>5.0f} / {q['load'] * 1e3:>5.0f} | "
          f"{o['rss_mb']:>6.0f} / {q['rss_mb']:>6.0f} | "
          f"{r['bytes_per_token'] / 1e6:>8.1f} {r['implied_gbs_ours']:>6.1f} / {r['implied_gbs_peer']:>5.1f} of {r['bandwidth_gbs']:.1f}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
