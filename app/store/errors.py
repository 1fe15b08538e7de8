"""How the chat store (app/store/chat_store.py) tells its errors apart: a lock (another program holds the
database: retried at once, then waits), a full disk or failing I/O (no damage: writes wait, the file
is read as it is), and the rest (damage at open: the file is moved aside; a value that can never be
written: dropped with a notice). And the guard that keeps any error out of the window.

No Qt here.
"""
from __future__ import annotations

import errno
import functools
import shutil
from pathlib import Path

# sqlite3 names these from Python 3.11 only
SQLITE_READONLY, SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 8, 10, 11, 13, 14, 26


def code(e) -> int | None:
    c = getattr(e, "sqlite_errorcode", None)  # Python 3.11+; older ones: the message only
    return None if c is None else c & 0xFF  # the primary code (SQLITE_IOERR_SHMSIZE is an SQLITE_IOERR)


def is_lock(e) -> bool:
    text = str(e).lower()
    return e is not None and ("locked" in text or "busy" in text)


def is_storage(e) -> bool:
    """Disk full or failing I/O: nothing wrong with the file, and worth retrying later."""
    text = str(e).lower()
    return code(e) in (SQLITE_IOERR, SQLITE_FULL) or "disk is full" in text or "disk i/o error" in text


def is_transient(e) -> bool:
    """An error the write waits out, not one it would meet each time (then it is dropped). Damage
    counts as one to wait out: the next start moves the file aside and replays the write into a
    fresh one."""
    text = str(e).lower()
    return (is_lock(e) or is_storage(e) or code(e) in (SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_CANTOPEN, SQLITE_NOTADB)
            or any(w in text for w in ("readonly", "unable to open", "malformed", "not a database")))


def disk_full(e, folder: Path) -> bool:
    if code(e) == SQLITE_FULL or getattr(e, "errno", None) == errno.ENOSPC or "disk is full" in str(e).lower():
        return True
    if is_storage(e):  # SQLite says "disk I/O error" when a full disk leaves no room for its -shm file
        try:
            return shutil.disk_usage(folder).free < 1 << 20
        except OSError:
            return False
    return False


def kind(e, folder: Path) -> str:
    """Why a write waits, as the notices tell it: "locked", "full" or "other"."""
    return "locked" if is_lock(e) else "full" if disk_full(e, folder) else "other"


def waiting_notice(why: str, error, db: Path, kept_in: Path | None, why_not: str) -> str:
    """The one message when writes start to wait for `why`: what happened, where they are, what next."""
    if why == "locked":
        return ("The chat database is locked by another program: your messages stay here and are saved as soon as "
                "it can be written.")
    if why == "full":
        what, until = f"The disk holding your chats is full: new messages cannot be written to {db}", "space is freed"
    else:
        what, until = f"The chat database cannot be written now ({error}): new messages cannot be saved", "it can be"
    if kept_in:
        return f"{what}. They are kept in {kept_in} and will be written to the chat database as soon as {until}."
    return (f"{what}, and no folder had room for a copy ({why_not}). They are in memory only: keep Mixdesk open "
            f"until {until} and they are written.")


def holding_notice(why: str, kept_in: Path | None) -> str:
    """The lasting status line while writes wait for `why`."""
    if why == "locked":
        return "Chats wait for the database (locked by another program)."
    until = "the disk has room" if why == "full" else "the chat database can be written"
    return f"Unsaved chats are kept in {kept_in or 'memory only'} until {until}."


def written_notice(why: str) -> str:
    """The message when everything that waited for `why` has been written."""
    return {"locked": "The chat database is free again: everything was saved.",
            "full": "The disk has room again: every waiting message was written to the chat database."}.get(
        why, "The chat database can be written again: every waiting message was written.")


def never_raises(fallback):
    """A store method that reports an unexpected error in the store's `notices` (once) and returns
    `fallback(self, *args)` instead of raising into the window."""
    def wrap(fn):
        @functools.wraps(fn)
        def safe(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception as e:  # a bug or a case not foreseen: said, and the window goes on
                self.say(f"bug:{fn.__name__}:{type(e).__name__}",
                         f"The chat store hit an unexpected problem ({fn.__name__}: {type(e).__name__}: {e}). "
                         "Your other chats are not affected; please report it.")
                return fallback(self, *args, **kwargs)
        return safe
    return wrap
