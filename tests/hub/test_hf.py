"""Models from the Hugging Face Hub (llminfer/hub/hf.py) through huggingface_hub,
against a small HTTP server on loopback that answers the way the Hub does:
HEAD/GET /{repo}/resolve/{revision}/{file} with X-Repo-Commit, ETag and
Content-Length (and Range for resumed downloads), and the tree listing
/api/models/{repo}/tree/{revision}. HF_ENDPOINT points the client at it; the
client runs in a subprocess, as it reads HF_ENDPOINT when imported."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from llminfer.errors import InvalidArgumentError, ModelNotFoundError
from llminfer.hub.hf import choose_files, parse_url, split_parts

from tiny_models import TinyConfig, write_model

pytest.importorskip("huggingface_hub")
gguf = pytest.importorskip("gguf")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "tiny-org/tiny-GGUF"


def write_split(src, dest_base, max_tensors):
    """src re-written by gguf's own writer as a split model (gguf-split's layout)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dest_base, arch, split_max_tensors=max_tensors)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        vtype = f.types[0]
        w.add_key_value(name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class FakeHub:
    def __init__(self, files):
        self.files = files  # path in repo -> bytes
        self.requests = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _resolve(self, body):
                parts = self.path.split("?")[0].strip("/").split("/")
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if parts[:2] == ["api", "models"]:
                    return self._api(parts)
                if len(parts) < 5 or parts[2] != "resolve" or "/".join(parts[:2]) != REPO:
                    return self._404("RepoNotFound")
                name = "/".join(parts[4:])
                if name not in hub.files:
                    return self._404("EntryNotFound")
                data = hub.files[name]
                start = 0
                rng = self.headers.get("Range")
                if rng and body:
                    start = int(rng.split("=")[1].split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if body:
                    self.wfile.write(data[start:])

            def _api(self, parts):
                if "/".join(parts[2:4]) != REPO or parts[4] != "tree":
                    return self._404("RepoNotFound")
                listing = [{"type": "file", "path": p, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                           for p, d in hub.files.items()]
                body = json.dumps(listing).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _404(self, code):
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):  # noqa: N802
                self._resolve(body=False)

            def do_GET(self):  # noqa: N802
                self._resolve(body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfrepo")
    whole = write_model(root / "tiny-Q8_0.gguf", TinyConfig(tie_output=False))
    write_split(whole, str(root / "tiny-split-Q8_0.gguf"), max_tensors=7)
    files = {"tiny-Q8_0.gguf": open(whole, "rb").read(), "README.md": b"# tiny\n"}
    parts = sorted(p for p in os.listdir(root) if p.startswith("tiny-split-Q8_0-"))
    assert len(parts) >= 2 and split_parts(parts[0]) == parts
    for p in parts:
        files[f"split/{p}"] = open(root / p, "rb").read()
    hub = FakeHub(files)
    yield hub, whole, parts
    hub.close()


def client(hub, tmp_path, code):
    """Run code in a fresh Python whose huggingface_hub talks to the fake hub,
    started outside the checkout so that it imports the installed package."""
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), LLMINFER_CACHE=str(tmp_path / "li"),
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="0", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                       cwd=tmp_path)
    return r


def test_from_pretrained_downloads_through_the_resolve_endpoint(repo, tmp_path):
    hub, whole, _ = repo
    r = client(hub, tmp_path, "from llminfer import LLM\n"
                              "m = LLM.from_pretrained('tiny-org/tiny-GGUF', '*Q8_0.gguf', n_ctx=32)\n"
                              "print(m.model_path)")
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip().splitlines()[-1]
    assert open(path, "rb").read() == open(whole, "rb").read()
    assert f"/{COMMIT}/" in path  # huggingface_hub's snapshot layout, from X-Repo-Commit
    kinds = {(m, p.split("?")[0]) for m, p, _ in hub.requests}
    assert ("HEAD", f"/{REPO}/resolve/main/tiny-Q8_0.gguf") in kinds
    assert ("GET", f"/api/models/{REPO}/tree/main") in kinds


def test_split_model_is_joined_and_runs_like_the_whole(repo, tmp_path):
    hub, whole, parts = repo
    r = client(hub, tmp_path, "from llminfer import Llama\n"
                              "m = Llama.from_pretrained('tiny-org/tiny-GGUF', 'split/*.gguf', n_ctx=32, verbose=False)\n"
                              "print(m.model_path)")
    assert r.returncode == 0, r.stderr
    joined = r.stdout.strip().splitlines()[-1]
    assert "hf-joined" in joined
    from llminfer import LLM

    a, b = LLM(whole, n_ctx=32, n_threads=1), LLM(joined, n_ctx=32, n_threads=1)
    ids = a.tokenize("the cat sat on the mat")
    np.testing.assert_array_equal(a.eval(ids), b.eval(ids))
    assert set(a.metadata) == set(b.metadata)  # the parts' split.* keys are gone
    for k, v in a.metadata.items():
        w = b.metadata[k]
        assert (np.array_equal(v, w) if hasattr(v, "__len__") and not isinstance(v, str) else v == w), k
    got = sorted(p.split("?")[0] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p)
    assert [g.rsplit("/", 1)[-1] for g in got if "split" in g] == parts


def test_a_part_of_a_split_model_is_refused_by_name(repo):
    from llminfer import LLM
    from llminfer.errors import UnsupportedModelError

    hub, _, parts = repo
    root = os.path.dirname(repo[1])
    with pytest.raises(UnsupportedModelError, match="part 1 of a model split into 3"):
        LLM(os.path.join(root, parts[0]), n_ctx=16)


def test_cli_pull_list_rm(repo, tmp_path):
    hub, whole, _ = repo
    r = client(hub, tmp_path, "import sys; from llminfer.cli.commands import main\n"
                              f"sys.exit(main(['pull', 'hf://{REPO}/tiny-Q8_0.gguf', '-q']))")
    assert r.returncode == 0, r.stderr
    r = client(hub, tmp_path, "import sys; from llminfer.cli.commands import main; sys.exit(main(['list']))")
    assert r.returncode == 0 and f"hf://{REPO}/tiny-Q8_0.gguf" in r.stdout, r.stderr
    r = client(hub, tmp_path, "import sys; from llminfer.cli.commands import main\n"
                              f"sys.exit(main(['rm', 'hf://{REPO}/tiny-Q8_0.gguf']))")
    assert r.returncode == 0 and "removed" in r.stdout, r.stderr
    r = client(hub, tmp_path, "import sys; from llminfer.cli.commands import main; sys.exit(main(['list']))")
    assert "tiny-Q8_0.gguf" not in r.stdout


def test_missing_file_and_repo_are_clear_errors(repo, tmp_path):
    hub, _, _ = repo
    r = client(hub, tmp_path, "from llminfer import LLM\nLLM.from_pretrained('tiny-org/tiny-GGUF', 'nope.gguf')")
    assert r.returncode != 0 and "ModelNotFoundError" in r.stderr and "nope.gguf" in r.stderr
    r = client(hub, tmp_path, "from llminfer import LLM\nLLM.from_pretrained('tiny-org/tiny-GGUF', '*Q2_K*')")
    assert "ModelNotFoundError" in r.stderr and "tiny-Q8_0.gguf" in r.stderr  # it lists what there is


def test_choose_files_and_urls():
    files = ["a-Q4_K_M.gguf", "a-Q8_0.gguf", "b/a-Q2_K-00001-of-00002.gguf", "b/a-Q2_K-00002-of-00002.gguf"]
    assert choose_files("r/r", "*Q8_0.gguf", files) == ["a-Q8_0.gguf"]
    assert choose_files("r/r", "*Q2_K*", files) == files[2:]
    assert choose_files("r/r", "b/a-Q2_K-00002-of-00002.gguf", []) == files[2:]
    with pytest.raises(InvalidArgumentError, match="several"):
        choose_files("r/r", "*.gguf", files)
    with pytest.raises(ModelNotFoundError):
        choose_files("r/r", "*Q3*", files)
    assert parse_url("hf://org/repo@v2/dir/f.gguf") == ("org/repo", "dir/f.gguf", "v2")
    assert parse_url("hf://org/repo") == ("org/repo", None, None)
    with pytest.raises(InvalidArgumentError):
        parse_url("hf://org")


HOSTILE_URLS = ["hf://org/../../etc/x.gguf", "hf://org/repo/../x", "hf://../repo/x.gguf", "hf://org/..",
                "hf://org/repo/./x.gguf", "hf://org/repo/dir/../../../x.gguf", "hf://org/repo/a//b.gguf",
                "hf://org/repo@v1/../x.gguf", "hf://org/repo/..\\x.gguf", "hf://org/./x.gguf"]


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_a_url_that_steps_out_of_its_repository_is_refused_before_any_access(url, monkeypatch, capsys):
    """parse_url, LLM(url) and `llminfer pull` refuse it with InvalidArgumentError
    naming the component; the download is never reached."""
    import llminfer.hub.hf as hf
    from llminfer import hub
    from llminfer.cli.commands import main

    def no_access(*a, **k):
        raise AssertionError("reached the Hub")

    monkeypatch.setattr(hf, "_hub", no_access)
    with pytest.raises(InvalidArgumentError, match="path component"):
        parse_url(url)
    with pytest.raises(InvalidArgumentError, match="path component"):
        hub.resolve(url)
    assert main(["pull", url, "-q"]) != 0
    err = capsys.readouterr().err
    assert "path component" in err and "Traceback" not in err
    for repo_id, path in (("org/repo", "../x.gguf"), ("org/..", "x.gguf"), ("org/repo", "a/./x.gguf")):
        with pytest.raises(InvalidArgumentError, match="path component"):
            hf.download(repo_id, path)
