"""Conversations in SQLite (WAL): every completed message is committed at once, and a reply is
saved while it streams, so a crash or a kill loses at most the last second of a reply.

The store never loses a reply and never stops the window:
- a write that finds the database locked (another program holds it) is retried with backoff for
  a fraction of a second; if it is still locked, or the disk is full, it waits in a pending queue,
  in order, and the reads see it (an overlay), until `flush` writes it (the window calls it every
  second, and it keeps trying until it lands);
- what waits is kept in a journal (app/store/journal.py) beside the database, or, when that disk is
  full, in the user's state or cache folder; the next start finds it there, replays what it can and
  keeps the rest, and removes it only once all of it is committed;
- a file that is not a database, or fails SQLite's quick check, is moved aside as
  `chats.sqlite3.corrupt-<date>` and a fresh one starts; a full disk or an I/O error is no damage:
  the database is read as it is and writes wait;
- a folder it cannot write gets an in-memory store for the session;
- a damaged page met later is reported, and the read returns what it can;
- text SQLite cannot store (a lone UTF-16 surrogate) is repaired before it is written, and any
  other error on a store path is caught and reported: nothing here raises into the window.
Each of these leaves one message in `notices` for the window to show.

No Qt here: the store is plain sqlite3, used from the GUI thread.
"""
from __future__ import annotations

import datetime
import os
import sqlite3
import time
from pathlib import Path

from . import export as store_export
from .pending import PendingWrites
from .errors import holding_notice, is_lock, is_storage, never_raises
from .journal import Journal, Pending, default_fallbacks
from .overlay import (ADD_MSG, DELETE, NEW_CONV, PROMPT, PURGE_CONVS, PURGE_MSGS, RENAME, SETTINGS,
                            TOUCH, TRUNCATE, UNDELETE, UPDATE_MSG, UPDATE_MSG_META, Conversation, Message, Overlay,
                            clean, conversation_columns, create_schema, dumps_meta,
                            load_meta)

__all__ = ["Conversation", "Message", "Store"]


class Store(PendingWrites):
    """The chats (see the module's docstring); its waiting writes' methods are app/store/pending.py's."""

    def __init__(self, path: str | Path, fallback_dirs: list[str | Path] | None = None):
        """`fallback_dirs`: where waiting writes go when the data folder's disk is full (default:
        the user's state, then cache folder; tests pass their own)."""
        self.path = Path(path)
        self.notices: list[str] = []  # messages for the user (the window shows and clears them)
        self.pending: list[Pending] = []  # writes waiting for a lock to clear or for disk space, in order
        self.overlay = Overlay(self.conversation, self.messages, self._conversation_of)  # what reads see of `pending`
        self._said: set[str] = set()  # notices given once per problem
        self._told = ""  # why writes wait, as last said: "locked", "full", "other" ("" when nothing waits)
        self._error: Exception | None = None  # the last error that made a write wait
        self._seq = 0  # the last sequence number given to a waiting write (continues the journal's)
        self._changes = self._kept = 0  # changes to `pending`, and how many of them the journal holds
        self._kept_at = 0.0
        self._quiet_until = 0.0  # see store_pending.QUIET_S
        self._kept_in: Path | None = None  # where the journal's complete copy is, None if nowhere
        self._on_disk = False  # a journal copy may exist (to remove once everything landed)
        self._why_not = ""  # why the last journal save found no place
        self._schema = False
        self._exclusive = False
        self._unopened = False  # no database file yet and no room to make one: reads see the overlay only
        self.in_memory = False
        self.journal = Journal(self.path, default_fallbacks() if fallback_dirs is None else list(fallback_dirs))
        try:
            self._start()
            self._replay()
        except Exception as e:  # never a window without a store
            self.say("start", f"The chat store could not start normally ({type(e).__name__}: {e}).")
            if not hasattr(self, "db"):
                self._memory(str(e))

    def _start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(self.path.parent, os.W_OK):
                raise PermissionError("read-only")
            self._open(str(self.path))
        except sqlite3.DatabaseError as e:
            msg = str(e).lower()
            if is_storage(e):
                # A full disk is no damage. SQLite cannot create the -shm file WAL readers share, so the
                # database is opened in exclusive mode (its WAL index in memory): read as it is, written
                # once there is room; flush reopens it shared afterwards.
                try:
                    self._open(str(self.path), exclusive=True)
                except sqlite3.Error as e2:
                    if not (is_storage(e2) and self._no_file()):
                        self._memory(str(e2))
                        return
                    # nothing to read yet: an empty database stands in, every write waits (and is kept
                    # in the journal), and flush makes the file once there is room
                    self._error, self._unopened = e2, True
                    self._open(":memory:")
            elif is_lock(e) or "unable to open" in msg or "readonly" in msg or "read-only" in msg:
                self._memory(str(e))
            else:
                try:
                    self._move_aside(e)
                except (OSError, sqlite3.Error) as e2:
                    self._memory(str(e2))
        except OSError as e:
            self._memory(e.strerror or str(e))

    def _replay(self) -> None:
        """Writes a previous session could not make (locked, disk full), from the journal's copies."""
        if self.in_memory:
            return  # its journal, if any, stays where it is for a session that can write the database
        try:
            applied = self.db.execute("SELECT seq FROM journal_applied WHERE id=0").fetchone()
        except sqlite3.Error:  # no such table: a database of the previous version, where none was recorded
            applied = None
        found = self.journal.load()
        self.notices += found.problems
        writes, self._seq = found.to_replay(applied[0] if applied else 0)
        for w in writes:
            self.pending.append(w)
            self.overlay.apply(w.sql, w.args)
        self._on_disk = bool(found.found)
        self._kept_in = found.newest
        self._changes = self._kept = 1
        if found.legacy or len(found.found) > 1:
            self._changes += 1  # one complete copy, numbered, in one place (the next save)
        if self.flush():
            if writes:
                self.notices.append(f"{len(writes)} change(s) an earlier session could not save were written to "
                                    "the chat database.")
        elif self.pending:  # else nothing is said until a write has to wait
            self._hold(self._error)

    def _no_file(self) -> bool:
        try:
            return self.path.stat().st_size == 0  # SQLite's failed open may leave an empty file
        except OSError:
            return True

    def _reopen(self) -> bool:
        """The database file, opened again: shared if it can be, else exclusive (a full disk); True if
        either. An exclusive connection is closed first: its lock would refuse the new one."""
        try:
            self.db.close()
        except sqlite3.Error:
            pass
        for exclusive in (False, True):
            try:
                self._open(str(self.path), exclusive=exclusive)
                self._unopened = False
                return True
            except sqlite3.Error as e:
                self._error = e
        self._unopened = True  # writes wait until the file opens
        self._open(":memory:")
        return False

    def _open(self, where: str, exclusive: bool = False) -> None:
        db = sqlite3.connect(where, isolation_level=None, timeout=0.0)  # autocommit; never block here
        try:
            if exclusive:  # before WAL is first used: then SQLite never needs the -shm file
                db.execute("PRAGMA locking_mode=EXCLUSIVE")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick check: {check}")
            try:
                create_schema(db)
                self._schema = True
            except sqlite3.Error as e:
                if not (is_storage(e) or is_lock(e)):
                    raise
                self._schema = False  # a new table on a full disk: flush creates it once there is room
        except BaseException:
            db.close()
            raise
        self.db = db
        self._exclusive = exclusive
        self._conv_cols = conversation_columns(self._read("PRAGMA table_info(conversations)"))

    def _move_aside(self, error: Exception) -> None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                p.replace(Path(str(aside) + suffix))
        self.notices.append(f"The chat database was damaged ({error}); it was moved aside to {aside.name} "
                            "and a fresh one was started.")
        self._open(str(self.path))

    def _memory(self, why: str) -> None:
        self.in_memory = True
        self.notices.append(f"Chats cannot be saved: the data folder {self.path.parent} cannot be written "
                            f"({why}). This session's chats are kept in memory only.")
        self._open(":memory:")

    def say(self, key: str, text: str) -> None:
        """A notice, once per problem (`key`): one met again says nothing new."""
        if key not in self._said:
            self._said.add(key)
            self.notices.append(text)

    @property
    def holding(self) -> str | None:
        """While writes wait: one line on why and where they are kept (for a lasting status); else None."""
        return holding_notice(self._told, self._kept_in) if self.pending else None

    def close(self) -> bool:
        """Write what waits, or keep it in the journal for the next start; False if some of it could be
        kept nowhere (its notice says so)."""
        try:
            if not self.flush() and not self.in_memory:
                self._keep(force=True)
                if self._kept != self._changes:
                    self.notices.append(f"{len(self.pending)} unsaved change(s) could not be kept anywhere "
                                        f"({self._why_not}): they are lost when Mixdesk closes.")
                    return False
            return True
        except Exception as e:
            self.say("close", f"The chat store could not close cleanly ({type(e).__name__}: {e}).")
            return False
        finally:
            try:
                self.db.close()
            except Exception:
                pass

    def _next_id(self, table: str, overlay: dict) -> int:
        top = self._read(f"SELECT max(id) FROM {table}", (), one=True)
        return max([(top[0] or 0) if top else 0, *overlay.keys()]) + 1

    def _read(self, sql: str, args: tuple = (), one: bool = False):
        try:
            cur = self.db.execute(sql, tuple(clean(a) for a in args))
            return cur.fetchone() if one else cur.fetchall()
        except Exception as e:
            if not is_lock(e):
                self.say(f"read:{e}", f"Part of the chat database could not be read ({e}); what could be read "
                         "is shown.")
            return None if one else []

    # ---- conversations ----
    @never_raises(lambda self, *a, **k: -1)
    def new_conversation(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        cid = self._next_id("conversations", self.overlay.convs)
        self._write(NEW_CONV, (cid, title, system_prompt, now, now))
        return cid

    @never_raises(lambda self, *a, **k: [])
    def conversations(self, search: str = "") -> list[Conversation]:
        q = f"SELECT {self._conv_cols} FROM conversations WHERE deleted IS NULL"
        args: tuple = ()
        if search:
            q += (" AND (title LIKE ? OR id IN (SELECT conversation FROM messages WHERE content LIKE ?))")
            args = (f"%{search}%", f"%{search}%")
        saved = {r[0]: Conversation(*r[:4], load_meta(r[4])) for r in self._read(q + " ORDER BY updated DESC", args)}
        return self.overlay.over_conversations(saved, search)

    @never_raises(lambda self, cid, *a, **k: Conversation(cid, "New chat", "", time.time()))
    def conversation(self, cid: int) -> Conversation:
        if cid in self.overlay.convs:
            return self.overlay.convs[cid]
        r = self._read(f"SELECT {self._conv_cols} FROM conversations WHERE id=?", (cid,), one=True)
        return Conversation(*r[:4], load_meta(r[4])) if r else Conversation(cid, "New chat", "", time.time())

    @never_raises(lambda self, *a, **k: None)
    def rename(self, cid: int, title: str) -> None:
        self._write(RENAME, (title, time.time(), cid))

    @never_raises(lambda self, *a, **k: None)
    def set_system_prompt(self, cid: int, text: str) -> None:
        self._write(PROMPT, (text, cid))

    @never_raises(lambda self, *a, **k: None)
    def set_settings(self, cid: int, settings: dict) -> None:
        """The chat's own generation settings (app/chat/settings.py reads and checks them); {}: the defaults."""
        self._write(SETTINGS, (dumps_meta(settings), cid))

    @never_raises(lambda self, *a, **k: None)
    def delete(self, cid: int) -> None:
        """Soft delete: `undelete` brings it back; `purge` removes it for good."""
        self._write(DELETE, (time.time(), cid))

    @never_raises(lambda self, *a, **k: None)
    def undelete(self, cid: int) -> None:
        self._write(UNDELETE, (cid,))

    @never_raises(lambda self, *a, **k: None)
    def purge(self) -> None:
        self._write(PURGE_MSGS)
        self._write(PURGE_CONVS)

    # ---- messages ----
    @never_raises(lambda self, *a, **k: -1)
    def add_message(self, cid: int, role: str, content: str, complete: bool = True, meta: dict | None = None) -> int:
        now = time.time()
        mid = self._next_id("messages", self.overlay.msgs)
        self._write(ADD_MSG, (mid, cid, role, content, int(complete), dumps_meta(meta or {}), now))
        self._write(TOUCH, (now, cid))
        return mid

    @never_raises(lambda self, *a, **k: None)
    def update_message(self, mid: int, content: str, complete: bool, meta: dict | None = None) -> None:
        if meta is None:
            self._write(UPDATE_MSG, (content, int(complete), mid))
        else:
            self._write(UPDATE_MSG_META, (content, int(complete), dumps_meta(meta), mid))

    def _conversation_of(self, mid: int) -> int:
        r = self._read("SELECT conversation FROM messages WHERE id=?", (mid,), one=True)
        return r[0] if r else -1

    @never_raises(lambda self, *a, **k: None)
    def delete_messages_from(self, cid: int, mid: int) -> None:
        """Drop message `mid` and everything after it (regenerate, edit-and-resend)."""
        self._write(TRUNCATE, (cid, mid))

    @never_raises(lambda self, *a, **k: [])
    def messages(self, cid: int) -> list[Message]:
        rows = self._read("SELECT id, role, content, complete, meta FROM messages WHERE conversation=? ORDER BY id",
                          (cid,))
        return self.overlay.over_messages(cid, {i: Message(i, r, c, bool(done), load_meta(m))
                                                for i, r, c, done, m in rows})

    # ---- export (app/store/export.py) ----
    @never_raises(lambda self, *a, **k: "")
    def export_markdown(self, cid: int) -> str:
        return store_export.markdown(self.conversation(cid), self.messages(cid))

    @never_raises(lambda self, *a, **k: "")
    def export_json(self, cid: int) -> str:
        return store_export.as_json(self.conversation(cid), self.messages(cid))
