"""llminfer/_clib.pxd mirrors csrc/llminfer.h by hand: this checks that the
two cannot drift. Every function of the header is declared in the .pxd with
the same number of parameters, every struct has the same fields in the same
order, and the status codes map to llminfer.errors."""

import re
from pathlib import Path

import pytest

from llminfer import errors

ROOT = Path(__file__).resolve().parent.parent
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
    text = re.sub(r"#.*", "", PXD.read_text())
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
