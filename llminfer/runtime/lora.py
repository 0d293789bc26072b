"""LoRA adapters in GGUF, as llama.cpp's convert_lora_to_gguf.py writes them.

An adapter file has general.type "adapter", adapter.type "lora",
adapter.lora.alpha, the base model's general.architecture, and for each
adapted weight `<name>.lora_a` ([rank, n_in] in numpy's order) and
`<name>.lora_b` ([n_out, rank]) beside it, in F32, F16, BF16 or Q8_0. A row
of a sequence that turns adapter i on with scale s gets, for each adapted
projection, y = W x + s_eff * B (A x), s_eff = s * alpha / rank (s itself
when alpha is 0): llama.cpp's build_lora_mm. The C core does that per row
(csrc/lora.c), so sequences with different adapters share a batch and each
gets the bits it gets alone; scale 0 is the base model, bit for bit.

llminfer adapts the attention projections (attn_q, attn_k, attn_v,
attn_output), the dense feed-forward's (ffn_gate, ffn_up, ffn_down), the
output head and the token embedding (its pair flipped, as llama.cpp has it:
lora_a [n_vocab, rank], lora_b [n_embd, rank], token t's row + s * b a[t];
not where the output head shares it, which llama.cpp cannot run either); an
adapter with any other tensor (a MoE layer's experts, a recurrent layer's)
is refused rather than half applied.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from llminfer.core import ops
from llminfer.errors import GGUFError, LLMInferError, LoRAAdapterError, ModelNotFoundError

# the GGUF name of a layer's weight -> the C core's projection (li_lora_layer's field)
PROJECTIONS = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w_gate",
               "ffn_up": "w_up", "ffn_down": "w_down"}
# tensor types an adapter's halves may be stored in (GGML numbers)
TYPES = {0: "F32", 1: "F16", 30: "BF16", 8: "Q8_0"}
_LAYER = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


@dataclass
class LoRAAdapter:
    """One adapter loaded for one model: its file, alpha, and per layer the
    (A, B) float32 pairs of the projections it adapts."""

    path: str
    alpha: float
    layers: list                     # [n_layer] dicts: projection name -> (a, b)
    output: tuple | None = None      # the output head's (a, b)
    tok_embd: tuple | None = None    # the token embedding's (a [n_vocab, rank], b [n_embd, rank])
    tensors: list = field(default_factory=list)  # the base weights it adapts, by GGUF name

    def describe(self):
        """(alpha, layers, output) for _core.Context.set_loras."""
        return (self.alpha, self.layers, self.output, self.tok_embd)


def load_adapter(path, model_gguf, spec) -> LoRAAdapter:
    """Read the adapter at `path` for the model of `model_gguf` (a GGUFFile)
    and `spec` (its ModelSpec); LoRAAdapterError when it is no LoRA adapter
    or does not fit the model."""
    from llminfer.core.gguf_file import GGUFFile

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelNotFoundError(f"no such LoRA adapter file: {path}")
    try:
        f = GGUFFile(path, mmap=False)
    except (GGUFError, OSError) as e:
        raise LoRAAdapterError(f"{path}: not a GGUF LoRA adapter: {e}") from e
    try:
        return _load(f, path, model_gguf, spec)
    finally:
        f.close()


def _load(f, path, model_gguf, spec) -> LoRAAdapter:
    md = f.metadata
    if md.get("general.type") != "adapter":
        raise LoRAAdapterError(f"{path}: not a LoRA adapter: general.type is {md.get('general.type')!r}, "
                               f"an adapter's is 'adapter' (is it a model?)")
    if md.get("adapter.type") != "lora":
        raise LoRAAdapterError(f"{path}: adapter.type is {md.get('adapter.type')!r}; only 'lora' adapters are "
                               f"supported")
    arch, want = md.get("general.architecture"), model_gguf.metadata.get("general.architecture")
    if arch != want:
        raise LoRAAdapterError(f"{path}: the adapter is for architecture {arch!r}, the model is {want!r}")
    if "adapter.alora.invocation_tokens" in md:
        raise LoRAAdapterError(f"{path}: activated LoRA (adapter.alora.invocation_tokens) is not supported")
    alpha = md.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoRAAdapterError(f"{path}: adapter.lora.alpha is {alpha!r}, not a finite number")
    halves = {}  # base name -> {"a": TensorInfo, "b": TensorInfo}
    for name, info in f.tensors.items():
        for half in ("a", "b"):
            if name.endswith(".lora_" + half):
                halves.setdefault(name[:-len(".lora_" + half)], {})[half] = info
                break
        else:
            if name.endswith("_norm.weight"):  # llama.cpp skips these too
                continue
            raise LoRAAdapterError(f"{path}: tensor {name!r} is neither a .lora_a nor a .lora_b")
    if not halves:
        raise LoRAAdapterError(f"{path}: the adapter has no lora_a/lora_b tensors")
    n_layer = spec.n_layer
    adapter = LoRAAdapter(path, float(alpha), [{} for _ in range(n_layer)])
    for base, pair in sorted(halves.items()):
        for half in ("a", "b"):
            if half not in pair:
                raise LoRAAdapterError(f"{path}: {base}.lora_{'b' if half == 'a' else 'a'} has no "
                                       f"{base}.lora_{half} beside it")
        if base not in model_gguf.tensors:
            raise LoRAAdapterError(f"{path}: {base!r} names no weight of the model (an adapter for another "
                                   f"model?)")
        target, slot = _target(base, spec)
        if target is None:
            tied = " (this model's output head shares the token embedding)" if base == "token_embd.weight" else ""
            raise LoRAAdapterError(f"{path}: {base!r} is a weight llminfer does not apply LoRA to{tied} (it adapts "
                                   f"the attention and dense feed-forward projections, the output head and an "
                                   f"untied token embedding)")
        winfo = model_gguf.tensors[base]
        if (target.data.ctypes.data != model_gguf.tensor_bytes(base).ctypes.data
                or winfo.shape != (target.rows, target.k)):
            raise LoRAAdapterError(f"{path}: {base!r} is not used as stored by this model's layers, so llminfer "
                                   f"cannot adapt it")
        a_info, b_info = pair["a"], pair["b"]
        for info in (a_info, b_info):
            if info.qtype not in TYPES:
                raise LoRAAdapterError(f"{path}: {info.name} is {info.type_name}; adapters are read in "
                                       f"{', '.join(TYPES.values())}")
            if len(info.shape) != 2:
                raise LoRAAdapterError(f"{path}: {info.name} has shape {info.shape}, not a matrix")
        rows, k = target.rows, target.k
        if slot == "tok_embd":  # flipped (llama.cpp's build_inp_embd): a [n_vocab, rank], b [n_embd, rank]
            rank = a_info.shape[1]
            if a_info.shape[0] != rows or b_info.shape != (k, rank):
                raise LoRAAdapterError(f"{path}: {base}: lora_a {a_info.shape} and lora_b {b_info.shape} do not "
                                       f"fit an embedding of {rows}x{k} (expected [{rows}, rank] and [{k}, rank])")
            adapter.tok_embd = (_read(f, a_info, path), _read(f, b_info, path))
            adapter.tensors.append(base)
            continue
        rank = a_info.shape[0]
        if a_info.shape[1] != k or b_info.shape != (rows, rank):
            raise LoRAAdapterError(f"{path}: {base}: lora_a {a_info.shape} and lora_b {b_info.shape} do not fit "
                                   f"a weight of {rows}x{k} (expected [rank, {k}] and [{rows}, rank])")
        a = _read(f, a_info, path)
        b = _read(f, b_info, path)
        if slot is None:
            adapter.output = (a, b)
        else:
            adapter.layers[slot[0]][slot[1]] = (a, b)
        adapter.tensors.append(base)
    return adapter


def _target(base, spec):
    """The spec's matrix a GGUF weight name is, and its place: ((layer, projection) or None for the head),
    or (None, None) where llminfer does not adapt it."""
    if base == "output.weight":
        return (spec.output, None) if spec.output is not spec.tok_embd else (None, None)
    if base == "token_embd.weight":
        return (spec.tok_embd, "tok_embd") if spec.output is not spec.tok_embd else (None, None)
    m = _LAYER.match(base)
    if not m or m.group(2) not in PROJECTIONS:
        return None, None
    il, proj = int(m.group(1)), PROJECTIONS[m.group(2)]
    if il >= spec.n_layer:
        return None, None
    L = spec.layers[il]
    if L.moe is not None and proj.startswith("w_"):
        return None, None
    w = getattr(L, proj, None)
    return (w, (il, proj)) if w is not None else (None, None)


def _read(f, info, path) -> np.ndarray:
    try:
        raw = f.tensor_bytes(info.name)
        a = ops.dequantize(raw, info.qtype, info.shape)
    except LLMInferError as e:
        raise LoRAAdapterError(f"{path}: {info.name}: {e}") from e
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise LoRAAdapterError(f"{path}: {info.name} holds a NaN or an infinity")
    return a


def check_scale(scale, what="a LoRA scale") -> float:
    """A finite number, as a float."""
    from llminfer.errors import InvalidArgumentError

    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise InvalidArgumentError(f"{what} must be a number, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise InvalidArgumentError(f"{what} must be finite, got {scale!r}")
    return scale
