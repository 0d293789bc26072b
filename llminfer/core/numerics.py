"""Guards on what a model computes, so a broken file fails loudly instead of
answering wrongly: check_logits() after each forward pass (two reductions,
cheap next to the pass itself), and scan_weights(), the full read of a file's
weights behind `llminfer info --check`.

A model whose norm epsilon is absurd, or whose weights hold a NaN scale,
produces logits that are NaN, infinite or all equal; sampled, those give a
random or empty answer with finish_reason "stop". NumericalError says so.

Where a NaN came from: only once the logits show one, the engine runs the
same pass again with the C core's probe on (li_context_set_probe), which
checks the residual stream after the embedding and after each layer's
attention and feed-forward halves, then the final norm and the logits, and
reports the first step with a non-finite value (locate_non_finite). The
normal pass pays one untaken branch per half for this. The re-run is safe
for the KV cache: a failed pass is never committed (the sequences keep their
tokens and positions), and running it again writes the same keys and values
to the same rows of the same reserved blocks and reads only what the first
run read, so the result, and the cache, are as after the first run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from llminfer.errors import NumericalError

_HINT = "run `llminfer info --check MODEL` to scan its weights for NaN or infinite values"


def check_logits(logits: np.ndarray, where: str, locate: Callable[..., str | None] | None = None,
                 ranges: np.ndarray | None = None) -> None:
    """Raise NumericalError if any row of logits ([n_vocab] or [n, n_vocab])
    holds NaN or an infinity, or has all its values equal. `where` names the
    step for the message ("the prompt's token 12 (position 40)"). locate(),
    called only when the check fails, may say where in the model non-finite
    values first appear (locate_non_finite); for all-equal logits it is
    called as locate(equal=True) and says nothing when every value is finite.
    ranges: each row's (min, max) when already known ([n, 2], both NaN for a
    row with a NaN: the C core's figures, _core.Context.logit_range), so the
    rows are read again only to describe a failure."""
    if logits.size == 0:
        return
    rows = logits.reshape(-1, logits.shape[-1])
    if ranges is not None:
        lo, hi = ranges[:, 0], ranges[:, 1]
    else:
        hi = rows.max(axis=1)    # max and min propagate NaN, and see +-inf
        lo = rows.min(axis=1)
    bad = ~(np.isfinite(hi) & np.isfinite(lo))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        row = rows[r]
        kind = "NaN" if np.isnan(row).any() else "an infinity"
        first = int(np.flatnonzero(~np.isfinite(row))[0])
        at = f" (row {r} of {len(rows)})" if len(rows) > 1 else ""
        found = locate() if locate is not None else None
        found = f"; {found}" if found else ""
        raise NumericalError(f"the model computed {kind} in its logits at {where}{at}, first at token id "
                             f"{first}{found}: the model file or its numerics are broken; {_HINT}")
    flat = hi == lo
    if flat.any() and rows.shape[1] > 1:
        r = int(np.flatnonzero(flat)[0])
        at = f" (row {r} of {len(rows)})" if len(rows) > 1 else ""
        # an infinity in the residual stream can end as all-zero logits: the
        # norm after it makes NaN, which quantizing the activations can zero
        found = locate(equal=True) if locate is not None else None
        found = f"; {found}" if found else ""
        raise NumericalError(f"the model computed logits that are all equal ({float(hi[r])!r}) at {where}{at}: "
                             f"nothing to choose a token by{found}; the hyperparameters (norm epsilon, RoPE base) "
                             f"or the weights are broken; {_HINT}")


def locate_non_finite(ctx, rerun: Callable[[], None], tokens, pos, want, equal: bool = False) -> str | None:
    """Run a pass again (rerun(): the same batch on the same views) with the
    probe on, and say where its first non-finite value appeared. tokens, pos,
    want: the batch's token ids (None for input embeddings), positions and
    logits flags, to name the row. equal: the logits were finite but all
    equal; None when the re-run finds every value finite."""
    from llminfer import _core

    _core.set_probe(ctx, True)
    try:
        rerun()
    finally:
        _core.set_probe(ctx, False)
    found = _core.probe_result(ctx)
    if found is None:
        if equal:
            return None
        return ("a re-run of the pass with every layer checked found every value finite (the failure did not "
                "repeat)")
    step, layer, row = found
    if step in ("output_norm", "logits"):  # a row of the logits: the batch row it came from
        row = int(np.flatnonzero(want)[row])
    at = f" at batch row {row} (position {int(pos[row])})"
    if step == "embedding":
        what = f"the embedding of token id {int(tokens[row])}" if tokens is not None else "the input embeddings"
        return f"non-finite values first appear in {what} (token_embd.weight times the embedding scale){at}"
    if step in ("attention", "ffn"):
        return f"non-finite values first appear in the output of layer {layer} ({step}; blk.{layer}.* weights){at}"
    if step == "backend":
        return f"non-finite values first appear in the layers run on the GPU (0..{layer - 1}, checked together){at}"
    if step == "output_norm":
        return f"non-finite values first appear in the final norm (output_norm, every layer's output finite){at}"
    return (f"non-finite values first appear in the logits{at} (every hidden state finite, so the output head "
            f"(output.weight) or the logit scale or soft-cap overflows)")


@dataclass
class BadTensor:
    """A tensor with non-finite values once dequantized."""

    name: str
    type_name: str
    n_bad: int      # values that are NaN or infinite
    first_row: int  # the first row that has one (a NaN block scale spoils its whole block)


def scan_weights(gguf, progress: Callable[[int, int], None] | None = None,
                 chunk_bytes: int = 1 << 24) -> tuple[list, list]:
    """Read every tensor of a GGUFFile and dequantize it in chunks of rows,
    looking for NaN and infinities (a NaN block scale makes a whole block
    NaN). Returns (bad tensors as BadTensor, names of tensors whose type
    cannot be dequantized here). progress(bytes done, bytes in all) is
    called after each chunk."""
    from llminfer import _core
    from llminfer.core import ops

    total = sum(t.nbytes for t in gguf.tensors.values())
    done, bad, skipped = 0, [], []
    for info in gguf.tensors.values():
        sizes = _core.type_sizes(info.qtype)
        if sizes is None:
            skipped.append(info.name)
            done += info.nbytes
            continue
        k = info.shape[-1]
        rows = info.nbytes // max(1, k // sizes[0] * sizes[1])
        row_bytes = info.nbytes // rows
        step = max(1, chunk_bytes // row_bytes)
        data = gguf.tensor_bytes(info.name)
        n_bad, first = 0, -1
        for r in range(0, rows, step):
            n = min(step, rows - r)
            x = ops.dequantize(data[r * row_bytes:(r + n) * row_bytes], info.qtype, (n, k))
            finite = np.isfinite(x)
            if not finite.all():
                per_row = (~finite).sum(axis=1)
                if first < 0:
                    first = r + int(np.flatnonzero(per_row)[0])
                n_bad += int(per_row.sum())
            done += n * row_bytes
            if progress is not None:
                progress(done, total)
        if n_bad:
            bad.append(BadTensor(info.name, info.type_name, n_bad, first))
    return bad, skipped
