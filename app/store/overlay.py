"""What the chat store's reads see of the writes still waiting (app/store/chat_store.py): the overlay, and the
statements it knows (with the schema), the records the store returns and the text repair done
before a write.

A waiting write's effect is derived from its statement and arguments alone (Overlay.apply), so the
writes replayed from a journal at the next start show exactly as they did in the session that made
them, with the same ids: the window's ids stay valid, and every message keeps its place.

No Qt here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL, deleted REAL, settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL REFERENCES conversations(id),
    role TEXT NOT NULL, content TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1,
    meta TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE TABLE IF NOT EXISTS journal_applied (id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL);
"""
# a database made before per-chat settings (app/chat/settings.py) gets their column; its chats keep theirs
ADD_SETTINGS = "ALTER TABLE conversations ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'"
APPLIED = "INSERT OR REPLACE INTO journal_applied(id, seq) VALUES (0, ?)"  # the last journal write committed

# Every write the store makes.
NEW_CONV = "INSERT INTO conversations(id, title, system_prompt, created, updated) VALUES (?,?,?,?,?)"
RENAME = "UPDATE conversations SET title=?, updated=? WHERE id=?"
PROMPT = "UPDATE conversations SET system_prompt=? WHERE id=?"
SETTINGS = "UPDATE conversations SET settings=? WHERE id=?"
TOUCH = "UPDATE conversations SET updated=? WHERE id=?"
DELETE = "UPDATE conversations SET deleted=? WHERE id=?"
UNDELETE = "UPDATE conversations SET deleted=NULL WHERE id=?"
PURGE_MSGS = "DELETE FROM messages WHERE conversation IN (SELECT id FROM conversations WHERE deleted IS NOT NULL)"
PURGE_CONVS = "DELETE FROM conversations WHERE deleted IS NOT NULL"
ADD_MSG = "INSERT INTO messages(id, conversation, role, content, complete, meta, created) VALUES (?,?,?,?,?,?,?)"
UPDATE_MSG = "UPDATE messages SET content=?, complete=? WHERE id=?"
UPDATE_MSG_META = "UPDATE messages SET content=?, complete=?, meta=? WHERE id=?"
TRUNCATE = "DELETE FROM messages WHERE conversation=? AND id>=?"


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
    settings: dict = field(default_factory=dict)  # the chat's own generation settings (app/chat/settings.py)


class Overlay:
    """The reads' view of the waiting writes; `conversation`, `messages` and `conversation_of` are the
    store's reads (database and overlay so far), which an update of a saved message starts from."""

    def __init__(self, conversation: Callable[[int], Conversation], messages: Callable[[int], list[Message]],
                 conversation_of: Callable[[int], int]):
        self.conversation, self.messages, self.conversation_of = conversation, messages, conversation_of
        self.msgs: dict[int, tuple[int, Message]] = {}  # id -> (conversation, message)
        self.convs: dict[int, Conversation] = {}
        self.born: set[int] = set()  # conversations created by a waiting write (not in the database yet)
        self.hidden: dict[int, bool] = {}  # conversation -> deleted, by a waiting write
        self.gone: set[int] = set()  # message ids deleted by a waiting write

    def clear(self) -> None:
        for part in (self.msgs, self.convs, self.born, self.hidden, self.gone):
            part.clear()

    def apply(self, sql: str, args: tuple) -> None:
        """A statement of an older version is not shown (it is still written)."""
        if sql == NEW_CONV:
            cid, title, prompt, _, updated = args
            self.convs[cid] = Conversation(cid, title, prompt, updated)
            self.born.add(cid)
        elif sql == RENAME:
            title, updated, cid = args
            self.convs[cid] = replace(self.conversation(cid), title=title, updated=updated)
        elif sql == PROMPT:
            self.convs[args[1]] = replace(self.conversation(args[1]), system_prompt=args[0])
        elif sql == SETTINGS:
            self.convs[args[1]] = replace(self.conversation(args[1]), settings=load_meta(args[0]))
        elif sql == TOUCH:
            self.convs[args[1]] = replace(self.conversation(args[1]), updated=args[0])
        elif sql in (DELETE, UNDELETE):
            self.hidden[args[-1]] = sql == DELETE
        elif sql == ADD_MSG:
            mid, cid, role, content, complete, meta, _ = args
            self.msgs[mid] = (cid, Message(mid, role, content, bool(complete), load_meta(meta)))
        elif sql in (UPDATE_MSG, UPDATE_MSG_META):
            mid = args[-1]
            cid, old = self.msgs.get(mid) or (self.conversation_of(mid), None)
            old = old or next((m for m in self.messages(cid) if m.id == mid), None)
            if old is not None:  # else no such message: the UPDATE changes nothing either
                meta = load_meta(args[2]) if sql == UPDATE_MSG_META else old.meta
                self.msgs[mid] = (cid, replace(old, content=args[0], complete=bool(args[1]), meta=meta))
        elif sql == TRUNCATE:
            cid, mid = args
            self.gone.update(m.id for m in self.messages(cid) if m.id >= mid)

    def over_messages(self, cid: int, saved: dict[int, Message]) -> list[Message]:
        saved.update({i: m for i, (c, m) in self.msgs.items() if c == cid})
        return [saved[i] for i in sorted(saved) if i not in self.gone]

    def over_conversations(self, saved: dict[int, Conversation], search: str) -> list[Conversation]:
        s = clean(search).lower()

        def matches(c: Conversation) -> bool:
            return (not s or s in c.title.lower()
                    or any(k == c.id and s in m.content.lower() for k, m in self.msgs.values()))

        for c in self.convs.values():  # one deleted in the database stays out
            if c.id in saved or (c.id in self.born and matches(c)):
                saved[c.id] = c
        for cid, hidden in self.hidden.items():
            if hidden:
                saved.pop(cid, None)
            elif cid not in saved and matches(self.conversation(cid)):
                saved[cid] = self.conversation(cid)
        return sorted(saved.values(), key=lambda c: -c.updated)


def create_schema(db) -> None:
    """The tables, and the columns a database of an earlier version lacks (raises sqlite3.Error as
    executescript does: a full disk or a lock leaves it for the store's flush to try again)."""
    db.executescript(SCHEMA)
    if "settings" not in {row[1] for row in db.execute("PRAGMA table_info(conversations)")}:
        db.execute(ADD_SETTINGS)


def conversation_columns(table_info: list) -> str:
    """What the conversation reads select, from PRAGMA table_info(conversations): an old database
    whose settings column could not be added yet (locked, disk full) reads as having none."""
    has = any(row[1] == "settings" for row in table_info)
    return "id, title, system_prompt, updated, " + ("settings" if has else "'{}'")


def clean(value):
    """SQLite stores text as UTF-8, which cannot hold a lone UTF-16 surrogate (half a pair, from a
    clipboard or an emoji cut in two): sqlite3 raises UnicodeEncodeError and the message would be
    lost. A pair that is still whole is joined into its character; a lone half becomes U+FFFD, the
    mark every text view shows for "a character was lost here". The rest stays plain, readable,
    searchable text; an escape (surrogatepass bytes) would keep the half but store text no other
    program reads back, and the half is no character anyone could read."""
    if not isinstance(value, str):
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def dumps_meta(meta: dict) -> str:
    return json.dumps(meta, default=str)  # a value JSON has no type for (a Path, a numpy float) is kept as text


def load_meta(text: str) -> dict:
    try:
        meta = json.loads(text)
        return meta if isinstance(meta, dict) else {}
    except (TypeError, ValueError):
        return {}  # a damaged meta must not hide its message
