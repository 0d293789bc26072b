"""Models from the Hugging Face Hub, through huggingface_hub (its cache,
resumed downloads, progress bars, tokens and HF_ENDPOINT).

    path = download("bartowski/SmolLM2-135M-Instruct-GGUF", "*Q4_K_M.gguf")
    llm = LLM.from_pretrained("bartowski/SmolLM2-135M-Instruct-GGUF", "*Q4_K_M.gguf")
    llm = LLM("hf://bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_K_M.gguf")

`filename` may be a glob ("*Q4_K_M.gguf"); it must then match one file, or
the parts of one split model. A model split by llama.cpp's gguf-split
(NAME-00001-of-00003.gguf ...) is fetched whole and joined into one GGUF
(metadata of the first part without the split.* keys, then every part's
tensors in order), kept beside the Hub's cache, since llminfer's loader maps
one file.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

from llminfer.hub.cache import cache_dir
from llminfer.errors import GGUFError, HubUnreachableError, InvalidArgumentError, LLMInferError, ModelNotFoundError

SPLIT = re.compile(r"^(?P<base>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_GLOB = set("*?[")
PROBE_TIMEOUT = 5.0  # seconds to connect to the Hub before calling it unreachable


def _unreachable(endpoint) -> str | None:
    """Why the Hub's endpoint cannot be reached (one TCP connection, with a
    short timeout), or None when it can. huggingface_hub itself retries a
    refused connection with backoff for half a minute before it fails."""
    url = urlsplit(endpoint)
    host = url.hostname
    port = url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return f"HF_ENDPOINT {endpoint!r} names no host"
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def _unreachable_error(repo_id, endpoint, why, cache_dir) -> HubUnreachableError:
    from huggingface_hub import constants

    where = cache_dir or constants.HF_HUB_CACHE
    return HubUnreachableError(
        f"cannot reach the Hugging Face Hub at {endpoint} ({why}) to fetch {repo_id}, and it is not in the "
        f"cache at {where}. Pass the path of a local .gguf file instead, or, with the file already "
        f"downloaded into that cache, set HF_HUB_OFFLINE=1 and give its exact file name (not a glob).")


def _cached(hub, repo_id, names, revision, cache_dir):
    """The local paths of names in the Hub's cache, or None if any is missing."""
    paths = []
    for n in names:
        p = hub.try_to_load_from_cache(repo_id, n, cache_dir=cache_dir, revision=revision)
        if not isinstance(p, str):
            return None
        paths.append(Path(p))
    return paths


def _is_network_error(e) -> bool:
    """An error of the HTTP client under huggingface_hub (httpx, httpx2,
    httpcore, requests, urllib3): the network, not the request."""
    return any(c.__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests", "urllib3")
               for c in type(e).__mro__) or isinstance(e, (ConnectionError, TimeoutError, socket.gaierror))


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise LLMInferError("models from the Hugging Face Hub need the huggingface_hub package: "
                            "pip install 'llminfer[hf]'") from None
    return huggingface_hub


def parse_url(url: str):
    """hf://ORG/REPO[@REVISION]/PATH/IN/REPO -> (repo_id, path or None, revision or None)."""
    if not isinstance(url, str) or not url.startswith("hf://"):
        raise InvalidArgumentError(f"expected hf://ORG/REPO/FILE.gguf, got {url!r}")
    parts = url[len("hf://"):].strip("/").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise InvalidArgumentError(f"{url!r} names no repository: use hf://ORG/REPO/FILE.gguf")
    repo, revision = parts[1], None
    if "@" in repo:
        repo, revision = repo.split("@", 1)
    path = "/".join(parts[2:]) or None
    _check_names(url, [parts[0], repo] + parts[2:])
    return f"{parts[0]}/{repo}", path, revision


def _check_names(what, parts):
    """Refuse path components that would step out of a repository or the
    cache (`..`, `.`, empty, a backslash or NUL), before any network or file
    access: InvalidArgumentError naming what."""
    for p in parts:
        if p in ("", ".", "..") or "\\" in p or "\0" in p:
            raise InvalidArgumentError(f"{str(what)[:200]!r} has the path component {p!r}: a repository and a "
                                       f"file in it are named ORG/REPO/PATH without '.', '..' or empty parts")


def split_parts(name: str) -> list | None:
    """All part names of a split GGUF name, or None if it is not one."""
    m = SPLIT.match(name)
    if not m:
        return None
    n = int(m["count"])
    return [f"{m['base']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


def choose_files(repo_id: str, filename: str, files: list) -> list:
    """The repository files `filename` (a name or a glob) stands for: one
    file, or every part of one split model, in order."""
    if not any(c in filename for c in _GLOB):
        return split_parts(filename) or [filename]
    hits = [f for f in files if fnmatch.fnmatch(f, filename) or fnmatch.fnmatch(f.rsplit("/", 1)[-1], filename)]
    if not hits:
        ggufs = [f for f in files if f.endswith(".gguf")]
        raise ModelNotFoundError(f"no file of {repo_id} matches {filename!r}; its GGUF files: "
                                 f"{', '.join(ggufs) or 'none'}")
    wholes = {tuple(split_parts(f) or [f]) for f in hits}
    if len(wholes) > 1:
        raise InvalidArgumentError(f"{filename!r} matches several models in {repo_id}: "
                                   f"{', '.join(sorted(w[0] for w in wholes))}; give a narrower pattern")
    return list(wholes.pop())


def joined_dir() -> Path:
    return cache_dir() / "hf-joined"


def download(repo_id: str, filename: str, revision: str | None = None, cache_dir=None, local_dir=None,
             token=None, quiet: bool = False) -> Path:
    """Fetch a GGUF from a Hub repository (a glob picks the file); returns its
    local path, a split model joined into one file."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise InvalidArgumentError(f"repo_id must be 'ORG/NAME', got {repo_id!r}")
    if not isinstance(filename, str) or not filename:
        raise InvalidArgumentError(f"filename must be a file name or a glob such as '*Q4_K_M.gguf', got "
                                   f"{filename!r}")
    _check_names(f"{repo_id}/{filename}", repo_id.split("/") + filename.split("/"))
    hub = _hub()
    import huggingface_hub.constants as hf_constants
    import huggingface_hub.utils as hf_utils

    endpoint = hf_constants.ENDPOINT
    glob = any(c in filename for c in _GLOB)
    if not hf_constants.HF_HUB_OFFLINE:
        why = _unreachable(endpoint)
        if why is not None:
            cached = None if glob or local_dir else _cached(hub, repo_id, choose_files(repo_id, filename, []),
                                                           revision, cache_dir)
            if cached is None:
                raise _unreachable_error(repo_id, endpoint, why, cache_dir)
            return _joined(repo_id, choose_files(repo_id, filename, []), cached)
    files = []
    if glob:
        try:
            files = hub.list_repo_files(repo_id, revision=revision, token=token)
        except Exception as e:  # noqa: BLE001 - only the network's errors are turned into ours
            if _is_network_error(e):
                raise _unreachable_error(repo_id, endpoint, f"{type(e).__name__}: {e}", cache_dir) from None
            raise
    names = choose_files(repo_id, filename, files)
    if quiet:
        hf_utils.disable_progress_bars()
    try:
        paths = [Path(hub.hf_hub_download(repo_id, n, revision=revision, cache_dir=cache_dir,
                                          local_dir=local_dir, token=token)) for n in names]
    except hf_utils.LocalEntryNotFoundError as e:  # offline (HF_HUB_OFFLINE=1), not in the cache
        raise _unreachable_error(repo_id, endpoint, f"offline: {e}", cache_dir) from None
    except hf_utils.EntryNotFoundError as e:
        raise ModelNotFoundError(f"{repo_id} has no file {names[0]!r}: {e}") from None
    except hf_utils.RepositoryNotFoundError as e:
        raise ModelNotFoundError(f"no repository {repo_id} on {hf_constants.ENDPOINT}: {e}") from None
    except Exception as e:  # noqa: BLE001 - only the network's errors are turned into ours
        if _is_network_error(e):
            raise _unreachable_error(repo_id, endpoint, f"{type(e).__name__}: {e}", cache_dir) from None
        raise
    finally:
        if quiet:
            hf_utils.enable_progress_bars()
    return _joined(repo_id, names, paths)


def _joined(repo_id, names, paths) -> Path:
    """The one file of paths, or the split model they are, joined."""
    if len(paths) == 1:
        return paths[0]
    base = SPLIT.match(names[0])["base"].rsplit("/", 1)[-1]
    # the parts' resolved blobs name the content: a new revision gets a new join
    stamp = "-".join(p.resolve().name[:12] for p in paths)
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    target = joined_dir() / repo_id.replace("/", "--") / f"{base}-{digest}.gguf"
    if not target.exists():
        join_split(paths, target)
    return target


def join_split(paths, target: Path) -> Path:
    """Join the parts of a split GGUF into one file at target (written beside
    it, then renamed into place)."""
    try:
        import gguf
    except ImportError:  # a dependency of llminfer; only a broken install lacks it
        raise LLMInferError("joining split GGUF files needs the gguf package") from None
    if not hasattr(gguf.ReaderField, "contents"):
        raise LLMInferError("joining split GGUF files needs gguf >= 0.11: pip install -U gguf")
    readers = [gguf.GGUFReader(str(p)) for p in paths]
    for i, r in enumerate(readers):
        count = r.fields.get("split.count")
        no = r.fields.get("split.no")
        if count is None or no is None or int(count.contents()) != len(paths) or int(no.contents()) != i:
            raise GGUFError(f"{paths[i]} is not part {i + 1} of {len(paths)} of a split GGUF (its split.no / "
                            f"split.count say otherwise)")
    first = readers[0]
    arch = first.fields["general.architecture"].contents()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), arch)
    try:
        for name, f in first.fields.items():
            if name.startswith(("GGUF.", "split.")) or name in ("general.architecture", "general.alignment"):
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, f.contents(), vtype, sub_type=sub)
        for r in readers:
            for t in r.tensors:
                # the reader's array shape (bytes per row for a quantized
                # type), which the writer turns back into element counts
                w.add_tensor(t.name, t.data, raw_shape=t.data.shape,
                             raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def cached_models() -> list:
    """(label, path, bytes) of every GGUF in the Hub's cache and of the joined ones."""
    out = []
    try:
        hub = _hub()
        info = hub.scan_cache_dir()
    except (LLMInferError, Exception):  # no cache yet, or huggingface_hub missing
        info = None
    if info is not None:
        for repo in info.repos:
            for rev in repo.revisions:
                for f in rev.files:
                    if f.file_name.endswith(".gguf"):
                        out.append((f"hf://{repo.repo_id}/{f.file_path.relative_to(rev.snapshot_path)}",
                                    f.file_path, f.size_on_disk))
    root = joined_dir()
    if root.exists():
        for p in sorted(root.glob("*/*.gguf")):
            out.append((f"joined: {p.parent.name.replace('--', '/')}/{p.name}", p, p.stat().st_size))
    return out


def remove(url: str) -> list:
    """Delete hf://ORG/REPO (every cached revision) or hf://ORG/REPO/FILE from
    the Hub's cache; returns the paths removed."""
    hub = _hub()
    repo_id, path, _ = parse_url(url)
    try:
        info = hub.scan_cache_dir()
    except Exception as e:  # noqa: BLE001 (the cache's own errors: missing, corrupt)
        raise ModelNotFoundError(f"nothing cached for {repo_id}: {e}") from None
    repos = [r for r in info.repos if r.repo_id == repo_id]
    if not repos:
        raise ModelNotFoundError(f"nothing cached for {repo_id}")
    removed = []
    if path is None:
        hashes = [rev.commit_hash for r in repos for rev in r.revisions]
        info.delete_revisions(*hashes).execute()
        removed = [r.repo_path for r in repos]
    else:
        for r in repos:
            for rev in r.revisions:
                for f in rev.files:
                    if str(f.file_path.relative_to(rev.snapshot_path)) == path:
                        blob = f.blob_path
                        f.file_path.unlink()
                        if blob.exists():
                            blob.unlink()
                        removed.append(f.file_path)
        if not removed:
            raise ModelNotFoundError(f"{path} of {repo_id} is not in the cache")
    for p in joined_dir().glob(f"{repo_id.replace('/', '--')}/*.gguf") if path is None else ():
        p.unlink()
        removed.append(p)
    return removed
