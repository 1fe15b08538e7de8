"""A file server on loopback that speaks as much of the Hugging Face hub's API as huggingface_hub
uses here: the model search (/api/models?search=), a repo's info with its files and their sizes
(?blobs=true), its file tree, and file downloads (HEAD/GET, ranges). Every request is logged, so a
test can say what was (and was not) fetched. A file may be given only by its size (Declared): it
is listed with that size and refused if fetched (weights a test must never download)."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "a" * 40


class Declared:
    """A file known by its size only (never served)."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size


class HubServer:
    def __init__(self, repos: dict[str, dict[str, bytes | Declared]]):
        self.repos = repos  # repo id -> file name -> bytes (or Declared)
        self.log: list[tuple[str, str, str | None]] = []  # files: (method, file name, Range)
        self.api_log: list[str] = []  # API requests: path?query
        self.cut_once = None  # file name whose first GET is cut short
        self.hang = False  # answer nothing (a hub that does not respond)
        self.srv = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.srv.server_address[1]}"

    def fetched(self) -> list[str]:
        """The files requested (HEAD or GET), by name."""
        return [n for m, n, _ in self.log]

    def _json(self, h, obj, status=200):
        body = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _not_found(self, h, code):
        h.send_response(404)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _api(self, h, path: str, query: dict):
        if path == "/api/models":  # the search
            q = (query.get("search") or [""])[0].lower()
            limit = int((query.get("limit") or ["1000"])[0])
            found = [{"id": r, "modelId": r, "sha": COMMIT, "downloads": 0, "likes": 0, "tags": []}
                     for r in self.repos if q in r.lower()][:limit]
            return self._json(h, found)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(/revision/[^/]+|/tree/.*)?", path)
        if not m or m.group(1) not in self.repos:
            return self._not_found(h, "RepoNotFound")
        repo_id, files = m.group(1), self.repos[m.group(1)]
        if (m.group(2) or "").startswith("/tree/"):  # the file listing
            return self._json(h, [{"type": "file", "path": n, "size": len(d),
                                   "oid": hashlib.sha1(d if isinstance(d, bytes) else n.encode()).hexdigest()}
                                  for n, d in files.items()])
        blobs = (query.get("blobs") or [""])[0].lower() == "true"
        siblings = [{"rfilename": n, **({"size": len(d)} if blobs else {})} for n, d in files.items()]
        return self._json(h, {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "siblings": siblings})

    def _file(self, h, head: bool):
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", unquote(h.path.split("?")[0]))
        files = self.repos.get(m.group(1)) if m else None
        rng = h.headers.get("Range")
        name = m.group(2) if m else h.path
        self.log.append((h.command, name, rng))
        if files is None or name not in files or isinstance(files[name], Declared):
            return self._not_found(h, "EntryNotFound")
        data = files[name]
        start = int(re.match(r"bytes=(\d+)-", rng).group(1)) if rng else 0
        h.send_response(206 if rng else 200)
        h.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Content-Length", str(len(data) - start))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        body = data[start:]
        if self.cut_once == name and not rng:
            self.cut_once = None
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        h.wfile.write(body)

    def serve(self) -> "HubServer":
        hub = self
        stop = threading.Event()
        self._stop = stop

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _hang(self) -> bool:
                if hub.hang:
                    stop.wait(60)  # until the server shuts down
                    return True
                return False

            def do_HEAD(self):
                if not self._hang():
                    hub._file(self, head=True)

            def do_GET(self):
                if self._hang():
                    return
                url = urlsplit(self.path)
                if url.path.startswith("/api/"):
                    hub.api_log.append(self.path)
                    return hub._api(self, unquote(url.path), parse_qs(url.query))
                hub._file(self, head=False)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.srv.shutdown()
        self.srv.server_close()
