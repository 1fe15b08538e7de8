"""A GGUF model as the user holds it: one .gguf file, a folder holding one, or a split set
(name-00001-of-00003.gguf ..., as llama.cpp's gguf-split writes it), with its tensors either mapped
or read.

- `view`: the tensor's bytes where the file is mapped read-only (no copy). What the engine keeps in
  the file's own blocks (the experts and dense matrices the native kernels run on the file's rows)
  is served from here: those pages are the page cache's, file-backed (RssFile, not RssAnon), which
  the OS shares, and evicts under pressure and reads back on the next touch, so a model larger than
  free memory still runs (slower, paging), as llama.cpp's does. A file truncated while mapped would
  raise SIGBUS on the next touch: engine/native's guard turns that into an error (engine/files/mapped.py).
- `read_bytes`: positional reads into a buffer the caller owns, for what is converted anyway (a
  dequantisation, a re-quantised form): the read leaves the file in the page cache only.
Nothing is ever written next to the file.
"""
from __future__ import annotations

import mmap
import os
import re
import threading
import warnings
from pathlib import Path

import torch

from ...protocol.errors import ModelError
from ..safetensors_file import regular_file  # one definition: a FIFO or a device would block a read
from .header import Header, TensorInfo

SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# files that sit beside a model's .gguf and are not the language model
NOT_MODELS = ("mmproj", "imatrix")


def is_gguf(path: str | Path) -> bool:
    """A .gguf file, or a folder holding .gguf files and no config.json (a Hugging Face folder)."""
    p = Path(path).expanduser()
    if p.suffix == ".gguf":
        return True
    return p.is_dir() and not (p / "config.json").exists() and any(p.glob("*.gguf"))


def resolve(path: str | Path) -> list[Path]:
    """The model's .gguf files, the first part first: every part of a split set must be there."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(q for q in p.glob("*.gguf") if not q.name.lower().startswith(NOT_MODELS))
        if not found:
            raise ModelError(p, "holds no .gguf model file")
        models = sorted({SPLIT.match(q.name)["prefix"] if SPLIT.match(q.name) else q.name for q in found})
        if len(models) > 1:
            raise ModelError(p, f"holds several GGUF models ({', '.join(models[:6])}); give the file to open")
        p = found[0]
    if not p.exists():
        raise ModelError(p, "does not exist")
    regular_file(p)
    m = SPLIT.match(p.name)
    if not m:
        return [p]
    count = int(m["count"])
    if count < 1:
        raise ModelError(p, "names a split set of 0 parts")
    parts = [p.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for q in parts:
        if not q.exists():
            raise ModelError(q, f"is missing: the model is split in {count} parts and every part is needed")
        regular_file(q)
    return parts


class GGUFFile:
    """The model's files opened: merged tensor infos (name -> TensorInfo) and the first part's
    metadata; reads are thread-safe (positional, no shared file offset)."""

    def __init__(self, path: str | Path):
        self.parts = resolve(path)
        self.path = self.parts[0]
        self.headers = [Header(p) for p in self.parts]
        self.metadata = self.headers[0].metadata
        self.header = self.headers[0]
        self._check_split()
        self.tensors: dict[str, TensorInfo] = {}
        for h in self.headers:
            for name, t in h.tensors.items():
                if name in self.tensors:
                    raise ModelError(h.path, f"is corrupt: tensor '{name}' is also in {self.tensors[name].path.name}")
                self.tensors[name] = t
        self._fds: dict[Path, int] = {}
        self._maps: dict[Path, mmap.mmap] = {}
        self._lock = threading.Lock()

    def _check_split(self) -> None:
        n = len(self.parts)
        declared = 0
        for i, h in enumerate(self.headers):
            no, count = h.get("split.no"), h.get("split.count")
            if n == 1 and count in (None, 0, 1):
                return
            if count != n or no != i:
                raise ModelError(h.path, f"is corrupt: its split metadata says part {no!r} of {count!r}, but it is "
                                 f"part {i} (counting from 0) of the {n} files of this split set")
            declared = h.get("split.tensors.count", declared)
        total = sum(len(h.tensors) for h in self.headers)
        if declared != total:
            raise ModelError(self.path, f"is corrupt: split.tensors.count is {declared!r}, and the {n} parts hold "
                             f"{total} tensors")

    def get(self, key: str, default=None):
        return self.header.get(key, default)

    # ---- reading ---------------------------------------------------------------------------------
    def _fd(self, path: Path) -> int:
        with self._lock:
            return self._fd_locked(path)

    def _fd_locked(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise ModelError(path, f"cannot be opened: {e.strerror or e}") from None
        return fd

    def _map(self, path: Path) -> mmap.mmap:
        with self._lock:
            m = self._maps.get(path)
            if m is None:
                fd = self._fd_locked(path)
                try:
                    m = self._maps[path] = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
                except (OSError, ValueError) as e:
                    raise ModelError(path, f"cannot be mapped: {getattr(e, 'strerror', None) or e}") from None
                from .. import mapped

                mapped.watch(m, path)  # a truncation while mapped: an error for this model, not a crash
            return m

    def view(self, t: TensorInfo, offset: int = 0, nbytes: int | None = None) -> torch.Tensor:
        """Bytes offset..offset+nbytes of tensor t's data as a uint8 tensor over the read-only mapping
        of its file: no copy, never to be written (the pages are the file's). The tensor keeps the
        mapping alive."""
        nbytes = t.nbytes - offset if nbytes is None else nbytes
        if not 0 <= offset <= offset + nbytes <= t.nbytes:
            raise ValueError(f"bytes {offset}..{offset + nbytes} of {t.name} ({t.nbytes} bytes)")
        m = self._map(t.path)
        if t.start + offset + nbytes > len(m):
            raise ModelError(t.path, f"is truncated: tensor '{t.name}' ends past the end of the file")
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        with warnings.catch_warnings():  # "not writable": by design, it is the file's read-only pages
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(m, dtype=torch.uint8, count=nbytes, offset=t.start + offset)

    def read_bytes(self, t: TensorInfo, offset: int = 0, nbytes: int | None = None,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """Bytes offset..offset+nbytes of tensor t's data into `out` (uint8, contiguous) or a new
        uint8 tensor."""
        nbytes = t.nbytes - offset if nbytes is None else nbytes
        if not 0 <= offset <= offset + nbytes <= t.nbytes:
            raise ValueError(f"bytes {offset}..{offset + nbytes} of {t.name} ({t.nbytes} bytes)")
        if out is None:
            out = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(out.view(torch.uint8).reshape(-1).numpy()).cast("B")
        if len(view) != nbytes:
            raise ValueError(f"buffer of {len(view)} bytes for {nbytes} bytes of {t.name}")
        fd, pos, done = self._fd(t.path), t.start + offset, 0
        while done < nbytes:  # a read may return less than asked (signals, very large reads)
            got = os.preadv(fd, [view[done:]], pos + done)
            if got <= 0:
                raise ModelError(t.path, f"is truncated: tensor '{t.name}' could not be read whole")
            done += got
        return out

    def close(self) -> None:
        """Close the files. A mapping stays while a tensor viewing it lives (the model using it), and
        goes with the last of them."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            for m in self._maps.values():
                try:
                    m.close()
                except BufferError:  # views still alive: unmapped when they go
                    pass
            self._maps.clear()
