"""llama.cpp beside us: its logits on a file (llama-cpp-python in its own
Python, through bench/peer_logits.py), the agreement check with its margin
and tolerance, and its llama-quantize."""

import subprocess

import gguf
from pathlib import Path
import numpy as np
import glob
import os
import shutil


SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "peer_logits.py"


MARGIN = 0.25       # top-1 must agree where llama.cpp's top logit leads its second by this much


TOL_RELATIVE = 2e-2  # max |ours - llama.cpp| over the largest |llama.cpp logit| (Q8_0 weights, 2 layers)


def peer_logits(peer_python, path, toks, tmp_path, n_ctx=512):
    ids, out = tmp_path / "ids.npy", tmp_path / "out.npy"
    np.save(ids, toks)
    r = subprocess.run([peer_python, str(SCRIPT), str(path), str(ids), str(out), "--n-ctx", str(n_ctx)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"llama.cpp failed on {path}: {r.stderr[-2000:]}"
    return np.load(out)


def check_against_peer(ours, peer, what, route_gap=None, route_tie=0.005):
    """ours within TOL_RELATIVE of llama.cpp's logits (relative to its largest),
    and the same top token wherever llama.cpp's leads by MARGIN. With
    route_gap (MoE: per token, the float64 reference's smallest expert
    margin) tokens routed on a near tie (within route_tie, archs.ROUTE_TIE)
    are left out: either engine's 8-bit activations may rightly pick the
    other expert there. They must be few."""
    if route_gap is not None:
        keep = route_gap > route_tie
        assert keep.mean() > 0.8, f"{what}: {np.sum(~keep)} of {keep.size} tokens routed on near ties"
        ours, peer = ours[keep], peer[keep]
    err = np.abs(ours - peer).max() / np.abs(peer).max()
    assert err < TOL_RELATIVE, f"{what}: max |ours - llama.cpp| is {err:.4f} of the largest logit"
    s = np.sort(peer, axis=-1)
    clear = s[:, -1] - s[:, -2] >= MARGIN
    assert np.array_equal(ours.argmax(-1)[clear], peer.argmax(-1)[clear]), what


def find_llama_quantize():
    exe = os.environ.get("LLAMA_QUANTIZE") or shutil.which("llama-quantize")
    if exe:
        return exe
    found = sorted(glob.glob("/work/peer/*/vendor/llama.cpp/build/bin/llama-quantize"))
    return found[0] if found else None


def write_imatrix(model_path, out_path, seed=0):
    """An importance matrix in llama.cpp's GGUF layout: per weight matrix, the
    sum of squared activations per input column (random, around 1) and the
    number of calls."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out_path), "imatrix")
    for t in gguf.GGUFReader(model_path).tensors:
        if len(t.shape) == 2:
            k = int(t.shape[0])
            w.add_tensor(t.name + ".in_sum2", (rng.uniform(0.5, 1.5, k) * 10).astype(np.float32))
            w.add_tensor(t.name + ".counts", np.array([10.0], np.float32))
    w.add_array("imatrix.datasets", ["random"])
    w.add_uint32("imatrix.chunk_count", 10)
    w.add_uint32("imatrix.chunk_size", 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out_path)
