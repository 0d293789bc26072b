"""Speculative decoding: generation tokens/s with and without it, and a check
that greedy output is the same token for token.

    PYTHONPATH=. python bench/speculative.py                     # the full table (slow)
    PYTHONPATH=. python bench/speculative.py --tiny              # a quick check that it runs

Tasks (chat prompts, greedy, every run from the same prompt):
  code     a ~300-line Python file (generated here, deterministically) and
           the instruction to rename a variable: the reply repeats the file
  summary  an article with quotes to summarise, quoting it
  story    free-form story writing: little to copy

Modes: plain (spec="off"), ngram (prompt lookup), and draft rows: each model
drafted by a Q4_0 requantization of itself (made with llminfer's quantizer
into --cache on first use), and, with --big, SmolLM2-135M drafting for that
larger model of the same vocabulary. bench/make_model.py writes one, a
random-weight 1B Llama with SmolLM2's vocabulary:

    python bench/make_model.py -o llama1b-f16.gguf
    llama-quantize llama1b-f16.gguf llama1b-q4_k_m.gguf Q4_K_M
    PYTHONPATH=. python bench/speculative.py --big llama1b-q4_k_m.gguf

Its text is noise, so its acceptance rate means nothing; the row shows only
what a draft pass costs against a target 8x its size.

Figures are LLM timings' generation tokens/s (prompt excluded; the prompt is
cached between the runs of one model, and a draft model's prefill counts as
prompt), the median of --runs runs; "speedup" is against plain at the same
thread count; "same" says whether the tokens equal plain's. Targets (issue
14): >= 2x on code at 2 threads, no more than 3% slower on story.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from llminfer import LLM, hub

MODELS = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}


# ---- prompts ----

def code_file(lines: int = 300) -> str:
    """A plausible Python module of about `lines` lines, the same every time,
    in which `total_count` appears often (the variable to rename)."""
    names = ["orders", "invoices", "parcels", "tickets", "readings", "samples", "events", "records",
             "messages", "payments", "visits", "shipments", "votes", "scores", "logs", "batches"]
    out = ['"""Small helpers for counting and summarising business records."""', "",
           "from __future__ import annotations", "", "import math", "from dataclasses import dataclass", ""]
    i = 0
    while len(out) < lines - 12:
        n = names[i % len(names)]
        k = i // len(names)
        out += [
            "",
            f"def summarise_{n}{'_' + str(k) if k else ''}(items, threshold={i % 7 + 1}):",
            f'    """Count the {n} above threshold and return their mean weight."""',
            "    total_count = 0",
            "    weight = 0.0",
            "    for item in items:",
            "        if item.value > threshold:",
            "            total_count += 1",
            f"            weight += item.value * {1 + i % 5}",
            "    if total_count == 0:",
            "        return 0, 0.0",
            "    return total_count, weight / total_count",
        ]
        i += 1
    out += ["", "", "@dataclass", "class Report:", "    total_count: int", "    mean: float", "",
            "    def describe(self) -> str:", '        return f"{self.total_count} items, mean {self.mean:.2f}"', ""]
    return "\n".join(out)


ARTICLE = """City Council Approves New Riverside Park

After months of debate, the city council voted 7 to 2 on Tuesday to turn the
old freight yard along the river into a public park. "This is the biggest
change to the riverfront in fifty years," said council member Ana Ortiz, who
led the proposal. "Families on the east side have waited far too long for a
green space they can walk to."

The plan sets aside 14 acres for lawns, a playground and a walking path that
links the park to the existing cycle route. Construction is expected to begin
in the spring and to take about two years. The project will cost an
estimated 38 million dollars, most of it from a state grant.

Not everyone is pleased. "We support parks, but the budget has no money for
maintenance after the first three years," said council member David Chen, who
voted against the plan. Local business owners also raised concerns about
parking. "Our customers already struggle to find a space on weekends," said
Maria Lopez, who runs a bakery on River Street.

Supporters point to studies showing that parks raise property values and
improve public health. "Every dollar we spend here comes back to the city
many times over," Ortiz said. The council will hold a public meeting next
month to present the final design, and residents are invited to comment.
"""

STORY = "Write a short story about a lighthouse keeper who finds an old map in a bottle."


def tasks(code_lines: int) -> dict:
    return {
        "code": "Here is a Python file.\n\n```python\n" + code_file(code_lines) + "\n```\n\n"
                "Rename the variable `total_count` to `n_items` everywhere in this file and keep every "
                "other line exactly as it is. Reply with the complete updated file only.",
        "summary": "Summarise this article in a few paragraphs. Quote every person's key sentence "
                   "word for word.\n\n" + ARTICLE,
        "story": STORY,
    }


# ---- running ----

def requantized(src: str, cache: Path, qtype: str = "Q4_0") -> str:
    """A qtype copy of src in cache, made once with llminfer's quantizer."""
    from llminfer.core.quantize_model import quantize_model

    src = str(hub.resolve(src))
    out = cache / f"{Path(src).stem}.{qtype}.gguf"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"# quantizing {src} to {out}", file=sys.stderr, flush=True)
        quantize_model(src, str(out), qtype, None, allow_requantize=True)
    return str(out)


def measure(llm, prompt, new, threads, spec, runs):
    llm.n_threads = threads
    msgs = [{"role": "user", "content": prompt}]
    speeds, last = [], None
    for _ in range(runs):
        c = llm.chat_completion(msgs, max_tokens=new, temperature=0, spec=spec)
        speeds.append(c.timings.generation_tokens_per_second)
        last = c
    return statistics.median(speeds), last


def bench_model(label, llm, draft_label, task_prompts, a, rows):
    for task, prompt in task_prompts.items():
        for threads in a.threads:
            base, plain = measure(llm, prompt, a.new, threads, "off", a.runs)
            rows.append((label, task, threads, "plain", base, 1.0, 0, 0, True, len(plain.tokens)))
            modes = ["ngram"] + (["draft"] if draft_label else [])
            for mode in modes:
                speed, c = measure(llm, prompt, a.new, threads, mode, a.runs)
                t = c.timings
                name = "ngram" if mode == "ngram" else f"draft {draft_label}"
                rows.append((label, task, threads, name, speed, speed / base if base else 0.0,
                             t.spec_drafted, t.spec_accepted, c.tokens == plain.tokens, len(c.tokens)))
            for r in rows[-len(modes) - 1:]:
                print_row(r)


def print_header():
    print(f"{'model':<22} {'task':<8} {'thr':>3} {'mode':<28} {'tok/s':>8} {'speedup':>8} "
          f"{'drafted':>8} {'accepted':>8} {'acc%':>6} {'same':>5} {'tokens':>6}", flush=True)


def print_row(r):
    label, task, threads, mode, speed, up, drafted, accepted, same, n = r
    acc = f"{100 * accepted / drafted:.0f}" if drafted else "-"
    print(f"{label:<22} {task:<8} {threads:>3} {mode:<28} {speed:>8.2f} {up:>7.2f}x "
          f"{drafted:>8} {accepted:>8} {acc:>6} {'yes' if same else 'NO':>5} {n:>6}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3, or GGUF paths")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("--new", type=int, default=256, help="tokens generated per run")
    ap.add_argument("-r", "--runs", type=int, default=3)
    ap.add_argument("--tasks", default="code,summary,story")
    ap.add_argument("--code-lines", type=int, default=300)
    ap.add_argument("--no-draft", action="store_true", help="skip the draft-model rows")
    ap.add_argument("--big", default="", help="a larger model with SmolLM2's vocabulary, drafted by "
                                              "SmolLM2-135M (default: none)")
    ap.add_argument("--cache", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache"),
                    help="where requantized draft models are written")
    ap.add_argument("--tiny", action="store_true", help="a quick check: 1 thread, 24 tokens, 1 run, "
                                                        "a 40-line file, SmolLM2 only, no --big")
    a = ap.parse_args()
    if a.tiny:
        a.models, a.threads, a.new, a.runs, a.code_lines, a.big = "smollm2", "1", 24, 1, 40, ""
    if a.big and not Path(a.big).exists():
        ap.error(f"--big {a.big}: no such file")
    a.threads = [int(t) for t in a.threads.split(",")]
    wanted = a.tasks.split(",")
    task_prompts = {k: v for k, v in tasks(a.code_lines).items() if k in wanted}
    n_ctx = 8192 if a.code_lines > 100 else 2048
    rows = []
    print_header()
    for name in filter(None, a.models.split(",")):
        model = MODELS.get(name, name)
        draft = None if a.no_draft else requantized(model, Path(a.cache))
        with LLM(model, n_ctx=n_ctx, draft_model=draft, spec="off") as llm:
            bench_model(name, llm, "Q4_0 self" if draft else None, task_prompts, a, rows)
    if a.big:
        with LLM(a.big, n_ctx=n_ctx, draft_model=MODELS["smollm2"], spec="off") as llm:
            bench_model(Path(a.big).stem + " (random)", llm, "smollm2-135m", task_prompts, a, rows)
    bad = [r for r in rows if not r[8]]
    if bad:
        print(f"\nOUTPUT DIFFERS from plain greedy in {len(bad)} rows", flush=True)
        return 1
    print("\ngreedy output identical with and without speculation in every row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
