"""One wheel from the index to a local file: resumed from where an interrupted download stopped
(an HTTP range request), checked against the index's sha256, and cancellable between chunks.

A download is written to `<name>.part` and renamed to `<name>` only once its sha256 matches, so
a file without `.part` is always a verified one."""
from __future__ import annotations

import hashlib
import http.client
import shutil
import socket
import threading
from pathlib import Path
from typing import Callable

from .index import Dist, RuntimeProblem, local_path, open_url

CHUNK = 1 << 20


class Cancelled(RuntimeProblem):
    """The user cancelled; what was downloaded is kept for a resume."""


class ChecksumMismatch(RuntimeProblem):
    """A downloaded file is not the one the index describes."""


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _sha256_of(path: Path, cancel: threading.Event | None) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK * 8):
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled")
            h.update(chunk)
    return h


def fetch(d: Dist, folder: Path, progress: Callable[[int], None] = lambda n: None,
          cancel: threading.Event | None = None) -> Path:
    """Download d into folder (resuming a `.part`), verify it, and return the verified file.
    progress(n) is called with each n new bytes (bytes resumed from disk are reported once, first)."""
    folder.mkdir(parents=True, exist_ok=True)
    final, part = folder / d.filename, folder / (d.filename + ".part")
    if final.exists():
        if final.stat().st_size == d.size and _sha256_of(final, cancel).hexdigest() == d.sha256:
            progress(final.stat().st_size)
            return final
        final.unlink()
    if d.url.startswith("file:"):  # a local mirror: a copy, checked like a download
        src = local_path(d.url)
        with open(src, "rb") as fi, open(part, "wb") as fo:
            while chunk := fi.read(CHUNK):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("cancelled")
                fo.write(chunk)
                progress(len(chunk))
        return _verified(d, part, final, _sha256_of(part, None))
    have = part.stat().st_size if part.exists() else 0
    if d.size is not None and have > d.size:
        part.unlink()
        have = 0
    h = _sha256_of(part, cancel) if have else hashlib.sha256()
    if have:
        progress(have)
    if d.size is not None and have == d.size:
        return _verified(d, part, final, h)
    r = open_url(d.url, {"Range": f"bytes={have}-"} if have else None)
    with r:
        if have and r.status != 206:  # the server ignored the range: start again
            progress(-have)
            have, h = 0, hashlib.sha256()
        mode = "ab" if have else "wb"
        got = have
        try:
            with open(part, mode) as f:
                while True:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled(f"cancelled; {_mb(got)} of {d.filename} kept to resume")
                    chunk = r.read(CHUNK)
                    if not chunk:
                        break
                    f.write(chunk)
                    h.update(chunk)
                    got += len(chunk)
                    progress(len(chunk))
        except (http.client.IncompleteRead, ConnectionError, socket.timeout, TimeoutError, OSError) as e:
            if isinstance(e, OSError) and e.errno == 28:
                raise RuntimeProblem(f"the disk is full while writing {part}") from None
            raise RuntimeProblem(f"the download of {d.filename} stopped at {_mb(got)} of {_mb(d.size or 0)} "
                                 f"({type(e).__name__}); run the install again to resume") from None
    if d.size is not None and got < d.size:
        raise RuntimeProblem(f"the download of {d.filename} stopped at {_mb(got)} of {_mb(d.size)} (the "
                             "connection closed); run the install again to resume")
    return _verified(d, part, final, h)


def _verified(d: Dist, part: Path, final: Path, h) -> Path:
    digest = h.hexdigest()
    if digest != d.sha256:
        part.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{d.filename}: sha256 {digest[:16]}… does not match the index's {d.sha256[:16]}…; "
                               "the file was deleted and nothing was installed")
    part.replace(final)
    return final


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds path (or its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free
