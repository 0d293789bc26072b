"""bench/compare.py's helper process: the read probe and the bytes a
generated token reads, kept out of the driver so that they do not count in
the benchmark children's peak RSS."""

import importlib.util
import os
from pathlib import Path

import pytest

from llminfer.gguf_file import GGUFFile
from llminfer.models import build_spec
from tiny_models import TinyConfig, write_model

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare", BENCH / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_model(tmp_path_factory.mktemp("compare") / "tiny.gguf", TinyConfig(tie_output=False)))


def test_probe_process_answers_both_questions(compare, tiny):
    probe = compare.ProbeProcess(dict(os.environ), mib=16)  # llminfer as this process imports it
    try:
        for threads in (1, 2):
            assert probe.read_gbs(threads) > 0
            assert probe.sync_ns(threads) > 0
        bw, ns = probe.bracket(2)
        assert bw > 0 and ns > 0
        got = probe.bytes_per_token(tiny, 128)
        deep = probe.bytes_per_token(tiny, 128, 1000)
    finally:
        probe.close()
    assert probe.proc.returncode == 0
    # written out here: the weights a token reads (no embedding table), and
    # K and V rows of every layer at the average position of 128 generated tokens
    spec = build_spec(GGUFFile(tiny))
    weights = spec.output.data.nbytes + sum(
        m.data.nbytes for L in spec.layers for m in [L.wq, L.wk, L.wv, L.wo] + L.ffn_matrices())
    kv = sum(64 * spec.n_head_kv * (spec.head_dim + spec.head_dim_v) * 2 for _ in spec.layers)
    assert got == weights + kv
    # from a context of 1000 tokens (-d 1000) the average position is 1064
    assert deep == weights + kv * 1064 // 64


def test_probe_process_reports_its_end(compare, tmp_path):
    """A helper that fails (here on a file that is not there) is an error in
    the driver, not a hang or a figure read from nothing."""
    probe = compare.ProbeProcess(dict(os.environ), mib=1)
    with pytest.raises(RuntimeError, match="ended"):
        probe.bytes_per_token(str(tmp_path / "absent.gguf"), 128)
    with pytest.raises(RuntimeError, match="ended"):
        probe.read_gbs(1)
    assert probe.proc.wait() != 0


def test_bracket_counts_only_runs_the_host_kept_still(compare):
    """A run counts in the fraction of the probe when the probes on both
    sides of it agree: the same side of far_ns, bandwidths within 15%."""
    res = {"tg": 50.0}
    b = compare.probe_bracket((40.0, 70.0), (36.0, 80.0), res, 10**9 * 0.7, 200)
    assert b["host"] == "near" and b["agree"]
    assert b["of_probe"] == pytest.approx(50 * 0.7 / 38)
    b = compare.probe_bracket((60.0, 300.0), (58.0, 310.0), res, 10**9 * 0.7, 200)
    assert b["host"] == "far" and b["agree"]
    b = compare.probe_bracket((36.0, 70.0), (60.0, 300.0), res, 10**9 * 0.7, 200)
    assert b["host"] == "moved" and not b["agree"]
    b = compare.probe_bracket((40.0, 70.0), (30.0, 70.0), res, 10**9 * 0.7, 200)
    assert b["host"] == "near" and not b["agree"]  # 25% apart


def test_fraction_of_the_probe_by_placement(compare):
    """The table's fraction of the probe: a median over each engine's
    agreeing runs, and one per placement those runs found; a run whose
    probes disagree counts in neither."""
    per_token = 10**9 * 0.7
    near = [compare.probe_bracket((40.0, 70.0), (40.0, 70.0), {"tg": tg}, per_token, 200) for tg in (50.0, 56.0, 53.0)]
    far = [compare.probe_bracket((70.0, 300.0), (70.0, 300.0), {"tg": 80.0}, per_token, 200)]
    moved = [compare.probe_bracket((40.0, 70.0), (70.0, 300.0), {"tg": 90.0}, per_token, 200)]
    frac, by_host = compare.of_probe_summary({"ours": near + far + moved, "peer": near[:1]})
    # the median of the 4 agreeing fractions: 0.875, 0.98, 0.9275 near, 0.8 far
    assert frac["ours"] == pytest.approx((50 + 53) / 2 * 0.7 / 40)
    assert frac["peer"] == pytest.approx(50 * 0.7 / 40)
    assert by_host["near"]["ours"] == pytest.approx(53 * 0.7 / 40)
    assert by_host["far"]["ours"] == pytest.approx(80 * 0.7 / 70)
    assert by_host["far"]["peer"] is None
    assert by_host["near"]["runs"] == {"ours": 3, "peer": 1}
    assert by_host["far"]["runs"] == {"ours": 1, "peer": 0}
    assert "moved" not in by_host
    frac, by_host = compare.of_probe_summary({"ours": moved, "peer": []})
    assert frac == {"ours": None, "peer": None} and by_host == {}


def test_team_barrier_timing_helper():
    """bench_sync (the host-placement probe): a time per pass for a team of
    one and of two, and a clear error for a team of none."""
    from llminfer import _core
    from llminfer.errors import InvalidArgumentError

    for threads in (1, 2):
        assert 0 < _core.bench_sync(threads, 2000) < 1e-3
    with pytest.raises(InvalidArgumentError):
        _core.bench_sync(0)
    with pytest.raises(InvalidArgumentError):
        _core.bench_sync(2, 0)
