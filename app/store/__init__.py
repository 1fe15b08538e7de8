"""The chats on disk: SQLite in WAL mode, every completed message committed at once (chat_store.py); the
writes a lock or a full disk held back, journaled (pending.py, journal.py) and seen by reads meanwhile
(overlay.py); its errors told apart (errors.py); a chat exported (export.py). No Qt.
"""
