"""A short, seeded run of each fuzzer (tests/fuzz): every mutated GGUF file
or chat template must load or be refused with an LLMInferError, never raise
anything else, crash or hang; every mutated HTTP body must be answered 2xx
or 4xx, never 5xx, and a stream must end with [DONE]. The long runs are
documented in tests/fuzz/run.py."""

import pytest

from fuzz.run import fuzz


@pytest.mark.parametrize("target, iterations", [("gguf", 400), ("gguf-run", 60), ("template", 400)])
def test_bounded_fuzz_run(target, iterations):
    messages = []
    stats = fuzz(target, iterations=iterations, seed=7, hang=30.0, log=messages.append)
    assert stats["findings"] == [], "\n".join(messages)
    assert stats["inputs"] == iterations
    # the run means something only if it reaches both sides of the checks
    assert stats["ok"] > 0 and stats["refused"] > 0, stats


def test_bounded_http_fuzz_run():
    """Mutated chat, completions, embeddings and tokenizer bodies (nested
    thousands deep, numbers no float holds, wrong types, invalid UTF-8,
    long strings) POSTed to the server's app with a tiny model."""
    pytest.importorskip("starlette", reason="the server needs starlette")
    pytest.importorskip("httpx", reason="starlette's TestClient needs httpx")
    messages = []
    stats = fuzz("http", iterations=1500, seed=7, hang=30.0, log=messages.append)
    assert stats["findings"] == [], "\n".join(messages)
    assert stats["inputs"] == 1500
    assert stats["ok"] > 0 and stats["refused"] > 0, stats
