"""llminfer/_clib.pxd mirrors csrc/llminfer.h, by hand but for the model
description's structs (generated into _desc_types.pxi): this checks that the
two cannot drift. Every function of the header is declared in the .pxd with
the same number of parameters, every struct has the same fields in the same
order, and the status codes map to llminfer.errors."""

import re
from pathlib import Path

import pytest

from llminfer import errors

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "csrc" / "llminfer.h"
PXD = ROOT / "llminfer" / "_clib.pxd"

pytestmark = pytest.mark.skipif(not HEADER.exists() or not PXD.exists(),
                                reason="run from a source checkout (the header is not installed)")


def _strip_c_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _params(arglist):
    arglist = arglist.strip()
    if arglist in ("", "void"):
        return 0
    return arglist.count(",") + 1


def header_functions():
    text = _strip_c_comments(HEADER.read_text())
    out = {}
    for m in re.finditer(r"^[A-Za-z_][\w \*]*?\b(li_\w+)\s*\(([^;{]*?)\)\s*;", text, flags=re.M | re.S):
        out[m.group(1)] = _params(m.group(2))
    return out


def pxd_functions():
    text = PXD.read_text()
    text = re.sub(r"#.*", "", text)
    out = {}
    for m in re.finditer(r"^\s+[A-Za-z_][\w \*]*?\b(li_\w+)\s*\(([^)]*)\)", text, flags=re.M | re.S):
        out[m.group(1)] = _params(m.group(2))
    return out


def _field_names(decl):
    """The names a declaration declares: "const float *a, b[2]" -> ["a", "b"]."""
    return [re.sub(r"\[.*?\]", "", n).strip(" *").split()[-1].lstrip("*") for n in decl.split(",")]


def header_structs():
    text = _strip_c_comments(HEADER.read_text())
    out = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = decl.strip()
            if not decl:
                continue
            fields += _field_names(decl)
        out[m.group(1)] = fields
    return out


def pxd_structs():
    """the structs the .pxd declares, with those of the generated file it includes"""
    text = re.sub(r"#.*", "", PXD.read_text() + "\n" + (PXD.parent / "_desc_types.pxi").read_text())
    out = {}
    for m in re.finditer(r"ctypedef struct (\w+):\n((?:\s{8,}.*\n)+)", text):
        fields = []
        for line in m.group(2).splitlines():
            line = line.strip()
            if not line or line == "pass":
                continue
            fields += _field_names(line)
        out[m.group(1)] = fields
    return out


def test_every_function_is_declared_alike():
    h, p = header_functions(), pxd_functions()
    assert len(h) > 30, "the header parser found too few functions"
    assert set(h) == set(p), f"only in the header: {set(h) - set(p)}; only in the .pxd: {set(p) - set(h)}"
    for name in h:
        assert h[name] == p[name], f"{name}: {h[name]} parameters in the header, {p[name]} in the .pxd"


def test_every_struct_has_the_same_fields():
    h, p = header_structs(), pxd_structs()
    for name in ("li_matrix", "li_layer_desc", "li_model_desc", "li_kv_config", "li_seq_view", "li_batch"):
        assert name in h and name in p, name
        assert h[name] == p[name], f"{name}: header {h[name]} vs .pxd {p[name]}"


def test_status_codes_map_to_error_classes():
    text = HEADER.read_text()
    codes = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (LI_E_\w+) \((-\d+)\)", text)}
    assert len(codes) >= 8
    for name, value in codes.items():
        assert value in errors._BY_STATUS, f"{name} ({value}) has no exception class"
        assert name in PXD.read_text(), f"{name} is not declared in the .pxd"


def test_the_description_fillers_are_generated_from_the_header():
    """llminfer/_desc.pxi (ModelDesc's field-by-field fill) is what
    tools/gen_desc.py writes from the header now: a field added to
    li_model_desc or li_layer_desc reaches the Python layer by its name."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_desc.py"), "--check"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_every_spec_has_every_field_the_header_reads(tmp_path):
    """The C names are the spec's attribute names: each architecture's spec
    (a tiny model of each kind of layer) has them all."""
    import ast

    from llminfer.core.gguf_file import GGUFFile
    from llminfer.models import build_spec
    from tiny_models import TinyConfig, write_model

    fields = {}
    for line in (ROOT / "llminfer" / "_desc.pxi").read_text().splitlines():
        if "_FIELDS = " in line:
            name, value = line.split(" = ", 1)
            fields[name] = ast.literal_eval(value)
    assert fields["MODEL_FIELDS"] and fields["LAYER_FIELDS"]
    for arch in ("llama", "gemma3", "qwen3moe"):
        with GGUFFile(write_model(tmp_path / f"{arch}.gguf", TinyConfig(arch=arch))) as g:
            spec = build_spec(g, n_ctx=64)
        missing = {f for f in fields["MODEL_FIELDS"] if not hasattr(spec, f)}
        missing |= {f for L in spec.layers for f in fields["LAYER_FIELDS"] if not hasattr(L, f)}
        assert not missing, f"{arch}: the spec lacks {sorted(missing)}"
