"""One GGUF file's header (metadata and tensor infos), parsed with every length checked first.

Why not gguf.GGUFReader: it walks the header in Python with two numpy views per string, so a
Qwen3 file's 151,936 tokens and 151,387 merges take seconds to open (measured in
tests/test_gguf_read.py), and it trusts every length: an array claiming 2^60 entries loops for ever,
a short file fails with an IndexError deep inside numpy. Here each length is checked against the
bytes the file holds and against fixed caps before anything is allocated or looped over, arrays of
strings are stepped over (their bytes kept, decoded only when asked), and every problem is one
ModelError naming the file. The tests check this parser against GGUFReader on the files they write.

Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 kv count; kv
pairs (string key, u32 type, value); tensor infos (string name, u32 n_dims, u64 ne[n_dims] with
ne0 the fastest-varying, u32 ggml type, u64 offset from the data start); padding to the alignment
(general.alignment, default 32); the tensors' data.
"""
from __future__ import annotations

import mmap
import os
import struct
from itertools import repeat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as GT

from ...protocol.errors import ModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
# Caps on what a header may claim, each far beyond any released model (Qwen3: ~450 kv and tensor
# entries, 151,936 tokens; DeepSeek-V3: ~1,100 tensors; the largest chat templates ~100 KB).
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_STRING = 16 << 20        # one metadata string
MAX_ARRAY = 1 << 24          # entries of one array
MAX_STRINGS = 1 << 23        # strings in all arrays together: bounds the time the walk takes
MAX_STRING_BYTES = 1 << 30  # all the strings of one array
MAX_NAME = 256               # a tensor name (llama.cpp's GGML_MAX_NAME is 64)
MAX_DIMS = 4                 # GGML_MAX_DIMS

# GGUF value types: struct format of the scalars (8 string, 9 array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class Strings:
    """An array of strings as the file holds it (u64 length, bytes; repeated), decoded on demand."""

    def __init__(self, blob: bytes, count: int, path: Path, key: str):
        self.blob, self.count, self.path, self.key = blob, count, path, key
        self._list: list[str] | None = None

    def __len__(self) -> int:
        return self.count

    def decode(self) -> list[str]:
        if self._list is None:
            out, off, blob = [], 0, self.blob
            unpack = struct.Struct("<Q").unpack_from
            try:
                for _ in range(self.count):
                    (n,) = unpack(blob, off)
                    out.append(blob[off + 8:off + 8 + n].decode("utf-8"))
                    off += 8 + n
            except UnicodeDecodeError:
                raise ModelError(self.path, f"metadata '{self.key}' holds a string that is not UTF-8") from None
            self._list = out
        return self._list


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GT
    ne: tuple[int, ...]      # GGUF's order: ne0 (a row's length) first
    start: int               # absolute byte offset in its file
    nbytes: int
    path: Path

    @property
    def shape(self) -> tuple[int, ...]:
        """torch's order: the outermost dimension first, a row last."""
        return tuple(reversed(self.ne))

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return self.ne[0] // block * size

    @property
    def rows(self) -> int:
        return self.nbytes // self.row_bytes if self.row_bytes else 0


class Header:
    """What one .gguf file says about itself: version, metadata (key -> value; arrays of strings as
    Strings, other arrays as lists), the tensors (name -> TensorInfo), where the data starts."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise ModelError(self.path, f"cannot be opened: {e.strerror or e}") from None
        try:
            self.size = os.fstat(fd).st_size
            if self.size < 24:
                raise ModelError(self.path, f"is truncated: {self.size} bytes is shorter than a GGUF header")
            # a read-only mapping of the file; only the header's pages are touched, and it is closed
            # before this returns (the tensors are read with positional reads: engine/files/gguf/reader.py)
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
                self._parse(mm)
        finally:
            os.close(fd)

    # ---- parsing ---------------------------------------------------------------------------------
    def _need(self, off: int, n: int, what: str) -> None:
        if n < 0 or off + n > self.size:
            raise ModelError(self.path, f"is truncated or corrupt: {what} at byte {off:,} needs {n:,} bytes, "
                             f"and the file holds {self.size:,}")

    def _u(self, mm, off: int, fmt: str, what: str) -> tuple[int, int]:
        n = struct.calcsize("<" + fmt)
        self._need(off, n, what)
        return struct.unpack_from("<" + fmt, mm, off)[0], off + n

    def _str(self, mm, off: int, what: str, cap: int) -> tuple[str, int]:
        n, off = self._u(mm, off, "Q", what)
        if n > cap:
            raise ModelError(self.path, f"is corrupt: {what} at byte {off - 8:,} claims {n:,} bytes "
                             f"(the most Mixdesk accepts is {cap:,})")
        self._need(off, n, what)
        try:
            return bytes(mm[off:off + n]).decode("utf-8"), off + n
        except UnicodeDecodeError:
            raise ModelError(self.path, f"is corrupt: {what} at byte {off:,} is not UTF-8") from None

    def _parse(self, mm) -> None:
        if mm[:4] != MAGIC:
            raise ModelError(self.path, f"is not a GGUF file (it starts with {bytes(mm[:4])!r}, not b'GGUF')")
        version = struct.unpack_from("<I", mm, 4)[0]
        if version not in VERSIONS:
            if version & 0xFFFF == 0 and (version >> 16) in (2, 3):
                raise ModelError(self.path, "is a big-endian GGUF file; Mixdesk reads little-endian GGUF files")
            old = ", from before August 2023 (convert the model again)" if version == 1 else ""
            raise ModelError(self.path, f"is GGUF version {version}{old}; Mixdesk reads GGUF versions 2 and 3")
        self.version = version
        n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        if n_kv > MAX_KV:
            raise ModelError(self.path, f"is corrupt: it claims {n_kv:,} metadata entries (at most {MAX_KV:,})")
        if n_tensors > MAX_TENSORS:
            raise ModelError(self.path, f"is corrupt: it claims {n_tensors:,} tensors (at most {MAX_TENSORS:,})")
        off = 24
        self.metadata: dict = {}
        self.types: dict[str, int] = {}  # key -> GGUF value type (arrays: 9)
        self._strings_left = MAX_STRINGS
        for _ in range(n_kv):
            key, off = self._str(mm, off, "a metadata key", MAX_NAME * 4)
            if key in self.metadata:
                raise ModelError(self.path, f"is corrupt: metadata '{key}' appears twice")
            vtype, off = self._u(mm, off, "I", f"the type of metadata '{key}'")
            self.metadata[key], off = self._value(mm, off, vtype, key)
            self.types[key] = vtype
        self.alignment = self.metadata.get("general.alignment", 32)
        if self.types.get("general.alignment", 4) != 4 or not isinstance(self.alignment, int) or \
                self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ModelError(self.path, f"is corrupt: general.alignment is {self.alignment!r}, not a power of two")
        infos = []
        for _ in range(n_tensors):
            name, off = self._str(mm, off, "a tensor name", MAX_NAME)
            n_dims, off = self._u(mm, off, "I", f"tensor '{name}'")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelError(self.path, f"is corrupt: tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS})")
            self._need(off, 8 * n_dims + 12, f"tensor '{name}'")
            ne = struct.unpack_from(f"<{n_dims}Q", mm, off)
            qcode, rel = struct.unpack_from("<IQ", mm, off + 8 * n_dims)
            off += 8 * n_dims + 12
            infos.append((name, ne, qcode, rel))
        self.data_start = off + (-off) % self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, qcode, rel in infos:
            self.tensors[name] = self._tensor(name, ne, qcode, rel)
        self._check_overlaps()

    def _value(self, mm, off: int, vtype: int, key: str):
        if vtype in SCALARS:
            v, off = self._u(mm, off, SCALARS[vtype], f"metadata '{key}'")
            if vtype == 6:  # float32: the shortest decimal that rounds to it (1e-05, not 9.99999974e-06),
                v = float(str(np.float32(v)))  # which is what the converter was given
            return v, off
        if vtype == STRING:
            return self._str(mm, off, f"metadata '{key}'", MAX_STRING)
        if vtype != ARRAY:
            raise ModelError(self.path, f"is corrupt: metadata '{key}' has the unknown value type {vtype}")
        itype, off = self._u(mm, off, "I", f"metadata '{key}'")
        count, off = self._u(mm, off, "Q", f"metadata '{key}'")
        if count > MAX_ARRAY:
            raise ModelError(self.path, f"is corrupt: metadata '{key}' claims an array of {count:,} entries "
                             f"(the most Mixdesk accepts is {MAX_ARRAY:,})")
        if itype in SCALARS:
            fmt = SCALARS[itype]
            n = count * struct.calcsize("<" + fmt)
            self._need(off, n, f"metadata '{key}'")
            return list(struct.unpack_from(f"<{count}{fmt}", mm, off)), off + n
        if itype == ARRAY:
            raise ModelError(self.path, f"metadata '{key}' is an array of arrays, which GGUF readers do not support")
        if itype != STRING:
            raise ModelError(self.path, f"is corrupt: metadata '{key}' is an array of the unknown type {itype}")
        self._strings_left -= count
        if self._strings_left < 0 or count * 8 > self.size - off:
            raise ModelError(self.path, f"is corrupt: metadata '{key}' claims {count:,} strings, more than "
                             "the file can hold" if count * 8 > self.size - off else
                             f"is corrupt: its metadata holds more than {MAX_STRINGS:,} strings")
        start, unpack = off, struct.Struct("<Q").unpack_from
        try:  # step over each string: the only per-entry loop of the parse, kept to two operations
            for _ in repeat(None, count):
                off += 8 + unpack(mm, off)[0]
        except struct.error:  # a length ran past the end of the file
            off = self.size + 1
        if off > self.size:
            raise ModelError(self.path, f"is truncated or corrupt: the strings of metadata '{key}' (from byte "
                             f"{start:,}) run past the end of the file ({self.size:,} bytes)")
        if off - start > MAX_STRING_BYTES:
            raise ModelError(self.path, f"is corrupt: the strings of metadata '{key}' take {off - start:,} bytes "
                             f"(the most Mixdesk accepts is {MAX_STRING_BYTES:,})")
        return Strings(bytes(mm[start:off]), count, self.path, key), off

    def _tensor(self, name: str, ne: tuple, qcode: int, rel: int) -> TensorInfo:
        try:
            qtype = GT(qcode)
        except ValueError:
            raise ModelError(self.path, f"tensor '{name}' has the unknown GGML type {qcode}") from None
        if qtype not in GGML_QUANT_SIZES:
            raise ModelError(self.path, f"tensor '{name}' has the GGML type {qtype.name}, which has no known size")
        block, size = GGML_QUANT_SIZES[qtype]
        if any(n == 0 for n in ne) or ne[0] % block:
            raise ModelError(self.path, f"is corrupt: tensor '{name}' has dimensions {list(ne)}; its rows must be "
                             f"whole {qtype.name} blocks of {block}")
        rows = 1
        for n in ne[1:]:
            rows *= n
        nbytes = rows * (ne[0] // block) * size
        if rel % self.alignment:
            raise ModelError(self.path, f"is corrupt: tensor '{name}' starts at offset {rel:,}, not a multiple of "
                             f"the alignment {self.alignment}")
        start = self.data_start + rel
        if start + nbytes > self.size:
            raise ModelError(self.path, f"is truncated: tensor '{name}' lies at bytes {start:,} to {start + nbytes:,} "
                             f"and the file holds {self.size:,}")
        if name in self.tensors:
            raise ModelError(self.path, f"is corrupt: tensor '{name}' appears twice")
        return TensorInfo(name, qtype, tuple(ne), start, nbytes, self.path)

    def _check_overlaps(self) -> None:
        spans = sorted((t.start, t.start + t.nbytes, t.name) for t in self.tensors.values())
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise ModelError(self.path, f"is corrupt: tensors '{an}' and '{bn}' overlap in the file")

    def get(self, key: str, default=None):
        v = self.metadata.get(key, default)
        return v.decode() if isinstance(v, Strings) else v
