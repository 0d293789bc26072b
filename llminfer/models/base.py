"""What an architecture file produces: a ModelSpec, the shapes, options and
weights of a decoder-only transformer, ready to hand to the C forward pass
(llminfer._core.ModelDesc). Attribute names follow the GGUF tensor names.

Also the helpers the architecture files share for reading hyperparameters
and tensors out of a GGUFFile with errors that name what is wrong.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
from llminfer.core.ggml import GGMLQuantizationType

from llminfer import _core
from llminfer.errors import ShapeError, UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile

ROPE_NORM = 0  # rotate pairs (2i, 2i+1): GGUF llama weights are permuted for it
ROPE_NEOX = 2  # rotate pairs (i, i + n_rot/2)
ACT_SILU = 0
ACT_GELU = 1
ACT_RELU_SQR = 2  # max(x, 0)^2: ungated feed-forwards only (nemotron_h)
ACT_SWIGLU_OAI = 3  # gpt-oss's clamped SwiGLU (csrc/llminfer.h, LI_FN_SWIGLU_OAI)
# how a MoE layer weighs its experts (enum li_expert_gating)
GATING_SOFTMAX = 0         # softmax over all, top k, renormalized (qwen3moe)
GATING_SOFTMAX_WEIGHT = 1  # top k logits, softmax over those k (gpt-oss)
GATING_SIGMOID = 2         # sigmoids, top k after a selection bias, normalized (lfm2moe)
# a layer's mixer (csrc/llminfer.h, enum li_mixer)
MIX_ATTN = 0       # attention over the paged KV cache
MIX_GDN = 1        # Gated DeltaNet (qwen35, qwen35moe, qwen3next)
MIX_SHORTCONV = 2  # LFM2's gated short convolution
MIX_MAMBA2 = 3     # Mamba2's selective scan
MIX_NONE = 4       # the layer is its feed-forward alone
RECURRENT_MIXERS = (MIX_GDN, MIX_SHORTCONV, MIX_MAMBA2)


@dataclass
class Matrix:
    """A weight [rows, k] in its stored type: the raw bytes, borrowed from the map."""

    data: np.ndarray
    qtype: int
    rows: int
    k: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.qtype).name


@dataclass
class MoESpec:
    """A mixture-of-experts feed-forward: the router and the experts' weights
    as GGUF stores its 3-D tensors, expert after expert (rows of all experts
    in one Matrix: gate/up [n_expert * n_ff_exp, n_embd], down
    [n_expert * n_embd, n_ff_exp])."""

    router: Matrix      # ffn_gate_inp [n_expert, n_embd]
    gate_exps: Matrix | None  # None where the layer's gate_up_exps holds both (gemma4)
    up_exps: Matrix | None
    down_exps: Matrix


@dataclass
class LayerSpec:
    attn_norm: np.ndarray | None  # None: no pre-norm (olmo2)
    wq: Matrix | None             # None in a layer whose mixer is not attention
    wk: Matrix | None
    wv: Matrix | None
    wo: Matrix | None
    ffn_norm: np.ndarray | None
    w_gate: Matrix | None         # None in a MoE layer, or a layer without a feed-forward
    w_up: Matrix | None
    w_down: Matrix | None
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    rope_base: float = 10000.0
    rope_scale: float = 1.0
    sliding_window: int = 0
    no_rope: bool = False         # True: queries and keys are not rotated (smollm3's every 4th layer)
    moe: MoESpec | None = None
    # hybrid models: the layer's mixer (MIX_*) and a recurrent mixer's weights,
    # named and shaped as csrc/llminfer.h's li_layer_desc describes them
    mixer: int = MIX_ATTN
    attn_out_gate: bool = False   # qwen35: wq yields [queries, gate] per head; output times sigmoid(gate)
    ssm_in: Matrix | None = None
    ssm_z: Matrix | None = None
    ssm_beta: Matrix | None = None
    ssm_alpha: Matrix | None = None
    ssm_conv: np.ndarray | None = None  # [channels, d_conv]
    ssm_conv_b: np.ndarray | None = None
    ssm_dt_b: np.ndarray | None = None
    ssm_a: np.ndarray | None = None
    ssm_d: np.ndarray | None = None
    ssm_norm: np.ndarray | None = None
    ssm_out: Matrix | None = None
    # a MoE layer's shared expert (ffn_*_shexp) and its sigmoid gate (ffn_gate_inp_shexp)
    gate_shexp: Matrix | None = None
    up_shexp: Matrix | None = None
    down_shexp: Matrix | None = None
    gate_inp_shexp: np.ndarray | None = None
    router_sel_b: np.ndarray | None = None  # lfm2moe: exp_probs_b, added to the router's sigmoids to choose
    # gpt-oss: per-head attention sinks [n_head], the attention output's bias
    # [n_embd], the router's [n_expert] and the experts' biases, expert after
    # expert ([n_expert * n_ff_exp] for gate and up, [n_expert * n_embd] for down)
    attn_sinks: np.ndarray | None = None
    bo: np.ndarray | None = None
    router_b: np.ndarray | None = None
    gate_exps_b: np.ndarray | None = None
    up_exps_b: np.ndarray | None = None
    down_exps_b: np.ndarray | None = None
    # gemma4: the layer's own attention and feed-forward sizes (0: the model's) and RoPE
    # divisors [n_rot/2] (None: the model's); a per-head RMSNorm of the values
    # [head_dim_v]; kv_reuse > 0: no wk/wv, the keys and values of layer
    # i - kv_reuse; out_scale != 0: the residual stream times it after the
    # layer; the per-layer embedding's gate [n_embd_pe, n_embd], projection
    # [n_embd, n_embd_pe] and norm [n_embd] (csrc/llminfer.h)
    head_dim: int = 0
    head_dim_v: int = 0
    n_head_kv: int = 0
    n_rot: int = 0
    n_ff: int = 0
    rope_factors: np.ndarray | None = None
    v_norm: np.ndarray | None = None
    kv_reuse: int = 0
    out_scale: float = 0.0
    pe_gate: Matrix | None = None
    pe_proj: Matrix | None = None
    pe_post_norm: np.ndarray | None = None
    # gemma4's MoE layers: the router's input scale [n_embd] (its input is
    # rmsnorm(x) * it / sqrt(n_embd)), the experts' input norm, each expert's
    # output scale [n_expert], the norms of the experts' sum and of the shared
    # expert's output; gate and up experts fused in one tensor
    # [n_expert * 2 * n_ff_exp, n_embd] (moe.gate_exps and moe.up_exps None)
    router_in_scale: np.ndarray | None = None
    moe_norm: np.ndarray | None = None
    down_exps_s: np.ndarray | None = None
    moe_post_norm: np.ndarray | None = None
    shexp_post_norm: np.ndarray | None = None
    gate_up_exps: Matrix | None = None

    @property
    def recurrent(self) -> bool:
        """Whether the layer keeps a per-sequence state instead of keys and values."""
        return self.mixer in RECURRENT_MIXERS

    def mixer_matrices(self) -> list:
        """The matrices of the layer's mixer (attention's four, or a recurrent mixer's)."""
        mats = [self.wq, self.wk, self.wv, self.wo, self.ssm_in, self.ssm_z, self.ssm_beta, self.ssm_alpha,
                self.ssm_out, self.pe_gate, self.pe_proj]
        out = []
        for m in mats:  # gemma4's wv may be wk itself (keys and values from one projection)
            if m is not None and not any(m is o for o in out):
                out.append(m)
        return out

    # the experts' weights by the C description's names (None in a dense layer)
    @property
    def router(self) -> Matrix | None:
        return None if self.moe is None else self.moe.router

    @property
    def gate_exps(self) -> Matrix | None:
        return None if self.moe is None else self.moe.gate_exps

    @property
    def up_exps(self) -> Matrix | None:
        return None if self.moe is None else self.moe.up_exps

    @property
    def down_exps(self) -> Matrix | None:
        return None if self.moe is None else self.moe.down_exps

    def ffn_matrices(self, active_only=False) -> list:
        """The feed-forward's weights; with active_only, as much of them as
        one token reads (a MoE layer: its router and k of its experts)."""
        if self.moe is None:
            return [m for m in (self.w_gate, self.w_up, self.w_down) if m is not None]
        shared = [m for m in (self.gate_shexp, self.up_shexp, self.down_shexp) if m is not None]
        experts = [self.moe.gate_exps, self.moe.up_exps, self.gate_up_exps, self.moe.down_exps]
        return [self.moe.router] + [m for m in experts if m is not None] + shared


@dataclass
class ModelSpec:
    arch: str
    n_vocab: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    n_ff: int
    n_rot: int
    rope_mode: int
    gate_fn: int                  # ACT_SILU, ACT_GELU or ACT_SWIGLU_OAI, gating the feed-forward
    norm_eps: float
    embd_scale: float
    attn_scale: float
    context_length: int
    tok_embd: Matrix
    output_norm: np.ndarray
    output: Matrix
    layers: list = field(default_factory=list)
    rope_factors: np.ndarray | None = None  # [n_rot/2] frequency divisors (rope_freqs.weight)
    # M-RoPE (qwen2vl): rope.dimension_sections, rotated pairs by temporal,
    # height, width and fourth position (li_model_desc); all 0: one position
    rope_sect_t: int = 0
    rope_sect_h: int = 0
    rope_sect_w: int = 0
    rope_sect_e: int = 0
    rope_sect_interleave: bool = False  # qwen3vl: the sections interleaved (imrope)
    n_deepstack: int = 0          # qwen3vl: input rows n_embd * (1 + n_deepstack) wide (li_model_desc)
    residual_scale: float = 1.0   # granite: each half's output times this before the residual add
    logit_scale: float = 1.0      # granite: logits times this (1 / granite.logit_scale)
    attn_softcap: float = 0.0     # gemma2: scores become cap * tanh(score / cap); 0: none
    final_softcap: float = 0.0    # gemma2: the same on the logits
    qk_norm_whole: bool = False   # olmo2: q_norm/k_norm over the whole projection, not per head
    # mistral3: queries at position p scaled by ln(floor((p + offset) / floor) + 1) * scale + 1; 0: none
    attn_temp_scale: float = 0.0
    attn_temp_offset: float = 0.0
    attn_temp_floor: int = 0
    n_expert: int = 0             # MoE: experts per layer, how many a token uses, one expert's width
    n_expert_used: int = 0
    n_ff_exp: int = 0
    # recurrent layers' sizes (csrc/llminfer.h, li_model_desc): 0 in a model without them
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_n_head: int = 0
    ssm_kv_grouped: bool = False  # GDN: value head h reads key head h // (n_head / n_group) (qwen3next)
    n_ff_shexp: int = 0           # a MoE layer's shared expert's width (0: none)
    expert_gating: int = GATING_SOFTMAX  # how router logits become the experts' weights
    # gemma4's E models: per-layer embeddings n_embd_pe wide (0: none), their
    # token table [n_vocab, n_layer * n_embd_pe] (read a row per token, like
    # tok_embd), the projection of the embedding [n_layer * n_embd_pe, n_embd]
    # and its norm [n_embd_pe]
    n_embd_pe: int = 0
    pe_tok_embd: Matrix | None = None
    pe_model_proj: Matrix | None = None
    pe_proj_norm: np.ndarray | None = None
    # an image batch decoded non-causally (Engine.decode_rows) opens the
    # sliding-window layers only, the full ones stay causal (gemma4: llama.cpp's
    # LLAMA_NON_CAUSAL_TYPE_SWA_ONLY); False: every layer (gemma3)
    non_causal_swa_only: bool = False

    @property
    def n_embd_inp(self) -> int:
        """The width of an input row (an image's): n_embd, and DeepStack's slices."""
        return self.n_embd * (1 + self.n_deepstack)

    def check_vectors(self):
        """Raise ShapeError where a recurrent layer's vector does not hold what
        the sizes say (the C core reads that many values)."""
        K, H, G, N, DI, E = (self.ssm_d_conv, self.ssm_n_head, self.ssm_n_group, self.ssm_d_state,
                             self.ssm_d_inner, self.n_embd)
        sizes = {"gate_inp_shexp": E, "router_sel_b": self.n_expert, "attn_sinks": self.n_head, "bo": E, "router_b": self.n_expert,
                 "gate_exps_b": self.n_expert * self.n_ff_exp, "up_exps_b": self.n_expert * self.n_ff_exp,
                 "down_exps_b": self.n_expert * E, "router_in_scale": E, "moe_norm": E, "down_exps_s": self.n_expert,
                 "moe_post_norm": E, "shexp_post_norm": E}
        if self.pe_proj_norm is not None:
            v = self.pe_proj_norm
            if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.size != self.n_embd_pe:
                raise ShapeError(f"pe_proj_norm holds {getattr(v, 'size', '?')} values, not {self.n_embd_pe} float32")
        for i, L in enumerate(self.layers):
            own = {"v_norm": L.head_dim_v or self.head_dim_v, "rope_factors": (L.n_rot or self.n_rot) // 2,
                   "pe_post_norm": E}
            for name, n in list(sizes.items()) + list(own.items()):
                v = getattr(L, name)
                if v is not None and (not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.size != n):
                    raise ShapeError(f"layer {i}: {name} holds {getattr(v, 'size', '?')} values, not {n} float32")
            if L.mixer == MIX_GDN:
                want = {"ssm_conv": (2 * G * N + DI) * K, "ssm_dt_b": H, "ssm_a": H, "ssm_norm": DI // max(H, 1)}
            elif L.mixer == MIX_SHORTCONV:
                want = {"ssm_conv": E * K}
            elif L.mixer == MIX_MAMBA2:
                want = {"ssm_conv": (DI + 2 * G * N) * K, "ssm_conv_b": DI + 2 * G * N, "ssm_dt_b": H, "ssm_a": H,
                        "ssm_d": H, "ssm_norm": DI}
            else:
                continue
            for name, n in want.items():
                v = getattr(L, name)
                if v is not None and (not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.size != n):
                    raise ShapeError(f"layer {i}: {name} holds {getattr(v, 'size', '?')} values "
                                     f"({getattr(v, 'dtype', type(v).__name__)}), the sizes say {n} float32")

    @property
    def recurrent_layers(self) -> list:
        """Indices of the layers that keep a per-sequence state."""
        return [i for i, L in enumerate(self.layers) if L.recurrent]

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def n_params(self) -> int:
        mats = [self.tok_embd] + ([] if self.output is self.tok_embd else [self.output])
        mats += [m for m in (self.pe_tok_embd, self.pe_model_proj) if m is not None]
        for L in self.layers:
            mats += L.mixer_matrices() + L.ffn_matrices()
        return sum(m.rows * m.k for m in mats)

    def weight_bytes(self) -> int:
        """Bytes of weights one token's forward pass reads (the embedding row
        aside, and a per-layer embedding's row); of a MoE layer, the router
        and k experts."""
        total = self.output.data.nbytes
        if self.pe_model_proj is not None:
            total += self.pe_model_proj.data.nbytes
        for L in self.layers:
            total += sum(m.data.nbytes for m in L.mixer_matrices())
            if L.moe is None:
                total += sum(m.data.nbytes for m in L.ffn_matrices())
            else:
                experts = sum(m.data.nbytes for m in (L.moe.gate_exps, L.moe.up_exps, L.gate_up_exps, L.moe.down_exps)
                              if m is not None)
                total += L.moe.router.data.nbytes + experts * self.n_expert_used // self.n_expert
                total += sum(m.data.nbytes for m in (L.gate_shexp, L.up_shexp, L.down_shexp) if m is not None)
        return total


# What a model can use, per hyperparameter: (low, high, whether low itself is
# excluded). Far beyond any released model; a value outside is corrupt or
# hostile, and would overflow a C int, divide by zero or turn every logit into
# the same number (layer_norm_rms_epsilon=1e300 makes each norm output zero).
_INT32_MAX = (1 << 31) - 1
HPARAM_RANGES = {
    "block_count": (1, 1 << 12, False),
    "context_length": (1, _INT32_MAX, False),
    "embedding_length": (1, 1 << 20, False),
    "feed_forward_length": (1, 1 << 22, False),
    "attention.head_count": (1, 1 << 12, False),
    "attention.head_count_kv": (1, 1 << 12, False),
    "attention.key_length": (1, 1 << 14, False),
    "attention.value_length": (1, 1 << 14, False),
    "rope.dimension_count": (2, 1 << 14, False),
    "attention.sliding_window": (0, 1 << 24, False),
    "attention.sliding_window_pattern": (0, 1 << 12, False),
    "vocab_size": (0, _INT32_MAX, False),
    "attention.layer_norm_rms_epsilon": (0.0, 1e-2, True),
    "rope.freq_base": (1.0, 1e12, True),
    "rope.scaling.factor": (0.0, 1e6, False),
    "rope.scaling.attn_factor": (0.0, 1e3, True),
    "rope.scaling.original_context_length": (1, _INT32_MAX, False),
    "rope.scaling.yarn_beta_fast": (0.0, 1e6, True),
    "rope.scaling.yarn_beta_slow": (0.0, 1e6, True),
    "rope.scaling.yarn_log_multiplier": (-1e3, 1e3, False),
    "attention.temperature_scale": (-1e3, 1e3, False),
}


class Hparams:
    """Reads `{arch}.*` metadata with errors that name the missing or bad key.
    Integers must be stored as integers, floats as numbers, and both must lie
    in the key's HPARAM_RANGES."""

    def __init__(self, gguf: GGUFFile, arch: str):
        self.meta = gguf.metadata
        self.arch = arch
        self.path = gguf.path

    def _get(self, key, default, kind):
        full = f"{self.arch}.{key}"
        v = self.meta.get(full)
        if v is None:
            if default is _REQUIRED:
                raise UnsupportedModelError(f"{self.path}: metadata key {full!r} is missing")
            return default
        if isinstance(v, np.ndarray):
            if v.size and np.all(v == v.flat[0]):
                v = v.flat[0]  # a per-layer array with one value
            else:
                raise UnsupportedModelError(f"{self.path}: per-layer values of {full!r} are not supported")
        if kind is int:
            ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
        else:
            ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        if not ok:
            want = "an integer" if kind is int else "a number"
            raise UnsupportedModelError(f"{self.path}: metadata {full!r} must be {want}, "
                                        f"got {type(v).__name__} {_short(v)}")
        out = kind(v)
        if key in HPARAM_RANGES:
            lo, hi, open_lo = HPARAM_RANGES[key]
            if not (math.isfinite(out) and (out > lo if open_lo else out >= lo) and out <= hi):
                interval = f"{'(' if open_lo else '['}{lo:g}, {hi:g}]"
                raise UnsupportedModelError(f"{self.path}: metadata {full!r} is {out!r}, outside the range "
                                            f"{interval} a model can use")
        return out

    def int(self, key, default=None) -> int:
        return self._get(key, _REQUIRED if default is None else default, int)

    def float(self, key, default=None) -> float:
        return self._get(key, _REQUIRED if default is None else default, float)

    def str(self, key, default=""):
        v = self.meta.get(f"{self.arch}.{key}", default)
        return v if isinstance(v, str) else default


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_REQUIRED = object()
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")  # a layer's tensor name; group 1 is the layer


class Weights:
    """Fetches tensors by GGUF name, checking type and shape."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf
        self.used = set()

    def has(self, name) -> bool:
        return name in self.gguf.tensors

    def matrix(self, name, rows, k) -> Matrix:
        info = self._info(name)
        if _core.type_sizes(info.qtype) is None:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} has type {info.type_name}, "
                                        f"which llminfer cannot compute with")
        if info.shape != (rows, k):
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} has shape {info.shape}, "
                                        f"expected ({rows}, {k}) from the metadata")
        return Matrix(self.gguf.tensor_bytes(name), info.qtype, rows, k)

    def expert_matrix(self, name, n_expert, rows, k) -> Matrix:
        """A 3-D expert tensor [n_expert, rows, k] as one Matrix of
        n_expert * rows rows (experts one after another, as stored)."""
        info = self._info(name)
        if _core.type_sizes(info.qtype) is None:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} has type {info.type_name}, "
                                        f"which llminfer cannot compute with")
        if info.shape != (n_expert, rows, k):
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} has shape {info.shape}, "
                                        f"expected ({n_expert}, {rows}, {k}) from the metadata")
        return Matrix(self.gguf.tensor_bytes(name), info.qtype, n_expert * rows, k)

    def split_rows(self, name, parts, k) -> list:
        """A fused matrix [sum(parts), k] cut into row blocks of the given
        sizes (phi3's attn_qkv and gate/up ffn_up), each a view of its bytes."""
        whole = self.matrix(name, sum(parts), k)
        row = whole.data.nbytes // whole.rows
        out, r0 = [], 0
        for rows in parts:
            out.append(Matrix(whole.data[r0 * row:(r0 + rows) * row], whole.qtype, rows, k))
            r0 += rows
        return out

    def vector(self, name, n, optional=False) -> np.ndarray | None:
        """A small tensor as float32 (converted from F16/BF16 when stored so)."""
        if optional and not self.has(name):
            return None
        info = self._info(name)
        if int(np.prod(info.shape)) != n:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} has shape {info.shape}, "
                                        f"expected {n} values")
        raw = self.gguf.tensor_bytes(name)
        t = GGMLQuantizationType(info.qtype)
        if t == GGMLQuantizationType.F32:
            out = raw.view(np.float32)
        elif t in (GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
            from llminfer.core import ops
            out = ops.dequantize(np.ascontiguousarray(raw), t, (n,))
        else:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} has type {info.type_name}; "
                                        f"norm and bias vectors must be F32, F16 or BF16")
        # Small, so checked here: a NaN in a norm weight would make every
        # logit NaN. Matrices are checked by `llminfer info --check`.
        bad = np.flatnonzero(~np.isfinite(out))
        if bad.size:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} holds {bad.size} non-finite "
                                        f"value(s), the first {out[bad[0]]} at index {bad[0]}")
        return out

    def check_all_used(self, n_layer: int, arch: str):
        """Refuse a file with tensors the architecture did not read: they are
        weights the model was meant to run with (a bias, another block), and
        ignoring them gives wrong text without a word. llama.cpp refuses
        these files too ("wrong number of tensors")."""
        unused = sorted(set(self.gguf.tensors) - self.used)
        if not unused:
            return
        blocks = sorted({int(m.group(1)) for m in map(LAYER_TENSOR.match, self.gguf.tensors) if m})
        beyond = [b for b in blocks if b >= n_layer]
        if beyond:
            raise UnsupportedModelError(
                f"{self.gguf.path}: {arch}.block_count is {n_layer}, but the file has tensors for "
                f"{len(blocks)} blocks (blk.{beyond[0]}. to blk.{blocks[-1]}.); the metadata does not "
                f"match the weights")
        shown = ", ".join(unused[:8]) + (f", ... ({len(unused)} in all)" if len(unused) > 8 else "")
        raise UnsupportedModelError(f"{self.gguf.path}: tensors that the {arch} architecture does not use: "
                                    f"{shown}; running without them would not be the model the file holds")

    def _info(self, name):
        info = self.gguf.tensors.get(name)
        if info is None:
            raise UnsupportedModelError(f"{self.gguf.path}: tensor {name!r} is missing")
        self.used.add(name)
        return info


def is_swa_layer(layer: int, pattern: int) -> bool:
    """llama.cpp's reading of attention.sliding_window_pattern: of every
    `pattern` layers the last attends globally, the others through the
    window; 0 means every layer is windowed, 1 none."""
    return pattern == 0 or layer % pattern < pattern - 1


def rope_scale(hp: Hparams, yarn_ok: bool = False) -> float:
    """The linear position scale from rope.scaling.* metadata (1.0 when none).
    yarn_ok: the caller builds through llama.build, which turns YaRN into
    per-frequency factors (apply_yarn); the linear scale is then 1."""
    kind = hp.str("rope.scaling.type", "none").lower()
    factor = hp.float("rope.scaling.factor", 0.0)  # 0: none, as 1
    if kind in ("", "none") or factor in (0.0, 1.0):
        return 1.0
    if kind == "linear":
        return 1.0 / factor
    if kind == "yarn" and yarn_ok:
        return 1.0
    supported = "linear and yarn" if yarn_ok else "only linear"
    raise UnsupportedModelError(f"{hp.path}: RoPE scaling {kind!r} is not supported ({supported})")


def apply_yarn(spec, hp: Hparams, beta_fast: float = 32.0, beta_slow: float = 1.0, log_mul: float = 0.0):
    """YaRN RoPE scaling (rope.scaling.type yarn), as ggml computes it. For
    pair i the angle is the unscaled one times fs * (1 - r_i) + r_i, fs =
    1 / rope.scaling.factor, r_i a ramp from 1 (pairs turning many times
    within the original context: kept) to 0 (slow pairs: interpolated)
    between the correction dims of beta_fast and beta_slow. That is a fixed
    divisor per pair, folded into spec.rope_factors. ggml also multiplies
    cos and sin by mscale, which scales every q.k by mscale**2: folded into
    attn_scale. mscale is 1 + 0.1 ln(factor), divided by 1 + 0.1 log_mul
    ln(factor) when the file gives yarn_log_multiplier, times
    rope.scaling.attn_factor."""
    bases = {L.rope_base for L in spec.layers if not L.no_rope}
    if len(bases) > 1:
        raise UnsupportedModelError(f"{hp.path}: YaRN scaling with RoPE bases differing by layer is not supported")
    if not bases or spec.n_rot == 0:
        return
    base = bases.pop()
    factor = hp.float("rope.scaling.factor", 0.0)
    fs = 1.0 / factor if factor > 0.0 else 1.0
    n_orig = hp.int("rope.scaling.original_context_length", spec.context_length)
    n_dims = spec.n_rot

    def corr_dim(n_turns):
        return n_dims * math.log(n_orig / (n_turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(beta_fast)))
    high = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
    i = np.arange(n_dims // 2, dtype=np.float64)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
    divisors = 1.0 / (fs * (1.0 - ramp) + ramp)
    if spec.rope_factors is not None:
        divisors = divisors * np.asarray(spec.rope_factors, dtype=np.float64)
    spec.rope_factors = np.ascontiguousarray(divisors, dtype=np.float32)
    mscale = 1.0
    if factor > 1.0:
        mscale = 1.0 + 0.1 * math.log(factor)
        if log_mul != 0.0:
            divisor = 1.0 + 0.1 * log_mul * math.log(factor)
            if not divisor > 0.0:
                raise UnsupportedModelError(f"{hp.path}: rope.scaling.yarn_log_multiplier {log_mul} with factor "
                                            f"{factor} gives a magnitude scale that is not positive")
            mscale /= divisor
    mscale *= hp.float("rope.scaling.attn_factor", 1.0)
    spec.attn_scale *= mscale * mscale


@dataclass(frozen=True)
class Shape:
    """The sizes every decoder-only architecture here reads the same way."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    n_ff: int


def read_shape(hp: Hparams) -> Shape:
    n_embd = hp.int("embedding_length")
    n_head = hp.int("attention.head_count")
    if f"{hp.arch}.attention.key_length" not in hp.meta and n_embd % n_head:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.embedding_length {n_embd} is not a multiple of "
                                    f"attention.head_count {n_head}, and no attention.key_length says the "
                                    f"head size")
    head_dim = hp.int("attention.key_length", n_embd // n_head)
    n_head_kv = hp.int("attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.attention.head_count {n_head} is not a multiple "
                                    f"of attention.head_count_kv {n_head_kv} (each KV head serves a whole "
                                    f"group of query heads)")
    return Shape(n_embd=n_embd, n_layer=hp.int("block_count"), n_head=n_head,
                 n_head_kv=n_head_kv, head_dim=head_dim,
                 head_dim_v=hp.int("attention.value_length", head_dim),
                 n_ff=hp.int("feed_forward_length"))


def rope_dims(hp: Hparams, head_dim: int) -> int:
    """rope.dimension_count: the leading dimensions of each head that RoPE
    rotates, in pairs, so an even number no larger than the head."""
    n_rot = hp.int("rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.rope.dimension_count {n_rot} must be even and at "
                                    f"most the head size {head_dim}")
    return n_rot


def standard_layers(w: Weights, sh: Shape, rope_base, scale, biases=False) -> list:
    """Layers of the Llama shape: norm, q/k/v/o, norm, gate/up/down."""
    n_embd, n_head, n_head_kv, n_ff = sh.n_embd, sh.n_head, sh.n_head_kv, sh.n_ff
    head_dim, head_dim_v = sh.head_dim, sh.head_dim_v
    layers = []
    for i in range(sh.n_layer):
        p = f"blk.{i}."
        L = LayerSpec(
            attn_norm=w.vector(p + "attn_norm.weight", n_embd),
            wq=w.matrix(p + "attn_q.weight", n_head * head_dim, n_embd),
            wk=w.matrix(p + "attn_k.weight", n_head_kv * head_dim, n_embd),
            wv=w.matrix(p + "attn_v.weight", n_head_kv * head_dim_v, n_embd),
            wo=w.matrix(p + "attn_output.weight", n_embd, n_head * head_dim_v),
            ffn_norm=w.vector(p + "ffn_norm.weight", n_embd),
            w_gate=w.matrix(p + "ffn_gate.weight", n_ff, n_embd),
            w_up=w.matrix(p + "ffn_up.weight", n_ff, n_embd),
            w_down=w.matrix(p + "ffn_down.weight", n_embd, n_ff),
            rope_base=rope_base,
            rope_scale=scale,
        )
        if biases:
            L.bq = w.vector(p + "attn_q.bias", n_head * head_dim, optional=True)
            L.bk = w.vector(p + "attn_k.bias", n_head_kv * head_dim, optional=True)
            L.bv = w.vector(p + "attn_v.bias", n_head_kv * head_dim_v, optional=True)
        layers.append(L)
    return layers


def vocab_size(gguf: GGUFFile, hp: Hparams) -> int:
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    n = hp.int("vocab_size", len(tokens) if tokens is not None else 0)
    if n <= 0:
        info = gguf.tensors.get("token_embd.weight")
        if info is None:
            raise UnsupportedModelError(f"{gguf.path}: cannot tell the vocabulary size")
        n = info.shape[0]
    if tokens is not None and len(tokens) != n:
        # ids past the shorter one would be tokens without embeddings or
        # embeddings no text can reach; llama.cpp refuses this too
        raise UnsupportedModelError(f"{gguf.path}: the vocabulary (tokenizer.ggml.tokens) has {len(tokens)} "
                                    f"tokens, but the model has {n} ({hp.arch}.vocab_size or the embedding)")
    return n


def output_head(w: Weights, tok_embd: Matrix, n_vocab, n_embd) -> Matrix:
    """output.weight, or the token embedding when the head is tied to it."""
    return w.matrix("output.weight", n_vocab, n_embd) if w.has("output.weight") else tok_embd


def attn_scale_default(head_dim) -> float:
    return 1.0 / math.sqrt(head_dim)


def rope_sections(hp: Hparams, n_rot: int) -> list:
    """The four sections of rope.dimension_sections (3 given: the fourth 0),
    checked: non-negative, summing to 1..n_rot (ggml's bound)."""
    raw = hp.meta.get(f"{hp.arch}.rope.dimension_sections")
    if raw is None:
        raise UnsupportedModelError(f"{hp.path}: metadata '{hp.arch}.rope.dimension_sections' is missing")
    sec = np.asarray(raw).reshape(-1)
    if sec.size < 3 or sec.size > 4 or not np.issubdtype(sec.dtype, np.integer) or np.any(sec < 0):
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.rope.dimension_sections must be 3 or 4 "
                                    f"non-negative integers, got {raw!r}")
    s = [int(x) for x in sec] + [0] * (4 - sec.size)
    if not 0 < sum(s) <= n_rot:
        raise UnsupportedModelError(f"{hp.path}: {hp.arch}.rope.dimension_sections {s} must sum to between 1 "
                                    f"and rope.dimension_count {n_rot}")
    return s
