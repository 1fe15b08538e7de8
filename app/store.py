"""Conversations in SQLite (WAL): every completed message is committed at once, and a reply is
saved while it streams, so a crash or a kill loses at most the last second of a reply.

No Qt here: the store is plain sqlite3, used from the GUI thread.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), isolation_level=None)  # autocommit: each write lands
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ---- conversations ----
    def new_conversation(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        cur = self.db.execute("INSERT INTO conversations(title, system_prompt, created, updated) VALUES (?,?,?,?)",
                              (title, system_prompt, now, now))
        return int(cur.lastrowid)

    def conversations(self, search: str = "") -> list[Conversation]:
        q = "SELECT id, title, system_prompt, updated FROM conversations WHERE deleted IS NULL"
        args: tuple = ()
        if search:
            q += (" AND (title LIKE ? OR id IN (SELECT conversation FROM messages WHERE content LIKE ?))")
            args = (f"%{search}%", f"%{search}%")
        return [Conversation(*r) for r in self.db.execute(q + " ORDER BY updated DESC", args)]

    def conversation(self, cid: int) -> Conversation:
        r = self.db.execute("SELECT id, title, system_prompt, updated FROM conversations WHERE id=?", (cid,)).fetchone()
        return Conversation(*r)

    def rename(self, cid: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title=?, updated=? WHERE id=?", (title, time.time(), cid))

    def set_system_prompt(self, cid: int, text: str) -> None:
        self.db.execute("UPDATE conversations SET system_prompt=? WHERE id=?", (text, cid))

    def delete(self, cid: int) -> None:
        """Soft delete: `undelete` brings it back; `purge` removes it for good."""
        self.db.execute("UPDATE conversations SET deleted=? WHERE id=?", (time.time(), cid))

    def undelete(self, cid: int) -> None:
        self.db.execute("UPDATE conversations SET deleted=NULL WHERE id=?", (cid,))

    def purge(self) -> None:
        self.db.execute("DELETE FROM messages WHERE conversation IN (SELECT id FROM conversations WHERE deleted IS NOT NULL)")
        self.db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL")

    # ---- messages ----
    def add_message(self, cid: int, role: str, content: str, complete: bool = True, meta: dict | None = None) -> int:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO messages(conversation, role, content, complete, meta, created) VALUES (?,?,?,?,?,?)",
            (cid, role, content, int(complete), json.dumps(meta or {}), now))
        self.db.execute("UPDATE conversations SET updated=? WHERE id=?", (now, cid))
        return int(cur.lastrowid)

    def update_message(self, mid: int, content: str, complete: bool, meta: dict | None = None) -> None:
        if meta is None:
            self.db.execute("UPDATE messages SET content=?, complete=? WHERE id=?", (content, int(complete), mid))
        else:
            self.db.execute("UPDATE messages SET content=?, complete=?, meta=? WHERE id=?",
                            (content, int(complete), json.dumps(meta), mid))

    def delete_messages_from(self, cid: int, mid: int) -> None:
        """Drop message `mid` and everything after it (regenerate, edit-and-resend)."""
        self.db.execute("DELETE FROM messages WHERE conversation=? AND id>=?", (cid, mid))

    def messages(self, cid: int) -> list[Message]:
        rows = self.db.execute("SELECT id, role, content, complete, meta FROM messages WHERE conversation=? ORDER BY id",
                               (cid,))
        return [Message(i, r, c, bool(done), json.loads(m)) for i, r, c, done, m in rows]

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
