"""The sidebar: new chat, search, the conversations (newest first, each with when it was last
active: app/chat/last_active.py), rename and delete with undo. It talks to the window through signals and
reads and writes the store itself."""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (QApplication, QInputDialog, QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton,
                               QStyle, QStyledItemDelegate, QStyleOptionViewItem, QVBoxLayout, QWidget)

from .last_active import short_when
from ..store.chat_store import Store

WHEN_ROLE = Qt.UserRole + 1  # an item's "14:02" / "Yesterday" / "Mon" / "30 Nov" / "30 Nov 2025"
now = time.time  # the list's clock (a test sets its own)


class TitleAndWhen(QStyledItemDelegate):
    """A row: the title, elided, and when the chat was last active, right-aligned and dimmer."""

    def paint(self, painter, option, index) -> None:
        when = index.data(WHEN_ROLE)
        if not when:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        rect = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, opt, opt.widget)
        title, opt.text = opt.text, ""
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)  # background, selection
        fm = opt.fontMetrics
        gap = fm.horizontalAdvance("  ")
        room = max(rect.width() - fm.horizontalAdvance(when) - gap, 0)
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        group = QPalette.ColorGroup.Active if opt.state & QStyle.StateFlag.State_Active else QPalette.ColorGroup.Inactive
        painter.save()
        painter.setFont(opt.font)
        painter.setPen(opt.palette.color(group, QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text))
        painter.drawText(rect.adjusted(0, 0, room - rect.width(), 0), Qt.AlignLeft | Qt.AlignVCenter,
                         fm.elidedText(title, Qt.ElideRight, room))
        painter.setPen(opt.palette.color(group, QPalette.ColorRole.HighlightedText if selected
                                         else QPalette.ColorRole.PlaceholderText))
        painter.drawText(rect, Qt.AlignRight | Qt.AlignVCenter, when)
        painter.restore()


class ConversationList(QWidget):
    selected = Signal(int)  # a conversation the user picked
    new_requested = Signal()
    deleted = Signal(int)  # a conversation the user deleted (it can still be undone)

    def __init__(self, store: Store, undo_button: QPushButton, parent=None):
        super().__init__(parent)
        self.store = store
        self.current: int | None = None  # highlighted in the list
        self.undo_btn = undo_button  # lives in the status bar
        self._undo_cid: int | None = None  # the chat its Undo brings back
        undo_button.clicked.connect(self._undo)
        self._undo_timer = QTimer(self, singleShot=True, interval=10000)  # a child: it dies with the list
        self._undo_timer.timeout.connect(undo_button.hide)
        lay = QVBoxLayout(self)
        new = QPushButton("New chat")
        new.clicked.connect(self.new_requested)
        self.search = QLineEdit(placeholderText="Search chats")
        self.search.textChanged.connect(self.refresh)
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.ElideRight)  # a long title ends in "…" (its tooltip has it whole)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setUniformItemSizes(True)
        self.list.setItemDelegate(TitleAndWhen(self.list))
        self.list.itemSelectionChanged.connect(self._on_select)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        lay.addWidget(new)
        lay.addWidget(self.search)
        lay.addWidget(self.list)

    def refresh(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        at = now()
        for c in self.store.conversations(self.search.text()):
            it = QListWidgetItem(c.title)
            it.setData(Qt.UserRole, c.id)
            it.setData(WHEN_ROLE, short_when(c.updated, at))
            it.setToolTip(c.title)
            self.list.addItem(it)
            if c.id == self.current:
                self.list.setCurrentItem(it)
                it.setSelected(True)
        if self.current is None:
            self.list.setCurrentItem(None)
        self.list.blockSignals(False)

    def highlight(self, cid: int | None) -> None:
        """Select chat cid's row (no `selected` signal): the row shown is the chat shown."""
        self.current = cid
        self.list.blockSignals(True)
        for i in range(self.list.count()):
            it = self.list.item(i)
            it.setSelected(it.data(Qt.UserRole) == cid)
            if it.data(Qt.UserRole) == cid:
                self.list.setCurrentItem(it)
        self.list.blockSignals(False)

    def _on_select(self) -> None:
        items = self.list.selectedItems()
        if items:
            self.selected.emit(items[0].data(Qt.UserRole))

    def _menu(self, pos) -> None:
        it = self.list.itemAt(pos)
        if it is None:
            return
        cid = it.data(Qt.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(cid))
        menu.addAction("Delete", lambda: self.delete(cid))
        menu.exec(self.list.mapToGlobal(pos))

    def rename(self, cid: int) -> None:
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=self.store.conversation(cid).title)
        if ok and title.strip():
            self.store.rename(cid, title.strip())
            self.refresh()

    def delete(self, cid: int) -> None:
        self.store.delete(cid)
        self.deleted.emit(cid)
        self.refresh()
        self._undo_cid = cid
        self.undo_btn.show()
        self._undo_timer.start()

    def _undo(self) -> None:
        cid, self._undo_cid = self._undo_cid, None
        self.undo_btn.hide()
        if cid is not None:
            self.store.undelete(cid)
            self.refresh()
