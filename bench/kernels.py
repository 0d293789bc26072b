"""Kernel benchmark: decode matvec bandwidth and prefill GEMM throughput per
weight type, beside this machine's own memory read bandwidth.

    python bench/kernels.py                      # every type, 1 and 2 threads
    python bench/kernels.py --types Q4_0,Q4_K --threads 1,2,4 --mib 128
    LLMINFER_ISA=scalar python bench/kernels.py  # another kernel level

Decode: y = W x for one activation row (n=1) with W of about --mib MiB, more
than the last-level cache, so the weights stream from memory every call: the
figure is GB/s of weight bytes read, and %bw compares it with the read
bandwidth measured here at the same thread count (a plain sum over a buffer
of the same size). Prefill: W of --prefill-rows x --prefill-k against n rows
(--prefill-n), in GFLOP/s (2 rows*k*n per call), activation quantization
included. Every figure is the median of --reps runs, the runs of all the
configurations interleaved so that a change in machine load hits them all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llminfer import _core  # noqa: E402

from llminfer.core import ops, system

ALL = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
       "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "MXFP4"]
# byte offsets of the f16 scales in each block: random bytes elsewhere, sane scales there
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,), "IQ4_NL": (0,), "MXFP4": ()}


def make_weight(rng, name, rows, k):
    """Bytes of a (rows, k) matrix of type `name`: random blocks with small f16 scales
    (quantizing hundreds of MiB of floats would take longer than the benchmark)."""
    if name in ("F32", "F16", "BF16"):
        return ops.quantize(rng.standard_normal((rows, k), dtype=np.float32), name)
    bs, ts = ops.block_sizes(name)
    nb = rows * k // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        b[:, off:off + 2] = (rng.standard_normal(nb) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 2)
    if name == "MXFP4":  # its E8M0 scale byte: a power of two near 2^-6
        b[:, 0] = rng.integers(118, 124, size=nb, dtype=np.uint8)
    return b.reshape(rows, -1)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def loadavg():
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default=",".join(ALL), help="comma-separated type names")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--k", type=int, default=4096, help="row length of the decode matrices")
    p.add_argument("--mib", type=float, default=256,
                   help="size of each decode matrix and of the bandwidth probe (MiB); well above the L3")
    p.add_argument("--prefill-rows", type=int, default=2048)
    p.add_argument("--prefill-k", type=int, default=2048)
    p.add_argument("--prefill-n", type=int, default=512)
    p.add_argument("--reps", type=int, default=7, help="runs per figure (median)")
    p.add_argument("--no-prefill", action="store_true")
    args = p.parse_args(argv)

    types = [ops.qtype_of(t).name for t in args.types.split(",") if t]
    threads = [int(t) for t in args.threads.split(",") if t]
    rng = np.random.default_rng(0)
    k = args.k

    print(f"llminfer kernels: level {system.current_isa()} "
          f"(available {', '.join(system.available_isas())}), OpenMP {_core.openmp_enabled()}, "
          f"{os.cpu_count()} CPUs, load average {loadavg()} at start")

    bw_buf = np.ones(int(args.mib * 2**20), dtype=np.uint8)
    dec = {}
    for name in types:
        bs, ts = ops.block_sizes(name)
        rows = max(1, int(args.mib * 2**20) // (k // bs * ts))
        dec[name] = (make_weight(rng, name, rows, k), rows)
    x1 = rng.standard_normal((1, k), dtype=np.float32)
    pre = {}
    if not args.no_prefill:
        pr, pk, pn = args.prefill_rows, args.prefill_k, args.prefill_n
        xp = rng.standard_normal((pn, pk), dtype=np.float32)
        for name in types:
            pre[name] = make_weight(rng, name, pr, pk)

    # the weights as a loaded model multiplies them: repacked once at load
    # (csrc/repack.h) where this level has kernels for the type, else the file's rows
    rep = set(ops.repacked_types())
    dec_fn, pre_fn = {}, {}
    for name in types:
        w, rows = dec[name]
        if name in rep:
            m = _core.RepackedMatrix(int(ops.qtype_of(name)), w.reshape(-1), rows, k, max(threads))
            dec_fn[name] = lambda t, m=m: m.matmul(x1, t)
            if pre:
                mp = _core.RepackedMatrix(int(ops.qtype_of(name)), pre[name].reshape(-1), pr, pk, max(threads))
                pre_fn[name] = lambda t, mp=mp: mp.matmul(xp, t)
        else:
            dec_fn[name] = lambda t, w=w, rows=rows, name=name: ops.matmul(w, name, (rows, k), x1, n_threads=t)
            if pre:
                pre_fn[name] = lambda t, name=name: ops.matmul(pre[name], name, (pr, pk), xp, n_threads=t)

    bw = {t: [] for t in threads}
    dt = {(n, t): [] for n in types for t in threads}
    pt = {(n, t): [] for n in types for t in threads}
    for name in types:  # warm up: first touch, thread start
        dec_fn[name](max(threads))
    peak = _core.bench_int8_peak()  # int8 multiply-adds per second, one thread
    for _ in range(args.reps):
        for t in threads:
            bw[t].append(bw_buf.nbytes / timed(lambda: _core.bench_read(bw_buf, t)))
            for name in types:
                w, rows = dec[name]
                dt[name, t].append(w.nbytes / timed(lambda: dec_fn[name](t)))
                if pre:
                    flop = 2.0 * pr * pk * pn
                    pt[name, t].append(flop / timed(lambda: pre_fn[name](t)))

    med = statistics.median
    print(f"load average {loadavg()} at end; medians of {args.reps} interleaved runs\n")
    print("memory read bandwidth (sum over {:.0f} MiB): ".format(args.mib) +
          ", ".join(f"{t} thread{'s' if t > 1 else ''} {med(bw[t]) / 1e9:.1f} GB/s" for t in threads))
    print()
    if peak:
        print(f"int8 peak (vpdpbusd, independent chains): {2 * peak / 1e9:.0f} GOP/s per thread "
              f"({peak / 1e9:.0f} G multiply-adds/s); prefill %pk below: GFLOP/s against that peak times the threads")
    print(f"repacked at load (as a model's weights): {', '.join(t for t in types if t in rep) or 'none'}")
    head = f"{'type':6}" + "".join(f" | {t}T dec GB/s  %bw" for t in threads)
    if pre:
        head += "".join(f" | {t}T pre GFLOP/s %pk" for t in threads)
    print(f"decode: n=1, k={k}, ~{args.mib:.0f} MiB of weights per type" +
          (f"; prefill: {pr}x{pk} weight, n={pn}" if pre else ""))
    print(head)
    print("-" * len(head))
    for name in types:
        line = f"{name:6}"
        for t in threads:
            g = med(dt[name, t])
            line += f" | {g / 1e9:12.1f} {100 * g / med(bw[t]):4.0f}"
        if pre:
            for t in threads:
                g = med(pt[name, t])
                pk_s = f"{100 * g / (2 * peak * t):4.0f}" if peak else "   -"
                line += f" | {g / 1e9:14.1f} {pk_s}"
        print(line + ("  (repacked)" if name in rep else ""))


if __name__ == "__main__":
    main()
