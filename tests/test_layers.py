"""The package's floors, read from the sources (nothing is imported): no
import cycle between llminfer's Python modules, the server imports no
private name of the library, and in C nothing below the model includes the
model's context (kernels and utilities report and allocate through util.h)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "llminfer"
CSRC = ROOT / "csrc"


def _modules() -> dict:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = p
    return out


def _imports(mods) -> dict:
    """module -> the llminfer modules it imports, at any depth of its code
    (an import inside a function is still a dependency)."""
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("llminfer"):
                for a in n.names:
                    full = f"{n.module}.{a.name}"
                    edges[m].add(full if full in mods else n.module)
            elif isinstance(n, ast.Import):
                edges[m].update(a.name for a in n.names if a.name.startswith("llminfer"))
        edges[m] &= set(mods) - {"llminfer", m}  # the package's __init__ re-exports; not a floor
    return edges


def _cycles(edges) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_python_modules():
    assert _cycles(_imports(_modules())) == []


def test_the_server_imports_no_private_name_of_the_library():
    for p in (PKG / "server").glob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("llminfer") \
                    and not n.module.startswith("llminfer.server"):
                private = [a.name for a in n.names if a.name.startswith("_")]
                assert not private, f"{p.name} imports {private} from {n.module}"


def test_only_the_model_includes_its_context_in_c():
    """context.h is the forward pass's state; the files below it (kernels,
    formats, the file reader, the fault watch, thread shares, repacking, the
    ops) use util.h to allocate and report."""
    includers = sorted(str(p.relative_to(CSRC)) for p in CSRC.rglob("*.[ch]")
                       if "cuda" not in p.parts and '#include "context.h"' in p.read_text())
    assert includers == ["attention.c", "encoder.c", "model.c"]
    util = (CSRC / "util.h").read_text()
    assert not re.search(r'#include "', util), "util.h sits below every other header"
    for p in (CSRC / "kernels").glob("*.[ch]"):
        names = re.findall(r'#include "([^"]+)"', p.read_text())
        above = [n for n in names if n in ("../context.h", "../matmul.h", "../backend.h", "../quantize.h")]
        assert not above, f"kernels/{p.name} includes {above}: the forward pass's floors, above the kernels"
