"""bench/compare.py's helper process: the read probe and the bytes a
generated token reads, kept out of the driver so that they do not count in
the benchmark children's peak RSS."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec
from tiny_models import TinyConfig, write_model

BENCH = Path(__file__).resolve().parents[2] / "bench"


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


# ---- bench/peer.py: finding llama.cpp and running llama-bench ----

# What `llama-bench -m llama1b-q4_k_m.gguf -t 2 -p 512 -n 128 -d 256 -r 1 -o json`
# prints on a CPU build, in the format of llama.cpp's tools/llama-bench/README.md
# (one object per test; the figures here are made up).
_ROW = {
    "build_commit": "a1b2c3d4", "build_number": 6000, "cpu_info": "Intel(R) Xeon(R) Platinum", "gpu_info": "",
    "backends": "CPU", "model_filename": "llama1b-q4_k_m.gguf", "model_type": "llama 1B Q4_K - Medium",
    "model_size": 807687168, "model_n_params": 1235814400, "n_batch": 2048, "n_ubatch": 512, "n_threads": 2,
    "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99,
    "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False, "flash_attn": -1,
    "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none", "use_mmap": True,
    "use_direct_io": False, "embeddings": False, "no_op_offload": 0, "no_host": False, "repack": True,
    "fit_target": 0, "fit_min_ctx": 0,
}
LLAMA_BENCH_JSON = json.dumps([
    {**_ROW, "n_prompt": 512, "n_gen": 0, "n_depth": 256, "test_time": "2026-12-03T10:00:00Z",
     "avg_ns": 10690000000, "stddev_ns": 0, "avg_ts": 47.895231, "stddev_ts": 0.0,
     "samples_ns": [10690000000], "samples_ts": [47.8952]},
    {**_ROW, "n_prompt": 0, "n_gen": 128, "n_depth": 256, "test_time": "2026-12-03T10:00:12Z",
     "avg_ns": 9846000000, "stddev_ns": 0, "avg_ts": 13.000203, "stddev_ts": 0.0,
     "samples_ns": [9846000000], "samples_ts": [13.0002]},
], indent=2)


def _as_csv(rows):
    """llama-bench's -o csv: a header, then every value quoted."""
    keys = [k for k in rows[0] if not k.startswith("samples_")]
    text = lambda v: str(v).lower() if isinstance(v, bool) else str(v)  # noqa: E731
    return "\n".join([",".join(keys)] + [",".join(f'"{text(r[k])}"' for k in keys) for r in rows]) + "\n"


@pytest.fixture(scope="module")
def peer(compare):
    return compare.peer  # bench/peer.py, as the scripts import it


def _tool(folder, name="llama-bench", body=""):
    """An executable shell script standing in for one of llama.cpp's tools."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return exe


def test_llama_bench_output_in_every_format(peer):
    """pp and tg tokens/s (each row's avg_ts) from -o json, jsonl and csv."""
    rows = json.loads(LLAMA_BENCH_JSON)
    want = {"pp": 47.895231, "tg": 13.000203}
    assert peer.parse_llama_bench(LLAMA_BENCH_JSON) == want
    assert peer.parse_llama_bench("\n".join(json.dumps(r) for r in rows)) == want
    assert peer.parse_llama_bench(_as_csv(rows)) == pytest.approx(want)
    assert peer.parse_llama_bench(json.dumps(rows[1:])) == {"tg": 13.000203}  # -p 0
    assert peer.parse_llama_bench(json.dumps([{**rows[0], "n_gen": 16}])) == {"pg": 47.895231}  # -pg 512,16
    with pytest.raises(ValueError, match="no results"):
        peer.parse_llama_bench("\n")
    with pytest.raises(ValueError, match="two pp rows"):
        peer.parse_llama_bench(json.dumps([rows[0], rows[0]]))
    with pytest.raises(ValueError, match="not a llama-bench result"):
        peer.parse_llama_bench(json.dumps([{"model_filename": "x.gguf"}]))


def test_llama_bench_run_end_to_end(peer, tmp_path):
    """The runner's command line reaches llama-bench, and what it prints comes back parsed."""
    (tmp_path / "out.json").write_text(LLAMA_BENCH_JSON)
    exe = _tool(tmp_path / "bin", body=f'echo "$@" > {tmp_path}/args\ncat {tmp_path}/out.json\n')
    res, rss = peer.llama_bench(str(exe), "m.gguf", 2, 512, 128, n_depth=256)
    assert res == {"pp": 47.895231, "tg": 13.000203} and rss > 0
    assert (tmp_path / "args").read_text().split() == \
        "-m m.gguf -t 2 -p 512 -n 128 -d 256 -r 1 -o json".split()
    peer.llama_bench(str(exe), "m.gguf", 1, 64, 16, reps=3, n_gpu_layers=99)
    assert (tmp_path / "args").read_text().split() == \
        "-m m.gguf -t 1 -p 64 -n 16 -ngl 99 -r 3 -o json".split()  # no -d when the depth is 0


def test_llama_bench_killed_by_a_signal_says_so(peer, tmp_path):
    """A peer killed by a signal (llama.cpp's AMX prompt path segfaults on some
    Xeons) is reported by the signal's name; a failed one by its status and
    the last line of its stderr."""
    exe = _tool(tmp_path, body="kill -SEGV $$\n")
    with pytest.raises(RuntimeError, match="killed by SIGSEGV"):
        peer.llama_bench(str(exe), "m.gguf", 1)
    exe = _tool(tmp_path, body="echo 'loading' >&2\necho 'error: failed to load model' >&2\nexit 3\n")
    with pytest.raises(RuntimeError, match="status 3: error: failed to load model"):
        peer.llama_bench(str(exe), "m.gguf", 1)


def test_llama_cpp_tools_found_flag_then_variable_then_path(peer, tmp_path, monkeypatch):
    flag, env, on_path = (_tool(tmp_path / d) for d in ("flag", "env", "path"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.delenv("LLMINFER_LLAMA_CPP", raising=False)
    assert peer.llama_cpp_tool("llama-bench") == str(on_path)
    monkeypatch.setenv("LLMINFER_LLAMA_CPP", str(env.parent))
    assert peer.llama_cpp_tool("llama-bench") == str(env)
    assert peer.llama_cpp_tool("llama-bench", str(flag.parent)) == str(flag)
    # the older flags took the binary itself
    assert peer.llama_cpp_tool("llama-bench", str(flag)) == str(flag)
    # a place given that lacks the tool is an error, not a reason to look elsewhere
    with pytest.raises(SystemExit, match=r"llama-quantize is not in --llama-cpp .*flag"):
        peer.llama_cpp_tool("llama-quantize", str(flag.parent))
    with pytest.raises(SystemExit, match=r"llama-quantize is not in \$LLMINFER_LLAMA_CPP"):
        peer.llama_cpp_tool("llama-quantize")
    monkeypatch.delenv("LLMINFER_LLAMA_CPP")
    with pytest.raises(SystemExit) as e:
        peer.llama_cpp_tool("llama-quantize")
    assert "--llama-cpp BIN_DIR" in str(e.value) and "$LLMINFER_LLAMA_CPP" in str(e.value)


def test_peer_python_found_flag_then_variable(peer, tmp_path, monkeypatch):
    flag, env = _tool(tmp_path / "a", "python"), _tool(tmp_path / "b", "python")
    monkeypatch.setenv("LLMINFER_PEER_PYTHON", str(env))
    assert peer.peer_python() == str(env)
    assert peer.peer_python(str(flag)) == str(flag)
    with pytest.raises(SystemExit, match="--peer-python .*absent"):
        peer.peer_python(str(tmp_path / "absent"))
    monkeypatch.delenv("LLMINFER_PEER_PYTHON")
    monkeypatch.setattr(peer, "_imports_llama_cpp", lambda: True)
    assert peer.peer_python() == sys.executable
    monkeypatch.setattr(peer, "_imports_llama_cpp", lambda: False)
    with pytest.raises(SystemExit) as e:
        peer.peer_python()
    assert "--peer-python" in str(e.value) and "$LLMINFER_PEER_PYTHON" in str(e.value)


def test_compare_llama_bench_mode_without_llama_cpp(tmp_path):
    """compare.py --llama-bench with no llama.cpp anywhere stops with the
    locator's message, before it writes or quantizes any model."""
    env = {k: v for k, v in os.environ.items() if k != "LLMINFER_LLAMA_CPP"}
    env["PATH"] = os.path.dirname(sys.executable)
    run = subprocess.run([sys.executable, str(BENCH / "compare.py"), "--llama-bench", "--work", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1
    assert "llama-bench not found" in run.stderr and "--llama-cpp BIN_DIR" in run.stderr
    assert list(tmp_path.iterdir()) == []
