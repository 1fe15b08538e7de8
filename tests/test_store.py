"""The chat store on a full disk, with text SQLite cannot take, and against errors (issue 25).

The full-disk tests fill a real tmpfs, so they need mount (root; CI runs as root); elsewhere they
are skipped with the reason."""
import errno
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.store.chat_store import Store

# The small disk: SQLite needs its database (a few 4 KB pages), the -shm file (32 KB) and a WAL
# frame (4 KB + 24 B) per commit; the first messages (two commits each: the message and the
# conversation's time) take ~170 KB of WAL. 512 KB holds them; the filler then takes the rest.
EARLY = 20  # messages written before the disk fills
TOTAL = 400
from store_helpers import DISK_K, fill, small_disk  # noqa: E402,F401 (shared: tests/store_helpers.py)


def chat(s: Store, cid: int, start: int, stop: int, expected: list) -> None:
    """Messages start..stop-1, user and assistant by turns; message 200 is a streamed reply."""
    for i in range(start, stop):
        if i == 200:
            mid = s.add_message(cid, "assistant", "", complete=False)
            for n in range(1, 6):
                s.update_message(mid, f"streamed reply, part {n}", complete=False)
            s.update_message(mid, "streamed reply, done", complete=True, meta={"stats": "6 tok/s"})
            expected.append((mid, "assistant", "streamed reply, done"))
        else:
            role = "user" if i % 2 == 0 else "assistant"
            mid = s.add_message(cid, role, f"message {i}")
            expected.append((mid, role, f"message {i}"))


def in_file(db: Path, cid: int) -> list:
    fresh = sqlite3.connect(str(db))
    try:
        return fresh.execute("SELECT id, role, content FROM messages WHERE conversation=? ORDER BY id",
                             (cid,)).fetchall()
    finally:
        fresh.close()


def test_full_disk_mid_chat_keeps_all_400_messages_across_a_restart_and_writes_them_once_freed(small_disk, tmp_path):
    fallback = tmp_path / "state"  # the user's state folder, on another disk
    db = small_disk / "chats.sqlite3"
    s = Store(db, fallback_dirs=[fallback])
    cid = s.new_conversation("long chat")
    expected = []
    chat(s, cid, 0, EARLY, expected)
    assert not s.pending and not s.notices
    filler = fill(small_disk)
    chat(s, cid, EARLY, TOTAL, expected)
    assert s.pending  # the disk took none of them
    assert [(m.id, m.role, m.content) for m in s.messages(cid)] == expected  # the window sees them all
    full = [n for n in s.notices if "disk holding your chats is full" in n]
    assert len(full) == 1 and str(fallback) in full[0] and "as soon as space is freed" in full[0], s.notices
    assert "as soon as it can be written" not in " ".join(s.notices)  # the lock's promise, untrue here
    s.close()  # as the window does at exit
    kept = list(fallback.glob("*.pending.json"))
    assert len(kept) == 1 and not list(small_disk.glob("*.pending.json*")) and not list(small_disk.glob(".*tmp"))

    # (a) a restart while the disk is still full: every message is there, none is lost
    s2 = Store(db, fallback_dirs=[fallback])
    assert [(m.id, m.role, m.content) for m in s2.messages(cid)] == expected
    assert s2.messages(cid)[-1].complete and s2.conversations()[0].id == cid
    assert s2.pending and kept[0].exists()  # not committed: the journal stays
    assert any(str(fallback) in n and "full" in n for n in s2.notices), s2.notices
    more = s2.add_message(cid, "user", "one more, written on the still-full disk")
    assert more == expected[-1][0] + 1  # ids continue after the waiting ones

    # (b) space returns: flush (the window's timer) writes all of them, in order, and the journal goes
    filler.unlink()
    assert s2.flush() and not s2.pending
    assert any("room again" in n for n in s2.notices)
    s2.close()
    assert in_file(db, cid) == expected + [(more, "user", "one more, written on the still-full disk")]
    assert len(expected) == TOTAL
    assert not list(fallback.glob("*.pending.json")) and not list(small_disk.glob("*.pending.json"))
    s3 = Store(db, fallback_dirs=[fallback])
    assert not s3.pending and len(s3.messages(cid)) == TOTAL + 1
    s3.close()


def test_full_disk_restart_keeps_what_waits_then_writes_it_when_freed(small_disk, tmp_path):
    """A second session on the still-full disk adds to what waits; the third, with room, writes all."""
    fallback = tmp_path / "state"
    db = small_disk / "chats.sqlite3"
    s = Store(db, fallback_dirs=[fallback])
    cid = s.new_conversation("chat")
    expected = []
    chat(s, cid, 0, 10, expected)
    filler = fill(small_disk)
    chat(s, cid, 10, 150, expected)
    s.close()
    s2 = Store(db, fallback_dirs=[fallback])
    chat(s2, cid, 150, TOTAL, expected)
    s2.close()
    filler.unlink()
    s3 = Store(db, fallback_dirs=[fallback])
    assert not s3.pending and any("were written" in n for n in s3.notices), s3.notices
    s3.close()
    assert in_file(db, cid) == expected and len(expected) == TOTAL
    assert not list(fallback.glob("*.pending.json"))


def test_full_disk_at_start_reads_the_database_as_it_is_never_moves_it_aside(small_disk, tmp_path):
    """After a clean close SQLite has no -shm file; on a full disk it cannot make one ("disk I/O
    error"). That is no damage: the chats are read, new ones wait, and are written when freed."""
    fallback = tmp_path / "state"
    db = small_disk / "chats.sqlite3"
    s = Store(db, fallback_dirs=[fallback])
    cid = s.new_conversation("before")
    first = s.add_message(cid, "user", "written before the disk filled")
    s.close()
    filler = fill(small_disk)
    s2 = Store(db, fallback_dirs=[fallback])
    assert not s2.in_memory and not list(small_disk.glob("*.corrupt-*")), s2.notices
    assert [m.content for m in s2.messages(cid)] == ["written before the disk filled"]
    second = s2.add_message(cid, "assistant", "written while full")
    assert s2.pending and any("full" in n for n in s2.notices), s2.notices
    filler.unlink()
    assert s2.flush()
    other = sqlite3.connect(str(db), timeout=0)  # shared again: another program can read it
    assert [r[0] for r in other.execute("SELECT id FROM messages ORDER BY id")] == [first, second]
    other.close()
    s2.close()


def test_the_previous_journal_survives_when_writing_the_new_one_fails(small_disk, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the fallback folder should be")
    fallback = blocker / "state"  # no fallback can be written either
    db = small_disk / "chats.sqlite3"
    s = Store(db, fallback_dirs=[fallback])
    cid = s.new_conversation("t")
    other = sqlite3.connect(str(db), isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # another program holds the lock: these wait
    kept = [s.add_message(cid, "user", f"kept by the lock {i}") for i in range(3)]
    s.close()
    other.execute("ROLLBACK")
    other.close()
    journal = small_disk / "chats.sqlite3.pending.json"
    before = journal.read_bytes()
    assert json.loads(before)["writes"]

    filler = fill(small_disk)
    s2 = Store(db, fallback_dirs=[fallback])
    assert [m.id for m in s2.messages(cid)] == kept  # from the journal, as the disk takes nothing
    s2.add_message(cid, "user", "this one can be kept nowhere")
    s2.flush()  # the window's timer: it tries to write it, then to keep it
    assert any("in memory only" in n and "earlier ones are safe" in n for n in s2.notices), s2.notices
    assert not s2.close()
    assert any("could not be kept anywhere" in n for n in s2.notices)
    assert journal.read_bytes() == before  # never written over, never truncated
    assert not [p for p in small_disk.iterdir() if p.name.endswith(".tmp")]

    filler.unlink()
    s3 = Store(db, fallback_dirs=[fallback])
    assert not s3.pending and [m.id for m in s3.messages(cid)] == kept
    assert not journal.exists()
    s3.close()


def test_full_disk_before_the_database_exists_keeps_the_chats_and_makes_it_once_freed(small_disk, tmp_path):
    fallback = tmp_path / "state"
    db = small_disk / "chats.sqlite3"
    filler = fill(small_disk)
    s = Store(db, fallback_dirs=[fallback])
    assert not s.in_memory and not s.notices  # not "kept in memory only": they are kept on another disk
    cid = s.new_conversation("first chat")
    mid = s.add_message(cid, "user", "hello on a full disk")
    assert [c.title for c in s.conversations()] == ["first chat"] and s.messages(cid)[0].id == mid
    assert any(str(fallback) in n for n in s.notices), s.notices
    s.close()
    s2 = Store(db, fallback_dirs=[fallback])
    assert [m.content for m in s2.messages(cid)] == ["hello on a full disk"]
    filler.unlink()
    assert s2.flush()
    s2.close()
    assert in_file(db, cid) == [(mid, "user", "hello on a full disk")]


def test_a_journal_of_the_previous_version_is_replayed_and_an_empty_one_set_aside(tmp_path):
    """Before issue 25 a journal was a bare list of [sql, args]; on a full disk it could be left empty."""
    db = tmp_path / "chats.sqlite3"
    s = Store(db, fallback_dirs=[tmp_path / "state"])
    cid = s.new_conversation("t")
    s.close()
    insert = "INSERT INTO messages(id, conversation, role, content, complete, meta, created) VALUES (?,?,?,?,?,?,?)"
    journal = tmp_path / "chats.sqlite3.pending.json"
    journal.write_text(json.dumps([[insert, [7, cid, "user", "from the old journal", 1, "{}", 0.0]]]))
    s2 = Store(db, fallback_dirs=[tmp_path / "state"])
    assert [(m.id, m.content) for m in s2.messages(cid)] == [(7, "from the old journal")] and not s2.pending
    assert not journal.exists() and any("were written" in n for n in s2.notices)
    s2.close()
    journal.write_text("")
    s3 = Store(db, fallback_dirs=[tmp_path / "state"])
    aside = list(tmp_path.glob("chats.sqlite3.pending.json.unreadable-*"))
    assert len(aside) == 1 and any("could not be read" in n and aside[0].name in n for n in s3.notices)
    assert [m.id for m in s3.messages(cid)] == [7]
    s3.close()


def test_a_lone_surrogate_is_saved_and_read_back(tmp_path):
    db = tmp_path / "chats.sqlite3"
    s = Store(db, fallback_dirs=[tmp_path / "state"])
    cid = s.new_conversation("title \ud800")
    lone = s.add_message(cid, "user", "half an emoji: \ud83d, then more")
    pair = s.add_message(cid, "assistant", "a whole one, as two halves: \ud83d\ude00")
    s.update_message(pair, "a whole one, as two halves: \ud83d\ude00 \udfff", complete=True, meta={"k": "\ud800"})
    s.rename(cid, "renamed \udc00")
    assert not s.pending and not s.notices, s.notices
    assert [c.id for c in s.conversations("\ud800")] == [cid]  # a search with one is repaired alike
    s.close()
    rows = dict(sqlite3.connect(str(db)).execute("SELECT id, content FROM messages").fetchall())
    assert rows[lone] == "half an emoji: \ufffd, then more"  # the text around it is kept, readable
    assert rows[pair] == "a whole one, as two halves: \U0001F600 \ufffd"
    s2 = Store(db, fallback_dirs=[tmp_path / "state"])
    assert [m.content for m in s2.messages(cid)] == [rows[lone], rows[pair]]
    assert s2.conversation(cid).title == "renamed \ufffd"
    assert s2.messages(cid)[1].meta == {"k": "\ud800"}  # JSON escapes it: kept as it was
    s2.close()


def test_nothing_raises_into_the_window(tmp_path):
    """Values sqlite3 cannot take, or JSON cannot write: said in a notice, the rest goes on."""
    s = Store(tmp_path / "chats.sqlite3", fallback_dirs=[tmp_path / "state"])
    cid = s.new_conversation("t")
    mid = s.add_message(cid, "assistant", "x", meta={"where": Path("/p"), "speed": object()})
    assert "/p" in s.messages(cid)[0].meta["where"]  # kept as text
    s.update_message(2 ** 70, "an id sqlite3 cannot bind", complete=True)
    assert [n for n in s.notices if "dropped" in n] == s.notices and len(s.notices) == 1, s.notices
    assert not s.pending  # never waits: it would block every write after it
    s.add_message(cid, "user", "still saved")
    s.db.execute("UPDATE messages SET meta='{not json' WHERE id=?", (mid,))
    assert [m.content for m in s.messages(cid)] == ["x", "still saved"]  # a damaged meta hides nothing
    assert s.close()


def test_full_disk_then_a_kill_keeps_what_the_timer_saw(small_disk, tmp_path, monkeypatch):
    """While writes wait, flush (the window's one-second timer) keeps the journal current, so a kill
    loses at most the last second, as with a database that can be written."""
    import app.store.pending

    monkeypatch.setattr(app.store.pending, "KEEP_EVERY_S", 0.0)  # the test's "second" passes at once
    fallback = tmp_path / "state"
    db = small_disk / "chats.sqlite3"
    s = Store(db, fallback_dirs=[fallback])
    cid = s.new_conversation("t")
    expected = []
    chat(s, cid, 0, 5, expected)
    filler = fill(small_disk)
    chat(s, cid, 5, 30, expected)
    s.flush()  # the timer's tick
    s.db.close()  # killed: no close(); the OS closes its files
    s2 = Store(db, fallback_dirs=[fallback])
    assert [(m.id, m.role, m.content) for m in s2.messages(cid)] == expected
    filler.unlink()
    assert s2.flush()
    s2.close()
    assert in_file(db, cid) == expected


# ---- per-chat settings (issue 29): a column on conversations, added to an older database ----
OLD_SCHEMA = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL, deleted REAL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL REFERENCES conversations(id),
    role TEXT NOT NULL, content TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1,
    meta TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL
);
INSERT INTO conversations VALUES (1, 'from before', 'Be brief.', 1.0, 2.0, NULL);
INSERT INTO messages VALUES (1, 1, 'user', 'hello from before', 1, '{}', 1.0);
"""


def old_database(path: Path) -> Path:
    """A database as Mixdesk wrote it before per-chat settings (the schema of 47415d3, no journal table)."""
    db = sqlite3.connect(str(path))
    db.executescript(OLD_SCHEMA)
    db.commit()
    db.close()
    return path


def test_an_old_database_opens_keeps_its_chats_and_gets_settings(tmp_path):
    db = old_database(tmp_path / "chats.sqlite3")
    s = Store(db, fallback_dirs=[tmp_path / "state"])
    assert not s.notices, s.notices
    [c] = s.conversations()
    assert (c.id, c.title, c.system_prompt, c.settings) == (1, "from before", "Be brief.", {})
    assert [m.content for m in s.messages(1)] == ["hello from before"]
    s.set_settings(1, {"top_k": 3, "max_new_tokens": 5})
    new = s.new_conversation("new")
    assert s.conversation(new).settings == {} and not s.pending
    s.close()
    s2 = Store(db, fallback_dirs=[tmp_path / "state"])
    assert s2.conversation(1).settings == {"top_k": 3, "max_new_tokens": 5}
    assert [c.settings for c in s2.conversations()] == [{}, {"top_k": 3, "max_new_tokens": 5}]
    assert json.loads(s2.export_json(1))["settings"] == {"top_k": 3, "max_new_tokens": 5}
    assert "hello from before" in s2.export_markdown(1) and "Be brief." in s2.export_markdown(1)
    s2.close()


def test_an_old_database_locked_at_start_is_read_and_gets_its_settings_column_once_free(tmp_path):
    """Another program holds the old database's write lock: the column cannot be added yet. Its chats
    read as they are (no settings), a setting waits (the reads see it), and lands once the lock goes."""
    db = old_database(tmp_path / "chats.sqlite3")
    other = sqlite3.connect(str(db), isolation_level=None)
    other.execute("PRAGMA journal_mode=WAL")
    other.execute("BEGIN IMMEDIATE")
    try:
        s = Store(db, fallback_dirs=[tmp_path / "state"])
        assert [(c.title, c.settings) for c in s.conversations()] == [("from before", {})]
        s.set_settings(1, {"temperature": 0.7})
        assert s.pending and s.conversation(1).settings == {"temperature": 0.7}
        assert [c.settings for c in s.conversations()] == [{"temperature": 0.7}]
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert s.flush() and not s.pending
    assert s.conversation(1).settings == {"temperature": 0.7}
    s.close()
    fresh = sqlite3.connect(str(db))
    assert fresh.execute("SELECT settings FROM conversations WHERE id=1").fetchone() == ('{"temperature": 0.7}',)
    fresh.close()


def test_a_damaged_settings_value_reads_as_none(tmp_path):
    s = Store(tmp_path / "chats.sqlite3", fallback_dirs=[tmp_path / "state"])
    cid = s.new_conversation("t")
    s.db.execute("UPDATE conversations SET settings='{not json' WHERE id=?", (cid,))
    assert s.conversation(cid).settings == {} and [c.settings for c in s.conversations()] == [{}]
    assert not s.notices
    s.close()
