"""One .safetensors file, read lazily tensor by tensor.

We parse the (documented, tiny) header ourselves. A tensor used as the file holds it (a cpu-16
expert or dense matrix at the checkpoint's own precision) is a view of the file's read-only
mapping (`view`: page cache, file-backed, not the process's memory; engine/files/gguf/reader.py says
more); one converted on the way (to another dtype, to 4 bits, to the GPU) is read straight into a
buffer the engine owns (`read`, `read_rows`: positional reads, which leave the file in the page
cache only).

Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the data; offsets are relative to the end of the header.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import stat
import struct
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..protocol.errors import ModelError

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
# bytes, for the MXFP4 experts of GPT-OSS releases (packed 4-bit values and power-of-two scales):
# the checkpoint checks which tensors may be bytes (Checkpoint._check_tensors)
READABLE = {**DTYPES, "U8": torch.uint8}
MAX_HEADER = 100 * 1024 * 1024  # the spec caps the header at 100 MB


def regular_file(path: Path) -> None:
    """Refuse anything but a regular file (a FIFO or a device would block or never end a read)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ModelError(path, "is missing") from None
    except OSError as e:
        raise ModelError(path, f"cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise ModelError(path, "is not a regular file")


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class SafetensorsFile:
    """Header parsed at open; tensors read on demand with positional reads (thread-safe)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        regular_file(self.path)
        try:
            self._fh = open(self.path, "rb")
        except OSError as e:
            raise ModelError(self.path, f"cannot be opened: {e.strerror or e}") from None
        try:
            self.tensors = self._parse_header()
        except Exception:
            self._fh.close()
            raise
        self._map: mmap.mmap | None = None

    def _parse_header(self) -> dict[str, TensorInfo]:
        size = os.fstat(self._fh.fileno()).st_size
        raw = self._fh.read(8)
        if len(raw) < 8:
            raise ModelError(self.path, "is truncated or not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or n + 8 > size:
            raise ModelError(self.path, "is truncated or corrupt: its header length does not fit the file")
        try:
            header = json.loads(self._fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ModelError(self.path, "is corrupt: its header is not valid JSON") from None
        if not isinstance(header, dict):
            raise ModelError(self.path, "is corrupt: its header is not a JSON object")
        meta = header.get("__metadata__")  # the writer's own notes, strings (a KV cache file's: engine/kv/files.py)
        self.metadata: dict[str, str] = {k: v for k, v in meta.items() if isinstance(v, str)} \
            if isinstance(meta, dict) else {}
        base = 8 + n
        out: dict[str, TensorInfo] = {}
        data_end = 0
        def whole(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(meta, dict):
                raise ModelError(self.path, f"is corrupt: the header entry for tensor '{name}' is not an object")
            dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
            if not isinstance(dtype, str):
                raise ModelError(self.path, f"is corrupt: tensor '{name}' has dtype {dtype!r}, not a type name")
            if not isinstance(shape, list) or not all(whole(s) for s in shape) or len(shape) > 8:
                raise ModelError(self.path, f"is corrupt: tensor '{name}' has shape {shape!r}, not a list of sizes")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(whole(o) for o in offsets)
                    and offsets[0] <= offsets[1]):
                raise ModelError(self.path, f"is corrupt: tensor '{name}' has data_offsets {offsets!r}, not two "
                                 "whole numbers [begin, end]")
            shape, (a, b) = tuple(shape), offsets
            if dtype not in READABLE:
                raise ModelError(
                    self.path,
                    f"tensor '{name}' has dtype {dtype}; Mixdesk reads 16- and 32-bit float checkpoints "
                    "(BF16, F16, F32) and quantises experts itself",
                )
            itemsize = torch.empty((), dtype=READABLE[dtype]).element_size()
            if b - a != math.prod(shape) * itemsize or a < 0:
                raise ModelError(self.path, f"is corrupt: tensor '{name}' has a size that does not match its shape")
            out[name] = TensorInfo(dtype, shape, base + a, base + b)
            data_end = max(data_end, b)
        spans = sorted((t.start, t.end, n) for n, t in out.items() if t.end > t.start)
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise ModelError(self.path, f"is corrupt: tensors '{an}' and '{bn}' overlap in the file")
        if base + data_end > size:
            raise ModelError(
                self.path,
                f"is truncated: its header describes {base + data_end:,} bytes but the file holds {size:,}",
            )
        return out

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Read one tensor; into `out` (a CPU tensor of the same dtype and shape) when given."""
        info = self.tensors[name]
        return self._read_span(name, info.start, info.nbytes, info.shape, out)

    def read_rows(self, name: str, first: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows first..first+count-1 of the tensor's first dimension (one expert of a tensor that
        fuses a layer's experts): a contiguous span of the file, read alone."""
        info = self.tensors[name]
        if not info.shape or not 0 <= first <= first + count <= info.shape[0]:
            raise ValueError(f"rows {first}..{first + count} of {name} {info.shape}")
        row = info.nbytes // info.shape[0] if info.shape[0] else 0
        return self._read_span(name, info.start + first * row, count * row, (count, *info.shape[1:]), out)

    def _read_span(self, name: str, start: int, nbytes: int, shape: tuple, out: torch.Tensor | None) -> torch.Tensor:
        dtype = READABLE[self.tensors[name].dtype]
        if out is None:
            out = torch.empty(shape, dtype=dtype)
        elif out.dtype != dtype or tuple(out.shape) != tuple(shape) or not out.is_contiguous():
            raise ValueError(f"buffer for {name} must be contiguous {dtype} {tuple(shape)}")
        view = out.view(torch.uint8).reshape(-1).numpy()
        with self._lock:
            self._fh.seek(start)
            got = self._fh.readinto(view)
        if got != nbytes:
            raise ModelError(self.path, f"is truncated: tensor '{name}' could not be read whole")
        return out

    def view(self, name: str) -> torch.Tensor:
        """The tensor where the file is mapped read-only: no copy, never to be written (its pages are
        the file's: page cache, not the process's memory; engine/files/gguf/reader.py says why). The
        tensor keeps the mapping alive."""
        info = self.tensors[name]
        with self._lock:
            if self._map is None:
                try:
                    self._map = mmap.mmap(self._fh.fileno(), 0, prot=mmap.PROT_READ)
                except (OSError, ValueError) as e:
                    raise ModelError(self.path, f"cannot be mapped: {getattr(e, 'strerror', None) or e}") from None
                from . import mapped

                mapped.watch(self._map, self.path)
            m = self._map
        if info.end > len(m):
            raise ModelError(self.path, f"is truncated: tensor '{name}' ends past the end of the file")
        dtype = READABLE[info.dtype]
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=dtype)
        with warnings.catch_warnings():  # "not writable": by design
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(m, dtype=dtype, count=info.nbytes // torch.empty((), dtype=dtype).element_size(),
                                    offset=info.start).view(info.shape)

    def close(self) -> None:
        """Close the file; a mapping stays while a view of it lives (the model using it)."""
        self._fh.close()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views still alive: unmapped when they go
                pass
            self._map = None
