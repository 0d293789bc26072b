"""Perplexity (llminfer/generation/perplexity.py) against llama-perplexity's method
written out again here in plain numpy: windows of n_ctx tokens, the first
token of each replaced by BOS, only the second half scored, and
ppl * sqrt(var / (count - 1)) as the uncertainty. A float-weight tiny model
is also scored with the numpy reference forward pass, and a @peer test
compares `llminfer perplexity` on SmolLM2 with llama.cpp's own logits.
"""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from llminfer import LLM

from llminfer.cli import commands as cli
from llminfer.errors import InvalidArgumentError
from llminfer.generation.perplexity import perplexity

from reference import ReferenceModel
from tiny_models import TinyConfig, write_model

ROOT = Path(__file__).resolve().parents[2]

TEXT = ("The river ran slowly past the mill, and the miller's daughter watched the boats go by. "
        "Each morning she counted them: barges heavy with grain, small skiffs with fishermen, "
        "and once, a painted boat with a red sail that nobody in the village had seen before. "
        "She asked her father where it came from, but he only shrugged and went back to his work. "
        "That evening the boat returned, moving upstream against the current without oars or wind, "
        "and the daughter ran along the bank to follow it until the lights of the village were far behind. ")
# Float weights against the float64 reference: logits within 5e-3 of the
# largest (tests/models/test_forward.py), so the mean NLL within about a percent.
TOL_PPL_FLOAT_WEIGHTS = 1e-2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppl")
    return {
        "q8": write_model(root / "q8.gguf", TinyConfig(tie_output=False)),
        "f32": write_model(root / "f32.gguf", TinyConfig(tie_output=False, qtype="F32", embd_qtype="F32",
                                                         seed=3)),
    }


def llama_perplexity(tokens, n_ctx, bos, logits_of):
    """llama-perplexity's estimate, from scratch. logits_of(window) gives the
    logits of a window evaluated from an empty context. Returns (ppl, err,
    number of windows, tokens scored, the estimate after each window)."""
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll, running = [], []
    for c in range(n_chunk):
        window = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if bos is not None:
            window[0] = bos
        logits = np.asarray(logits_of(window), dtype=np.float64)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            log_z = row.max() + math.log(np.exp(row - row.max()).sum())
            # the token that follows in the text (position 0 is never a target)
            nll.append(log_z - row[tokens[c * n_ctx + j + 1]])
        running.append(math.exp(sum(nll) / len(nll)))
    nll = np.array(nll)
    mean = nll.mean()
    var = (nll * nll).mean() - mean * mean
    ppl = math.exp(mean)
    return ppl, ppl * math.sqrt(var / (len(nll) - 1)), n_chunk, len(nll), running


def fresh_logits(llm):
    def logits_of(window):
        llm.reset()
        return llm.eval(window)
    return logits_of


@pytest.mark.parametrize("n_ctx", [32, 33])
def test_matches_llama_perplexity_method(models, n_ctx):
    with LLM(models["q8"], n_ctx=64, n_threads=1) as llm:
        tokens = llm.tokenize(TEXT)
        assert len(tokens) >= 4 * n_ctx
        r = perplexity(llm, TEXT, n_ctx=n_ctx)
        ppl, err, n_chunk, count, running = llama_perplexity(tokens, n_ctx, llm.tokenizer.bos_id,
                                                             fresh_logits(llm))
    assert (r.n_chunks, r.n_ctx, r.tokens_scored) == (n_chunk, n_ctx, count)
    assert r.ppl == pytest.approx(ppl, rel=1e-9)
    assert r.ppl_err == pytest.approx(err, rel=1e-9)
    assert r.running == pytest.approx(running, rel=1e-9)


def test_without_bos(models):
    """A vocabulary that adds no BOS (SmolLM2's): the text is tokenized
    without one and the windows keep their own first token."""
    with LLM(models["q8"], n_ctx=64, n_threads=1) as llm:
        llm.tokenizer.add_bos = False
        tokens = llm.tokenize(TEXT)
        assert tokens[0] != llm.tokenizer.bos_id
        r = perplexity(llm, TEXT, n_ctx=32)
        ppl, err, _, _, _ = llama_perplexity(tokens, 32, None, fresh_logits(llm))
    assert r.ppl == pytest.approx(ppl, rel=1e-9) and r.ppl_err == pytest.approx(err, rel=1e-9)


def test_against_the_reference_forward_pass(models):
    path = models["f32"]
    ref = ReferenceModel(path)
    with LLM(path, n_ctx=64, n_threads=1) as llm:
        tokens = llm.tokenize(TEXT)
        r = perplexity(llm, TEXT, n_ctx=48, max_chunks=3)
    ppl, err, _, _, _ = llama_perplexity(tokens[:3 * 48], 48, tokens[0], ref.logits)
    assert r.n_chunks == 3
    assert r.ppl == pytest.approx(ppl, rel=TOL_PPL_FLOAT_WEIGHTS)
    assert r.ppl_err == pytest.approx(err, rel=5 * TOL_PPL_FLOAT_WEIGHTS)


def test_chunk_limit_and_progress(models):
    calls = []
    with LLM(models["q8"], n_ctx=64, n_threads=1) as llm:
        full = perplexity(llm, TEXT, n_ctx=32)
        r = perplexity(llm, TEXT, n_ctx=32, max_chunks=2, progress=lambda *a: calls.append(a))
        assert llm.tokens == []  # the context is left empty
    assert r.n_chunks == 2 and full.n_chunks > 2
    assert r.running == full.running[:2] and r.ppl == pytest.approx(full.running[1], rel=1e-12)
    assert [(i, n) for i, n, _ in calls] == [(1, 2), (2, 2)]
    assert [p for _, _, p in calls] == r.running


def test_bad_arguments(models):
    with LLM(models["q8"], n_ctx=64, n_threads=1) as llm:
        n_tokens = len(llm.tokenize("a short text"))
        with pytest.raises(InvalidArgumentError) as e:
            perplexity(llm, "a short text", n_ctx=32)
        assert str(n_tokens) in str(e.value) and "64" in str(e.value)
        with pytest.raises(InvalidArgumentError, match="n_ctx=128"):
            perplexity(llm, TEXT, n_ctx=128)  # beyond the LLM's context
        with pytest.raises(InvalidArgumentError, match="n_ctx=2"):
            perplexity(llm, TEXT, n_ctx=2)


@pytest.mark.peer
def test_cli_matches_llama_cpp(smollm2_path, tmp_path, capsys):
    """`llminfer perplexity` on SmolLM2 within 1% of llama.cpp's figure
    (bench/perplexity_peer.py: the same windows scored on llama.cpp's logits)."""
    spec = importlib.util.spec_from_file_location("perplexity_peer", ROOT / "bench" / "perplexity_peer.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    text = TEXT * 3
    f = tmp_path / "text.txt"
    f.write_text(text, encoding="utf-8")
    assert cli.main(["perplexity", "-m", str(smollm2_path), "-f", str(f), "-c", "128", "-t", "2"]) == 0
    out = capsys.readouterr().out
    ours = float(out.split("PPL = ")[1].split()[0])
    theirs, _, _, _ = peer.peer_perplexity(smollm2_path, text, 128, 2)
    assert ours == pytest.approx(theirs, rel=0.01)
