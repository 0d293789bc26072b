"""Perplexity by llama.cpp's llama-perplexity method, so figures compare.

The text is tokenized once (BOS as the vocabulary says, special tokens not
parsed) and cut into consecutive windows of n_ctx tokens; a remainder shorter
than a window is dropped. Each window is evaluated from an empty context with
its first token replaced by BOS (when the vocabulary adds one), and only its
second half is scored: the logits at positions n_ctx/2 .. n_ctx-2 predict the
tokens after them. The estimate is exp(mean NLL) and its uncertainty
ppl * sqrt(var(NLL) / (count - 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from llminfer.errors import InvalidArgumentError


@dataclass
class PerplexityResult:
    ppl: float
    ppl_err: float
    n_chunks: int
    n_ctx: int
    tokens_scored: int
    running: list = field(default_factory=list)  # the estimate after each window
    seconds: float = 0.0


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target under its row of logits (float64)."""
    x = logits.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(x - mx).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


def chunks(tokens, n_ctx: int, bos_id: int | None):
    """The windows scored: lists of n_ctx tokens, BOS first when given."""
    if n_ctx < 4:
        raise InvalidArgumentError(f"the window must be at least 4 tokens, got n_ctx={n_ctx}")
    n_chunk = len(tokens) // n_ctx
    if n_chunk < 1 or len(tokens) < 2 * n_ctx:
        raise InvalidArgumentError(f"the text has {len(tokens)} tokens; at least 2*n_ctx = {2 * n_ctx} "
                                   f"are needed")
    for i in range(n_chunk):
        window = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            window[0] = bos_id
        yield window


def perplexity(llm, text: str, n_ctx: int = 512, max_chunks: int | None = None, progress=None):
    """llama-perplexity's estimate for `text` with windows of n_ctx tokens.
    progress(i, n, running_ppl) is called after each window."""
    import time

    if n_ctx > llm.n_ctx:
        raise InvalidArgumentError(f"n_ctx={n_ctx} exceeds the model's context of {llm.n_ctx} tokens; "
                                   f"load it with n_ctx >= {n_ctx}")
    tokens = llm.tokenize(text, add_bos=True, special=False)
    bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
    windows = list(chunks(tokens, n_ctx, bos))
    if max_chunks is not None:
        windows = windows[:max(1, max_chunks)]
    first = n_ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    t0 = time.perf_counter()
    for i, window in enumerate(windows):
        llm.reset()
        logits = llm.eval(window)
        nll = token_nll(logits[first:n_ctx - 1], np.asarray(window[first + 1:n_ctx]))
        nll_sum += float(nll.sum())
        nll2_sum += float((nll * nll).sum())
        count += len(nll)
        running.append(math.exp(nll_sum / count))
        if progress is not None:
            progress(i + 1, len(windows), running[-1])
    llm.reset()
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, err, len(windows), n_ctx, count, running, time.perf_counter() - t0)
