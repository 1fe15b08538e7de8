"""The pending journal: the writes the chat database could not take yet (locked, disk full), kept in
a file so that a close, a kill or a restart loses none of them (see app/store/chat_store.py).

- A journal is never written over its only copy: the new one is written beside it, fsynced, then
  moved over it with os.replace, so a full disk or a crash mid-write leaves the previous one whole.
- It goes beside the database first; when that disk is full, to the fallback folders (the user's
  state folder, then cache folder), under a name keyed by the database's path. Once a complete copy
  lies in one place, copies elsewhere are removed: they hold nothing it does not.
- Each write carries a sequence number, and the database records, in the same transaction, the last
  one committed (Store.flush). A copy that outlived its writes (a kill right after they landed, a
  folder that could not be cleaned) is therefore harmless: its writes are skipped, never run twice.

No Qt here.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

VERSION = 2  # version 1 (before issue 25) was a bare list of [sql, args], without sequence numbers


class Pending(NamedTuple):
    seq: int
    sql: str
    args: tuple


class Loaded(NamedTuple):
    legacy: list[tuple[str, tuple]]  # from a version-1 copy: in order, no sequence numbers
    writes: list[Pending]  # every copy's, merged by sequence number
    found: list[Path]  # the copies read
    newest: Path | None  # the copy holding the latest write
    problems: list[str]  # one notice per copy that could not be read

    def to_replay(self, applied: int) -> tuple[list[Pending], int]:
        """The writes still to make, in order, after the database's last committed number `applied`;
        and the last number in use. A version-1 copy's writes have no numbers: they come first, and
        all are numbered after the highest seen."""
        seq = max([applied, *(w.seq for w in self.writes)])
        writes = [w for w in self.writes if w.seq > applied]  # the rest were committed before
        if self.legacy:
            both = list(self.legacy) + [(w.sql, w.args) for w in writes]
            writes = [Pending(seq + i + 1, sql, args) for i, (sql, args) in enumerate(both)]
            seq += len(writes)
        return writes, seq


def default_fallbacks() -> list[Path]:
    """The folders a journal goes to when the data folder's disk is full, named as app/main.py names
    the data folder (platformdirs, appauthor=False). Often on the same disk as the data folder, but
    not always (a data folder on its own partition, a roaming profile); each is only tried."""
    from platformdirs import user_cache_path, user_state_path

    return [user_state_path("mixdesk", appauthor=False) / "pending",
            user_cache_path("mixdesk", appauthor=False) / "pending"]


class Journal:
    def __init__(self, db_path: Path, fallback_dirs: list[str | Path]):
        self.db_path = db_path
        self.primary = db_path.with_name(db_path.name + ".pending.json")
        # one shared fallback folder serves every database (tests, a second profile): the name says which
        key = hashlib.sha256(os.path.abspath(db_path).encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.places = [self.primary] + [Path(d) / f"{db_path.name}-{key}.pending.json" for d in fallback_dirs]
        self.blocked: set[Path] = set()  # a copy that could not be read nor moved aside: never written over

    def load(self) -> Loaded:
        legacy, writes, found, problems = [], {}, [], []
        newest, top = None, -1
        for p in self.places:
            try:
                if not p.is_file():
                    continue
                raw = json.loads(p.read_text(encoding="utf-8"))
                if isinstance(raw, list):
                    legacy += [(str(sql), tuple(args)) for sql, args in raw]
                elif isinstance(raw, dict) and raw.get("version") == VERSION:
                    for seq, sql, args in raw["writes"]:
                        writes[int(seq)] = Pending(int(seq), str(sql), tuple(args))
                        if int(seq) > top:
                            newest, top = p, int(seq)
                else:
                    raise ValueError("not a Mixdesk journal this version knows")
                found.append(p)
                newest = newest or p
            except (OSError, ValueError, TypeError, KeyError) as e:
                problems.append(self._set_aside(p, e))
        return Loaded(legacy, [writes[s] for s in sorted(writes)], found, newest, problems)

    def _set_aside(self, p: Path, error: Exception) -> str:
        """An unreadable copy is kept under another name (someone may recover it by hand) so that
        nothing later writes over it."""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = p.with_name(f"{p.name}.unreadable-{stamp}")
        try:
            p.replace(aside)
        except OSError:
            self.blocked.add(p)
            return f"{p} could not be read ({error}); it was left in place."
        return f"{p} could not be read ({error}); it was kept as {aside.name}."

    def save(self, writes: list[Pending]) -> tuple[Path | None, list[str]]:
        """Write every waiting write to the first place that takes a complete copy; that place, or
        None with one reason per place tried."""
        # ensure_ascii (the default): a lone surrogate in meta becomes \ud800, which ASCII can hold;
        # default=str: a value sqlite3 will refuse anyway (flush drops it) must not stop the others being kept
        text = json.dumps({"version": VERSION, "database": str(self.db_path), "writes": [list(w) for w in writes]},
                          default=str)
        reasons = []
        for p in self.places:
            if p in self.blocked:
                continue
            try:
                _write_whole(p, text)
            except OSError as e:
                reasons.append(f"{p.parent}: {e.strerror or e}")
                continue
            for other in self.places:
                if other != p and other not in self.blocked:
                    try:
                        other.unlink(missing_ok=True)
                    except OSError:
                        pass  # harmless: its writes are in p too, or committed (see the module's note)
            return p, reasons
        return None, reasons

    def remove(self) -> None:
        """Every copy: called once all their writes are committed."""
        for p in self.places:
            if p not in self.blocked:
                try:
                    p.unlink(missing_ok=True)
                except OSError:
                    pass  # a stale copy is skipped at the next start (sequence numbers)


def _write_whole(path: Path, text: str) -> None:
    """A new file beside `path`, synced, then moved over it: `path` is the old copy or the new one,
    whole, whatever fails (a full disk, a kill, a power cut)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # chats: only this user reads them
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)  # a partial file would only take the space the next try needs
        except OSError:
            pass
        raise
    try:  # the rename itself survives a power cut once the folder is synced (POSIX; not on Windows)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
