"""The composer's chips never leave a stale Qt wrapper behind.

QLayout.itemAt returns a QWidgetItem whose Python wrapper PySide keeps alive after the layout deletes the
item (when its chip is deleted). A later Qt object allocated at that address then comes back to Python as
the stale wrapper: in the window tests a QTextFrame came back as a QWidgetItem ("'QWidgetItem' object has
no attribute 'document'", app/chat/markdown_render.py) and runs segfaulted in widget code. The attachments keep
their own list of chips; this test fails where they read the row back through itemAt."""
import gc
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
import shiboken6  # noqa: E402
from PySide6.QtCore import QEvent, QObject  # noqa: E402
from PySide6.QtWidgets import QApplication, QLayoutItem  # noqa: E402

from app.chat.attachments import Attachments  # noqa: E402
from app.chat.documents import Document  # noqa: E402


def _deleted_later() -> None:
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)


def _layout_item_wrappers() -> list:
    gc.collect()
    # items a layout owns (QWidgetItem, QSpacerItem), not the layouts (a QLayout is a QLayoutItem too)
    return [o for o in gc.get_objects()
            if isinstance(o, QLayoutItem) and not isinstance(o, QObject) and shiboken6.isValid(o)]


def test_chips_added_removed_and_cleared_leave_no_layout_item_wrapper(qapp):
    before = len(_layout_item_wrappers())
    box = Attachments()
    for round_ in range(5):
        docs = [Document(Path(f"/tmp/doc{round_}-{i}.txt"), "text", 10 + i) for i in range(3)]
        for d in docs:
            box.add(d, tokens=3)
        chips = box.chip_widgets()
        assert [c.text().split(" ·")[0] for c in chips] == [d.name for d in docs]  # the row's order
        chips[1].click()  # ✕ on the middle chip
        _deleted_later()
        assert [c.text().split(" ·")[0] for c in box.chip_widgets()] == [docs[0].name, docs[2].name]
        assert box.docs == [docs[0], docs[2]]
        box.clear()
        _deleted_later()
        assert box.chip_widgets() == [] and box.docs == []
    assert len(_layout_item_wrappers()) == before
    box.deleteLater()
    _deleted_later()
