"""A Python package index as pip reads it (PEP 503 HTML or PEP 691 JSON, plus PEP 658 metadata):
the wheels of a project, their sha256, sizes and requirements. Only wheels: nothing is built.

HTTP(S) and file:// indexes both work (a local mirror is a folder of `<project>/index.html`).
Every failure is a RuntimeProblem with one line that names the index or the file."""
from __future__ import annotations

import email.parser
import hashlib
import html
import io
import json
import os
import sys
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from email.message import Message
from html.parser import HTMLParser
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ...protocol.errors import MixdeskError

TIMEOUT_S = 30
ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


class RuntimeProblem(MixdeskError):
    """Fetching or using the GPU runtime failed; the message is one line, and the app goes on on the CPU."""


class HttpStatus(RuntimeProblem):
    """The server answered with an HTTP error status."""

    def __init__(self, url: str, code: int, reason: str):
        self.code = code
        super().__init__(f"{url}: HTTP {code} {reason}")


@dataclass
class Dist:
    """One wheel file of one project on the index."""
    name: str                   # canonical project name
    version: Version
    filename: str
    url: str
    sha256: str | None
    size: int | None = None
    metadata_url: str | None = None
    metadata_sha256: str | None = None
    rank: int = 0               # position of its best tag in this interpreter's sys_tags: lower is better


def _ssl_context() -> ssl.SSLContext:
    try:  # a frozen app's OpenSSL may not know where the system keeps its certificates: certifi does
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


_SSL = None


def local_path(url: str) -> Path:
    """The file a file:// URL names."""
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))


def open_url(url: str, headers: dict | None = None, method: str = "GET", timeout: float = TIMEOUT_S):
    """An open response, or RuntimeProblem saying in one line why not (offline, refused, HTTP error)."""
    global _SSL
    if url.startswith("file:"):
        path = local_path(url)
        if path.is_dir():
            path = path / "index.html"
        if not path.exists():
            raise HttpStatus(url, 404, "Not Found")
        url = path.as_uri()
    if _SSL is None:
        _SSL = _ssl_context()
    req = urllib.request.Request(url, headers={"User-Agent": "mixdesk-runtime", **(headers or {})}, method=method)
    host = urllib.parse.urlparse(url).netloc or url
    try:
        return urllib.request.urlopen(req, timeout=timeout, context=_SSL if url.startswith("https:") else None)
    except urllib.error.HTTPError as e:
        raise HttpStatus(url, e.code, e.reason) from None
    except urllib.error.URLError as e:
        why = e.reason
        if isinstance(why, ConnectionRefusedError):
            msg = "connection refused"
        elif isinstance(why, socket.gaierror):
            msg = "the name does not resolve"
        elif isinstance(why, (socket.timeout, TimeoutError)):
            msg = "no answer (timed out)"
        elif isinstance(why, ssl.SSLError):
            msg = f"TLS failed ({why})"
        else:
            msg = str(why)
        raise RuntimeProblem(f"cannot reach {host}: {msg} — offline? Mixdesk goes on on the CPU") from None
    except (OSError, ValueError) as e:
        raise RuntimeProblem(f"cannot reach {host}: {e} — offline? Mixdesk goes on on the CPU") from None


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append({k: (html.unescape(v) if v is not None else "") for k, v in attrs})


def _hash_of(value) -> str | None:
    """sha256 from a PEP 658/714 attribute ("sha256=..."), a JSON hashes dict, or None."""
    if isinstance(value, dict):
        return value.get("sha256")
    if isinstance(value, str) and value.startswith("sha256="):
        return value.split("=", 1)[1]
    return None


class Index:
    """One package index. project(name) lists the wheels this interpreter can install."""

    def __init__(self, url: str):
        if not url or urllib.parse.urlparse(url).scheme not in ("http", "https", "file"):
            raise RuntimeProblem(f"--index-url {url!r}: give an http(s):// or file:// URL of a package index")
        self.url = url.rstrip("/") + "/"
        self._pages: dict[str, list[Dist]] = {}
        self._tags = {t: i for i, t in enumerate(sys_tags())}
        self._python = Version(".".join(map(str, sys.version_info[:3])))

    def project(self, name: str) -> list[Dist]:
        name = canonicalize_name(name)
        if name not in self._pages:
            page = urllib.parse.urljoin(self.url, name + "/")
            try:
                r = open_url(page, {"Accept": ACCEPT})
            except HttpStatus as e:
                if e.code == 404:
                    raise RuntimeProblem(f"the index {self.url} has no package {name}") from None
                raise
            with r:
                body, ctype = r.read(), r.headers.get("Content-Type", "") or ""
            base = r.geturl() or page
            try:
                files = self._from_json(body, base) if "json" in ctype else self._from_html(body, base)
            except (ValueError, KeyError, TypeError) as e:
                raise RuntimeProblem(f"{page}: not a package index page ({type(e).__name__}: {e})") from None
            self._pages[name] = [d for d in files if d is not None and d.name == name]
        return self._pages[name]

    def _dist(self, filename, url, sha256, size, requires_python, yanked, meta, meta_hash) -> Dist | None:
        if not filename.endswith(".whl") or yanked:
            return None
        try:
            name, version, _, tags = parse_wheel_filename(filename)
        except Exception:
            return None
        ranks = [self._tags[t] for t in tags if t in self._tags]
        if not ranks:
            return None
        if requires_python:
            try:
                if not SpecifierSet(requires_python).contains(self._python, prereleases=True):
                    return None
            except Exception:
                pass
        url, frag = urllib.parse.urldefrag(url)
        if not sha256 and frag.startswith("sha256="):
            sha256 = frag.split("=", 1)[1]
        return Dist(name, version, filename, url, sha256.lower() if sha256 else None, size,
                    (url + ".metadata") if meta else None, meta_hash, min(ranks))

    def _from_html(self, body: bytes, base: str) -> list[Dist | None]:
        p = _Links()
        p.feed(body.decode("utf-8", "replace"))
        out = []
        for a in p.links:
            href = a.get("href")
            if not href:
                continue
            url = urllib.parse.urljoin(base, href)
            filename = urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
            meta = a.get("data-core-metadata", a.get("data-dist-info-metadata"))
            out.append(self._dist(filename, url, None, None, a.get("data-requires-python"),
                                  "data-yanked" in a, meta not in (None, "false"), _hash_of(meta)))
        return out

    def _from_json(self, body: bytes, base: str) -> list[Dist | None]:
        doc = json.loads(body)
        out = []
        for f in doc.get("files", []):
            meta = f.get("core-metadata", f.get("dist-info-metadata", False))
            out.append(self._dist(f["filename"], urllib.parse.urljoin(base, f["url"]), _hash_of(f.get("hashes")),
                                  f.get("size"), f.get("requires-python"), bool(f.get("yanked")),
                                  bool(meta), _hash_of(meta)))
        return out

    def best(self, name: str, spec: SpecifierSet) -> Dist:
        """The newest wheel of `name` within spec that this interpreter can install."""
        fits = [d for d in self.project(name) if spec.contains(d.version, prereleases=True)]
        ok = [d for d in fits if not d.version.is_prerelease] or fits  # a pre-release only when nothing else fits
        if not ok:
            have = sorted({str(d.version) for d in self.project(name)})
            return self._none(name, spec, have)
        return max(ok, key=lambda d: (d.version, -d.rank))

    def _none(self, name, spec, have):
        here = f"{sys.implementation.cache_tag}, {next(iter(sys_tags()))}"
        raise RuntimeProblem(f"the index {self.url} has no wheel of {name}{spec or ''} for this Python ({here})"
                             + (f"; it has {', '.join(have[-5:])}" if have else ""))

    def size(self, d: Dist) -> int:
        """The file's size in bytes (from the index, else a HEAD request)."""
        if d.size is None:
            if d.url.startswith("file:"):
                d.size = local_path(d.url).stat().st_size
            else:
                with open_url(d.url, method="HEAD") as r:
                    d.size = int(r.headers.get("Content-Length") or 0) or None
            if d.size is None:
                raise RuntimeProblem(f"{d.url}: the server gives no size for {d.filename}")
        return d.size

    def metadata(self, d: Dist) -> Message:
        """The wheel's METADATA: PEP 658's file next to it, else read from the zip by range requests."""
        if d.metadata_url:
            with open_url(d.metadata_url) as r:
                raw = r.read()
            if d.metadata_sha256 and hashlib.sha256(raw).hexdigest() != d.metadata_sha256.lower():
                raise RuntimeProblem(f"{d.metadata_url}: sha256 does not match the index's; refusing it")
            return email.parser.Parser().parsestr(raw.decode("utf-8", "replace"), headersonly=True)
        if d.url.startswith("file:"):
            f = open(local_path(d.url), "rb")
        else:
            f = io.BufferedReader(RangeFile(d.url, self.size(d)), buffer_size=1 << 16)
        try:
            with zipfile.ZipFile(f) as z:
                names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
                if not names:
                    raise RuntimeProblem(f"{d.filename}: a wheel without .dist-info/METADATA")
                raw = z.read(names[0])
        except zipfile.BadZipFile as e:
            raise RuntimeProblem(f"{d.filename}: not a valid wheel ({e})") from None
        finally:
            f.close()
        return email.parser.Parser().parsestr(raw.decode("utf-8", "replace"), headersonly=True)


class RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, so zipfile can read a wheel's METADATA from its
    central directory without downloading the whole (GB-sized) wheel."""

    BLOCK = 1 << 18

    def __init__(self, url: str, size: int):
        self.url, self.length, self.pos = url, size, 0
        self._blocks: dict[int, bytes] = {}

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=os.SEEK_SET):
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence] + offset
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self._blocks:
            lo, hi = i * self.BLOCK, min(self.length, (i + 1) * self.BLOCK) - 1
            with open_url(self.url, {"Range": f"bytes={lo}-{hi}"}) as r:
                if r.status != 206:
                    raise RuntimeProblem(f"{self.url}: the server does not answer range requests, and the index "
                                         "gives no metadata file (PEP 658); cannot read the requirements")
                self._blocks[i] = r.read()
        return self._blocks[i]

    def readinto(self, b):
        n = min(len(b), max(0, self.length - self.pos))
        got = 0
        while got < n:
            i, off = divmod(self.pos + got, self.BLOCK)
            chunk = self._block(i)[off:off + n - got]
            if not chunk:
                break
            b[got:got + len(chunk)] = chunk
            got += len(chunk)
        self.pos += got
        return got
