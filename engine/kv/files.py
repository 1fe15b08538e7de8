"""KV caches kept on disk: a conversation's keys and values written to a file in the user cache folder
(after a reply ends, and as a cache is evicted from memory), so that a return to it after an eviction,
or after a restart, reads the file instead of the whole conversation again, when that measures faster.

One safetensors file per cache (never pickle), named after the model's path and the cache's key
(engine/kv/cache.py): the tensors as KVCache.tensors() names them (keys and values, a linear state and
its turn-boundary copies), and in its metadata the token ids they stand for, the model's fingerprint and
a CRC-32 of the data. A file is checked before anything of it is used: the model (its files' path,
sizes and times), what else makes its keys and values (the compute and cache dtypes, the text config:
dims and rope; the shapes and dtypes of the tensors against the cache's own), the tokens (a prompt
uses the longest prefix it shares with them), and the CRC. A damaged or stale file is ignored with one
log line, never loaded. The folder is bounded in size (LIMIT, or a share of the disk's free space),
the least recently used files going first, whichever model wrote them.

Writes run on a thread of their own (`save_later`) straight from the cache's memory, a row at a time
(nothing is copied whole); the cache's owner stops or waits for one before it writes that cache again.
Restores run on the engine thread, when the file's read rate (measured on the restores before, and as
this one goes) beats reading the tokens again at the prefill rate the telemetry knows."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..protocol.errors import ModelError
from ..files.safetensors_file import SafetensorsFile

log = logging.getLogger("mixdesk.kv")

FORMAT = "mixdesk-kv-1"
MIN_TOKENS = 256  # a cache holding fewer is not written: they are read again in about a second or less
LIMIT = 8 << 30  # bytes of cache files kept at most (every model's together) ...
DISK_SHARE = 0.1  # ... and at most this share of the disk's free space
DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.uint8: "U8",
               torch.int8: "I8"}
_CRC = b'"crc32":"'  # where the header's checksum goes, once the data after it is written


def folder() -> Path:
    """Where the files are: the user cache folder (platformdirs, as the profiles' folder)."""
    from platformdirs import user_cache_path

    return user_cache_path("mixdesk", appauthor=False) / "kv"


def fingerprint(ld) -> str:
    """What a loaded model's keys and values depend on, apart from where its experts are: its files
    (files/model_files.model_key: path, sizes, times), its compute and cache dtypes (an 8-bit cache's rows
    named by their layout too: engine/kv/int8.py), and its text config (dims, rope settings)."""
    from . import int8 as kv8
    from ..files.model_files import model_key

    config = json.dumps(ld.ckpt.config.get_text_config().to_dict(), sort_keys=True, default=str)
    parts = [FORMAT, model_key(Path(ld.ckpt.folder)), str(ld.model.dtype), str(ld.model.kv_dtype), config]
    if getattr(ld.model, "kv_bits", 16) == 8:
        parts.append(kv8.LAYOUT)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def disk_limit(root: Path) -> int:
    where = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    return int(min(LIMIT, DISK_SHARE * shutil.disk_usage(where).free))


@dataclass
class Stored:
    """One file of this model's: whose cache it holds (key), the tokens, its size."""
    path: Path
    key: str
    tokens: list[int]
    nbytes: int


class Declined(Exception):
    """Reading the file measures slower than reading its tokens again."""


class Damaged(Exception):
    pass


class SaveJob:
    """A file being written on its own thread: `stop` cancels it (the file stays as it was), `wait`
    lets it end."""

    def __init__(self, run: Callable[[threading.Event], None]):
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=run, args=(self.cancel,), name="mixdesk-kv-save", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.cancel.set()
        self.thread.join()

    def wait(self) -> None:
        self.thread.join()


class KVFiles:
    """One model's cache files (model: its path, resolved; fingerprint: fingerprint())."""

    def __init__(self, root: Path, model: str, fingerprint: str, limit: int | None = None,
                 min_tokens: int = MIN_TOKENS):
        self.root, self.model, self.fingerprint = Path(root), model, fingerprint
        self.limit = disk_limit(self.root) if limit is None else limit
        self.min_tokens = min_tokens
        self.read_bps = 0.0  # the read rate the last restore measured (0: none yet)
        self._index: dict[str, Stored] | None = None  # this model's files by key, once looked at
        self._lock = threading.Lock()
        self._jobs: list[SaveJob] = []

    @classmethod
    def for_model(cls, ld, root: Path | None = None) -> "KVFiles | None":
        try:
            return cls(root or folder(), str(Path(ld.ckpt.folder).resolve()), fingerprint(ld))
        except (OSError, AttributeError, TypeError, ValueError) as e:  # a convenience: the model serves without
            log.warning("KV caches are not kept on disk for this model: %s", e)
            return None

    def path_of(self, key: str) -> Path:
        return self.root / (hashlib.sha256(f"{self.model}\0{key}".encode()).hexdigest()[:32] + ".safetensors")

    # ---- what is there ----
    def find(self, key: str) -> Stored | None:
        with self._lock:
            return self._scan().get(key)

    def pooled(self) -> list[Stored]:
        """The files of pool caches (the server's, keyed "pool:..."), to match by prefix."""
        with self._lock:
            return [s for k, s in self._scan().items() if k.startswith("pool:")]

    def _scan(self) -> dict[str, Stored]:
        """This model's files, each header read and checked once (at the first look)."""
        if self._index is None:
            self._index = {}
            for path in sorted(self.root.glob("*.safetensors")) if self.root.is_dir() else ():
                stored = self._check(path)
                if stored is not None:
                    self._index[stored.key] = stored
        return self._index

    def _check(self, path: Path) -> Stored | None:
        try:
            f = SafetensorsFile(path)
            meta, f_size = f.metadata, path.stat().st_size
            f.close()
        except (ModelError, OSError) as e:
            self._ignore(path, str(e).removeprefix(f"{path}: "), drop=True)
            return None
        if meta.get("format") != FORMAT:
            self._ignore(path, "it is not a Mixdesk KV cache file", drop=False)
            return None
        if meta.get("model") != self.model:
            return None  # another model's
        if meta.get("fingerprint") != self.fingerprint:
            self._ignore(path, "it was made from another version of the model's files, or with another dtype or "
                         "config", drop=False)
            return None
        try:
            tokens, key = json.loads(meta["tokens"]), meta["key"]
            int(meta["crc32"], 16)
            if not (isinstance(tokens, list) and all(type(t) is int for t in tokens) and isinstance(key, str)):
                raise ValueError
        except (KeyError, ValueError, TypeError):
            self._ignore(path, "its metadata is damaged", drop=True)
            return None
        return Stored(path, key, tokens, f_size)

    def _ignore(self, path: Path, why: str, drop: bool) -> None:
        """One log line; a damaged file (no use to any model) goes, a stale one is left to be replaced."""
        log.warning("KV cache file %s ignored: %s", path, why)
        if drop:
            path.unlink(missing_ok=True)

    def _forget(self, path: Path) -> None:
        with self._lock:
            for k in [k for k, s in (self._index or {}).items() if s.path == path]:
                del self._index[k]

    # ---- reading ----
    def restore(self, stored: Stored, cache, shared: int, prefill_tok_s: float) -> bool:
        """Fill `cache` (empty) with the file, when that beats reading again the `shared` tokens it would
        save at prefill_tok_s (0: not measured yet: the file is read). True if the cache holds the file's
        tokens now; else the caller forgets what the cache holds. One log line either way."""
        if len(stored.tokens) > cache.ctx:
            log.info("KV cache file %s not used: its %s tokens are more than the context (%s)", stored.path,
                     f"{len(stored.tokens):,}", f"{cache.ctx:,}")
            return False
        again = shared / prefill_tok_s if prefill_tok_s > 0 else None
        rate = f"at {prefill_tok_s:,.0f} tok/s: {again:.1f} s" if again is not None else "(prefill rate not measured yet)"
        if again is not None and self.read_bps > 0 and stored.nbytes / self.read_bps > again:
            log.info("KV cache file %s not read: its %s at the %.0f MB/s measured would take %.1f s; reading "
                     "its %s tokens again %s", stored.path, _size(stored.nbytes), self.read_bps / 1e6,
                     stored.nbytes / self.read_bps, f"{shared:,}", rate)
            return False
        t0 = time.perf_counter()
        try:
            f = SafetensorsFile(stored.path)
            try:
                cache.from_tensors(stored.tokens, self._pieces(f, t0, again))
            finally:
                f.close()
        except Declined as e:
            log.info("KV cache file %s not read: %s; reading its %s tokens again %s", stored.path, e,
                     f"{shared:,}", rate)
            return False
        except (ModelError, OSError, ValueError, Damaged) as e:
            self._ignore(stored.path, str(e).removeprefix(f"{stored.path}: "), drop=True)
            self._forget(stored.path)
            return False
        seconds = max(time.perf_counter() - t0, 1e-6)
        self.read_bps = stored.nbytes / seconds
        try:
            os.utime(stored.path)  # the most recently used now (the folder's bound drops the least)
        except OSError:
            pass
        log.info("KV cache restored from %s: %s tokens (%s) in %.2f s at %.0f MB/s; reading its %s tokens "
                 "again %s", stored.path, f"{len(stored.tokens):,}", _size(stored.nbytes), seconds,
                 self.read_bps / 1e6, f"{shared:,}", rate)
        return True

    @staticmethod
    def _pieces(f: SafetensorsFile, t0: float, again: float | None):
        """The file's tensors in its order, the CRC checked at the end (Damaged), the read abandoned
        (Declined) once it measures slower than `again` seconds."""
        want = int(f.metadata["crc32"], 16)
        infos = sorted(f.tensors.items(), key=lambda kv: kv[1].start)
        total, done, crc = sum(i.nbytes for _, i in infos), 0, 0
        for name, info in infos:
            t = f.read(name)
            crc = zlib.crc32(t.view(torch.uint8).reshape(-1).numpy(), crc)
            done += info.nbytes
            spent = time.perf_counter() - t0
            if again is not None and done < total and spent > 0.05 and spent / done * total > again:
                raise Declined(f"it reads at {done / spent / 1e6:.0f} MB/s: {spent / done * total:.1f} s for its "
                               f"{_size(total)}")
            yield name, t
        if crc != want:
            raise Damaged("its data does not match its checksum (damaged)")

    # ---- writing ----
    def save_later(self, key: str, cache, done: Callable[[list[int]], None]) -> SaveJob:
        """Write the cache on a thread of its own; done(tokens written) there once it is written. The
        cache must not change until the job has ended (SaveJob.stop or wait)."""
        def run(cancel: threading.Event) -> None:
            tokens = self.save(key, cache, cancel)
            if tokens is not None:
                done(tokens)

        job = SaveJob(run)
        with self._lock:
            self._jobs = [j for j in self._jobs if j.thread.is_alive()] + [job]
        return job

    def wait(self) -> None:
        """Every write in progress ends (the model goes, the engine stops)."""
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for j in jobs:
            j.wait()

    def save(self, key: str, cache, cancel: threading.Event | None = None) -> list[int] | None:
        """Write what the cache holds to its file (a .tmp file renamed over it: a crash leaves the old
        one). The tokens written, or None when cancelled or it could not be written (one log line)."""
        tokens, tensors = list(cache.tokens), cache.tensors()
        path = self.path_of(key)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            header, crc_at = self._header(key, tokens, tensors)
            crc = 0
            with open(tmp, "wb") as out:
                out.write(header)
                for t in tensors.values():
                    for row in _contiguous(t):
                        if cancel is not None and cancel.is_set():
                            raise InterruptedError
                        b = row.cpu().view(torch.uint8).reshape(-1).numpy()
                        out.write(b)
                        crc = zlib.crc32(b, crc)
                out.seek(crc_at)
                out.write(f"{crc:08x}".encode())
            os.replace(tmp, path)
        except InterruptedError:
            tmp.unlink(missing_ok=True)
            return None
        except OSError as e:
            tmp.unlink(missing_ok=True)
            log.warning("KV cache file %s not written: %s", path, e.strerror or e)
            return None
        with self._lock:
            self._scan()[key] = Stored(path, key, tokens, path.stat().st_size)
        self.trim(keep=path)
        return tokens

    def _header(self, key: str, tokens: list[int], tensors: dict) -> tuple[bytes, int]:
        """The safetensors header (8-byte length, JSON padded to 8 bytes) with a blank CRC, and where
        in the file the CRC's 8 hex digits go."""
        entries, at = {}, 0
        for name, t in tensors.items():
            n = t.numel() * t.element_size()
            entries[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + n]}
            at += n
        meta = {"format": FORMAT, "model": self.model, "fingerprint": self.fingerprint, "key": key,
                "tokens": json.dumps(tokens, separators=(",", ":")), "crc32": "00000000"}
        body = json.dumps({"__metadata__": meta, **entries}, separators=(",", ":")).encode()
        body += b" " * (-len(body) % 8)
        return len(body).to_bytes(8, "little") + body, 8 + body.index(_CRC) + len(_CRC)

    def trim(self, keep: Path | None = None) -> None:
        """The folder within its limit, the least recently used files (any model's) going first; a
        write a crash left half done goes after an hour."""
        now, files = time.time(), []
        for p in self.root.glob("*"):
            try:
                st = p.stat()
            except OSError:
                continue
            if p.suffix == ".tmp" and now - st.st_mtime > 3600:
                p.unlink(missing_ok=True)
            elif p.suffix == ".safetensors":
                files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.limit:
                break
            if p != keep:
                p.unlink(missing_ok=True)
                self._forget(p)
                total -= size


def _contiguous(t: torch.Tensor):
    """t's bytes in order, as contiguous pieces (a cache's rows up to its tokens are one per head)."""
    if t.is_contiguous():
        yield t
    else:
        for s in t:
            yield from _contiguous(s)
