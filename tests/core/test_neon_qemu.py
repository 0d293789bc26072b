"""The NEON kernels against the scalar ones, bit for bit, built for aarch64
and run under qemu-user by tests/c/run_neon_qemu.sh (both NEON levels, -O2
and -O3). Skipped where the cross compiler or qemu is missing (Debian:
apt-get install gcc-aarch64-linux-gnu qemu-user)."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "c" / "run_neon_qemu.sh"


def test_neon_kernels_give_the_scalar_bits_under_qemu():
    if not (ROOT / "csrc").is_dir():
        pytest.skip("needs the C sources of a checkout")
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    r = subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    if r.returncode == 0 and "SKIP" in r.stdout:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and "PASS" in r.stdout, (r.stdout[-4000:] + r.stderr[-4000:])
