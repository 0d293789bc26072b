"""The server's metrics, in Prometheus' text exposition format (version 0.0.4).

Names follow vLLM's (`vllm:num_requests_running` here is
`llminfer:num_requests_running`), so dashboards and routers written for it
need only the prefix changed:

    llminfer:num_requests_running       gauge      requests in the running batch
    llminfer:num_requests_waiting       gauge      requests queued for admission
    llminfer:kv_cache_usage_perc        gauge      share of KV blocks held by requests (0..1)
    llminfer:prefix_cache_blocks        gauge      KV blocks the prefix cache keeps
    llminfer:state_cache_usage_perc     gauge      share of recurrent-state slots in use (hybrid models)
    llminfer:state_cache_bytes          gauge      bytes of recurrent state in use (hybrid models)
    llminfer:prompt_tokens_total        counter    prompt tokens of finished requests
    llminfer:generation_tokens_total    counter    tokens generated
    llminfer:prefix_cache_queries_total counter    prompt tokens looked up in the prefix cache
    llminfer:prefix_cache_hits_total    counter    of those, tokens found
    llminfer:num_preemptions_total      counter    requests preempted (recomputed later)
    llminfer:request_success_total      counter    finished requests, by finished_reason
    llminfer:avg_generation_throughput_toks_per_s  gauge  over the last 10 s
    llminfer:time_to_first_token_seconds   histogram
    llminfer:inter_token_latency_seconds   histogram
    llminfer:e2e_request_latency_seconds   histogram

Written here rather than with prometheus_client: a few counters and
histograms, updated from the engine thread and read by the HTTP thread.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque

PREFIX = "llminfer:"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0)


def _number(v) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def labels_text(labels: dict) -> str:
    if not labels:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc)) + "}"


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus keeps them."""

    def __init__(self, buckets):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float):
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def lines(self, name, labels):
        out, acc = [], 0
        for bound, c in zip(self.bounds + (math.inf,), self.counts):
            acc += c
            out.append(f"{name}_bucket{labels_text({**labels, 'le': _number(float(bound))})} {acc}")
        out.append(f"{name}_sum{labels_text(labels)} {_number(self.sum)}")
        out.append(f"{name}_count{labels_text(labels)} {self.count}")
        return out


class Metrics:
    """Every metric of one server. Counters and histograms are updated with
    the methods below (any thread); gauges are read when rendered, from
    `gauges()`, a callable the scheduler supplies."""

    def __init__(self, model_name: str, gauges=None):
        self.labels = {"model_name": model_name}
        self.gauges = gauges or (lambda: {})
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.finished = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self._recent = deque()  # (time, tokens) of recent steps, for the throughput gauge

    def on_tokens(self, n: int, now: float | None = None):
        now = time.monotonic() if now is None else now
        with self._lock:
            self.generation_tokens += n
            self._recent.append((now, n))
            while self._recent and self._recent[0][0] < now - 10.0:
                self._recent.popleft()

    def on_first_token(self, seconds: float):
        with self._lock:
            self.ttft.observe(seconds)

    def on_inter_token(self, seconds: float):
        with self._lock:
            self.itl.observe(seconds)

    def on_finished(self, reason: str, prompt_tokens: int, seconds: float):
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.prompt_tokens += prompt_tokens
            self.e2e.observe(seconds)

    def on_preemption(self):
        with self._lock:
            self.preemptions += 1

    def throughput(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            recent = [n for t, n in self._recent if t >= now - 10.0]
        return sum(recent) / 10.0

    def render(self) -> str:
        g = self.gauges()
        lab = self.labels
        out = []

        def family(name, kind, doc, samples):
            full = PREFIX + name
            out.append(f"# HELP {full} {doc}")
            out.append(f"# TYPE {full} {kind}")
            for suffix, labels, v in samples:
                out.append(f"{full}{suffix}{labels_text(labels)} {_number(v)}")

        family("num_requests_running", "gauge", "Requests in the running batch.",
               [("", lab, g.get("running", 0))])
        family("num_requests_waiting", "gauge", "Requests waiting to be admitted.",
               [("", lab, g.get("waiting", 0))])
        family("kv_cache_usage_perc", "gauge", "Share of KV cache blocks held by requests (1 = all).",
               [("", lab, float(g.get("kv_usage", 0.0)))])
        family("prefix_cache_blocks", "gauge", "KV cache blocks kept by the prefix cache.",
               [("", lab, g.get("prefix_blocks", 0))])
        if g.get("state_slots"):  # a hybrid model's recurrent-state pool, beside the KV pool
            family("state_cache_usage_perc", "gauge", "Share of recurrent-state slots in use (sequences and "
                   "their checkpoints; 1 = all).", [("", lab, g["state_used_slots"] / g["state_slots"])])
            family("state_cache_bytes", "gauge", "Bytes of recurrent state in use.",
                   [("", lab, g["state_used_slots"] * g["state_slot_bytes"])])
        family("avg_generation_throughput_toks_per_s", "gauge", "Tokens generated per second over the last 10 s.",
               [("", lab, self.throughput())])
        with self._lock:
            family("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                   [("", lab, self.prompt_tokens)])
            family("generation_tokens_total", "counter", "Tokens generated.", [("", lab, self.generation_tokens)])
            family("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                   [("", lab, g.get("prefix_queries", 0))])
            family("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
                   [("", lab, g.get("prefix_hits", 0))])
            family("num_preemptions_total", "counter", "Requests preempted to free KV blocks.",
                   [("", lab, self.preemptions)])
            family("request_success_total", "counter", "Finished requests by why they finished.",
                   [("", {**lab, "finished_reason": k}, v) for k, v in sorted(self.finished.items())])
            for name, h, doc in (("time_to_first_token_seconds", self.ttft, "Time to first token."),
                                 ("inter_token_latency_seconds", self.itl, "Time between tokens of a request."),
                                 ("e2e_request_latency_seconds", self.e2e, "Time from arrival to the last token.")):
                full = PREFIX + name
                out.append(f"# HELP {full} {doc}")
                out.append(f"# TYPE {full} histogram")
                out.extend(h.lines(full, lab))
        return "\n".join(out) + "\n"
