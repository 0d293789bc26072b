"""The `mamba2` architecture (Mamba-2, Mamba-Codestral), as llama.cpp's
converter stores it (src/models/mamba2.cpp, mamba-base.cpp there): no
attention and no feed-forward; each layer is RMSNorm, a Mamba2 mixer
(hybrid.mamba2_layer) and the residual add:

- ssm_in gives z, x, B, C and dt; a causal convolution over ssm.conv_kernel
  taps, with its bias, over the x, B and C channels, then SiLU;
- per head h of time_step_rank heads (inner_size / heads channels each),
  with group g = h / (heads / group_count): dt' = softplus(dt +
  ssm_dt.bias); state [channels, state_size] = state * exp(dt' * ssm_a) +
  (x * dt') B_g^T (ssm_a stored as -exp(A_log)); y = state C_g + ssm_d * x;
- y times SiLU(z), RMSNorm over each group's channels times ssm_norm, then
  ssm_out.

The file gives no attention sizes (head_count 0) and no feed-forward; the
ModelSpec's attention and feed-forward sizes are placeholders (1 head of 2,
n_ff 1), which the C core checks but no layer uses."""

from llminfer.core.gguf_file import GGUFFile
from llminfer.models.base import ACT_SILU, ROPE_NEOX, Hparams, ModelSpec, Weights, output_head, vocab_size
from llminfer.models.hybrid import mamba2_layer, mamba2_sizes, set_ssm_sizes

ARCH = "mamba2"


def build(gguf: GGUFFile) -> ModelSpec:
    hp = Hparams(gguf, ARCH)
    n_layer = hp.int("block_count")
    n_embd = hp.int("embedding_length")
    s = mamba2_sizes(hp)
    n_vocab = vocab_size(gguf, hp)
    w = Weights(gguf)
    tok_embd = w.matrix("token_embd.weight", n_vocab, n_embd)
    layers = [mamba2_layer(w, f"blk.{i}.", n_embd, s) for i in range(n_layer)]
    spec = ModelSpec(
        arch=ARCH,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=1, n_head_kv=1, head_dim=2, head_dim_v=2, n_ff=1, n_rot=2,  # placeholders: no attention, no FFN
        rope_mode=ROPE_NEOX,
        gate_fn=ACT_SILU,
        norm_eps=hp.float("attention.layer_norm_rms_epsilon", 1e-5),
        embd_scale=1.0,
        attn_scale=1.0,
        context_length=hp.int("context_length", 1 << 20),
        tok_embd=tok_embd,
        output_norm=w.vector("output_norm.weight", n_embd),
        output=output_head(w, tok_embd, n_vocab, n_embd),
        layers=layers,
    )
    set_ssm_sizes(spec, s)
    w.check_all_used(n_layer, ARCH)
    return spec
