"""A short, seeded run of each fuzzer (tests/fuzz): every mutated GGUF file
or chat template must load or be refused with an LLMInferError, never raise
anything else, crash or hang. The long runs are documented in
tests/fuzz/run.py."""

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
