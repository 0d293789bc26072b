"""Token-id parity with llama.cpp, and how long a tokenizer takes to build.

Run with a Python that has llama-cpp-python (the peer) as well as llminfer:

    PYTHONPATH=. $LLMINFER_PEER_PYTHON bench/tokenizer_parity.py [model.gguf ...]

Without arguments it checks the known models (fetched into the cache by
name). Each battery string (tests/text/test_tokenizer.py) is encoded under every
(add_bos, special) combination and compared with llama.cpp's ids; the table
counts exact matches. Build time is from metadata to a ready Tokenizer,
first and best of three, reading the GGUF not included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llminfer import hub  # noqa: E402
from llminfer.core.gguf_file import GGUFFile  # noqa: E402
from llminfer.text.tokenizer import Tokenizer  # noqa: E402
from tokenizer_battery import BATTERY, FLAGS  # noqa: E402

KNOWN = ("smollm2-135m-instruct", "gemma3-270m")


def build_time(metadata, repeats=3):
    """Seconds for the first build and the best of repeats."""
    times, tok = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        tok = Tokenizer.from_metadata(metadata)
        times.append(time.perf_counter() - t0)
    return tok, times[0], min(times)


def check(path):
    import llama_cpp

    t0 = time.perf_counter()
    metadata = GGUFFile(path).metadata
    read_s = time.perf_counter() - t0
    tok, first_s, build_s = build_time(metadata)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    exact, misses = 0, []
    for text in BATTERY:
        for add_bos, special in FLAGS:
            ours = tok.encode(text, add_bos=add_bos, special=special)
            theirs = llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
            if ours == theirs:
                exact += 1
            else:
                misses.append((text, add_bos, special, ours, theirs))
    return {
        "model": Path(path).name,
        "tokenizer": f"{tok.kind}" + (f"/{tok.pre}" if tok.pre else ""),
        "n_vocab": tok.n_vocab,
        "strings": len(BATTERY),
        "checks": len(BATTERY) * len(FLAGS),
        "exact": exact,
        "read_s": read_s,
        "first_s": first_s,
        "build_s": build_s,
        "misses": misses,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="GGUF files (default: the known models)")
    args = ap.parse_args(argv)
    paths = args.models or [hub.pull(name, quiet=True) for name in KNOWN]

    rows = [check(p) for p in paths]
    head = ("model", "tokenizer", "n_vocab", "strings", "checks", "exact", "read s", "build s 1st", "best of 3")
    table = [head] + [
        (r["model"], r["tokenizer"], str(r["n_vocab"]), str(r["strings"]), str(r["checks"]),
         str(r["exact"]), f"{r['read_s']:.3f}", f"{r['first_s']:.3f}", f"{r['build_s']:.3f}")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for k, row in enumerate(table):
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print(f"\nchecks: each string under (add_bos, special) in {FLAGS}")
    failed = False
    for r in rows:
        for text, add_bos, special, ours, theirs in r["misses"]:
            failed = True
            print(f"MISMATCH {r['model']} add_bos={add_bos} special={special} {text!r}\n"
                  f"  ours:      {ours}\n  llama.cpp: {theirs}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
