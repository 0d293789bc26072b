"""The package's floors, read from the sources (nothing is imported): each
folder of llminfer imports only from the folders below it, no
import cycle between llminfer's Python modules, no module imports a
private name of another (the server none of the library's), and in C nothing below the model includes the
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


# llminfer's folders, lowest first: a module imports from its own folder and
# the folders before it (errors, _core and _moved sit below them all, and the
# package's __init__ re-exports from above them all); the last three stand side
# by side above the rest, the server below the command line and integrations
FLOORS = ["core", "hub", "text", "models", "vision", "runtime", "generation", "compat", "server", "cli",
          "integrations"]
BASE = {"llminfer.errors", "llminfer._core", "llminfer._moved"}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


def _upward_imports(edges) -> list:
    """(module, what it imports) for each import of a higher floor, or of a
    flat module outside the floors."""
    out = []
    for m, targets in edges.items():
        if m in BASE or m in ("llminfer", "llminfer.__main__"):  # the entry points re-export from above
            continue
        for t in sorted(targets):
            if t in BASE:
                continue
            if _floor(t) is None or _floor(m) is None or _floor(t) > _floor(m) \
                    or (_floor(t) == _floor(m) and FLOORS[_floor(m)] in ("cli", "integrations") and
                        t.split(".")[1] != m.split(".")[1]):
                out.append((m, t))
    return out


def test_the_floor_check_sees_an_upward_import():
    assert _upward_imports({"llminfer.core.ops": {"llminfer.runtime.engine", "llminfer.errors"},
                            "llminfer.runtime.engine": {"llminfer.core.ops"},
                            "llminfer.text.chat": {"llminfer.tokenizer"}}) == [
        ("llminfer.core.ops", "llminfer.runtime.engine"), ("llminfer.text.chat", "llminfer.tokenizer")]


def test_every_module_is_in_a_floor_and_imports_only_below_it():
    mods = _modules()
    flat = sorted(m for m in mods if m not in BASE and m not in ("llminfer", "llminfer.__main__") and _floor(m) is None)
    assert flat == [], f"modules outside llminfer's folders: {flat}"
    assert _upward_imports(_imports(mods)) == []


def test_the_old_flat_names_are_the_moved_modules():
    """Every module name the flat layout had still imports, as the same
    module object as its new name (llminfer/_moved.py)."""
    import importlib

    from llminfer import _moved

    for old, new in _moved.OLD_NAMES.items():
        assert importlib.import_module(f"llminfer.{old}") is importlib.import_module(f"llminfer.{new}"), old
        assert (PKG / (new.replace(".", "/") + ".py")).is_file(), new


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_python_modules():
    assert _cycles(_imports(_modules())) == []


def test_the_server_imports_no_private_name_of_the_library():
    for p in (PKG / "server").glob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("llminfer") \
                    and not n.module.startswith("llminfer.server"):
                private = [a.name for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{p.name} imports {private} from {n.module}"


def _private_imports() -> list:
    """(module, name, from) for each underscore name a module of the package
    imports from another (the compiled core, llminfer._core, is a module, and
    dunders such as __version__ are public)."""
    out = []
    for m, p in _modules().items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("llminfer") and n.module != m:
                out += [(m, a.name, n.module) for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__") and a.name != "_core"]
    return out


def test_no_module_imports_a_private_name_of_another():
    assert _private_imports() == []


def test_only_the_model_includes_its_context_in_c():
    """context.h is the forward pass's state, read by the forward pass's own
    files (the model, attention, the vision encoder, LoRA's deltas); the files
    below it (kernels, formats, the file reader, the fault watch, thread
    shares, repacking, the ops) use util.h to allocate and report."""
    includers = sorted(str(p.relative_to(CSRC)) for p in CSRC.rglob("*.[ch]")
                       if "cuda" not in p.parts and '#include "context.h"' in p.read_text())
    assert includers == ["attention.c", "context.c", "encoder.c", "lora.c", "model.c", "model_check.c"]
    util = (CSRC / "util.h").read_text()
    assert not re.search(r'#include "', util), "util.h sits below every other header"
    for p in (CSRC / "kernels").glob("*.[ch]"):
        names = re.findall(r'#include "([^"]+)"', p.read_text())
        above = [n for n in names if n in ("../context.h", "../matmul.h", "../backend.h", "../quantize.h")]
        assert not above, f"kernels/{p.name} includes {above}: the forward pass's floors, above the kernels"


OPENAI_SHAPES = PKG / "generation" / "openai_shapes.py"
# the object names of OpenAI's completion responses, as a dict literal writes them
_OBJECT_LITERAL = re.compile(r"""["'](chat\.completion\.chunk|chat\.completion|text_completion)["']""")


def _object_literals(path) -> list:
    """The OpenAI object names a module writes as string constants (its
    docstrings and comments aside)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return sorted(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and id(n) not in docs and _OBJECT_LITERAL.fullmatch(repr(n.value)))


def test_the_literal_finder_sees_an_object_name(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""A chat.completion dict."""\nx = {"object": "chat.completion.chunk"}\ny = "text_completion"\n')
    assert _object_literals(p) == ["chat.completion.chunk", "text_completion"]


def test_only_openai_shapes_names_openai_objects():
    """One OpenAI layer: every completion, chat completion and chunk is
    built by llminfer.generation.openai_shapes; no other module writes their object
    names (a second builder would drift from the first)."""
    assert _object_literals(OPENAI_SHAPES), "openai_shapes builds the objects"
    others = {str(p.relative_to(ROOT)): found for p in PKG.rglob("*.py") if p != OPENAI_SHAPES
              for found in [_object_literals(p)] if found}
    assert others == {}


def test_every_subpackage_ships_in_the_wheel():
    """pyproject.toml names the packages the wheel carries: a folder of
    modules left out installs as a ModuleNotFoundError."""
    import pytest

    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    named = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")}
    assert folders <= named, f"not in pyproject.toml's packages: {sorted(folders - named)}"


def support_imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of each `from M import name` in a file where
    tests/support/M.py exists, and ("test_*", "", line) for an import of a
    test module."""
    support = {p.stem for p in (ROOT / "tests" / "support").glob("*.py")}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods = [(node.module, [a.name for a in node.names])]
        elif isinstance(node, ast.Import):
            mods = [(a.name, []) for a in node.names]
        else:
            continue
        for mod, names in mods:
            if mod.startswith("test_"):
                found.append((mod, "", node.lineno))
            elif mod in support:
                found += [(mod, n, node.lineno) for n in names]
    return found


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_the_support_import_check_sees_a_test_module_and_a_missing_name(tmp_path):
    f = tmp_path / "b.py"
    f.write_text("from test_archs import run\nfrom archs import no_such_helper\n")
    found = support_imports(f)
    assert ("test_archs", "", 1) in found and ("archs", "no_such_helper", 2) in found
    assert "no_such_helper" not in defined_names(ROOT / "tests" / "support" / "archs.py")


def test_bench_scripts_import_only_helpers_that_exist():
    """bench/ takes what it shares with the tests from tests/support, never
    from a test module (tests move; bench/hybrid_peer.py, quant_types.py and
    tokenizer_parity.py broke so when the tests went into folders)."""
    bad = []
    for f in sorted((ROOT / "bench").glob("*.py")):
        for mod, name, line in support_imports(f):
            if mod.startswith("test_"):
                bad.append(f"{f.name}:{line} imports the test module {mod}")
            elif name != "*" and name not in defined_names(ROOT / "tests" / "support" / f"{mod}.py"):
                bad.append(f"{f.name}:{line} imports {name} from tests/support/{mod}.py, which has none")
    assert not bad, "\n".join(bad)
