"""Conversations in SQLite (WAL): every completed message is committed at once, and a reply is
saved while it streams, so a crash or a kill loses at most the last second of a reply.

The store never loses a reply and never stops the window:
- a write that finds the database locked (another program holds it) is retried with backoff for
  a fraction of a second; if it is still locked, it waits in a pending queue, in order, and the
  reads see it (an overlay), until `flush` writes it (the window calls it every second);
- a file that is not a database, or fails SQLite's quick check, is moved aside as
  `chats.sqlite3.corrupt-<date>` and a fresh one starts;
- a folder it cannot write gets an in-memory store for the session;
- a damaged page met later is reported, and the read returns what it can.
Each of these leaves one message in `notices` for the window to show.

No Qt here: the store is plain sqlite3, used from the GUI thread.
"""
from __future__ import annotations

import datetime
import json
import os
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path

RETRY_S = (0.02, 0.05, 0.1, 0.2)  # backoff while locked: at most ~0.4 s on the GUI thread per write
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL, deleted REAL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL REFERENCES conversations(id),
    role TEXT NOT NULL, content TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1,
    meta TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
"""


@dataclass
class Message:
    id: int
    role: str
    content: str
    complete: bool
    meta: dict


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    updated: float


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.notices: list[str] = []  # messages for the user (the window shows and clears them)
        self.pending: list[tuple[str, tuple]] = []  # writes waiting for a lock to clear, in order
        self._msgs: dict[int, tuple[int, Message]] = {}  # overlay of pending writes: id -> (conversation, message)
        self._convs: dict[int, Conversation] = {}
        self._gone: set[int] = set()  # message ids deleted by a pending write
        self._told_locked = False
        self.in_memory = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(self.path.parent, os.W_OK):
                raise PermissionError("read-only")
            self._open(str(self.path))
        except sqlite3.DatabaseError as e:
            msg = str(e).lower()
            if _is_lock(e) or "unable to open" in msg or "readonly" in msg or "read-only" in msg:
                self._memory(str(e))
            else:
                try:
                    self._move_aside(e)
                except (OSError, sqlite3.Error) as e2:
                    self._memory(str(e2))
        except OSError as e:
            self._memory(e.strerror or str(e))
        self._replay()

    @property
    def _journal(self) -> Path:
        return self.path.with_name(self.path.name + ".pending.json")

    def _replay(self) -> None:
        """Writes a previous session could not make (the database stayed locked until it closed)."""
        if self.in_memory or not self._journal.exists():
            return
        try:
            self.pending = [(str(sql), tuple(args)) for sql, args in json.loads(self._journal.read_text())] + self.pending
        except (OSError, ValueError, TypeError):
            self.notices.append(f"{self._journal.name} could not be read; it was left in place.")
            return
        if self.flush():
            self._journal.unlink(missing_ok=True)

    def _open(self, where: str) -> None:
        self.db = sqlite3.connect(where, isolation_level=None, timeout=0.0)  # autocommit; never block here
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick check: {check}")
            self.db.executescript(SCHEMA)
        except BaseException:
            self.db.close()
            raise

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

    def close(self) -> None:
        if not self.flush() and not self.in_memory:
            try:  # still locked: kept for the next start (see _replay)
                self._journal.write_text(json.dumps(self.pending))
            except OSError:
                pass
        elif self._journal.exists():
            self._journal.unlink(missing_ok=True)
        self.db.close()

    # ---- writes that survive a lock ----
    def _write(self, sql: str, args: tuple = ()) -> bool:
        """Run one write; True if it landed, False if it waits in the pending queue."""
        if self.pending and not self.flush():
            self.pending.append((sql, args))
            return False
        for delay in (0.0, *RETRY_S):
            if delay:
                time.sleep(delay)
            try:
                self.db.execute(sql, args)
                return True
            except sqlite3.Error as e:
                error = e
                if not _is_lock(e):
                    break  # disk full, I/O error: no use retrying now; the queue tries again later
        self.pending.append((sql, args))
        if not self._told_locked:
            self._told_locked = True
            why = "is locked by another program" if _is_lock(error) else f"cannot be written now ({error})"
            self.notices.append(f"The chat database {why}: your messages stay here and are saved as soon as "
                                "it can be written.")
        return False

    def flush(self) -> bool:
        """Write what waits (in order); True when nothing is left."""
        while self.pending:
            sql, args = self.pending[0]
            try:
                self.db.execute(sql, args)
            except sqlite3.IntegrityError as e:  # it can never land (an id taken since): drop it, say so
                self.notices.append(f"A saved change could not be applied ({e}) and was dropped.")
            except sqlite3.Error:
                return False
            self.pending.pop(0)
        if self._msgs or self._convs or self._gone:
            self._msgs.clear()
            self._convs.clear()
            self._gone.clear()
            if self._told_locked:
                self.notices.append("The chat database is free again: everything was saved.")
                self._told_locked = False
        return True

    def _next_id(self, table: str, overlay: dict) -> int:
        top = self._read(f"SELECT max(id) FROM {table}", (), one=True)
        return max([(top[0] or 0) if top else 0, *overlay.keys()]) + 1

    def _read(self, sql: str, args: tuple = (), one: bool = False):
        try:
            cur = self.db.execute(sql, args)
            return cur.fetchone() if one else cur.fetchall()
        except sqlite3.DatabaseError as e:
            if _is_lock(e):
                return None if one else []
            self.notices.append(f"Part of the chat database could not be read ({e}); what could be read is shown.")
            return None if one else []

    # ---- conversations ----
    def new_conversation(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        cid = self._next_id("conversations", self._convs)
        if not self._write("INSERT INTO conversations(id, title, system_prompt, created, updated) VALUES (?,?,?,?,?)",
                           (cid, title, system_prompt, now, now)):
            self._convs[cid] = Conversation(cid, title, system_prompt, now)
        return cid

    def conversations(self, search: str = "") -> list[Conversation]:
        q = "SELECT id, title, system_prompt, updated FROM conversations WHERE deleted IS NULL"
        args: tuple = ()
        if search:
            q += (" AND (title LIKE ? OR id IN (SELECT conversation FROM messages WHERE content LIKE ?))")
            args = (f"%{search}%", f"%{search}%")
        rows = {r[0]: Conversation(*r) for r in self._read(q + " ORDER BY updated DESC", args)}
        rows.update({c.id: c for c in self._convs.values() if not search or search.lower() in c.title.lower()})
        return sorted(rows.values(), key=lambda c: -c.updated)

    def conversation(self, cid: int) -> Conversation:
        if cid in self._convs:
            return self._convs[cid]
        r = self._read("SELECT id, title, system_prompt, updated FROM conversations WHERE id=?", (cid,), one=True)
        return Conversation(*r) if r else Conversation(cid, "New chat", "", time.time())

    def rename(self, cid: int, title: str) -> None:
        if not self._write("UPDATE conversations SET title=?, updated=? WHERE id=?", (title, time.time(), cid)):
            self._convs[cid] = replace(self.conversation(cid), title=title)

    def set_system_prompt(self, cid: int, text: str) -> None:
        if not self._write("UPDATE conversations SET system_prompt=? WHERE id=?", (text, cid)):
            self._convs[cid] = replace(self.conversation(cid), system_prompt=text)

    def delete(self, cid: int) -> None:
        """Soft delete: `undelete` brings it back; `purge` removes it for good."""
        self._write("UPDATE conversations SET deleted=? WHERE id=?", (time.time(), cid))

    def undelete(self, cid: int) -> None:
        self._write("UPDATE conversations SET deleted=NULL WHERE id=?", (cid,))

    def purge(self) -> None:
        self._write("DELETE FROM messages WHERE conversation IN (SELECT id FROM conversations WHERE deleted IS NOT NULL)")
        self._write("DELETE FROM conversations WHERE deleted IS NOT NULL")

    # ---- messages ----
    def add_message(self, cid: int, role: str, content: str, complete: bool = True, meta: dict | None = None) -> int:
        now = time.time()
        mid = self._next_id("messages", self._msgs)
        if not self._write("INSERT INTO messages(id, conversation, role, content, complete, meta, created) "
                           "VALUES (?,?,?,?,?,?,?)", (mid, cid, role, content, int(complete), json.dumps(meta or {}), now)):
            self._msgs[mid] = (cid, Message(mid, role, content, complete, meta or {}))
        self._write("UPDATE conversations SET updated=? WHERE id=?", (now, cid))
        return mid

    def update_message(self, mid: int, content: str, complete: bool, meta: dict | None = None) -> None:
        if meta is None:
            landed = self._write("UPDATE messages SET content=?, complete=? WHERE id=?", (content, int(complete), mid))
        else:
            landed = self._write("UPDATE messages SET content=?, complete=?, meta=? WHERE id=?",
                                 (content, int(complete), json.dumps(meta), mid))
        if not landed:
            cid, old = self._msgs.get(mid) or (self._conversation_of(mid), None)
            old = old or next((m for m in self.messages(cid) if m.id == mid), Message(mid, "assistant", "", False, {}))
            self._msgs[mid] = (cid, replace(old, content=content, complete=complete,
                                            meta=old.meta if meta is None else meta))

    def _conversation_of(self, mid: int) -> int:
        r = self._read("SELECT conversation FROM messages WHERE id=?", (mid,), one=True)
        return r[0] if r else -1

    def delete_messages_from(self, cid: int, mid: int) -> None:
        """Drop message `mid` and everything after it (regenerate, edit-and-resend)."""
        if not self._write("DELETE FROM messages WHERE conversation=? AND id>=?", (cid, mid)):
            self._gone.update(m.id for m in self.messages(cid) if m.id >= mid)

    def messages(self, cid: int) -> list[Message]:
        rows = self._read("SELECT id, role, content, complete, meta FROM messages WHERE conversation=? ORDER BY id",
                          (cid,))
        out = {i: Message(i, r, c, bool(done), json.loads(m)) for i, r, c, done, m in rows}
        out.update({i: m for i, (c, m) in self._msgs.items() if c == cid})
        return [out[i] for i in sorted(out) if i not in self._gone]
    # ---- export ----
    def export_markdown(self, cid: int) -> str:
        c = self.conversation(cid)
        out = [f"# {c.title}\n"]
        if c.system_prompt:
            out.append(f"_System:_ {c.system_prompt}\n")
        for m in self.messages(cid):
            out.append(f"**{m.role}**\n\n{m.content}\n")
        return "\n".join(out)

    def export_json(self, cid: int) -> str:
        c = self.conversation(cid)
        return json.dumps({"title": c.title, "system_prompt": c.system_prompt,
                           "messages": [{"role": m.role, "content": m.content, "complete": m.complete, **m.meta}
                                        for m in self.messages(cid)]}, indent=2, ensure_ascii=False)


def _is_lock(e: Exception) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text
