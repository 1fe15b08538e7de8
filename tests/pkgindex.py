"""A package index served on loopback for the GPU runtime's tests: PEP 503 pages (optionally with
PEP 658 metadata files), wheel files with HTTP range support, and faults on demand (a connection cut
after N bytes, a wrong sha256 on the page, a refused project). Wheels come from three places:
stand-in wheels that make_wheel() writes, real wheel files, and local mirror folders of
`<project>/index.html` pages (pip's file:// indexes on this machine kind)."""
from __future__ import annotations

import hashlib
import html
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename


def make_wheel(folder: Path, name: str, version: str, requires: list[str] = (), files: dict[str, str] | None = None,
               tag: str = "py3-none-any", extras: list[str] = ()) -> Path:
    """A small, valid wheel: its files, METADATA with Requires-Dist, WHEEL and RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = Path(folder) / f"{dist}-{tag}.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, text in (files or {}).items():
            z.writestr(rel, text)
        z.writestr(f"{dist}.dist-info/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nGenerator: mixdesk-tests\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Entry:
    path: Path
    sha: str


@dataclass
class PackageIndex:
    """Start with .start(); its URL is .url ("http://127.0.0.1:PORT/simple")."""
    wheels: list[Path] = field(default_factory=list)
    mirrors: list[Path] = field(default_factory=list)   # folders of <project>/index.html, links with #sha256=
    pep658: bool = True
    cut_after: dict[str, int] = field(default_factory=dict)    # filename -> bytes sent before the first cut
    wrong_sha: set[str] = field(default_factory=set)           # filenames whose page hash is wrong
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range header)

    def __post_init__(self):
        self._files: dict[str, Entry] = {}
        self._projects: dict[str, list[str]] = {}
        self._mirrored: set[str] = set()
        for w in self.wheels:
            self.add(w)

    def add(self, wheel: Path, sha: str | None = None) -> None:
        wheel = Path(wheel)
        self._files[wheel.name] = Entry(wheel, sha or sha256(wheel))
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        self._projects.setdefault(name, [])
        if wheel.name not in self._projects[name]:
            self._projects[name].append(wheel.name)

    def _project(self, name: str) -> list[str] | None:
        if name not in self._mirrored:
            self._mirrored.add(name)
            for m in self.mirrors:
                page = Path(m) / name / "index.html"
                if page.exists():
                    for href, sha in re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', page.read_text()):
                        f = (page.parent / html.unescape(href)).resolve()
                        if f.exists() and f.suffix == ".whl":
                            self.add(f, sha)
        return self._projects.get(name)

    def start(self) -> "PackageIndex":
        index = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head=False):
                index.requests.append(("HEAD" if head else "GET", self.path, self.headers.get("Range", "")))
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) == 2 and parts[0] == "simple":
                    return self._page(canonicalize_name(parts[1]), head)
                if len(parts) == 2 and parts[0] == "files":
                    name = parts[1]
                    if name.endswith(".metadata") and name[:-9] in index._files:
                        return self._metadata(index._files[name[:-9]].path, head)
                    if name in index._files:
                        return self._file(index._files[name].path, head)
                self.send_error(404)

            def _send(self, body: bytes, ctype: str, head: bool):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _page(self, name, head):
                files = index._project(name)
                if files is None:
                    return self.send_error(404)
                links = []
                for fn in files:
                    e = index._files[fn]
                    sha = ("0" * 64) if fn in index.wrong_sha else e.sha
                    meta = ' data-core-metadata="true"' if index.pep658 else ""
                    links.append(f'<a href="/files/{fn}#sha256={sha}"{meta}>{fn}</a>')
                body = ("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>").encode()
                self._send(body, "text/html", head)

            def _metadata(self, path: Path, head):
                with zipfile.ZipFile(path) as z:
                    name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
                    self._send(z.read(name), "text/plain", head)

            def _file(self, path: Path, head):
                size = path.stat().st_size
                lo, hi, status = 0, size - 1, 200
                m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
                if m:
                    lo, hi, status = int(m[1]), int(m[2]) if m[2] else size - 1, 206
                    if lo >= size:
                        self.send_error(416)
                        return
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(hi - lo + 1))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
                self.end_headers()
                if head:
                    return
                cut = index.cut_after.pop(path.name, None)
                with open(path, "rb") as f:
                    f.seek(lo)
                    left = hi - lo + 1
                    while left > 0:
                        n = min(left, 1 << 20) if cut is None else min(left, 1 << 20, cut)
                        chunk = f.read(n)
                        if not chunk:
                            break
                        try:
                            self.wfile.write(chunk)
                        except (BrokenPipeError, ConnectionResetError):
                            return
                        left -= len(chunk)
                        if cut is not None:
                            cut -= len(chunk)
                            if cut <= 0:  # the connection drops mid-file
                                self.wfile.flush()
                                self.close_connection = True
                                self.connection.shutdown(2)
                                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
