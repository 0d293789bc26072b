"""Soak: do resident memory and open file descriptors stay flat over many
loads and many generations? Prints a table of RSS and descriptor counts at
intervals; a leak shows as a column that keeps growing.

    python bench/soak.py                          # 1000 load/generate/close, 10000 generate calls
    python bench/soak.py -m model.gguf --cycles 200 --calls 2000
Without -m it writes a tiny random model (tests/tiny_models.py), so the run
measures llminfer's own bookkeeping rather than a big model's page cache.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time


def rss_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # peak, where /proc is missing


def open_fds() -> int:
    for d in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(d):
            return len(os.listdir(d))
    return -1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model")
    p.add_argument("--cycles", type=int, default=1000, help="load/generate/close cycles")
    p.add_argument("--calls", type=int, default=10000, help="generate calls on one object")
    p.add_argument("--tokens", type=int, default=4, help="tokens per generation")
    a = p.parse_args(argv)

    import llminfer

    path = a.model
    if path is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from tiny_models import TinyConfig, write_model
        path = write_model(os.path.join(tempfile.mkdtemp(), "soak.gguf"), TinyConfig())

    def report(phase, i, t0):
        gc.collect()  # count what is kept, not garbage waiting for the collector
        print(f"{phase:<10} {i:>7} {rss_kib() / 1024:>9.1f} {open_fds():>5} {time.monotonic() - t0:>8.1f}", flush=True)

    print(f"{'phase':<10} {'done':>7} {'RSS MiB':>9} {'fds':>5} {'seconds':>8}")
    t0 = time.monotonic()
    step = max(1, a.cycles // 10)
    for i in range(a.cycles):
        with llminfer.LLM(path, n_ctx=64, n_threads=1) as llm:
            llm.generate("the cat", max_tokens=a.tokens, temperature=0)
        if i % step == 0 or i == a.cycles - 1:
            report("load", i + 1, t0)

    t0 = time.monotonic()
    step = max(1, a.calls // 10)
    with llminfer.LLM(path, n_ctx=64, n_threads=1) as llm:
        for i in range(a.calls):
            llm.generate("the cat" if i % 2 else "a dog", max_tokens=a.tokens, seed=i)
            if i % step == 0 or i == a.calls - 1:
                report("generate", i + 1, t0)


if __name__ == "__main__":
    main()
