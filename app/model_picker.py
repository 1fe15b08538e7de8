"""The model picker: recent models, the built-in demo, a folder on disk, or a Hugging Face repo id
(downloaded with progress and Cancel in the window). Recent models are remembered (QSettings)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QListWidget,
                               QListWidgetItem, QPushButton, QVBoxLayout)

from . import theme

MAX_RECENT = 10


def recent() -> list[str]:
    value = theme.settings().value("recent_models", [])
    if isinstance(value, str):  # QSettings gives a single value back as a string
        value = [value]
    return [v for v in value if isinstance(v, str)][:MAX_RECENT]


def remember(spec: str) -> None:
    items = [spec] + [r for r in recent() if r != spec]
    theme.settings().setValue("recent_models", items[:MAX_RECENT])


class ModelPicker(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Open a model")
        self.resize(560, 420)
        self.choice: str | None = None
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("<b>Recent models</b>"))
        self.list = QListWidget()
        for spec in ["demo"] + [r for r in recent() if r != "demo"]:
            item = QListWidgetItem("Built-in demo (SmolLM2-135M, 8 experts)" if spec == "demo" else spec)
            item.setData(Qt.UserRole, spec)
            self.list.addItem(item)
        self.list.setCurrentRow(0)
        self.list.itemDoubleClicked.connect(lambda item: self._pick(item.data(Qt.UserRole)))
        lay.addWidget(self.list, 1)
        folder = QPushButton("Open a model folder…")
        folder.clicked.connect(self._folder)
        lay.addWidget(folder)
        lay.addWidget(QLabel("<b>From the Hugging Face hub</b> (safetensors only; downloads resume)"))
        row = QHBoxLayout()
        self.hub = QLineEdit(placeholderText="owner/name, e.g. mistralai/Mixtral-8x7B-Instruct-v0.1")
        self.hub.returnPressed.connect(self._download)
        row.addWidget(self.hub, 1)
        get = QPushButton("Download and open")
        get.clicked.connect(self._download)
        row.addWidget(get)
        lay.addLayout(row)
        buttons = QDialogButtonBox(QDialogButtonBox.Open | QDialogButtonBox.Cancel)
        buttons.accepted.connect(lambda: self.list.currentItem() and self._pick(self.list.currentItem().data(Qt.UserRole)))
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)

    def _pick(self, spec: str) -> None:
        self.choice = spec
        self.accept()

    def _folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Open a model folder (Mixtral, Qwen3-MoE, OLMoE or Qwen2-MoE)")
        if d:
            self._pick(d)

    def _download(self) -> None:
        if self.hub.text().strip():
            self._pick(self.hub.text().strip())
