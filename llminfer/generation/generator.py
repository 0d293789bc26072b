"""One sequence's generation, token by token: the one place that turns logits
into the next token and a token into output.

Every front drives the same `Generator`: the single-sequence path of
`LLM` (streams, speculative decoding), the batch path (`LLM.generate` over a
list of prompts) and the server's scheduler. Each calls

    tok = gen.next_token(logits)       # grammar mask, then the sampler
    event, reason = gen.emit(tok, logits)
    ...
    text, reason = gen.finish(reason)  # the text held back, once

`emit` gives a `TokenEvent` (the token, the text it completes, its
log-probabilities when asked for) and a finish reason when the sequence ends
at this token: "stop" for an end-of-generation token, a stop string or a
completed grammar. The caller owns the context, the forward passes and the
token budget ("length"). Text is assembled from the tokens' bytes with an
incremental UTF-8 decoder (a character split over two tokens comes out
whole), and text that may be the start of a stop string is held back until
it is known not to be one.

Log-probabilities are those of the model's logits, before a grammar masks
them, in float64 (`token_logprobs`).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

import numpy as np

from llminfer.errors import InvalidArgumentError


def stop_list(stop) -> list:
    """stop= as a list of strings (None, a string, or a list of strings)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got {stop!r}")
    return list(stop)


class StopMatcher:
    """Holds back text that might be the start of a stop string, so a partial
    stop string is never emitted; reports when one is complete."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was reached)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [(self.pending.find(s), s) for s in self.stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            i = min(i for i, _ in hits)
            out, self.pending = self.pending[:i], ""
            return out, True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log(softmax(logits)) in float64."""
    z = logits.astype(np.float64)
    z -= z.max()
    z -= np.log(np.exp(z).sum())
    return z


def token_logprobs(logits: np.ndarray, tok: int, top_n: int):
    """(log-probability of tok, [(token, log-probability)] of the top_n most
    likely, descending, equal ones by id) under logits."""
    lp = log_softmax(logits)
    top = []
    if top_n:
        ids = np.argpartition(-lp, min(top_n, lp.size - 1))[:top_n] if top_n < lp.size else np.arange(lp.size)
        ids = ids[np.lexsort((ids, -lp[ids]))]
        top = [(int(i), float(lp[i])) for i in ids]
    return float(lp[tok]), top


@dataclass
class TokenEvent:
    """One generated token: its id, the text it completes (may be empty: a
    partial UTF-8 character or a possible stop string is held back), and
    when asked for, its log-probability and the top alternatives."""

    token: int
    text: str
    logprob: float | None = None
    top: list | None = None  # [(token id, logprob)], most likely first


class Generator:
    """One sequence's sampler, grammar, stop strings and text assembly.

    sampler: a llminfer.generation.sampling.Sampler. tokenizer: gives eog_ids and
    token_bytes. constraint: a llminfer.text.structured.Constraint or None (this
    object closes it in finish). history: the prompt's tokens, which the
    penalties read. logprobs: None, or how many top alternatives each
    TokenEvent carries (0: the token's own log-probability alone).
    ignore_eos: an end-of-generation token is output like any other.
    thinking: a llminfer.text.reasoning.ThinkingTracker for a thinking model's
    chat, or None: the grammar then applies to the answer only (not while
    the model thinks), and the reasoning budget forces the closing tag."""

    def __init__(self, sampler, tokenizer, stops=(), constraint=None, history=(), logprobs: int | None = None,
                 ignore_eos: bool = False, thinking=None):
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.eog = frozenset() if ignore_eos else tokenizer.eog_ids
        self.constraint = constraint
        self.history = list(history)
        self.logprobs = logprobs
        self.matcher = StopMatcher(stops)
        # Not tokenizer.stream_decoder(): that one takes off the space a
        # SentencePiece encoder puts before a text, and a completion is not the
        # start of a text, its first "\u2581" is a real space (" Paris").
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.finished = False
        self.thinking = thinking

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The logits the next token is drawn from: the grammar's mask
        applied (to the answer: while a thinking model thinks, none; while
        it may still open its thinking, the opening tag is allowed too), or
        every token but the one the reasoning budget forces at -inf."""
        t, c = self.thinking, self.constraint
        if t is not None:
            forced = t.forced()
            if forced is not None:
                out = np.full_like(logits, -np.inf)
                out[forced] = 0.0
                return out
            if t.free:
                return logits
            if c is not None and t.undecided and t.r.open_id is not None:
                allowed = c.allowed().copy()
                allowed[t.r.open_id] = True
                return np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32, copy=False)
        return logits if c is None else c.apply(logits)

    def next_token(self, logits: np.ndarray) -> int:
        """The token to follow, drawn from logits (float32 [n_vocab]) under
        the grammar's mask (see mask())."""
        return self.sampler.sample(self.mask(logits), self.history)

    def emit(self, tok: int, logits: np.ndarray | None = None) -> tuple[TokenEvent | None, str | None]:
        """Take tok (drawn from logits, which the log-probabilities read) as
        the sequence's next token: (its event, or None for an
        end-of-generation token, which is not output; "stop" when the
        sequence ends here, else None)."""
        if tok in self.eog:
            return None, "stop"
        lp, top = token_logprobs(logits, tok, self.logprobs) if self.logprobs is not None else (None, None)
        self.history.append(tok)
        piece = self.decoder.decode(self.tokenizer.token_bytes(tok))
        answer = self.thinking is None or self.thinking.see(tok, piece)
        text, stopped = self.matcher.push(piece)
        event = TokenEvent(tok, text, lp, top)
        if stopped:  # what follows a stop string is never output
            self.finished = True
            return event, "stop"
        if self.constraint is not None and answer:
            self.constraint.advance(tok)
            if self.constraint.done:  # the grammar is complete: end as the model's EOS would
                return event, "stop"
        return event, None

    def finish(self, reason: str) -> tuple[str, str]:
        """End the sequence for reason: (the text held back, which completes
        the output of a sequence that ends for "stop" or "length"; the
        reason, "stop" where that text completes a stop string). Closes the
        grammar's worker."""
        text = ""
        if not self.finished and reason in ("stop", "length"):
            text, stopped = self.matcher.push(self.decoder.decode(b"", final=True))
            if stopped:
                reason = "stop"
            else:
                text += self.matcher.flush()
        self.finished = True
        if self.constraint is not None:
            self.constraint.close()
            self.constraint = None
        return text, reason
