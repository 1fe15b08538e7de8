"""The window's two doors to the network: the Local server switch (the engine the chat uses, served
to other programs as an OpenAI-compatible API: engine/tools/serve) and Connect to a server (the
chat talks to a served model elsewhere: app/chat/remote.py)."""
from __future__ import annotations

import time

from PySide6.QtCore import QObject, QSettings, Qt, QTimer
from PySide6.QtWidgets import (QApplication, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QListWidget, QPushButton, QSizePolicy, QSpinBox,
                               QVBoxLayout)

from .chat.remote import RemoteError, list_models

LOG_ROWS = 50


class LocalServer(QObject):
    """The local server on the window's engine thread. Its request log (server.log, appended on
    the server's thread) is read by the panel's ServerBox on the GUI thread."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.server = None

    @property
    def running(self) -> bool:
        return self.server is not None

    def start(self, session, port: int, api_key: str = "", origins: list[str] | None = None) -> str:
        """Serve on 127.0.0.1:port; returns the URL (OSError when the port is taken). origins: the
        web pages that may call it (None: the ones saved by the dialog; by default none may)."""
        from engine.tools.serve import Server

        self.stop()
        self.server = Server(session, "127.0.0.1", port, api_key or None,
                             allowed_origins=saved_origins() if origins is None else origins).start()
        return self.server.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class ElidedLabel(QLabel):
    """One line that never widens its column: elided at the right, the whole text in the tooltip
    (and in `full`)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.full = ""
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setTextFormat(Qt.PlainText)

    def set_full(self, text: str) -> None:
        self.full = text
        self.setToolTip(text)
        self._elide()

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self.full, Qt.ElideRight, max(self.width(), 1)))


class ServerBox(QGroupBox):
    """The panel's box while the local server runs: its URL (elided, with Copy), the model id, and
    the last requests; it keeps to the panel's column whatever their length."""

    def __init__(self, parent=None):
        super().__init__("Local server", parent)
        self.source = None  # the running Server whose log is shown
        self.shown = 0  # its requests already listed
        self._timer = QTimer(self, interval=300)
        self._timer.timeout.connect(self.refresh)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Maximum)  # the column's width, not its own
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        self.url = ElidedLabel()
        self.url.setTextInteractionFlags(Qt.TextSelectableByMouse)
        row.addWidget(self.url, 1)
        self.copy = QPushButton("Copy")
        self.copy.setToolTip("Copy the server's address (its OpenAI-compatible base URL)")
        self.copy.clicked.connect(lambda: QApplication.clipboard().setText(self.url.full))
        row.addWidget(self.copy)
        lay.addLayout(row)
        self.model = ElidedLabel()  # "model id …": what clients put in "model"
        lay.addWidget(self.model)
        self.log = QListWidget()
        self.log.setMaximumHeight(80)
        self.log.setWordWrap(True)
        self.log.setTextElideMode(Qt.ElideRight)
        self.log.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.log.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        lay.addWidget(self.log)
        self.hide()

    def show_server(self, server, model: str) -> None:
        self.url.set_full(server.url)
        self.model.set_full(f"model id {model}" + (" · API key required" if server.api_key else ""))
        if server is not self.source:
            self.source, self.shown = server, 0
            self.log.clear()
        self._timer.start()
        self.show()

    def stop(self) -> None:
        self.refresh()
        self._timer.stop()
        self.source = None
        self.hide()

    def refresh(self) -> None:
        if self.source is None:
            return
        entries = list(self.source.log)  # a bounded deque: count what is new by the running total
        new = self.source.requests - self.shown
        for entry in entries[max(0, len(entries) - new):]:
            self.add(entry)
        self.shown = self.source.requests

    def add(self, entry) -> None:
        extra = f" · {entry.tokens} tokens" if entry.tokens else ""
        self.log.insertItem(0, f"{time.strftime('%H:%M:%S', time.localtime(entry.when))} {entry.method} {entry.path} "
                               f"{entry.status} · {entry.seconds:.2f} s{extra}")
        while self.log.count() > LOG_ROWS:
            self.log.takeItem(self.log.count() - 1)


def saved_port() -> int:
    return int(QSettings("mixdesk", "mixdesk").value("server/port", 8080))


def saved_origins() -> list[str]:
    return split_origins(str(QSettings("mixdesk", "mixdesk").value("server/origins", "")))


def split_origins(text: str) -> list[str]:
    return [o for o in text.replace(",", " ").split() if o]


class ServerDialog(QDialog):
    """Port and optional API key for the local server (it listens on this machine only)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Local server")
        form = QFormLayout(self)
        form.addRow(QLabel("Serves the model in use to other programs on this machine, as an OpenAI-compatible API "
                           "(http://127.0.0.1:PORT/v1). The chat keeps working beside it."))
        self.port = QSpinBox(minimum=1024, maximum=65535, value=saved_port())
        self.key = QLineEdit(placeholderText="none")
        self.origins = QLineEdit(" ".join(saved_origins()), placeholderText="none (web pages may not call it)")
        self.origins.setToolTip("Web pages in your browser are refused, so that a site you visit cannot use your "
                                "model. List the origins of web apps you trust, e.g. http://localhost:3000")
        form.addRow("Port", self.port)
        form.addRow("API key (optional)", self.key)
        form.addRow("Web apps allowed (optional)", self.origins)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def accept(self) -> None:
        s = QSettings("mixdesk", "mixdesk")
        s.setValue("server/port", self.port.value())
        s.setValue("server/origins", " ".join(split_origins(self.origins.text())))
        super().accept()


class ConnectDialog(QDialog):
    """An OpenAI-compatible endpoint to chat with: its URL, a key if it needs one, and a model."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        s = QSettings("mixdesk", "mixdesk")
        form = QFormLayout(self)
        form.addRow(QLabel("Chat with a model served elsewhere: vLLM, SGLang, a llama.cpp server, Ollama or another "
                           "Mixdesk (e.g. http://gpu-box:8000/v1)."))
        self.url = QLineEdit(str(s.value("remote/url", "http://127.0.0.1:8000/v1")))
        self.key = QLineEdit(placeholderText="none")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.models = QComboBox(editable=True)
        self.fetch = QPushButton("List models")
        self.fetch.clicked.connect(self.list_models)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        form.addRow("URL", self.url)
        form.addRow("API key", self.key)
        form.addRow("Model", self.models)
        form.addRow(self.fetch, self.status)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def list_models(self) -> bool:
        try:
            names = list_models(self.url.text().strip(), self.key.text().strip())
        except RemoteError as e:
            self.status.setText(str(e))
            return False
        self.models.clear()
        self.models.addItems(names)
        self.status.setText(f"{len(names)} model(s)")
        return bool(names)

    def accept(self) -> None:
        if not self.models.currentText().strip() and not self.list_models():
            return
        QSettings("mixdesk", "mixdesk").setValue("remote/url", self.url.text().strip())
        super().accept()

    def choice(self) -> tuple[str, str, str]:
        return self.url.text().strip(), self.key.text().strip(), self.models.currentText().strip()


def ask_connection(parent) -> tuple[str, str, str] | None:
    """File > Connect to a server's dialog (modal): the endpoint chosen (url, key, model), None if cancelled."""
    from .menus import run_modal

    dlg = ConnectDialog(parent)
    return dlg.choice() if run_modal(dlg) else None
