"""llminfer.core.numerics: logits checked after a forward pass, and the weight
scan behind `llminfer info --check`."""

from contextlib import closing

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llminfer import _core

from llminfer.cli import commands as cli
from llminfer.runtime.engine import Engine
from llminfer.errors import InvalidArgumentError, LLMInferError, NumericalError
from llminfer.core.gguf_file import GGUFFile
from llminfer.core.numerics import check_logits, scan_weights

from kernel_cases import isa  # noqa: F401 (the fixture that runs a test at every kernel level)
from tiny_models import TinyConfig, write_model


def test_finite_logits_pass():
    check_logits(np.array([0.5, -2.0, 3.0], dtype=np.float32), "x")
    check_logits(np.zeros((0, 5), dtype=np.float32), "x")


@pytest.mark.parametrize("value, kind", [(np.nan, "NaN"), (np.inf, "an infinity"), (-np.inf, "an infinity")])
def test_non_finite_logits(value, kind):
    z = np.array([0.5, -2.0, 3.0, 1.0], dtype=np.float32)
    z[2] = value
    with pytest.raises(NumericalError, match=rf"{kind} in its logits at generated token 7, first at token id 2"):
        check_logits(z, "generated token 7")


def test_the_row_is_named():
    z = np.ones((3, 4), dtype=np.float32) * np.arange(4, dtype=np.float32)
    z[1, 3] = np.nan
    with pytest.raises(NumericalError, match=r"at the prompt \(row 1 of 3\), first at token id 3"):
        check_logits(z, "the prompt")


def test_all_equal_logits():
    """What an absurd norm epsilon gives: every logit 0."""
    with pytest.raises(NumericalError, match=r"all equal \(0.0\) at position 3"):
        check_logits(np.zeros(10, dtype=np.float32), "position 3")


@pytest.mark.parametrize("n", [1, 7, 31, 32, 33, 100, 262144 + 5])
def test_value_range_kernel(isa, n):
    """The kernel behind the logits check (li_value_range, as each pass's
    head ends): numpy's min and max, with an infinity, at every length past
    the vector loops; NaN anywhere, even at the very end, makes both NaN."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 30).astype(np.float32)
    assert _core.value_range(x) == (x.min(), x.max())
    x[rng.integers(n)] = -np.inf
    assert _core.value_range(x) == (-np.inf, x.max())
    for at in sorted({0, n // 2, n - 1}):
        y = x.copy()
        y[at] = np.nan
        lo, hi = _core.value_range(y)
        assert np.isnan(lo) and np.isnan(hi), (at, lo, hi)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_passes_logit_ranges_are_the_logits(tmp_path, isa, threads):
    """What the team leaves for the check after the head is each row's min
    and max of the logits handed back, for one row and for several, with
    the verdict that they are sound (1); a count of rows the pass did not
    compute gets none (-1). Unsound rows (0) are the NaN models' below."""
    path = write_model(tmp_path / "r.gguf", TinyConfig(final_softcap=0.0))
    with closing(Engine(path, n_ctx=64, n_threads=threads)) as eng:
        rows = eng.decode([(eng.new_sequence(), list(range(1, 9)), "all")])[0]
        got = np.empty((len(rows), 2), np.float32)
        assert eng.ctx.logit_range(got) == 1
        assert np.array_equal(got, np.stack([rows.min(axis=1), rows.max(axis=1)], axis=1))
        last = eng.decode([(eng.new_sequence(), [3, 4], "last")])[0]
        one = np.empty((1, 2), np.float32)
        assert eng.ctx.logit_range(one) == 1 and tuple(one[0]) == (last.min(), last.max())
        assert eng.ctx.logit_range(got) == -1  # the last pass had 1 row, not 8


def test_numerical_error_does_not_blame_the_caller():
    assert issubclass(NumericalError, LLMInferError)
    assert not issubclass(NumericalError, (ValueError, InvalidArgumentError))


@pytest.fixture(autouse=True)
def _unchecked_scales(monkeypatch):
    """The load refuses a non-finite block scale (GGUFFile.check_finite):
    these tests load such files on purpose, to see what a pass makes of them."""
    monkeypatch.setenv("LLMINFER_CHECK_SCALES", "0")


@pytest.fixture(scope="module")
def nan_scale_model(tmp_path_factory):
    """Q8_0 projections; row 5 of blk.1.ffn_up.weight has a NaN block scale."""
    def hook(name, data, t):
        if name == "blk.1.ffn_up.weight":
            data = data.copy()
            data[5, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # the first block's d
        return data, t
    return write_model(tmp_path_factory.mktemp("nan") / "nan.gguf", TinyConfig(qtype="Q8_0"), tensor_hook=hook)


def test_scan_finds_a_nan_scale(nan_scale_model):
    seen = []
    with GGUFFile(nan_scale_model) as g:
        bad, skipped = scan_weights(g, progress=lambda done, total: seen.append((done, total)), chunk_bytes=4096)
    assert [(b.name, b.type_name, b.n_bad, b.first_row) for b in bad] == [("blk.1.ffn_up.weight", "Q8_0", 32, 5)]
    assert skipped == []
    assert seen[-1][0] == seen[-1][1]                      # reaches 100%
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))  # and only goes forward


def test_scan_of_a_sound_model(tmp_path):
    p = write_model(tmp_path / "ok.gguf", TinyConfig(qtype="Q4_K"))
    with GGUFFile(p) as g:
        assert scan_weights(g) == ([], [])


def test_info_check(nan_scale_model, capsys):
    code = cli.main(["info", "-m", str(nan_scale_model), "--check"])
    out = capsys.readouterr().out
    assert code == 1
    assert "NON-FINITE: blk.1.ffn_up.weight (Q8_0): 32 values, first in row 5" in out
    assert "1 with NaN or infinite values" in out


# ---- where a NaN first appears: the probe's diagnostic re-run ----

def _corrupt(names_rows, value=np.nan):
    """A tensor_hook setting the first block's scale (Q8_0: bytes 0..1 of the
    row) of the given rows, or a value of an F32 row, to value."""
    def hook(name, data, t):
        for row in names_rows.get(name, ()):
            data = data.copy()
            if t == GGMLQuantizationType.F32:  # stored as bytes: value 3 of the row
                data[row, 12:16] = np.frombuffer(np.float32(value).tobytes(), np.uint8)
            else:
                data[row, 0:2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
        return data, t
    return hook


PROMPT = [40, 41, 42, 43, 44]  # byte tokens; 65 is the corrupted embedding row below


@pytest.fixture(scope="module")
def nan_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    cfg = TinyConfig(qtype="Q8_0", n_layer=4, tie_output=False, embd_qtype="F32")
    return {
        "ok": write_model(d / "ok.gguf", cfg),
        "ffn2": write_model(d / "ffn2.gguf", cfg, tensor_hook=_corrupt({"blk.2.ffn_down.weight": [7]})),
        "attn1": write_model(d / "attn1.gguf", cfg, tensor_hook=_corrupt({"blk.1.attn_output.weight": [3]},
                                                                           np.inf)),
        "embd": write_model(d / "embd.gguf", cfg, tensor_hook=_corrupt({"token_embd.weight": [65]})),
        "head": write_model(d / "head.gguf", cfg, tensor_hook=_corrupt({"output.weight": [9]})),
    }


def test_nan_in_a_layer_weight_names_the_layer(nan_models):
    with closing(Engine(nan_models["ffn2"], n_ctx=64)) as eng:
        s = eng.new_sequence()
        with pytest.raises(NumericalError, match=r"NaN in its logits .* first appear in the output of layer 2 "
                                                 r"\(ffn; blk\.2\.\* weights\) at batch row 0 \(position 0\)"):
            eng.decode([(s, PROMPT)])
        assert s.tokens == []  # the failed pass was not committed


def test_an_infinity_in_attention_names_the_layer_and_half(nan_models):
    """An infinity in the residual stream ends here as all-zero logits (the
    next norm makes NaN of it, and quantizing the activations zeros that):
    the all-equal message keeps its words and says where it started."""
    with closing(Engine(nan_models["attn1"], n_ctx=64)) as eng:
        with pytest.raises(NumericalError, match=r"all equal \(0.0\) at a batch of 5 tokens \(positions 0..4\): "
                                                 r"nothing to choose a token by; non-finite values first appear in "
                                                 r"the output of layer 1 \(attention; blk\.1\.\* weights\) "
                                                 r"at batch row 0"):
            eng.decode([(eng.new_sequence(), PROMPT)])


def test_nan_in_an_embedding_row_names_the_embedding_and_the_row(nan_models):
    with closing(Engine(nan_models["embd"], n_ctx=64)) as eng:
        a, b = eng.new_sequence(), eng.new_sequence()
        # b's third token is the bad row: batch row 5 + 2 of the flat batch
        with pytest.raises(NumericalError, match=r"first appear in the embedding of token id 65 \(token_embd"
                                                 r"\.weight times the embedding scale\) at batch row 7 \(position 2\)"):
            eng.decode([(a, PROMPT), (b, [40, 41, 65, 42])])


def test_nan_in_the_output_head_names_the_logits(nan_models):
    with closing(Engine(nan_models["head"], n_ctx=64)) as eng:
        with pytest.raises(NumericalError, match=r"first at token id 9; non-finite values first appear in the "
                                                 r"logits at batch row 4 \(position 4\) .*every hidden state finite"
                                                 r".*output\.weight"):
            eng.decode([(eng.new_sequence(), PROMPT)])


def test_the_cache_is_sound_after_a_located_failure(nan_models):
    """The failed pass and its diagnostic re-run write the rows of the
    uncommitted tokens only: the sequence goes on as if they never ran."""
    with closing(Engine(nan_models["embd"], n_ctx=64)) as eng:
        s = eng.new_sequence()
        eng.decode([(s, PROMPT)])
        with pytest.raises(NumericalError, match="embedding of token id 65"):
            eng.decode([(s, [65, 40])])
        assert s.tokens == PROMPT
        after = eng.decode([(s, [41, 42])])[0]
        fresh = eng.new_sequence()
        assert np.array_equal(eng.decode([(fresh, PROMPT + [41, 42])])[0], after)


def _engine_with(path, monkeypatch, **spec_changes):
    """An engine whose spec is changed after loading: the loader's ranges keep
    a file's hyperparameters from these values, so the test sets them here."""
    from llminfer.runtime import engine as engine_mod
    real = engine_mod.build_spec

    def build(*args, **kwargs):
        spec = real(*args, **kwargs)
        for k, v in spec_changes.items():
            setattr(spec, k, v)
        return spec
    monkeypatch.setattr(engine_mod, "build_spec", build)
    return closing(Engine(path, n_ctx=64))


def test_hyperparameters_overflowing_the_logits(nan_models, monkeypatch):
    with _engine_with(nan_models["ok"], monkeypatch, logit_scale=3e38) as eng:
        with pytest.raises(NumericalError, match=r"an infinity in its logits.*first appear in the logits.*"
                                                 r"logit scale or soft-cap overflows"):
            eng.decode([(eng.new_sequence(), PROMPT)])


def test_hyperparameters_overflowing_the_embedding(nan_models, monkeypatch):
    with _engine_with(nan_models["ok"], monkeypatch, embd_scale=3e38) as eng:
        with pytest.raises(NumericalError, match=r"first appear in the embedding of token id 40 \(token_embd"
                                                 r"\.weight times the embedding scale\) at batch row 0 \(position 0\)"):
            eng.decode([(eng.new_sequence(), PROMPT)])


def test_all_equal_logits_keep_their_message(nan_models, monkeypatch):
    """What an absurd norm epsilon gives: every value finite, so the message
    names no layer."""
    with _engine_with(nan_models["ok"], monkeypatch, norm_eps=1e30) as eng:
        with pytest.raises(NumericalError, match=r"logits that are all equal \(0.0\) at a batch of 5 tokens "
                                                 r"\(positions 0..4\): nothing to choose a token by; the "
                                                 r"hyperparameters"):
            eng.decode([(eng.new_sequence(), PROMPT)])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3moe"])
def test_the_probe_changes_nothing_on_a_sound_model(tmp_path, arch):
    """With the probe on, a sound model's logits are bitwise those of the
    normal pass, and the probe finds nothing."""
    p = write_model(tmp_path / f"{arch}.gguf", TinyConfig(arch=arch, qtype="Q8_0", n_layer=3, sliding_window=8))
    with closing(Engine(p, n_ctx=64, n_threads=2)) as eng:
        plain = eng.decode([(eng.new_sequence(), PROMPT * 3, "all")])[0]
        _core.set_probe(eng.ctx, True)
        try:
            probed = eng.decode([(eng.new_sequence(), PROMPT * 3, "all")])[0]
            assert _core.probe_result(eng.ctx) is None
        finally:
            _core.set_probe(eng.ctx, False)
        again = eng.decode([(eng.new_sequence(), PROMPT * 3, "all")])[0]
    assert np.isfinite(plain).all()
    assert np.array_equal(plain, probed) and np.array_equal(plain, again)


def test_probe_result_when_off(nan_models):
    with closing(Engine(nan_models["ok"], n_ctx=64)) as eng:
        eng.decode([(eng.new_sequence(), PROMPT)])
        assert _core.probe_result(eng.ctx) is None
