"""Soak: do resident memory and open file descriptors stay flat over many
loads and many generations? Prints a table of RSS and descriptor counts at
intervals; a leak shows as a column that keeps growing.

    python bench/soak.py                          # 1000 load/generate/close, 10000 generate calls
    python bench/soak.py -m model.gguf --cycles 200 --calls 2000
Every tenth call of the second phase is a stream abandoned after its first
piece. The two last lines sum up each phase: RSS and fds at the start,
after the warm-up (the first tenth) and at the end. Without -m it writes a tiny random model (tests/support/tiny_models.py), so the run
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


class Phase:
    """Samples of (done, RSS KiB, fds) over one phase, and the summary line:
    RSS and fds at the start, after the warm-up (the first tenth, where
    caches and allocator arenas fill) and at the end."""

    def __init__(self, name, total):
        self.name, self.total, self.rows = name, total, []
        self.t0 = time.monotonic()
        self.step = max(1, total // 10)
        self.sample(0)

    def sample(self, done):
        gc.collect()  # count what is kept, not garbage waiting for the collector
        row = (done, rss_kib(), open_fds())
        self.rows.append(row)
        print(f"{self.name:<10} {done:>7} {row[1] / 1024:>9.1f} {row[2]:>5} {time.monotonic() - self.t0:>8.1f}",
              flush=True)

    def tick(self, i):
        """after iteration i (0-based)"""
        if (i + 1) % self.step == 0 or i + 1 == self.total:
            self.sample(i + 1)

    def summary(self):
        start, end = self.rows[0], self.rows[-1]
        warm = next((r for r in self.rows if r[0] >= self.step), end)
        grow = (end[1] - warm[1]) / 1024
        return (f"{self.name}: {self.total} done; RSS {start[1] / 1024:.1f} MiB at the start, "
                f"{warm[1] / 1024:.1f} after {warm[0]} (warm-up), {end[1] / 1024:.1f} at the end "
                f"({grow:+.1f} MiB after the warm-up); fds {start[2]} at the start, {warm[2]} after the warm-up, "
                f"{end[2]} at the end")


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

    print(f"{'phase':<10} {'done':>7} {'RSS MiB':>9} {'fds':>5} {'seconds':>8}")
    load = Phase("load", a.cycles)
    for i in range(a.cycles):
        with llminfer.LLM(path, n_ctx=64, n_threads=1) as llm:
            text = llm.generate("the cat", max_tokens=a.tokens, temperature=0)
        if not text:
            raise SystemExit(f"cycle {i}: the generation was empty")
        load.tick(i)

    gen = Phase("generate", a.calls)
    produced = 0
    with llminfer.LLM(path, n_ctx=64, n_threads=1) as llm:
        for i in range(a.calls):
            if i % 10 == 9:  # a stream left after its first piece: the next call must not leak it
                for _ in llm.generate("a stream", max_tokens=a.tokens, seed=i, stream=True):
                    break
            else:
                produced += len(llm.generate("the cat" if i % 2 else "a dog", max_tokens=a.tokens, seed=i))
            gen.tick(i)
    if produced == 0:
        raise SystemExit("the generate calls produced no text")
    print(load.summary())
    print(gen.summary())


if __name__ == "__main__":
    main()
