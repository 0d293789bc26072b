"""What the architecture tests share: running a tiny model through the
Engine (run, run_f32_kv), tokens, tolerances and the closeness check, the
invariance check across an attention span, and the architectures and YaRN
cases they cover."""

import numpy as np
from llminfer.runtime.engine import Engine
from tiny_models import TinyConfig


TOL_FLOAT_WEIGHTS = 5e-3   # as in test_forward: relative to the largest |reference logit|


TOL_QUANT_WEIGHTS = 3e-2


ROUTE_TIE = 0.005


NEW_ARCHS = ["qwen2vl", "qwen3vl", "qwen3", "gemma2", "phi3", "granite", "olmo2", "smollm3", "qwen3moe", "qwen3vlmoe",
             "mistral3"]


def config(arch, **kw):
    defaults = dict(arch=arch, tie_output=arch not in ("olmo2", "qwen2", "qwen2vl"))
    if arch == "gemma2":
        defaults["sliding_window"] = 8
    if arch == "smollm3":
        defaults["n_layer"] = 4  # layer 3 is the first without RoPE
    if arch == "qwen3vlmoe":
        # two layers and 4 experts, 2 per token (fewer near-tied routes than 8 and 3 over
        # more layers); DeepStack after layer 0 only, not the last (llama.cpp's graph needs that)
        defaults.update(n_layer=2, n_deepstack=1, n_expert=4, n_expert_used=2)
    if arch == "qwen3vl":
        defaults["n_layer"] = 4  # DeepStack after layers 0 and 1, not the last (llama.cpp's graph needs that)
    if arch == "mistral3":
        # YaRN x4 from an original context of 16, and temperature tuning
        # stepping every 16 positions, so a 40-token prompt sees three scales
        defaults.update(yarn_factor=4.0, yarn_orig_ctx=16, attn_temp_scale=0.5)
    defaults.update(kw)
    return TinyConfig(**defaults)


def run(path, tokens, step=None, n_ctx=512, n_batch=64, threads=2, block_size=16, repack=True, engine_out=None,
        kv_type="f16"):
    eng = Engine(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, block_size=block_size, repack=repack,
                 kv_type=kv_type)
    if engine_out is not None:
        engine_out.append(eng.repacked_bytes)
    try:
        seq = eng.new_sequence()
        step = step or len(tokens)
        parts = [eng.decode([(seq, tokens[i:i + step], "all")])[0] for i in range(0, len(tokens), step)]
        return np.concatenate(parts)
    finally:
        eng.close()


def tokens_for(seed, n=40, vocab=268):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


def run_f32_kv(path, tokens, step=7, threads=2):
    """every position's logits, the prompt fed `step` tokens at a time, F32 KV cache"""
    return run(path, tokens, step=step, threads=threads, kv_type="f32")


def assert_invariant_across_span(path):
    """300 positions (past a 128- or 256-token attention span): prefill,
    chunks of 7, a decode token by token, 1 or 2 threads and a batch shared
    with another sequence all give a token the same bits. Returns the
    whole prefill's logits."""
    a, b = tokens_for(31, 300), tokens_for(32, 45)
    whole = run(path, a, n_batch=300, threads=1)
    assert np.array_equal(run(path, a, step=7, n_batch=300, threads=2), whole)
    eng = Engine(path, n_ctx=512, kv_pool_tokens=1024, n_batch=512, n_threads=2, block_size=16)
    try:
        s = eng.new_sequence()
        eng.decode([(s, a[:250], "all")])
        steps = [eng.decode([(s, a[i:i + 1], "all")])[0] for i in range(250, 300)]
        assert np.array_equal(np.concatenate(steps), whole[250:])
        sa, sb = eng.new_sequence(), eng.new_sequence()
        la, lb = eng.decode([(sa, a, "all"), (sb, b, "all")])
    finally:
        eng.close()
    assert np.array_equal(la, whole)
    assert np.array_equal(lb, run(path, b))
    return whole


def check_close(ours, ref, tol, what, route_gap=None):
    """ours within tol of ref (relative to its largest logit), and the same
    top token wherever the reference leads clearly. With route_gap (MoE),
    tokens whose expert choice was a near tie in the reference (their
    probabilities within ROUTE_TIE) are left out: 8-bit activations may
    rightly pick the other expert there. They must be few."""
    if route_gap is not None:
        keep = route_gap > ROUTE_TIE
        assert keep.mean() > 0.8, f"{what}: {np.sum(~keep)} of {keep.size} tokens routed on near ties"
        ours, ref = ours[keep], ref[keep]
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < tol, f"{what}: relative logit error {err:.4f} >= {tol}"
    s = np.sort(ref, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > 4 * err * np.abs(ref).max()
    assert np.array_equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear]), what


YARN_CASES = [
    ("mistral3", dict(attn_temp_scale=0.0)),    # YaRN alone
    ("mistral3", dict(yarn_factor=0.0)),         # temperature tuning alone
    ("mistral3", dict(yarn_log_mul=0.0)),        # YaRN's mscale not divided down
    ("qwen3", dict(yarn_factor=4.0)),            # YaRN with llama.cpp's betas (Qwen's long-context files)
    ("llama", dict(yarn_factor=8.0, yarn_orig_ctx=64)),
]
