"""The chat store's writes that survive a lock or a full disk (app/store/chat_store.py's Store inherits them).

A write is tried at once, with a short backoff while the database is locked; if it still cannot
land it waits in `pending`, in order, seen by the reads through the overlay, kept in the journal
(at most every KEEP_EVERY_S), and `flush` writes it later, in chunks. The state these methods use
(pending, overlay, journal, notices and the counters) is the Store's, set up in its __init__.
"""
from __future__ import annotations

import sqlite3
import time

from .errors import is_lock, is_transient, kind, never_raises, waiting_notice, written_notice
from .journal import Pending
from .overlay import APPLIED, UPDATE_MSG, UPDATE_MSG_META, clean, conversation_columns, create_schema

RETRY_S = (0.02, 0.05, 0.1, 0.2)  # backoff while locked: at most ~0.4 s on the GUI thread per write
KEEP_EVERY_S = 1.0  # while writes wait, the journal is rewritten at most this often: a kill loses at most that
CHUNK = 200  # waiting writes per transaction in flush: few fsyncs, and a full disk refuses a chunk whole
QUIET_S = 0.5  # after a flush failed, writes queue without trying again for this long (the timer's flush still
# tries): on a full disk each try runs a chunk only to fail at COMMIT, once per streamed token otherwise


class PendingWrites:
    def _write(self, sql: str, args: tuple = ()) -> bool:
        """Run one write; True if it landed, False if it waits in the pending queue."""
        args = tuple(clean(a) for a in args)
        waiting = self.pending or not self._schema or self._unopened
        if waiting and (time.monotonic() < self._quiet_until or not self.flush()):
            self._queue(sql, args)
            self._hold(self._error)
            return False
        error: Exception | None = None
        for delay in (0.0, *RETRY_S):
            if delay:
                time.sleep(delay)
            try:
                self.db.execute(sql, args)
                return True
            except Exception as e:
                error = e
                if not is_lock(e):
                    break  # disk full, I/O error: no use retrying now; the queue tries again later
        if not is_transient(error):  # it would fail the same way each time (a value sqlite3 cannot take)
            self.notices.append(f"A change could not be saved ({type(error).__name__}: {error}) and was dropped.")
            return False
        self._queue(sql, args)
        self._hold(error)
        return False

    def _queue(self, sql: str, args: tuple) -> None:
        self._seq += 1
        last = self.pending[-1] if self.pending else None
        if (last and sql in (UPDATE_MSG, UPDATE_MSG_META) and last.sql in (UPDATE_MSG, UPDATE_MSG_META)
                and last.args[-1] == args[-1]):
            # a streamed reply: each update holds all the text so far, so only the newest is kept (it
            # takes a new number: a journal copy holding the older one then replays both, in order)
            if sql == UPDATE_MSG and last.sql == UPDATE_MSG_META:
                sql, args = UPDATE_MSG_META, (args[0], args[1], last.args[2], args[2])
            self.pending[-1] = Pending(self._seq, sql, args)
        else:
            self.pending.append(Pending(self._seq, sql, args))
        self._changes += 1
        self.overlay.apply(sql, args)

    def _hold(self, error: Exception | None) -> None:
        """Writes wait: keep them on disk at once (unless only locked), and say why and where, once."""
        why = kind(error, self.path.parent)
        if why == self._told:
            return
        if why != "locked":  # a lock passes in seconds; a full disk may outlast the session
            self._keep(force=True)
        self._told = why
        self.notices.append(waiting_notice(why, error, self.path, self._kept_in, self._why_not))

    def _keep(self, force: bool = False) -> None:
        """Write the waiting writes to the journal, if they changed since (at most every KEEP_EVERY_S)."""
        if self.in_memory or not self.pending or self._kept == self._changes:
            return
        if not force and time.monotonic() - self._kept_at < KEEP_EVERY_S:
            return
        self._kept_at = time.monotonic()
        before = self._kept_in
        where, reasons = self.journal.save(self.pending)
        self._why_not = "; ".join(reasons)
        if where is None:
            if before is not None and self._told not in ("", "locked"):
                self.say("kept-nowhere", f"New messages could not be copied to any folder ({self._why_not}): "
                         "they are in memory only, so keep Mixdesk open until space is freed. The earlier "
                         f"ones are safe in {before}.")
            return
        self._said.discard("kept-nowhere")
        self._kept, self._kept_in, self._on_disk = self._changes, where, True
        if before not in (None, where) and self._told not in ("", "locked"):
            self.notices.append(f"Unsaved messages are now kept in {where}.")

    @never_raises(lambda self: False)
    def flush(self) -> bool:
        """Write what waits (in order); True when nothing is left."""
        if self._unopened and not self._reopen():
            self._keep()
            return False
        if not self._schema:
            try:
                create_schema(self.db)
                self._schema = True
                self._conv_cols = conversation_columns(self._read("PRAGMA table_info(conversations)"))
            except sqlite3.Error as e:
                self._error = e
                self._keep()
                return False
        while self.pending:
            chunk = self.pending[:CHUNK]
            dropped = []
            try:
                self.db.execute("BEGIN IMMEDIATE")
                for w in chunk:
                    try:
                        self.db.execute(w.sql, w.args)
                    except sqlite3.Error as e:
                        if is_transient(e):
                            raise
                        dropped.append(e)  # it can never land (an id taken since): dropped, said below
                    except Exception as e:  # a value sqlite3 cannot bind
                        dropped.append(e)
                self.db.execute(APPLIED, (chunk[-1].seq,))
                self.db.execute("COMMIT")
            except sqlite3.Error as e:
                if self.db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                    try:
                        self.db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                self._error = e
                self._quiet_until = time.monotonic() + QUIET_S
                self._keep()
                return False
            del self.pending[:len(chunk)]
            self._changes += 1
            for e in dropped:
                self.notices.append(f"A saved change could not be applied ({e}) and was dropped.")
        self._landed()
        return True

    def _landed(self) -> None:
        """Everything waiting is committed: the overlay and the journal have served."""
        self.overlay.clear()
        if self._on_disk:
            self.journal.remove()
            self._on_disk, self._kept_in = False, None
        self._kept = self._changes
        if self._told:
            self.notices.append(written_notice(self._told))
            self._told = ""
        if self._exclusive:  # opened on a full disk: shared again, so other programs can read it
            self._reopen()
