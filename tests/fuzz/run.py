"""Fuzz llminfer's untrusted inputs: GGUF files, chat templates and HTTP request bodies.

    python tests/fuzz/run.py gguf --seconds 60             # pure-Python mutator
    python tests/fuzz/run.py template --iterations 5000 --seed 3
    python tests/fuzz/run.py http --seconds 600              # JSON bodies POSTed to the server's app
    python tests/fuzz/run.py gguf-run --seconds 60          # also load and run each model
    python tests/fuzz/run.py gguf --atheris -max_total_time=60    # coverage-guided (pip install atheris)
    python tests/fuzz/run.py template --atheris -max_total_time=3600 -timeout=20 CORPUS_DIR

Targets are in targets.py, seeds in corpus.py. A finding is any exception
that is not an LLMInferError (saved under --findings, default
./fuzz-findings, with its traceback), a crash (atheris saves the input; the
pure-Python runner writes each input to `<findings>/current` before running
it, so after a crash that file is the culprit), or a hang: an input that runs
longer than --hang seconds (SIGALRM, POSIX only) is saved and reported.
Exit status 0 when nothing was found.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for gguf_bytes and the fuzz package

from fuzz.corpus import SEEDS, write  # noqa: E402
from fuzz.mutate import JSONMutator, Mutator  # noqa: E402
from fuzz.targets import TARGETS  # noqa: E402


class Hang(BaseException):
    """Raised by SIGALRM in an input that ran too long (BaseException, so no
    `except Exception` in the code under test swallows it)."""


def _save(findings, kind, data, text=""):
    os.makedirs(findings, exist_ok=True)
    name = f"{kind}-{hashlib.sha1(data).hexdigest()[:12]}"
    with open(os.path.join(findings, name), "wb") as f:
        f.write(data)
    if text:
        with open(os.path.join(findings, name + ".txt"), "w") as f:
            f.write(text)
    return name


def fuzz(target: str, iterations=None, seconds=None, seed=0, hang=None, findings=None, log=print) -> dict:
    """Run the pure-Python mutational fuzzer; returns the figures of the run:
    inputs, ok, refused, findings (list of (kind, message)), slowest (s)."""
    run_one = TARGETS[target]
    mutator = (JSONMutator if target == "http" else Mutator)(SEEDS[target](), seed=seed)
    stats = {"inputs": 0, "ok": 0, "refused": 0, "findings": [], "slowest": 0.0}
    use_alarm = hang is not None and hasattr(signal, "SIGALRM")
    if use_alarm:
        def on_alarm(signum, frame):
            raise Hang()
        previous = signal.signal(signal.SIGALRM, on_alarm)
    start = time.monotonic()
    try:
        while True:
            if iterations is not None and stats["inputs"] >= iterations:
                break
            if seconds is not None and time.monotonic() - start >= seconds:
                break
            data = mutator.next() if stats["inputs"] >= len(mutator.seeds) else mutator.seeds[stats["inputs"]]
            if findings:
                os.makedirs(findings, exist_ok=True)
                with open(os.path.join(findings, "current"), "wb") as f:
                    f.write(data)
            t = time.monotonic()
            try:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, hang)
                stats[run_one(data)] += 1
            except Hang:
                msg = f"ran longer than {hang} s"
                stats["findings"].append(("hang", msg))
                if findings:
                    log(f"hang: saved as {_save(findings, 'hang', data)}")
            except Exception as e:  # a finding: not an LLMInferError
                text = traceback.format_exc()
                stats["findings"].append(("exception", f"{type(e).__name__}: {e}"[:300]))
                if findings:
                    log(f"finding {type(e).__name__}: saved as {_save(findings, 'exception', data, text)}")
                else:
                    log(text)
            finally:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            stats["slowest"] = max(stats["slowest"], time.monotonic() - t)
            stats["inputs"] += 1
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, previous)
    if findings and os.path.exists(os.path.join(findings, "current")):
        os.remove(os.path.join(findings, "current"))
    return stats


def _atheris(target, argv):
    import atheris

    with atheris.instrument_imports(include=["llminfer", "jinja2"]):
        import llminfer.text.chat  # noqa: F401
        import llminfer.core.gguf_file  # noqa: F401
        import llminfer.models  # noqa: F401
        import llminfer.text.tokenizer  # noqa: F401
    run_one = TARGETS[target]

    def test_one_input(data):
        run_one(bytes(data))

    corpus = [a for a in argv[1:] if not a.startswith("-")]
    if not corpus:
        seeds = os.path.join(os.getcwd(), f"fuzz-corpus-{target}")
        write(seeds, target)
        argv = argv + [seeds]
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--atheris" in argv:
        rest = [a for a in argv if a != "--atheris"]
        return _atheris(rest[0], [sys.argv[0]] + rest[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", choices=sorted(TARGETS))
    p.add_argument("--iterations", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hang", type=float, default=20.0, help="seconds after which an input counts as a hang")
    p.add_argument("--findings", default="fuzz-findings")
    a = p.parse_args(argv)
    if a.iterations is None and a.seconds is None:
        a.seconds = 60.0
    t = time.monotonic()
    s = fuzz(a.target, a.iterations, a.seconds, a.seed, a.hang, a.findings)
    hangs = sum(1 for k, _ in s["findings"] if k == "hang")
    print(f"{a.target}: {s['inputs']} inputs in {time.monotonic() - t:.0f} s ({s['ok']} loaded, {s['refused']} "
          f"refused with an LLMInferError), {len(s['findings']) - hangs} findings, {hangs} hangs, "
          f"slowest input {s['slowest']:.2f} s")
    return 1 if s["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
