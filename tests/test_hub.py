"""A Hugging Face repo id downloads through huggingface_hub — tested against a file server on
loopback that speaks the hub's API, never the network: progress, cache reuse, resume."""
import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.checkpoint import Checkpoint
from engine.errors import ModelError
from engine.sources.hub import resolve

COMMIT = "a" * 40


class Hub:
    def __init__(self, repo_id, folder):
        self.repo_id = repo_id
        self.files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        self.files["pytorch_model.bin"] = b"pickle that must never be fetched"
        self.log = []
        self.cut_once = None  # file name whose first GET is cut short

    def serve(self):
        hub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _file(self, head):
                m = re.fullmatch(rf"/{hub.repo_id}/resolve/[^/]+/(.+)", self.path.split("?")[0])
                if not m or m.group(1) not in hub.files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.end_headers()
                    return
                name = m.group(1)
                data = hub.files[name]
                rng = self.headers.get("Range")
                hub.log.append((self.command, name, rng))
                start = int(re.match(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                self.send_response(206 if rng else 200)
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(len(data) - start))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                body = data[start:]
                if hub.cut_once == name and not rng:
                    hub.cut_once = None
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def do_HEAD(self):
                self._file(head=True)

            def do_GET(self):
                if self.path.startswith("/api/models/"):
                    if not self.path.startswith(f"/api/models/{hub.repo_id}"):
                        self.send_response(404)
                        self.send_header("X-Error-Code", "RepoNotFound")
                        self.end_headers()
                        return
                    if "/tree/" in self.path:  # the file listing
                        body = json.dumps([{"type": "file", "path": n, "size": len(d),
                                            "oid": hashlib.sha1(d).hexdigest()}
                                           for n, d in hub.files.items()]).encode()
                    else:  # repo info
                        body = json.dumps({"id": hub.repo_id, "sha": COMMIT,
                                           "siblings": [{"rfilename": n} for n in hub.files]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._file(head=False)

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv


@pytest.fixture
def hub(tiny, tmp_path, monkeypatch):
    h = Hub("acme/tiny-moe", tiny)
    srv = h.serve()
    h.kw = dict(endpoint=f"http://127.0.0.1:{srv.server_address[1]}", cache_dir=tmp_path / "hf-cache")
    yield h
    srv.shutdown()


def test_repo_id_downloads_safetensors_only_and_reuses_cache(hub):
    path = resolve("acme/tiny-moe", **hub.kw)
    assert (path / "model.safetensors").is_file() and not (path / "pytorch_model.bin").exists()
    Checkpoint(path).load_tokenizer()
    fetched = {n for m, n, _ in hub.log if m == "GET"}
    assert "model.safetensors" in fetched and "pytorch_model.bin" not in fetched
    n = len([1 for m, *_ in hub.log if m == "GET"])
    assert resolve("acme/tiny-moe", **hub.kw) == path
    assert len([1 for m, *_ in hub.log if m == "GET"]) == n  # nothing fetched again


def test_interrupted_download_resumes(hub):
    # huggingface_hub writes in 10 MiB chunks, so only a file larger than that can resume mid-way
    big = "model-extra.safetensors"
    hub.files[big] = os.urandom(24 * 2**20)
    hub.cut_once = big
    path = resolve("acme/tiny-moe", **hub.kw)
    assert (path / big).read_bytes() == hub.files[big]
    ranges = [r for m, n, r in hub.log if m == "GET" and n == big and r]
    assert ranges and int(re.match(r"bytes=(\d+)-", ranges[0]).group(1)) >= 10 * 2**20  # resumed, not restarted


def test_unknown_repo_is_one_clear_error(hub):
    with pytest.raises(ModelError, match="not found"):
        resolve("acme/nope", **hub.kw)


def test_local_path_is_used_as_is(tiny):
    assert resolve(str(tiny)) == tiny


def test_download_reports_progress_and_can_be_cancelled(hub):
    import threading

    from engine.sources.hub import DownloadCancelled

    seen = []
    path = resolve("acme/tiny-moe", **hub.kw, progress=lambda d, t, w: seen.append((d, t)))
    assert path.is_dir() and seen and seen[-1][0] == seen[-1][1] > 0  # files fetched / files in all
    cancel = threading.Event()
    cancel.set()
    hub.kw["cache_dir"] = hub.kw["cache_dir"].parent / "another-cache"
    with pytest.raises(DownloadCancelled, match="cancelled"):
        resolve("acme/tiny-moe", **hub.kw, cancel=cancel)
