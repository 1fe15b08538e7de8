"""File > Open model…: the model browser. Recent models (with their size on disk and what the
planner predicts for them here), the built-in demo, a folder or GGUF file on disk, and a search of
the Hugging Face hub that lists each candidate's files and sizes and its fit on this machine before
any download (app/dialogs/model_browser.py). Non-blocking: `accepted` fires with `choice` set to the spec
to open (a folder, a file, "demo", a repo id, or "owner/name/file.gguf"). Recent models are
remembered (QSettings), each once (the demo's folder is "demo"; a path is absolute, without a
trailing slash), and the one in use is marked."""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFileDialog, QHBoxLayout, QLabel, QListWidget,
                               QListWidgetItem, QPushButton, QSplitter, QVBoxLayout, QWidget)

from . import context_choice, hub_search
from .. import theme
from .model_browser import HubBrowser, Jobs, Machine

MAX_RECENT = 10
DEMO_LABEL = "Built-in demo (SmolLM2-135M, 8 experts)"
IN_USE = "  (in use)"


def _is_path(spec: str) -> bool:
    """A folder or file on disk, not a hub id ("owner/name" looks like a relative path)."""
    return spec.startswith((".", "~")) or os.path.isabs(spec) or Path(spec).exists()


def normal(spec: str) -> str:
    """The spec a model is remembered by: "demo" for the demo (by name or by its built folder), a path
    absolute and without a trailing slash, a hub id as typed."""
    if spec == "demo" or not _is_path(spec):
        return spec
    from engine.sources import demo

    path = os.path.abspath(os.path.expanduser(spec))
    return "demo" if os.path.realpath(path) == os.path.realpath(demo.demo_dir()) else path


def same_model(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    a, b = normal(a), normal(b)
    return a == b or (_is_path(a) and _is_path(b) and os.path.realpath(a) == os.path.realpath(b))


def recent() -> list[str]:
    """The recent models, newest first, each once (however it was opened: normal())."""
    value = theme.settings().value("recent_models", [])
    if isinstance(value, str):  # QSettings gives a single value back as a string
        value = [value]
    seen: list[str] = []
    for spec in (normal(v) for v in value if isinstance(v, str)):
        if not any(same_model(spec, s) for s in seen):
            seen.append(spec)
    return seen[:MAX_RECENT]


def remember(spec: str) -> None:
    items = [normal(spec)] + [r for r in recent() if not same_model(r, spec)]
    theme.settings().setValue("recent_models", items[:MAX_RECENT])


class ModelPicker(QDialog):
    def __init__(self, parent=None, in_use: str | None = None, device: str | None = None, dtype: str = "auto"):
        """in_use: the spec of the model in use (marked in the recent list); device and dtype: what the
        window opens models with (the context's memory depends on them)."""
        super().__init__(parent)
        self.setWindowTitle("Open a model")
        self.in_use = in_use
        self.device, self.dtype = device, dtype
        self.resize(900, 640)
        self.choice: str | None = None
        self.jobs = Jobs()
        self.machine = Machine(self.jobs, self)
        self.jobs.done.connect(self._done)
        self._last = "recent"  # which list the Open button takes its choice from

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(QLabel("<b>Recent models</b>"))
        self.list = QListWidget()
        self.list.setWordWrap(True)
        for spec in ["demo"] + [r for r in recent() if r != "demo"]:
            item = QListWidgetItem(self._label(spec))
            item.setData(Qt.UserRole, spec)
            if same_model(spec, in_use):
                font = QFont(item.font())
                font.setBold(True)
                item.setFont(font)
            self.list.addItem(item)
        self.list.setCurrentRow(0)
        self.list.itemDoubleClicked.connect(lambda item: self._pick(item.data(Qt.UserRole)))
        self.list.currentItemChanged.connect(lambda *_: setattr(self, "_last", "recent"))
        tl.addWidget(self.list, 1)
        files = QHBoxLayout()
        folder = QPushButton("Open a model folder…")
        folder.clicked.connect(self._folder)
        files.addWidget(folder)
        self.gguf = QPushButton("Open a GGUF file…")  # what LM Studio, Ollama, Jan and llama.cpp keep
        self.gguf.clicked.connect(self._gguf)
        files.addWidget(self.gguf)
        files.addStretch(1)
        tl.addLayout(files)

        bottom = QWidget()
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(0, 0, 0, 0)
        hub_title = QLabel("<b>From the Hugging Face hub</b> (safetensors or GGUF; nothing is downloaded "
                           "until you open one; downloads resume)")
        hub_title.setWordWrap(True)
        bl.addWidget(hub_title)
        self.browser = HubBrowser(self.machine, self.jobs, self)
        self.hub = self.browser.field  # the search field; Enter opens the id typed in it
        self.hub.returnPressed.connect(self._download)
        self.browser.chosen.connect(self._pick)
        self.browser.results.currentItemChanged.connect(lambda *_: setattr(self, "_last", "hub"))
        bl.addWidget(self.browser, 1)
        row = QHBoxLayout()
        self.machine_line = QLabel()
        self.machine_line.setWordWrap(True)
        row.addWidget(self.machine_line, 1)
        self.get = QPushButton("Download and open")
        self.get.setToolTip("The model chosen below, or the owner/name typed above")
        self.get.clicked.connect(self._download)
        row.addWidget(self.get)
        bl.addLayout(row)

        split = QSplitter(Qt.Vertical)
        split.addWidget(top)
        split.addWidget(bottom)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        lay.addWidget(split, 1)
        ctx_row = QHBoxLayout()  # the context it opens at: auto, or a length with what it costs
        ctx_row.addWidget(QLabel("Context:"))
        self.context_box = QComboBox()
        self.context_box.setToolTip("How many tokens the model can read at once (a conversation with its documents). "
                                    "Auto: the model's own length, as far as memory allows; remembered for this model")
        ctx_row.addWidget(self.context_box)
        ctx_row.addStretch(1)
        lay.addLayout(ctx_row)
        self.list.currentItemChanged.connect(lambda item, _=None: item is not None and self._context_for(
            item.data(Qt.UserRole)))
        self.browser.results.currentItemChanged.connect(lambda *_: self._context_for(self.browser.current_spec()))
        self._context_for(self.list.currentItem().data(Qt.UserRole))
        buttons = QDialogButtonBox(QDialogButtonBox.Open | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self._open)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.machine.ready.connect(self._machine_ready)
        if self.machine.measuring:
            self.machine_line.setText("Measuring this machine… (once; the predictions follow)")

    # ---- what this machine is, and the recent models' lines ----
    def _machine_ready(self) -> None:
        m = self.machine
        if m.hw is None:
            self.machine_line.setText(f"No predictions: this machine could not be measured ({m.error})")
            return
        b = m.budgets
        has = f"{hub_search.size_text(b.ram)} of RAM" + (f" and {hub_search.size_text(b.vram)} of VRAM" if b.vram else "")
        self.machine_line.setText(f"Predictions for this machine: {has} free for a model"
                                  + ("" if b.vram else " (no GPU: CPU only)") + ".")
        self.machine_line.setToolTip("Budgets: the available memory less the engine's margins; tier costs from "
                                     "the hardware profile measured on this machine")
        for i in range(self.list.count()):
            spec = self.list.item(i).data(Qt.UserRole)
            self.jobs.run(("recent", None, spec), hub_search.recent_line, spec, m.hw, m.budgets)

    # ---- the context it opens at ----
    @property
    def context(self):
        """The context chosen: "auto" or a length in tokens."""
        value = self.context_box.currentData()
        return value if value is not None else "auto"

    def _context_for(self, spec: str | None) -> None:
        """The Context box for the model selected: what it remembers, then (from the model's header,
        off the GUI thread) what each length costs here."""
        self.context_spec = spec
        chosen = context_choice.remembered(spec)
        context_choice.fill(self.context_box, None, chosen)
        if spec:
            self.jobs.run(("context", spec), context_choice.cost_of, spec, self.device, self.dtype)

    def _done(self, tag, result) -> None:
        if tag[0] == "context":
            if tag[1] == self.context_spec and result is not None:
                context_choice.fill(self.context_box, result, self.context)
            return
        if tag[0] != "recent":
            return
        line, tip = result
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.UserRole) == tag[2] and line:
                item.setText(f"{self._label(tag[2])}\n    {line}")
                item.setToolTip(tip or line)

    def _label(self, spec: str) -> str:
        return (DEMO_LABEL if spec == "demo" else spec) + (IN_USE if same_model(spec, self.in_use) else "")

    # ---- choosing ----
    def _pick(self, spec: str) -> None:
        self.choice = spec
        self.accept()

    def _open(self) -> None:
        spec = self.browser.current_spec() if self._last == "hub" else None
        item = self.list.currentItem()
        if spec:
            self._pick(spec)
        elif item is not None:
            self._pick(item.data(Qt.UserRole))

    def _folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Open a model folder (Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE or gpt-oss)")
        if d:
            self._pick(d)

    def _gguf(self) -> None:
        from ..menus import GGUF_FILTER, GGUF_TITLE

        path, _ = QFileDialog.getOpenFileName(self, GGUF_TITLE, "", GGUF_FILTER)
        if path:
            self._pick(path)

    def _download(self) -> None:
        from engine.sources.hub import REPO_GGUF, REPO_ID

        text = self.hub.text().strip()
        spec = self.browser.current_spec()
        if spec and self._last == "hub":
            self._pick(spec)
        elif text and (REPO_ID.fullmatch(text) or REPO_GGUF.fullmatch(text) or not self.browser.searchable(text)):
            self._pick(text)  # an id, or a path: opened as typed
        elif text:
            self.browser.status.setText(f"“{text}” is a search: choose one of the models below, or type owner/name.")
