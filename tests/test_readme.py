"""Every ```python block of README.md and docs/*.md, run.

The blocks of one file run in order in one namespace, as a reader goes
through them: a fragment may use the names an earlier block made (`llm`,
`messages`). Nothing here knows which blocks a document has: a new block runs
as it is. What a block cannot do in a test is said in the tables below, each
entry keyed by a piece of the block's text:

- FILES: file names the examples use for "your model", and what stands in
  for them (SmolLM2, fetched by the fixtures; a tiny random encoder).
- SKIP: blocks that need what a test machine has not (a server, the network,
  a GPU, Ray), with the reason pytest shows.
- SETUP: names a fragment takes from prose around it, defined before it runs.
- SHORTEN: edits that keep an example's shape and cut its length (tokens).

A `>>>` block runs its statements; the output shown is not compared (it is
this machine's, in system_info's case).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def _gpu_missing():
    from llminfer.core import gpu

    return not gpu.info()["available"]


FILES = {
    "model.gguf": "smollm2",
    "big.gguf": "smollm2",
    "small.gguf": "smollm2",
    "all-MiniLM-L6-v2.Q8_0.gguf": "encoder",
}

SKIP = [
    # (text in the block, reason, when: None for always, else a callable)
    ("OpenAI(base_url=", "needs a running llminfer server (tests/server/test_server.py covers it)", None),
    ("anthropic.Anthropic(base_url=", "needs a running llminfer server (tests/server/test_server_anthropic.py covers it)",
     None),
    ('from_pretrained("ORG/REPO-GGUF"', "needs the network: a placeholder Hugging Face repository", None),
    ("from ray import serve", "needs Ray Serve and a model at /models (tests/integrations/test_ray_serve.py covers it)", None),
    ("n_gpu_layers=-1)   # every layer", "needs a GPU build and a GPU", _gpu_missing),
    ("gemma-3-4b-it-Q4_K_M.gguf", "needs a vision model and its mmproj (tests/vision/test_vision.py covers it)", None),
    ("ms-marco-MiniLM-L6-v2-Q8_0.gguf", "needs a reranker GGUF (tests/generation/test_rerank.py covers it)", None),
    ('"my-lora.gguf"', "needs a LoRA adapter GGUF for the model (tests/runtime/test_lora.py covers it)", None),
    ('open("cat.jpg"', "needs a server with a vision model and an image (tests/server/test_server_vision.py covers it)",
     None),
]

SETUP = [
    ("llm.complete(prompts", "from llminfer import SamplingParams\nprompts = ['The sea is', 'Bread is']"),
    # the structured-output fragment is about LLM (an earlier block made `llm` a Llama)
    ("json_schema=", "import llminfer\nllm = llminfer.LLM('smollm2-135m-instruct', n_ctx=1024)\n"
                     "schema = {'type': 'object', 'properties': {'name': {'type': 'string'}}, 'required': ['name']}"),
    ("json.loads(call", "import json"),
    ("eng.decode([(a, ids_a)", "ids_a, ids_b, tok_a, tok_c = list(range(1, 17)), [4, 5, 6], 7, 8"),
    ('draft_model="small.gguf"', "from llminfer import LLM\nprompt = 'def add(a, b):\\n    return a + b\\n'"),
]

SHORTEN = [("max_tokens=512", "max_tokens=16")]


def _code(block: str) -> str:
    """A block's code; for a `>>>` block, its statements without the prompts and output."""
    if not block.lstrip().startswith(">>>"):
        return block
    lines = [ln[4:] for ln in block.splitlines() if ln.startswith((">>> ", "... "))]
    return "\n".join(lines) + "\n"


def _blocks():
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(pytest.param(doc, line, m.group(1), id=f"{doc.name}:{line}"))
    return out


BLOCKS = _blocks()


def test_the_documents_have_python_blocks():
    assert any(p.values[0].name == "README.md" for p in BLOCKS)


@pytest.fixture(scope="module")
def stand_ins(smollm2_path, tmp_path_factory):
    from tiny_models import write_encoder

    enc = tmp_path_factory.mktemp("readme") / "encoder.gguf"
    write_encoder(enc)
    return {"smollm2": str(smollm2_path), "encoder": str(enc)}


_state: dict = {}  # document -> {"ns": namespace, "done": lines run (or skipped), "errors": {line: exception}}


@pytest.fixture(scope="module", autouse=True)
def _release():
    """The models the blocks loaded are freed with the module's tests, not
    at interpreter exit (when the modules their finalizers use are gone)."""
    yield
    import gc

    _state.clear()
    gc.collect()


def _prepared(code: str, stand_ins) -> str:
    setup = [s for key, s in SETUP if key in code]
    for name, what in FILES.items():
        code = code.replace(f'"{name}"', repr(stand_ins[what])).replace(f"'{name}'", repr(stand_ins[what]))
    for old, new in SHORTEN:
        code = code.replace(old, new)
    return "\n".join(setup + [code])


def _skip_reason(code: str):
    for key, reason, when in SKIP:
        if key in code and (when is None or when()):
            return reason
    return None


def _run_one(doc, line, block, stand_ins):
    st = _state.setdefault(doc, {"ns": {"__name__": "__readme__"}, "done": set(), "errors": {}})
    if line in st["done"]:
        if line in st["errors"]:
            raise st["errors"][line]
        return
    st["done"].add(line)
    code = _code(block)
    if _skip_reason(code):
        return
    try:
        exec(compile(_prepared(code, stand_ins), f"{doc.name}:{line}", "exec"), st["ns"])  # noqa: S102
    except Exception as e:
        st["errors"][line] = e
        raise


@pytest.mark.parametrize("doc,line,block", BLOCKS)
def test_python_block_runs(doc, line, block, stand_ins, tmp_path_factory, monkeypatch):
    reason = _skip_reason(_code(block))
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))  # blocks that write files write them here
    # the blocks above this one first, when it runs alone (-k)
    for p in BLOCKS:
        d, ln, b = p.values
        if d == doc and ln < line:
            try:
                _run_one(d, ln, b, stand_ins)
            except Exception:  # noqa: BLE001 - reported by that block's own test
                pass
    _run_one(doc, line, block, stand_ins)
