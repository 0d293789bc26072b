"""The `llminfer` command: llama.cpp-style flags over the Python API.

    llminfer run -m smollm2-135m-instruct -p "Once upon a time" -n 64
    llminfer chat -m smollm2-135m-instruct --system "Be brief."
    llminfer tokenize -m MODEL "Hello world"
    llminfer perplexity -m MODEL -f text.txt -c 512
    llminfer bench -m MODEL -p 512 -n 128 -t 1,2
    llminfer info -m MODEL
    llminfer pull smollm2-135m-instruct
    llminfer quantize -m MODEL -o out.gguf --type Q4_K_M

MODEL is a .gguf path or a known model name (`llminfer pull --list`).
Generated text goes to stdout; progress, timings and errors to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

from llminfer import hub
from llminfer.errors import LLMInferError


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _non_negative_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {v}")
    return v


def _int_list(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _add_model(p, ctx_default=4096):
    p.add_argument("-m", "--model", default=hub.DEFAULT_MODEL,
                   help=f"GGUF path or known model name (default: {hub.DEFAULT_MODEL})")
    p.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="threads for the native kernels (default: physical cores)")
    p.add_argument("-c", "--ctx-size", type=_positive_int, default=ctx_default, help="context length")
    p.add_argument("-b", "--batch-size", type=_positive_int, default=512, help="prompt batch size")
    p.add_argument("-ctk", "--kv-type", default="f16", choices=["f16", "f32", "q8_0", "q4_0"],
                   help="KV cache type (default f16; q8_0 and q4_0 take 53%% and 28%% of its memory)")


def _add_sampling(p):
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default: random)")


def _sampling_kwargs(a):
    return dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, penalty_last_n=a.repeat_last_n,
                frequency_penalty=a.frequency_penalty, presence_penalty=a.presence_penalty,
                seed=a.seed)


def _load(a, **kw):
    from llminfer.llm import LLM

    return LLM(a.model, n_ctx=a.ctx_size, n_threads=a.threads, n_batch=a.batch_size, kv_type=a.kv_type, **kw)


def _err(msg):
    print(msg, file=sys.stderr, flush=True)


def _read_text(path):
    """A text file's contents; an LLMInferError (one line, not a traceback)
    when it is not UTF-8."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LLMInferError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from None


def _print_timings(t):
    _err(f"\nprompt: {t.prompt_tokens} tokens in {t.prompt_seconds * 1000:.1f} ms "
         f"({t.prompt_tokens_per_second:.1f} tokens/s, {t.cached_tokens} cached) | "
         f"generation: {t.generated_tokens} tokens, {t.generation_tokens_per_second:.1f} tokens/s, "
         f"{100 * t.python_share:.1f}% outside the native forward pass | "
         f"first token after {t.time_to_first_token * 1000:.1f} ms")


# ---- commands ----

def cmd_run(a):
    if a.file:
        prompt = _read_text(a.file)
    elif a.prompt is not None:
        prompt = a.prompt
    else:
        raise LLMInferError("give a prompt with -p TEXT or -f FILE")
    with _load(a) as llm:
        stream = llm.complete(prompt, max_tokens=a.n_predict, stop=a.stop or None, stream=True,
                              **_sampling_kwargs(a))
        if a.echo:
            sys.stdout.write(prompt)
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        _print_timings(stream.result.timings)
    return 0


def cmd_tokenize(a):
    from llminfer.gguf_file import GGUFFile
    from llminfer.tokenizer import Tokenizer

    with GGUFFile(hub.resolve(a.model)) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    ids = tok.encode(a.text, add_bos=not a.no_bos, special=a.special)
    if a.show_pieces:
        for i in ids:
            print(f"{i:>8} -> {tok.piece(i)!r}")
    else:
        print(ids)
    return 0


def cmd_perplexity(a):
    from llminfer.perplexity import perplexity

    text = _read_text(a.file)
    with _load(a) as llm:
        t0 = time.perf_counter()

        def progress(i, n, ppl):
            eta = (time.perf_counter() - t0) / i * (n - i)
            _err(f"[{i}/{n}] ppl {ppl:.4f}  (eta {eta:.0f} s)")

        r = perplexity(llm, text, n_ctx=a.ctx_size, max_chunks=a.chunks, progress=progress)
    print(f"Final estimate: PPL = {r.ppl:.4f} +/- {r.ppl_err:.5f}  "
          f"({r.n_chunks} chunks of {r.n_ctx} tokens, {r.tokens_scored} scored, {r.seconds:.1f} s)")
    return 0


def bench_once(llm, n_prompt, n_gen, threads, seed=0):
    """(prompt tokens/s, generation tokens/s) of one run: a random prompt of
    n_prompt tokens, then n_gen greedy tokens one at a time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    llm.n_threads = threads
    llm.reset()
    pp = tg = 0.0
    if n_prompt:
        ids = rng.integers(0, llm.n_vocab, n_prompt).astype(np.int32)
        t = time.perf_counter()
        llm._forward(ids, logits_all=False)
        pp = n_prompt / (time.perf_counter() - t)
    if n_gen:
        tok = np.array([int(np.argmax(llm._last_logits)) if n_prompt else 0], dtype=np.int32)
        if not n_prompt:
            llm._forward(tok, logits_all=False)
        t = time.perf_counter()
        for _ in range(n_gen):
            llm._forward(tok, logits_all=False)
            tok[0] = int(np.argmax(llm._last_logits))
        tg = n_gen / (time.perf_counter() - t)
    llm.reset()
    return pp, tg


def cmd_bench(a):
    from llminfer.system import system_info

    rows = []
    with _load(a, **{}) as llm:
        need = a.n_prompt + a.n_gen + 1
        if need > llm.n_ctx:
            raise LLMInferError(f"-p {a.n_prompt} -n {a.n_gen} needs a context of {need}; use -c")
        for threads in a.threads_list:
            pps, tgs = [], []
            for r in range(a.repetitions):
                pp, tg = bench_once(llm, a.n_prompt, a.n_gen, threads, seed=r)
                pps.append(pp)
                tgs.append(tg)
            for test, vals, n in (("pp", pps, a.n_prompt), ("tg", tgs, a.n_gen)):
                if n:
                    rows.append({"model": str(llm.model_path), "arch": llm.architecture,
                                 "threads": threads, "test": f"{test}{n}",
                                 "tokens_per_second": statistics.median(vals),
                                 "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                                 "runs": len(vals)})
    if a.json:
        print(json.dumps({"system": system_info(), "results": rows}, indent=2))
        return 0
    print(f"{'model':<40} {'threads':>7} {'test':>8} {'tokens/s':>16}")
    for r in rows:
        name = r["model"].rsplit("/", 1)[-1][:40]
        print(f"{name:<40} {r['threads']:>7} {r['test']:>8} "
              f"{r['tokens_per_second']:>9.2f} ± {r['stdev']:<6.2f}")
    return 0


def cmd_info(a):
    from llminfer.gguf_file import GGUFFile

    path = hub.resolve(a.model)
    with GGUFFile(path) as g:
        print(f"file: {path} ({g.file_size / 1e6:.1f} MB, GGUF v{g.version})")
        for k, v in g.metadata.items():
            if isinstance(v, (list, tuple)) or hasattr(v, "shape"):
                shown = f"[{len(v)} items]"
            else:
                shown = repr(v)
                if len(shown) > 100:
                    shown = shown[:97] + "..."
            print(f"  {k} = {shown}")
        counts = {}
        for t in g.tensors.values():
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        print(f"tensors: {len(g.tensors)} ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})")
        for line in _unloadable_types(g):
            print(line)
        if a.tensors:
            for t in g.tensors.values():
                print(f"  {t.name:<40} {t.type_name:<6} {str(t.shape):<16} {t.nbytes:>12}")
        if a.check:
            return _check_weights(g)
    return 0


def _unloadable_types(g) -> list:
    """Lines naming the tensor types in g that llminfer has no kernels for."""
    from llminfer.ops import SUPPORTED_TYPES

    supported = {int(t) for t in SUPPORTED_TYPES}
    by_type = {}
    for t in g.tensors.values():
        if t.qtype not in supported:
            by_type.setdefault(t.type_name, []).append(t.name)
    return [f"cannot load: {len(names)} tensor(s) of type {name} (e.g. {names[0]}): llminfer has no "
            f"kernels for {name}" for name, names in sorted(by_type.items())]


def _check_weights(g) -> int:
    """info --check: dequantize every tensor looking for NaN/inf; 1 if any."""
    from llminfer.numerics import scan_weights

    shown = [-1]

    def progress(done, total):
        if not sys.stderr.isatty():
            return
        pct = 100 * done // max(1, total)
        if pct != shown[0]:
            shown[0] = pct
            bar = "#" * (pct // 4)
            sys.stderr.write(f"\rchecking weights [{bar:<25}] {pct:3d}%")
            sys.stderr.flush()

    bad, skipped = scan_weights(g, progress)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    for name in skipped:
        print(f"  not checked: {name} (a type llminfer cannot dequantize)")
    for b in bad:
        print(f"  NON-FINITE: {b.name} ({b.type_name}): {b.n_bad} values, first in row {b.first_row}")
    print(f"check: {len(g.tensors) - len(skipped)} tensors read, "
          f"{'no NaN or infinite values' if not bad else f'{len(bad)} with NaN or infinite values'}")
    return 1 if bad else 0


def cmd_pull(a):
    if a.list or not a.name:
        for m in hub.KNOWN_MODELS.values():
            state = "fetched" if hub.model_path(m.name).exists() else "not fetched"
            print(f"{m.name:<24} {m.description} [{state}]")
        return 0
    path = hub.pull(a.name, force=a.force)
    print(path)
    return 0


def cmd_chat(a):
    from llminfer.chat_repl import repl

    with _load(a, chat_format=a.chat_format) as llm:
        return repl(llm, system=a.system, max_tokens=a.n_predict, sampling=_sampling_kwargs(a))


def cmd_quantize(a):
    from llminfer.quantize_model import quantize_model

    quantize_model(hub.resolve(a.model), a.output, a.type, a.threads, log=_err)
    return 0


def build_parser():
    p = argparse.ArgumentParser(prog="llminfer", description="Run GGUF language models on the CPU.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="generate text after a prompt, streamed to stdout")
    _add_model(r)
    r.add_argument("-p", "--prompt", help="the prompt")
    r.add_argument("-f", "--file", help="read the prompt from a file")
    r.add_argument("-n", "--n-predict", type=_non_negative_int, default=128, help="tokens to generate")
    r.add_argument("--stop", action="append", help="stop string (repeatable)")
    r.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    _add_sampling(r)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("chat", help="interactive chat in the terminal")
    _add_model(c)
    c.add_argument("--system", help="system message")
    c.add_argument("--chat-format", help="force a chat format (chatml, gemma, llama3)")
    c.add_argument("-n", "--n-predict", type=_non_negative_int, default=512, help="most tokens per reply")
    _add_sampling(c)
    c.set_defaults(func=cmd_chat)

    t = sub.add_parser("tokenize", help="print the token ids of a text")
    t.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    t.add_argument("text")
    t.add_argument("--no-bos", action="store_true", help="do not add BOS")
    t.add_argument("--special", action="store_true", help="match special tokens in the text")
    t.add_argument("--show-pieces", action="store_true", help="print each id with its piece")
    t.set_defaults(func=cmd_tokenize)

    q = sub.add_parser("perplexity", help="llama-perplexity's estimate on a text file")
    _add_model(q, ctx_default=512)
    q.add_argument("-f", "--file", required=True, help="the text")
    q.add_argument("--chunks", type=_positive_int, default=None, help="score at most this many windows")
    q.set_defaults(func=cmd_perplexity)

    b = sub.add_parser("bench", help="prompt and generation speed, llama-bench style")
    b.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    b.add_argument("-p", "--n-prompt", type=_non_negative_int, default=512)
    b.add_argument("-n", "--n-gen", type=_non_negative_int, default=128)
    b.add_argument("-t", "--threads", dest="threads_list", type=_int_list, default=None,
                   help="comma-separated thread counts (default: physical cores)")
    b.add_argument("-r", "--repetitions", type=_positive_int, default=3)
    b.add_argument("-c", "--ctx-size", type=_positive_int, default=None)
    b.add_argument("-b", "--batch-size", type=_positive_int, default=512)
    b.add_argument("-ctk", "--kv-type", default="f16", choices=["f16", "f32", "q8_0", "q4_0"], help="KV cache type")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_bench)

    i = sub.add_parser("info", help="metadata and tensor types of a model (and the types llminfer cannot load)")
    i.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    i.add_argument("--tensors", action="store_true", help="list every tensor")
    i.add_argument("--check", action="store_true",
                   help="read every weight looking for NaN or infinite values (exit status 1 if any)")
    i.set_defaults(func=cmd_info)

    from llminfer.quantize_model import PRESETS

    z = sub.add_parser("quantize", help="requantize a model with llminfer's quantizers")
    z.add_argument("-m", "--model", required=True)
    z.add_argument("-o", "--output", required=True, help="the GGUF file to write")
    z.add_argument("--type", required=True, type=str.upper, choices=PRESETS)
    z.add_argument("-t", "--threads", type=_positive_int, default=None)
    z.set_defaults(func=cmd_quantize)

    u = sub.add_parser("pull", help="fetch a known model into the cache")
    u.add_argument("name", nargs="?")
    u.add_argument("--list", action="store_true", help="list the known models")
    u.add_argument("--force", action="store_true", help="fetch again even if cached")
    u.set_defaults(func=cmd_pull)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None):
    # the user ran a command, not our code: no file, line number or source line
    _err(f"llminfer: warning: {message}")


def _stdout_gone():
    """The reader of stdout went away (llminfer run ... | head): point stdout
    at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (captured in a test)


def main(argv=None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.command == "bench":
        from llminfer.system import default_threads

        a.threads_list = a.threads_list or [default_threads()]
        a.threads = max(a.threads_list)
        a.ctx_size = a.ctx_size or max(512, a.n_prompt + a.n_gen + 1)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return a.func(a)
    except BrokenPipeError:
        _stdout_gone()
        return 141  # as a shell reports a process ended by SIGPIPE
    except (LLMInferError, OSError) as e:
        _err(f"llminfer: error: {e}")
        return 1
    except KeyboardInterrupt:
        _err("\ninterrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
