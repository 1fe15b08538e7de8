"""One .safetensors file, read lazily tensor by tensor.

We parse the (documented, tiny) header ourselves instead of using safetensors' mmap so that each
tensor can be read straight into a buffer the engine owns (a slice of a fused expert weight, a
pinned staging buffer). An mmap keeps every page it has touched counted in the process's RSS for
as long as it is mapped, which would double peak memory; positional reads leave the checkpoint in
the OS page cache only, so peak RSS follows the placement.

Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the data; offsets are relative to the end of the header.
"""
from __future__ import annotations

import json
import math
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ModelError

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
MAX_HEADER = 100 * 1024 * 1024  # the spec caps the header at 100 MB


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
        try:
            self._fh = open(self.path, "rb")
        except OSError as e:
            raise ModelError(self.path, f"cannot be opened: {e.strerror or e}") from None
        try:
            self.tensors = self._parse_header()
        except Exception:
            self._fh.close()
            raise

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
        base = 8 + n
        out: dict[str, TensorInfo] = {}
        data_end = 0
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (a, b) = meta["dtype"], tuple(int(s) for s in meta["shape"]), meta["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise ModelError(self.path, f"is corrupt: bad header entry for tensor '{name}'") from None
            if dtype not in DTYPES:
                raise ModelError(
                    self.path,
                    f"tensor '{name}' has dtype {dtype}; Mixdesk reads 16- and 32-bit float checkpoints "
                    "(BF16, F16, F32) and quantises experts itself",
                )
            itemsize = torch.empty((), dtype=DTYPES[dtype]).element_size()
            if b - a != math.prod(shape) * itemsize or a < 0:
                raise ModelError(self.path, f"is corrupt: tensor '{name}' has a size that does not match its shape")
            out[name] = TensorInfo(dtype, shape, base + a, base + b)
            data_end = max(data_end, b)
        if base + data_end > size:
            raise ModelError(
                self.path,
                f"is truncated: its header describes {base + data_end:,} bytes but the file holds {size:,}",
            )
        return out

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Read one tensor; into `out` (a CPU tensor of the same dtype and shape) when given."""
        info = self.tensors[name]
        dtype = DTYPES[info.dtype]
        if out is None:
            out = torch.empty(info.shape, dtype=dtype)
        elif out.dtype != dtype or tuple(out.shape) != info.shape or not out.is_contiguous():
            raise ValueError(f"buffer for {name} must be contiguous {dtype} {info.shape}")
        view = out.view(torch.uint8).reshape(-1).numpy()
        with self._lock:
            self._fh.seek(info.start)
            got = self._fh.readinto(view)
        if got != info.nbytes:
            raise ModelError(self.path, f"is truncated: tensor '{name}' could not be read whole")
        return out

    def close(self) -> None:
        self._fh.close()
