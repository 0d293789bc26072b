"""`llminfer bench` and the model facts `llminfer info` prints.

The bench follows llama-bench: one untimed warm-up run, then -r timed runs
per (thread count, test), each row printed as soon as it is measured, in
llama-bench's markdown table (or CSV, or JSON at the end). Its columns:
model (architecture, size class, file type), size, params, backend,
threads, test (pp512 = a 512-token prompt, tg128 = 128 generated tokens;
"@ d4096" when the test starts at a context of 4096 tokens, -d),
t/s (mean ± standard deviation over the runs, as llama-bench gives it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import sys
import time

import numpy as np

COLUMNS = [("model", 30, "<"), ("size", 10, ">"), ("params", 10, ">"), ("backend", 10, "<"),
           ("threads", 7, ">"), ("test", 15, ">"), ("t/s", 20, ">")]


def file_type_name(metadata) -> str:
    """The file type (general.file_type) as llama.cpp names it: "Q4_K_M", "F16"..."""
    from llminfer.core.ggml import LlamaFileType

    ft = metadata.get("general.file_type")
    if ft is None:
        return "unknown file type"
    try:
        name = LlamaFileType(int(ft)).name
    except ValueError:
        return f"file type {ft}"
    return name.replace("MOSTLY_", "").replace("ALL_", "")


def parameter_count(gguf_file) -> int:
    """Elements in every tensor of the file."""
    return int(sum(int(np.prod(t.shape, dtype=np.int64)) for t in gguf_file.tensors.values()))


def size_class(n_params: int) -> str:
    """llama.cpp's model size label: 135M, 1B, 7B..."""
    if n_params >= 1e9:
        return f"{n_params / 1e9:.0f}B" if n_params >= 1e10 else f"{n_params / 1e9:.1f}B".replace(".0B", "B")
    return f"{n_params / 1e6:.0f}M"


def format_params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def model_facts(gguf_file) -> dict:
    n = parameter_count(gguf_file)
    size = sum(t.nbytes for t in gguf_file.tensors.values())
    arch = gguf_file.metadata.get("general.architecture", "?")
    return {"model_type": f"{arch} {size_class(n)} {file_type_name(gguf_file.metadata)}",
            "model_size": size, "model_n_params": n}


def _run(llm, n_prompt, n_gen, threads, seed, depth=None):
    """(seconds) of one test: a random prompt of n_prompt tokens in one go, or
    n_gen random tokens one at a time, as llama-bench's tg: each pass computes
    (and checks) its logits, and the next id is drawn, not picked from them
    (an argmax over the logits, cold from the pass, is work llama-bench does
    not do: 12-65 us of a 135M model's ~2.7 ms token here). depth: token ids
    evaluated first, untimed: the context the test starts at (llama-bench's -d)."""
    # Python's generator, not numpy's: numpy.random imports secrets and with it
    # 3 MiB of libcrypto, which would count in the peak RSS compared with llama-bench
    rng = random.Random(seed)
    llm.reset()  # the LLM's context gives its blocks back; the test runs a sequence of its own
    eng = llm.engine
    seq = eng.new_sequence()
    logits = np.empty(llm.n_vocab, np.float32)  # each pass writes (and checks) its row here
    try:
        if depth is not None:
            eng.decode([(seq, depth, logits)], n_threads=threads)
        if n_prompt:
            ids = np.array([rng.randrange(llm.n_vocab) for _ in range(n_prompt)], dtype=np.int32)
            t = time.perf_counter()
            eng.decode([(seq, ids, logits)], n_threads=threads)
            dt = time.perf_counter() - t
        else:
            tok = rng.randrange(llm.n_vocab)
            t = time.perf_counter()
            for _ in range(n_gen):
                eng.step(seq, tok, logits, n_threads=threads)
                tok = rng.randrange(llm.n_vocab)
            dt = time.perf_counter() - t
    finally:
        eng.free(seq)
    return dt


class _Printer:
    def __init__(self, fmt, out):
        self.fmt, self.out = fmt, out
        self.rows = []

    def header(self):
        if self.fmt == "md":
            self.out.write("| " + " | ".join(f"{n:{a}{w}}" for n, w, a in COLUMNS) + " |\n")
            self.out.write("| " + " | ".join(("-" * (w - 1) + ":") if a == ">" else "-" * w
                                             for _, w, a in COLUMNS) + " |\n")
        elif self.fmt == "csv":
            self.out.write("model_type,model_size,model_n_params,backend,n_threads,n_prompt,n_gen,n_depth,"
                           "avg_ts,stddev_ts\n")
        self.out.flush()

    def row(self, r):
        self.rows.append(r)
        if self.fmt == "md":
            cells = [r["model_type"][:30], f"{r['model_size'] / 2**20:.2f} MiB", format_params(r["model_n_params"]),
                     r["backend"], str(r["n_threads"]), r["test"], f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"]
            self.out.write("| " + " | ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, COLUMNS)) + " |\n")
        elif self.fmt == "csv":
            buf = io.StringIO()
            csv.writer(buf).writerow([r[k] for k in ("model_type", "model_size", "model_n_params", "backend",
                                                     "n_threads", "n_prompt", "n_gen", "n_depth", "avg_ts",
                                                     "stddev_ts")])
            self.out.write(buf.getvalue())
        self.out.flush()

    def end(self):
        if self.fmt == "json":
            from llminfer.core.system import system_info

            self.out.write(json.dumps({"system": system_info(), "results": self.rows}, indent=2) + "\n")
        self.out.flush()


def mean_sd(rates):
    """The mean and the sample standard deviation (0 for one value). Plain
    sums: `statistics` imports decimal and fractions, 0.5 MB of a process
    whose peak memory is one of the figures."""
    mean = sum(rates) / len(rates)
    if len(rates) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((r - mean) ** 2 for r in rates) / (len(rates) - 1))


def depth_ids(llm, n_depth: int) -> np.ndarray:
    """A random prompt of n_depth token ids, which each run of a test at that
    depth evaluates first, untimed (llama-bench's -d). llama-bench evaluates
    it once and restores a saved state before each run; a saved state is a
    copy of the cache, which would count in the peak memory set beside
    llama-bench's, so here each run evaluates it."""
    rng = random.Random(-2 % 2**32)
    return np.array([rng.randrange(llm.n_vocab) for _ in range(n_depth)], dtype=np.int32)


def bench(llm, n_prompt: int, n_gen: int, threads_list, repetitions: int, fmt: str = "md", out=None,
          log=None, depths=(0,)) -> list:
    """Run the tests and print each row as it is measured; returns the rows.
    depths: context lengths each test starts at (llama-bench's -d)."""
    out = out or sys.stdout
    facts = model_facts(llm.engine.gguf)
    printer = _Printer(fmt, out)
    printer.header()
    tests = [(n_prompt, 0)] * bool(n_prompt) + [(0, n_gen)] * bool(n_gen)
    gpu_layers = getattr(llm.engine, "n_gpu_layers", 0) or 0
    backend = f"CPU+GPU({gpu_layers} layers)" if gpu_layers else "CPU"
    for threads in threads_list:
        for d in depths:
            ids = depth_ids(llm, d) if d else None
            if d and log:
                log(f"bench: each run below first evaluates a context of {d} tokens, untimed")
            for p, g in tests:
                name = (f"pp{p}" if p else f"tg{g}") + (f" @ d{d}" if d else "")
                if log:
                    log(f"bench: warm-up {name}, {threads} threads")
                _run(llm, min(p, 32), min(g, 4), threads, seed=-1 % 2**32)  # untimed: pages, caches, team
                times = [_run(llm, p, g, threads, seed=r, depth=ids) for r in range(repetitions)]
                rates = [(p or g) / t for t in times]
                mean, sd = mean_sd(rates)
                printer.row({**facts, "backend": backend, "n_threads": threads, "n_prompt": p, "n_gen": g,
                             "n_depth": d, "test": name, "avg_ts": mean, "stddev_ts": sd,
                             "samples_ts": rates,
                             # the names of earlier llminfer versions' JSON, kept for scripts that read it
                             "model": str(llm.model_path), "arch": llm.architecture, "threads": threads,
                             "tokens_per_second": mean, "stdev": sd, "runs": len(rates)})
    printer.end()
    return printer.rows
