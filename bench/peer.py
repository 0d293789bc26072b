"""The peer, llama.cpp, as the bench scripts reach it: where its command-line
tools and a Python with llama-cpp-python are, and one way to run llama-bench
and read what it prints.

Where things are found, first match wins:
  llama.cpp's tools (llama-bench, llama-quantize, llama-server):
      --llama-cpp BIN_DIR, then $LLMINFER_LLAMA_CPP, then the PATH
  a Python with llama-cpp-python:
      --peer-python PYTHON, then $LLMINFER_PEER_PYTHON, then the Python
      running the script if it imports llama_cpp
Nothing found is a SystemExit that names the flag and the variable. BIN_DIR
may also be the tool itself (older flags took the llama-bench binary).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

LLAMA_CPP_ENV = "LLMINFER_LLAMA_CPP"
PEER_PYTHON_ENV = "LLMINFER_PEER_PYTHON"  # the name tests/conftest.py reads too


# ---- locators ----

def add_llama_cpp_arg(ap: argparse.ArgumentParser, *aliases: str, help_extra: str = "") -> None:
    """--llama-cpp BIN_DIR (and the script's older spellings of it), into a.llama_cpp."""
    ap.add_argument("--llama-cpp", *aliases, dest="llama_cpp", metavar="BIN_DIR",
                    help=f"llama.cpp's build/bin (default: ${LLAMA_CPP_ENV}, then the PATH){help_extra}")


def add_peer_python_arg(ap: argparse.ArgumentParser, *aliases: str) -> None:
    """--peer-python PYTHON (and the script's older spellings of it), into a.peer_python."""
    ap.add_argument("--peer-python", *aliases, dest="peer_python", metavar="PYTHON",
                    help=f"a Python with llama-cpp-python (default: ${PEER_PYTHON_ENV}, then this Python "
                         f"if it has llama_cpp)")


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def llama_cpp_tool(name: str, bin_dir: str | None = None) -> str:
    """The path of llama.cpp's tool `name` ("llama-bench", "llama-quantize",
    "llama-server"): in bin_dir (--llama-cpp) if given, else in
    $LLMINFER_LLAMA_CPP, else on the PATH."""
    env = os.environ.get(LLAMA_CPP_ENV)
    for where, place in ((f"--llama-cpp {bin_dir}", bin_dir), (f"${LLAMA_CPP_ENV}={env}", env)):
        if not place:
            continue
        folder = os.path.dirname(place) if os.path.isfile(place) else place  # the tool given, not its folder
        exe = os.path.join(folder, name)
        if _executable(exe):
            return exe
        # an explicit place that lacks the tool is an error, not a reason to look elsewhere
        raise SystemExit(f"{name} is not in {where} (llama.cpp's build/bin, where `cmake --build build` puts it)")
    exe = shutil.which(name)
    if exe:
        return exe
    raise SystemExit(f"{name} not found: give llama.cpp's build/bin with --llama-cpp BIN_DIR or "
                     f"${LLAMA_CPP_ENV}, or put it on the PATH")


def peer_python(path: str | None = None) -> str:
    """A Python that has llama-cpp-python: path (--peer-python) if given,
    else $LLMINFER_PEER_PYTHON, else the running Python if it imports llama_cpp."""
    env = os.environ.get(PEER_PYTHON_ENV)
    for where, exe in ((f"--peer-python {path}", path), (f"${PEER_PYTHON_ENV}={env}", env)):
        if not exe:
            continue
        found = exe if os.sep in exe else shutil.which(exe)
        if found and _executable(found):
            return found
        raise SystemExit(f"the peer Python of {where} is not an executable file")
    if _imports_llama_cpp():
        return sys.executable
    raise SystemExit(f"no Python with llama-cpp-python: give one with --peer-python PYTHON or "
                     f"${PEER_PYTHON_ENV} (this Python, {sys.executable}, cannot import llama_cpp)")


def _imports_llama_cpp() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


# ---- running a peer ----

def run_child(cmd: list[str], env: dict | None = None) -> tuple[str, float]:
    """(stdout, peak RSS MB) of one child, its rusage taken with os.wait4. A
    child that fails is a RuntimeError that says how: killed by a signal (by
    its name), or its exit status and the last line it wrote to stderr."""
    with tempfile.TemporaryFile(mode="w+") as err:  # a file, not a pipe: wait4 must reap the child, not communicate()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        with proc.stdout:
            out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        err.seek(0)
        last = err.read().strip().splitlines()[-1:]
    if code < 0:  # llama.cpp's AMX prompt path on some Xeons: SIGSEGV (docs/performance.md)
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        raise RuntimeError(f"{' '.join(cmd)} was killed by {name}")
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with status {code}" + (f": {last[0]}" if last else ""))
    return out, usage.ru_maxrss / 1024  # KiB on Linux


def llama_bench_cmd(exe: str, model: str, threads: int, n_prompt: int = 512, n_gen: int = 128, n_depth: int = 0,
                    reps: int = 1, n_gpu_layers: int | None = None, output: str = "json") -> list[str]:
    """llama-bench's command line for one model and thread count: a pp test
    of n_prompt tokens and a tg test of n_gen (0 leaves a test out), each
    from a context of n_depth tokens (-d), repeated reps times (-r)."""
    cmd = [exe, "-m", str(model), "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen)]
    if n_depth:  # -d is recent (2025): left out when not wanted, so older builds still run
        cmd += ["-d", str(n_depth)]
    if n_gpu_layers is not None:
        cmd += ["-ngl", str(n_gpu_layers)]
    return cmd + ["-r", str(reps), "-o", output]


def parse_llama_bench(text: str) -> dict[str, float]:
    """Tokens per second by test from llama-bench's -o json, jsonl or csv
    output: "pp" (a row with n_prompt and no n_gen), "tg" (n_gen and no
    n_prompt), "pg" (both, -pg). Each is the row's avg_ts, the mean over its
    repetitions."""
    text = text.strip()
    if not text:
        raise ValueError("llama-bench printed no results")
    if text.startswith("["):
        rows = json.loads(text)
    elif text.startswith("{"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = list(csv.DictReader(io.StringIO(text)))
    res: dict[str, float] = {}
    for row in rows:
        try:
            n_prompt, n_gen, ts = int(row["n_prompt"]), int(row["n_gen"]), float(row["avg_ts"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a llama-bench result row ({e!r}): {str(row)[:200]}") from None
        test = "pg" if n_prompt and n_gen else "pp" if n_prompt else "tg"
        if test in res:
            raise ValueError(f"llama-bench printed two {test} rows: run it with one -p and one -n")
        res[test] = ts
    return res


def llama_bench(exe: str, model: str, threads: int, n_prompt: int = 512, n_gen: int = 128, n_depth: int = 0,
                reps: int = 1, n_gpu_layers: int | None = None, env: dict | None = None) -> tuple[dict, float]:
    """({"pp": tok/s, "tg": tok/s}, peak RSS MB) of one llama-bench process
    (exe from llama_cpp_tool("llama-bench", ...)); tests left out by
    n_prompt=0 or n_gen=0 are absent. A failed run is run_child's RuntimeError."""
    out, rss = run_child(llama_bench_cmd(exe, model, threads, n_prompt, n_gen, n_depth, reps, n_gpu_layers), env)
    return parse_llama_bench(out), rss
