"""A guard against a PySide6 6.12.0 bug on Python 3.11 (measured here): every call of a Qt method
that returns void hands Python a `None` it never counted (sys.getrefcount(None) drops by one per
call: QLabel.setText, QTextCursor.setPosition, QTextCursor.insertText ...). Python 3.11's None is not
immortal, so after some tens of thousands of such calls its count reaches zero and the interpreter
aborts ("none_dealloc: deallocating None"). The message view makes many such calls per flush, so it
tops the count up (`guard()`, called per flush): references to None kept in a list, added when the
count runs low. Harmless where the bug is absent (Python >= 3.12's None is immortal)."""
from __future__ import annotations

import sys

LOW = 200_000  # top up below this many references
TOP_UP = 1_000_000  # references added each time (8 MB of list)
_kept: list = []


def guard() -> None:
    if sys.version_info < (3, 12) and sys.getrefcount(None) < LOW:
        _kept.extend([None] * TOP_UP)
