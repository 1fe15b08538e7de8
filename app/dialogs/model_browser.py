"""The model browser's hub search (inside File > Open model…): type a name, and the hub's models
that match are listed with their files and sizes and what Mixdesk's planner predicts for each on
this machine, before any download (app/dialogs/hub_search.py does the work, engine/measures/fit.py the
prediction).

The work runs on daemon threads (Jobs) that post results back through a queued signal: typing is
debounced, a newer search drops the results of an older one, and a hub that does not answer within
`deadline_s` is said to in one line (huggingface_hub's own retries go on behind it, unseen)."""
from __future__ import annotations


from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QHeaderView, QLabel, QLineEdit, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from .. import gui_threads
from . import hub_search

SPEC = Qt.UserRole  # an item's model spec: a repo id, or "owner/name/file.gguf"


class Jobs(QObject):
    """fn(*args) on a daemon thread; done(tag, result) or failed(tag, one line) on the GUI thread.
    It has no Qt parent: a thread that outlives the dialog still has a live object to emit from."""
    done = Signal(object, object)
    failed = Signal(object, str)

    def run(self, tag, fn, *args) -> None:
        def work():
            try:
                result = fn(*args)
            except Exception as e:  # noqa: BLE001 - said in one line, never a traceback
                from engine.protocol.errors import MixdeskError

                self.failed.emit(tag, e.args[0] if isinstance(e, MixdeskError) and e.args else
                                 f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
                return
            self.done.emit(tag, result)
        gui_threads.start(work, f"model-browser-{tag[0]}")  # Jobs let go of on the GUI thread, even if last


def machine_profile():
    """This machine's hardware profile: the cached one (measured by the engine), else measured now
    (this runs on a worker thread; the browser says "measuring this machine…" meanwhile)."""
    from engine.measures import hardware

    prof = hardware.cached()
    if prof is None:
        import torch

        prof = hardware.load_or_measure(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return prof


class Machine(QObject):
    """The hardware profile and budgets the predictions use, got once per dialog off the GUI
    thread; `ready` fires when known (at once if the cached profile is read fast)."""
    ready = Signal()

    def __init__(self, jobs: Jobs, parent=None):
        super().__init__(parent)
        self.hw = self.budgets = None
        self.error: str | None = None  # why the profile could not be had
        jobs.done.connect(self._done)
        jobs.failed.connect(self._failed)
        from engine.measures import hardware

        self.measuring = not hardware.profile_path().is_file()  # a cheap look: no profile, it will be measured
        jobs.run(("hardware",), self._get)

    @staticmethod
    def _get():
        from engine.measures import fit

        hw = machine_profile()
        return hw, fit.machine_budgets(hw)

    def _done(self, tag, result):
        if tag == ("hardware",):
            self.hw, self.budgets = result
            self.measuring = False
            self.ready.emit()

    def _failed(self, tag, message):
        if tag == ("hardware",):
            self.measuring = False
            self.error = message
            self.ready.emit()


class HubBrowser(QWidget):
    """The search field, a one-line status, and the results: one row per repo (its size and fit
    line), its files under it (sizes; a GGUF file's own line). chosen(spec) on a double-click."""
    chosen = Signal(str)

    def __init__(self, machine: Machine, jobs: Jobs, parent=None, debounce_ms: int = 350, deadline_s: float = 12.0):
        super().__init__(parent)
        self.machine, self.jobs = machine, jobs
        self.deadline_s = deadline_s
        self.generation = 0  # the search in progress; results of older ones are dropped
        self.query = ""
        self.pending: list[str] = []  # repo ids waiting for the hardware profile
        self.items: dict[str, QTreeWidgetItem] = {}
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.field = QLineEdit(placeholderText="Search the hub (e.g. Mixtral, Qwen3 MoE) or type owner/name")
        self.field.setClearButtonEnabled(True)
        self.field.setToolTip("Searches the Hugging Face hub as you type; Enter downloads and opens the model "
                              "whose id you typed")
        lay.addWidget(self.field)
        self.status = QLabel()
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.results = QTreeWidget()
        self.results.setHeaderLabels(["Model", "Size", "On this machine"])
        self.results.setRootIsDecorated(True)
        self.results.header().setStretchLastSection(True)
        self.results.header().setSectionResizeMode(0, QHeaderView.ResizeToContents)
        self.results.itemDoubleClicked.connect(self._double)
        lay.addWidget(self.results, 1)
        self.debounce = QTimer(self, singleShot=True, interval=debounce_ms)
        self.debounce.timeout.connect(self._search)
        self.deadline = QTimer(self, singleShot=True)
        self.deadline.timeout.connect(self._late)
        self.field.textEdited.connect(lambda _: self.debounce.start())
        jobs.done.connect(self._done)
        jobs.failed.connect(self._failed)
        machine.ready.connect(self._machine_ready)

    # ---- searching ----
    @staticmethod
    def searchable(text: str) -> bool:
        return len(text) >= 2 and not text.startswith(("/", "~", ".", "\\")) and ":" not in text[:3]

    def _search(self) -> None:
        text = self.field.text().strip()
        if text == self.query:
            return
        self.generation += 1
        self.query, self.pending = text, []
        self.results.clear()
        self.items.clear()
        self.deadline.stop()
        if not self.searchable(text):
            self.status.setText("")
            return
        self.status.setText(f"Searching the hub for “{text}”…")
        self.deadline.start(int(self.deadline_s * 1000))
        self.jobs.run(("search", self.generation), hub_search.search, text)

    def _late(self) -> None:
        self.status.setText(f"The Hugging Face hub ({hub_search.where()}) did not answer within "
                            f"{self.deadline_s:.0f} s: offline? Folders, GGUF files and recent models still open.")

    def _mine(self, tag) -> bool:
        return tag[0] in ("search", "candidate") and tag[1] == self.generation

    def _done(self, tag, result) -> None:
        if not self._mine(tag):
            return
        kind = tag[0]
        if kind == "search":
            self.deadline.stop()
            self._listed(result)
        elif kind == "candidate":
            self._fill(result)

    def _failed(self, tag, message: str) -> None:
        if not self._mine(tag):
            return
        if tag[0] == "search":
            self.deadline.stop()
            self.status.setText(message)
        elif tag[2] in self.items:
            self.items[tag[2]].setText(2, message)

    def _listed(self, ids: list[str]) -> None:
        if not ids:
            self.status.setText(f"No model on the hub matches “{self.query}”.")
            return
        self.status.setText(f"{len(ids)} model{'s' * (len(ids) > 1)} on the hub match “{self.query}”; "
                            "double-click one to download and open it.")
        for repo in ids:
            item = QTreeWidgetItem([repo, "", "reading its files…"])
            item.setData(0, SPEC, repo)
            self.results.addTopLevelItem(item)
            self.items[repo] = item
        self.pending = list(ids)
        self._machine_ready()

    def _machine_ready(self) -> None:
        m = self.machine
        if m.hw is None and m.error is None:
            if self.pending:
                self.status.setText("Measuring this machine… (once; the predictions follow)")
            return
        ids, self.pending = self.pending, []
        for repo in ids:
            self.jobs.run(("candidate", self.generation, repo), hub_search.candidate, repo, m.hw, m.budgets)

    def _fill(self, c: hub_search.Candidate) -> None:
        item = self.items.get(c.repo_id)
        if item is None:
            return
        item.setText(1, hub_search.size_text(c.weight_bytes) if c.weight_bytes else "")
        item.setText(2, c.line)
        item.setToolTip(2, c.details or c.line)
        if not c.openable:
            item.setData(0, SPEC, None)
        gguf_lines = {f.name: line for f, line in c.ggufs}
        for f in c.files:
            child = QTreeWidgetItem([f.name, hub_search.size_text(f.size), gguf_lines.get(f.name, "")])
            if f.name in gguf_lines:
                child.setData(0, SPEC, f"{c.repo_id}/{f.name}")
                child.setToolTip(2, "Double-click to download this file and open it")
            item.addChild(child)
        item.setExpanded(bool(c.ggufs) and not c.openable)

    # ---- choosing ----
    def current_spec(self) -> str | None:
        item = self.results.currentItem()
        return item.data(0, SPEC) if item is not None else None

    def _double(self, item: QTreeWidgetItem, _col: int) -> None:
        spec = item.data(0, SPEC)
        if spec:
            self.chosen.emit(spec)

    def row_texts(self) -> dict[str, list[str]]:
        """Each result's columns, and its files' (for tests and screenshots)."""
        out = {}
        for i in range(self.results.topLevelItemCount()):
            it = self.results.topLevelItem(i)
            out[it.text(0)] = [it.text(1), it.text(2)] + [
                f"{it.child(k).text(0)} {it.child(k).text(1)} {it.child(k).text(2)}".strip()
                for k in range(it.childCount())]
        return out
