"""llminfer.numerics: logits checked after a forward pass, and the weight
scan behind `llminfer info --check`."""

import numpy as np
import pytest

from llminfer import cli
from llminfer.errors import InvalidArgumentError, LLMInferError, NumericalError
from llminfer.gguf_file import GGUFFile
from llminfer.numerics import check_logits, scan_weights

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


def test_numerical_error_does_not_blame_the_caller():
    assert issubclass(NumericalError, LLMInferError)
    assert not issubclass(NumericalError, (ValueError, InvalidArgumentError))


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
