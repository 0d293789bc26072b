"""Guards on what a model computes, so a broken file fails loudly instead of
answering wrongly: check_logits() after each forward pass (two reductions,
cheap next to the pass itself), and scan_weights(), the full read of a file's
weights behind `llminfer info --check`.

A model whose norm epsilon is absurd, or whose weights hold a NaN scale,
produces logits that are NaN, infinite or all equal; sampled, those give a
random or empty answer with finish_reason "stop". NumericalError says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from llminfer.errors import NumericalError

_HINT = "run `llminfer info --check MODEL` to scan its weights for NaN or infinite values"


def check_logits(logits: np.ndarray, where: str) -> None:
    """Raise NumericalError if any row of logits ([n_vocab] or [n, n_vocab])
    holds NaN or an infinity, or has all its values equal. `where` names the
    step for the message ("the prompt's token 12 (position 40)")."""
    if logits.size == 0:
        return
    rows = logits.reshape(-1, logits.shape[-1])
    hi = rows.max(axis=1)    # max and min propagate NaN, and see +-inf
    lo = rows.min(axis=1)
    bad = ~(np.isfinite(hi) & np.isfinite(lo))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        row = rows[r]
        kind = "NaN" if np.isnan(row).any() else "an infinity"
        first = int(np.flatnonzero(~np.isfinite(row))[0])
        at = f" (row {r} of {len(rows)})" if len(rows) > 1 else ""
        raise NumericalError(f"the model computed {kind} in its logits at {where}{at}, first at token id "
                             f"{first}: the model file or its numerics are broken; {_HINT}")
    flat = hi == lo
    if flat.any() and rows.shape[1] > 1:
        r = int(np.flatnonzero(flat)[0])
        at = f" (row {r} of {len(rows)})" if len(rows) > 1 else ""
        raise NumericalError(f"the model computed logits that are all equal ({float(hi[r])!r}) at {where}{at}: "
                             f"nothing to choose a token by; the hyperparameters (norm epsilon, RoPE base) or "
                             f"the weights are broken; {_HINT}")


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
    from llminfer import _core, ops

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
