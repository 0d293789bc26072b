"""The GGUF reader: metadata and tensors as gguf's own reader sees them, and
clear GGUFError / UnsupportedModelError for files that are not valid models."""

import os
import struct
import subprocess
import sys

import gguf
import numpy as np
import re

import pytest

from llminfer.errors import GGUFError, InvalidArgumentError, ModelNotFoundError, UnsupportedModelError
from llminfer.core.gguf_file import GGUFFile
from llminfer.models import build_spec

from tiny_models import TinyConfig, write_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("g") / "tiny.gguf", TinyConfig(qtype="Q4_K"))


def test_metadata_and_tensors_match_gguf_reader(model_path):
    ours = GGUFFile(model_path)
    ref = gguf.GGUFReader(model_path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        if isinstance(got, np.ndarray):
            got = got.tolist()
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.qtype == int(t.tensor_type)
        assert info.shape == tuple(int(v) for v in reversed(t.shape.tolist()))
        assert np.array_equal(ours.tensor_bytes(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_real_models_open_quickly_and_fully(smollm2_path):
    f = GGUFFile(smollm2_path)
    assert f.architecture == "llama"
    assert len(f.metadata["tokenizer.ggml.tokens"]) == f.tensors["token_embd.weight"].shape[0]


def corrupt(tmp_path, data, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_not_a_gguf_file(tmp_path):
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(corrupt(tmp_path, b"PK\x03\x04" + b"\0" * 64))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(corrupt(tmp_path, b"GGUF"))
    with pytest.raises(ModelNotFoundError):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile(tmp_path)


def test_unsupported_version(tmp_path):
    data = b"GGUF" + struct.pack("<IQQ", 7, 0, 0)
    with pytest.raises(GGUFError, match="version 7"):
        GGUFFile(corrupt(tmp_path, data))


@pytest.mark.parametrize("keep", [0.001, 0.01, 0.3, 0.9, 0.999])
def test_truncated_file(model_path, tmp_path, keep):
    data = open(model_path, "rb").read()
    cut = max(24, int(len(data) * keep))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(corrupt(tmp_path, data[:cut]))


def test_absurd_counts_and_lengths(tmp_path):
    huge = b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1)
    with pytest.raises(GGUFError, match="corrupt header"):
        GGUFFile(corrupt(tmp_path, huge + b"\0" * 64))
    # a key whose length runs past the end
    bad_key = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 50) + b"abc"
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        GGUFFile(corrupt(tmp_path, bad_key + b"\0" * 16))
    # an unknown value type
    key = b"k"
    odd = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 99)
    with pytest.raises(GGUFError, match="unknown value type 99"):
        GGUFFile(corrupt(tmp_path, odd + b"\0" * 16))


def test_invalid_utf8_key(tmp_path):
    key = b"\xff\xfe"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    data += struct.pack("<I", 4) + struct.pack("<I", 1)
    with pytest.raises(GGUFError, match="not valid UTF-8"):
        GGUFFile(corrupt(tmp_path, data + b"\0" * 16))


def write_custom(path, arch=None, drop=None, shape_override=None, qtype=None):
    """A tiny model with one tensor missing, misshapen or of an odd type."""
    def hook(name, data, t):
        if name == drop:
            return None
        if name == shape_override:
            return np.zeros((3, 5), dtype=np.float32), gguf.GGMLQuantizationType.F32
        if name == qtype:
            # a type llminfer cannot compute with (NVFP4), of the right byte size
            rows = data.shape[0]
            k = data.shape[1] // gguf.GGML_QUANT_SIZES[t][1] * gguf.GGML_QUANT_SIZES[t][0]
            return (np.zeros((rows, k // 64 * 36), dtype=np.uint8),
                    gguf.GGMLQuantizationType.NVFP4)
        return data, t

    return write_model(path, TinyConfig(qtype="Q4_K"), declared_arch=arch, tensor_hook=hook)


def test_unsupported_architecture_lists_supported(tmp_path):
    p = write_custom(tmp_path / "m.gguf", arch="mamba")
    from llminfer.models import ARCHITECTURES

    listed = ", ".join(sorted(ARCHITECTURES))
    assert {"gemma3", "llama", "qwen2", "qwen3"} <= set(ARCHITECTURES)
    with pytest.raises(UnsupportedModelError, match=r"'mamba' is not supported; supported: " + re.escape(listed)):
        build_spec(GGUFFile(p))


def test_missing_tensor(tmp_path):
    p = write_custom(tmp_path / "m.gguf", drop="blk.1.ffn_up.weight")
    with pytest.raises(UnsupportedModelError, match=r"'blk.1.ffn_up.weight' is missing"):
        build_spec(GGUFFile(p))


def test_inconsistent_shape(tmp_path):
    p = write_custom(tmp_path / "m.gguf", shape_override="blk.0.attn_q.weight")
    with pytest.raises(UnsupportedModelError, match=r"'blk.0.attn_q.weight' has shape \(3, 5\)"):
        build_spec(GGUFFile(p))


def test_unsupported_tensor_type(tmp_path):
    p = write_custom(tmp_path / "m.gguf", qtype="blk.0.ffn_gate.weight")
    with pytest.raises(UnsupportedModelError, match=r"NVFP4, which llminfer cannot compute with"):
        build_spec(GGUFFile(p))


# ---- what ggml's reader refuses, refused here with the key or tensor named ----

from gguf import GGMLQuantizationType, GGUFValueType  # noqa: E402

from gguf_bytes import Tensor, gguf_bytes, kv, tiny_llama  # noqa: E402

F32 = GGMLQuantizationType.F32
VEC = np.arange(8, dtype=np.float32).tobytes()


def test_duplicate_metadata_key(tmp_path):
    data = gguf_bytes([kv("general.architecture", "llama"), kv("llama.block_count", 2),
                       kv("llama.block_count", 30)])
    with pytest.raises(GGUFError, match=r"metadata key 'llama.block_count' appears twice \(again at offset \d+\)"):
        GGUFFile(corrupt(tmp_path, data))


def test_duplicate_tensor_name(tmp_path):
    data = gguf_bytes([kv("a", 1)], [Tensor("w", (8,), F32, VEC), Tensor("w", (8,), F32, VEC)])
    with pytest.raises(GGUFError, match=r"tensor 'w' appears twice"):
        GGUFFile(corrupt(tmp_path, data))


@pytest.mark.parametrize("offset, why", [(0, "overlaps the first"), (64, "leaves a gap"), (8, "misaligned")])
def test_tensor_offsets_must_follow_in_order(tmp_path, offset, why):
    data = gguf_bytes([kv("a", 1)], [Tensor("first", (8,), F32, VEC), Tensor("second", (8,), F32, VEC, offset)])
    with pytest.raises(GGUFError, match=rf"tensor 'second' has data offset {offset}, expected 32"):
        GGUFFile(corrupt(tmp_path, data))
    # laid out as ggml expects, the same tensors load
    ok = GGUFFile(corrupt(tmp_path, gguf_bytes([kv("a", 1)], [Tensor("first", (8,), F32, VEC),
                                                             Tensor("second", (8,), F32, VEC)]), "ok.gguf"))
    assert ok.tensors["second"].offset - ok.tensors["first"].offset == 32


@pytest.mark.parametrize("alignment", [0, 1, 2, 4, 12, 48])
def test_alignment_must_be_a_power_of_two_of_at_least_8(tmp_path, alignment):
    data = gguf_bytes([kv("general.alignment", alignment)], [Tensor("w", (8,), F32, VEC)], alignment=max(alignment, 1))
    with pytest.raises(GGUFError, match=rf"general.alignment {alignment} is not a power of two of at least 8"):
        GGUFFile(corrupt(tmp_path, data))


def test_alignment_of_the_wrong_type(tmp_path):
    for value, vtype in (("32", GGUFValueType.STRING), (32.0, GGUFValueType.FLOAT32), ([32], GGUFValueType.ARRAY)):
        data = gguf_bytes([kv("general.alignment", value, vtype)], [Tensor("w", (8,), F32, VEC)])
        with pytest.raises(GGUFError, match="general.alignment must be an integer"):
            GGUFFile(corrupt(tmp_path, data))


def test_larger_alignment_is_honoured(tmp_path):
    data = gguf_bytes([kv("general.alignment", 64)], [Tensor("a", (8,), F32, VEC), Tensor("b", (8,), F32, VEC)],
                      alignment=64)
    f = GGUFFile(corrupt(tmp_path, data))
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert f.tensors["b"].offset - f.tensors["a"].offset == 64
    assert np.array_equal(f.tensor_bytes("b").view(np.float32), np.arange(8))


@pytest.mark.parametrize("qtype", [4, 5, 99, 2**31 + 5, 2**32 - 1])
def test_unknown_tensor_type(tmp_path, qtype):
    data = gguf_bytes([kv("a", 1)], [Tensor("w", (8,), F32, VEC)])
    info = struct.pack("<IQI", 1, 8, F32)
    assert data.count(info) == 1
    data = data.replace(info, struct.pack("<IQI", 1, 8, qtype))
    with pytest.raises(GGUFError, match=rf"tensor 'w' has unknown type {qtype}"):
        GGUFFile(corrupt(tmp_path, data))


def test_element_count_past_int64(tmp_path):
    big = Tensor("w", (1 << 40, 1 << 40), F32, b"")
    with pytest.raises(GGUFError, match=r"tensor 'w' has \d+ elements .* int64"):
        GGUFFile(corrupt(tmp_path, gguf_bytes([kv("a", 1)], [big])))


def test_nested_arrays_are_refused(tmp_path):
    nested = kv("deep", [[1, 2], [3]], GGUFValueType.ARRAY, etype=GGUFValueType.ARRAY)
    with pytest.raises(GGUFError, match=r"array 'deep' at offset \d+ holds arrays"):
        GGUFFile(corrupt(tmp_path, gguf_bytes([nested])))


def test_tensor_name_too_long(tmp_path):
    data = gguf_bytes([kv("a", 1)], [Tensor("x" * 64, (8,), F32, VEC)])
    with pytest.raises(GGUFError, match="has a name of 64 bytes"):
        GGUFFile(corrupt(tmp_path, data))


# ---- a file that changes on disk while loaded ----

def test_check_unchanged_sees_truncation(tmp_path):
    p = corrupt(tmp_path, tiny_llama())
    f = GGUFFile(p)
    f.check_unchanged()  # untouched: fine
    with open(p, "r+b") as fh:
        fh.truncate(f.data_offset)
    with pytest.raises(GGUFError, match="changed on disk while loaded"):
        f.check_unchanged()
    f.close()


def test_check_unchanged_sees_a_rewrite_of_the_same_size(tmp_path):
    """The stamp is the size and the modification time: a file rewritten in
    place at its old size is a change too. The stamp is os.fstat's."""
    from llminfer import _core
    p = corrupt(tmp_path, tiny_llama())
    f = GGUFFile(p)
    st = os.fstat(f.descriptor())
    assert _core.file_stamp(f.descriptor()) == (st.st_size, st.st_mtime_ns)
    assert _core.file_stamp_is(f.descriptor(), st.st_size, st.st_mtime_ns)
    assert not _core.file_stamp_is(f.descriptor(), st.st_size, st.st_mtime_ns + 1)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    with pytest.raises(GGUFError, match="changed on disk while loaded"):
        f.check_unchanged()
    f.close()
    fd = os.open(p, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError, match="stamp"):
        _core.file_stamp(fd)


def test_check_unchanged_ignores_a_file_renamed_over(tmp_path):
    p = corrupt(tmp_path, tiny_llama())
    f = GGUFFile(p)
    corrupt(tmp_path, b"new contents", "other")
    (tmp_path / "other").replace(p)  # the mapped inode lives on
    f.check_unchanged()
    assert f.tensor_bytes("output_norm.weight").view(np.float32).size == 32
    f.close()


def test_private_copy_survives_truncation(tmp_path):
    """mmap=False reads the file into memory: truncating it afterwards cannot
    kill the process (a mapped file would die with SIGBUS on the next read,
    hence a child process)."""
    import subprocess
    import sys
    p = corrupt(tmp_path, tiny_llama())
    code = (
        "import sys, numpy as np\n"
        "from llminfer.core.gguf_file import GGUFFile\n"
        "f = GGUFFile(sys.argv[1], mmap=False)\n"
        "before = f.tensor_bytes('blk.0.ffn_down.weight').sum()\n"
        "open(sys.argv[1], 'r+b').truncate(100)\n"
        "f.check_unchanged()\n"
        "assert f.tensor_bytes('blk.0.ffn_down.weight').sum() == before\n"
        "print('ok')\n")
    # from tmp_path: run from the checkout, "-c" would import the uncompiled sources
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert p.stat().st_size == 100


def test_private_copy_equals_the_map(model_path):
    with GGUFFile(model_path) as a, GGUFFile(model_path, mmap=False) as b:
        assert a.metadata.keys() == b.metadata.keys()
        for name in a.tensors:
            assert np.array_equal(a.tensor_bytes(name), b.tensor_bytes(name))
    with pytest.raises(InvalidArgumentError):
        GGUFFile(model_path, mmap="no")


def test_no_descriptor_left_open(model_path):
    """The reader holds a descriptor for check_unchanged(); close() and a
    dropped object both give it back."""
    import gc
    import os
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc/self/fd")
    gc.collect()  # what earlier tests dropped gives its descriptors back first
    before = fds()
    for _ in range(20):
        GGUFFile(model_path).close()
        GGUFFile(model_path).metadata  # dropped without close()
        GGUFFile(model_path, mmap=False)
    gc.collect()
    assert fds() == before


def test_constants_match_the_gguf_package():
    """llminfer.core.ggml restates ggml's enums so a load does not import gguf; they
    must be the numbers the gguf package (the writer of every test file) uses."""
    from llminfer.core import ggml

    assert {t.name: int(t) for t in ggml.GGMLQuantizationType} == {t.name: int(t) for t in gguf.GGMLQuantizationType}
    for t in gguf.GGMLQuantizationType:
        assert ggml.GGML_QUANT_SIZES[ggml.GGMLQuantizationType[t.name]] == tuple(gguf.GGML_QUANT_SIZES[t]), t.name
    assert {v.name: int(v) for v in ggml.GGUFValueType} == {v.name: int(v) for v in gguf.GGUFValueType}
    assert {v.name: int(v) for v in ggml.LlamaFileType} == {v.name: int(v) for v in gguf.LlamaFileType}
    assert {v.name: int(v) for v in ggml.TokenType} == {v.name: int(v) for v in gguf.TokenType}
    for name, key in vars(ggml.Keys.Tokenizer).items():
        if not name.startswith("_"):
            assert getattr(gguf.Keys.Tokenizer, name) == key, name


def test_loading_a_model_does_not_import_gguf(model_path):
    """A fresh process that loads a model and generates keeps gguf (and the
    yaml it imports) out of memory."""
    path = model_path
    code = ("import sys, llminfer; llm = llminfer.LLM(sys.argv[1], n_ctx=64); llm.generate('hi', max_tokens=2); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gguf', 'yaml')))")
    # run outside the checkout, so the installed package is imported, not the source folder
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(str(path)))
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_llminfer_bench_does_not_import_gguf(model_path):
    """`llminfer bench`, whose peak memory is one of its figures, keeps gguf,
    yaml and sentencepiece out of memory: the CLI's parser (quantize's
    presets) and the bench's file type names come from llminfer.core.ggml."""
    code = ("import sys; from llminfer import cli; "
            "cli.main(['bench', '-m', sys.argv[1], '-p', '8', '-n', '2', '-r', '1', '-t', '1']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gguf', 'yaml', 'sentencepiece')))")
    out = subprocess.run([sys.executable, "-c", code, str(model_path)], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(str(model_path)))
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_string_arrays_read_like_lists(tmp_path):
    """A metadata array of strings is a StringArray: its bytes and offsets, read
    like the list it replaces (index, negative index, slice, iteration, ==),
    empty items and invalid UTF-8 (U+FFFD, raw() keeps the bytes) included."""
    from llminfer.core.gguf_file import StringArray

    items = ["a", "", "héllo", "<0x0A>", "x" * 300, "\u2581the"]
    path = tmp_path / "s.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("t.words", items, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    w.add_key_value("t.bad", [b"ok", b"\xff\xfe", b"\xe2\x96"], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with GGUFFile(path) as g:
        words, bad = g.metadata["t.words"], g.metadata["t.bad"]
    assert isinstance(words, StringArray) and len(words) == len(items)
    assert list(words) == items and words == items and words != items[:-1]
    assert [words[i] for i in range(-len(items), len(items))] == items + items
    assert words[1:4] == items[1:4] and words[::-2] == items[::-2] and words[4:2] == [] and words[-2:] == items[-2:]
    assert words.raw(2) == "héllo".encode() and words.lengths().tolist() == [len(s.encode()) for s in items]
    assert "héllo" in words and words.index("<0x0A>") == 3
    with pytest.raises(IndexError):
        words[len(items)]
    assert list(bad) == ["ok", "\ufffd\ufffd", "\ufffd"] and bad.raw(1) == b"\xff\xfe"
    assert StringArray.of(items) == words and StringArray.of([]) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_header_pages_handed_back(tmp_path):
    """The parse copies the header out (a vocabulary is megabytes), so its
    mapped pages are handed back: they do not stay in the process's RSS."""
    path = tmp_path / "big_header.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("t.words", [f"piece-{i:06d}-" + "x" * 40 for i in range(60000)],
                    gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    w.add_tensor("t", np.zeros(4096, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    def resident_kib():
        total, mine = 0, False
        for line in open("/proc/self/smaps"):
            parts = line.split()
            if "-" in parts[0] and ":" not in parts[0]:
                mine = line.rstrip().endswith(str(path))
            elif mine and parts[0] == "Rss:":
                total += int(parts[1])
        return total

    with GGUFFile(path) as g:
        assert g.data_offset > 3 << 20
        assert len(g.metadata["t.words"]) == 60000 and g.metadata["t.words"][59999].startswith("piece-059999-")
        assert resident_kib() < 256
        assert np.array_equal(g.tensor_bytes("t"), np.zeros(4096 * 4, dtype=np.uint8))


def test_string_blob_helpers_refuse_offsets_outside_the_blob():
    """_core.decode_strings and hash_strings check the offsets they are given
    before reading: past the blob, or going backwards, is an error naming the
    function, not a read out of bounds."""
    from llminfer import _core

    blob = b"abcdef"
    for fn in (_core.decode_strings, _core.hash_strings):
        name = fn.__name__
        with pytest.raises(InvalidArgumentError, match=f"{name}: offsets past the blob"):
            fn(blob, np.array([0, 3, 7], dtype=np.int64))
        with pytest.raises(InvalidArgumentError, match=f"{name}: offsets past the blob"):
            fn(blob, np.array([-1, 3], dtype=np.int64))
        with pytest.raises(InvalidArgumentError, match=f"{name}: offsets go backwards"):
            fn(blob, np.array([0, 4, 2, 6], dtype=np.int64))
        assert len(fn(blob, np.array([0, 2, 6], dtype=np.int64))) == 2
        assert len(fn(blob, np.zeros(0, dtype=np.int64))) == 0


# ---- a mapped file truncated during a pass (csrc/fault.c) ----

# The truncation lands after the pass's check_unchanged(), while the pass
# runs: the test switches the check off to make that window certain. Run in
# a child, so that a regression (SIGBUS, returncode -7) fails the test
# instead of killing pytest.
_TRUNCATED_CHILD = r"""
import os, shutil, sys
from llminfer import LLM
from llminfer.errors import GGUFError
src, copy, mode = sys.argv[1:4]
shutil.copy(src, copy)

def truncate_under(engine):
    engine.gguf.check_unchanged = lambda: None  # as if the file shrank after the check
    os.truncate(copy, os.path.getsize(copy) // 2)  # the tensors' pages past the middle vanish

if mode == "llm":
    llm = LLM(copy, n_ctx=64, n_threads=2)
    truncate_under(llm.engine)
    for attempt in range(2):  # the pass that faulted, then every later one
        try:
            llm.generate("hello there", max_tokens=4) if attempt == 0 else llm.eval([1, 2, 3])
        except GGUFError as e:
            assert copy in str(e) and "truncated" in str(e), e
        else:
            raise SystemExit(f"attempt {attempt}: no GGUFError")
    other = LLM(src, n_ctx=64, n_threads=2)  # an intact model still loads and runs
    assert len(other.eval([1, 2, 3])) == 3
    print("ok")
else:
    from starlette.testclient import TestClient
    from llminfer.server import ServeArgs, create_app
    app = create_app(ServeArgs(model=copy, n_ctx=128, n_threads=1, max_batch_tokens=64))
    with TestClient(app) as client:
        truncate_under(app.state.server.engine)
        for attempt in range(2):
            r = client.post("/v1/completions", json={"prompt": "hello there", "max_tokens": 4})
            assert 400 <= r.status_code < 600, (r.status_code, r.text)
            assert "truncated" in r.json()["error"]["message"], r.text
        assert client.get("/health").status_code in (200, 503)
    print("ok")
"""


@pytest.mark.parametrize("mode", ["llm", "server"])
def test_truncation_during_a_pass_is_an_error_not_sigbus(tmp_path, mode):
    if mode == "server":
        pytest.importorskip("starlette")
        pytest.importorskip("httpx")
    src = write_model(tmp_path / "tiny.gguf", TinyConfig())
    copy = tmp_path / "copy.gguf"
    out = subprocess.run([sys.executable, "-c", _TRUNCATED_CHILD, src, str(copy), mode], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (out.returncode, out.stderr[-3000:])


def test_a_watch_ends_with_its_map(tmp_path):
    from llminfer import _core
    p = write_model(tmp_path / "tiny.gguf", TinyConfig(n_layer=1))
    f = GGUFFile(p)
    token = f.fault_token
    assert token >= 0 and not _core.fault_hit(token)
    view = f.tensor_bytes("output_norm.weight")
    f.close()  # a view outlives close(): the map, and its watch, stay
    assert f.fault_token >= 0
    kept = f.fault_token
    del view
    import gc
    gc.collect()
    assert not _core.fault_hit(kept)
    assert GGUFFile(p, mmap=False).fault_token == -1


# ---- non-finite block scales (csrc/finite.c) ----

# where a block's f16 d lies, per type (blocks.h; gguf's quants.py)
_SCALE_AT = {"Q4_0": 0, "Q8_0": 0, "Q4_1": 2, "Q5_0": 0, "Q4_K": 0, "Q5_K": 2, "Q6_K": 208, "Q2_K": 82,
             "Q3_K": 108, "IQ4_XS": 0, "IQ4_NL": 0, "TQ2_0": 64}


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16", "BF16",
                                   "F32"])
@pytest.mark.parametrize("bad", [0x7E00, 0x7C00, 0xFC00])  # NaN, +inf, -inf (f16)
def test_a_nonfinite_block_scale_is_refused_at_load(tmp_path, qtype, bad):
    """One block of blk.0.attn_q with a NaN or infinite scale ran with finite,
    wrong logits: the activation quantizers drop a NaN. The load refuses it,
    naming the tensor and the block."""
    from llminfer import LLM
    t = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[t]
    which = 3  # a block of row 0 (a K-quant's row has one)

    def hook(name, data, qt):
        if name != "blk.0.attn_q.weight":
            return data, qt
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1).copy()
        if qtype == "F32":
            raw.view(np.uint32)[which] = {0x7E00: 0x7FC00000, 0x7C00: 0x7F800000, 0xFC00: 0xFF800000}[bad]
        elif qtype == "BF16":
            raw.view(np.uint16)[which] = {0x7E00: 0x7FC0, 0x7C00: 0x7F80, 0xFC00: 0xFF80}[bad]
        elif qtype == "F16":
            raw.view(np.uint16)[which] = bad
        else:
            at = (which if block == 32 else 0) * size + _SCALE_AT[qtype]
            raw[at:at + 2] = np.array([bad], np.uint16).view(np.uint8)
        return raw.view(data.dtype).reshape(data.shape), qt

    p = write_model(tmp_path / "bad.gguf", TinyConfig(qtype=qtype), tensor_hook=hook)
    unit = which if (block == 1 or block == 32) else 0
    for mmap in (True, False):
        with pytest.raises(GGUFError, match=rf"'blk\.0\.attn_q\.weight' \({qtype}\).* {unit} \(row 0\)"):
            LLM(p, n_ctx=64, mmap=mmap)
    good = write_model(tmp_path / "good.gguf", TinyConfig(qtype=qtype))
    LLM(good, n_ctx=64).eval([1, 2])  # the intact file loads and runs


def test_first_nonfinite_scans_every_scale_layout():
    """Each type's d (and dmin or m) is where gguf's numpy code reads it: a
    NaN put there makes gguf dequantize that block to NaN, and the C scan
    names that block; a NaN in the quantized values' bytes is not a scale."""
    from llminfer import _core
    for name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                 "IQ4_XS", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"]:
        t = gguf.GGMLQuantizationType[name]
        block, size = gguf.GGML_QUANT_SIZES[t]
        clean = np.zeros(4 * size, np.uint8)  # zero scales: every block finite
        assert _core.first_nonfinite(int(t), clean) == -1, name
        found = 0
        for at in range(size - 1):  # every byte pair of block 2 set to an f16 NaN
            raw = clean.copy()
            raw[2 * size + at:2 * size + at + 2] = np.array([0x7E00], np.uint16).view(np.uint8)
            nonfinite = not np.isfinite(gguf.quants.dequantize(raw.reshape(4, size), t)).all()
            got = _core.first_nonfinite(int(t), raw)
            assert got == (2 if nonfinite else -1), (name, at, got)
            found += got == 2
        assert found >= 1, name
    # IQ1_M's d lies in the top nibbles of its four scale words; MXFP4's
    # exponent 0xFF is E8M0's NaN (gguf reads it as 2^127)
    iq1_m = gguf.GGMLQuantizationType.IQ1_M
    size = gguf.GGML_QUANT_SIZES[iq1_m][1]
    raw = np.zeros(4 * size, np.uint8)
    raw[3 * size - 8:3 * size].view(np.uint16)[:] = 0xF000 | 0x0111  # d = 0xFFFF, sub-scales 1
    assert not np.isfinite(gguf.quants.dequantize(raw.reshape(4, size), iq1_m)).all()
    assert _core.first_nonfinite(int(iq1_m), raw) == 2
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    size = gguf.GGML_QUANT_SIZES[mxfp4][1]
    raw = np.zeros(4 * size, np.uint8)
    raw[size] = 0xFE
    assert _core.first_nonfinite(int(mxfp4), raw) == -1
    raw[2 * size] = 0xFF
    assert _core.first_nonfinite(int(mxfp4), raw) == 2
    assert _core.first_nonfinite(28, np.zeros(8, np.uint8)) is None  # a type with no layout (I64)


_FOREIGN_SIGBUS_CHILD = r"""
import mmap, os, signal, sys
from llminfer import LLM
model, other, how = sys.argv[1:4]
llm = LLM(model, n_ctx=64)  # its mapping watched: the handler is installed
if how == "kill":
    os.kill(os.getpid(), signal.SIGBUS)
else:  # a mapping that is not a model's, truncated under it
    with open(other, "wb") as f:
        f.write(b"x" * (1 << 16))
    f = open(other, "r+b")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate(other, 0)
    print(m[1 << 15])
print("survived")
"""


@pytest.mark.parametrize("how", ["fault", "kill"])
def test_a_sigbus_outside_the_models_still_kills(tmp_path, how):
    """The handler catches only faults in a watched model mapping: any other
    SIGBUS (a fault elsewhere, a signal sent) ends the process as before."""
    src = write_model(tmp_path / "tiny.gguf", TinyConfig(n_layer=1))
    out = subprocess.run([sys.executable, "-c", _FOREIGN_SIGBUS_CHILD, src, str(tmp_path / "other"), how],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == -7 and "survived" not in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])
