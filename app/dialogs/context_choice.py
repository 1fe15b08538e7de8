"""The context a model runs at, chosen by the user: when it opens (the model picker's Context box) and
from the model bar (ContextButton), remembered per model (QSettings, keyed by the model as the recent
list names it) and used the next time it opens. "Auto" is the engine's: the model's own context length
as far as memory allows (engine/control/context_fit.py); an explicit length says what it costs in memory. A
change of a loaded model's context is a SetContext (engine/protocol/commands.py): no reload of the weights.

Each option's memory comes from the model's context cost (engine/planning/kv_reservation.py): from the
Loaded event for the model in use, from the model's header on disk for one not open yet (`cost_of`, on
a worker thread: no weights read)."""
from __future__ import annotations

import json

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QComboBox, QMenu, QToolButton

from engine.planning.kv_reservation import size_text

from .. import theme

KEY = "model_context"  # QSettings: {model (model_picker.normal): "auto" or tokens}
LENGTHS = (2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)


# ---- remembered per model ----
def _all() -> dict:
    try:
        value = json.loads(theme.settings().value(KEY, "{}") or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def remembered(spec: str | None):
    """The context last chosen for this model: "auto" (also when none was), or a length in tokens."""
    from .model_picker import normal

    if not spec:
        return "auto"
    value = _all().get(normal(spec), "auto")
    ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
    return value if ok else "auto"


def remember(spec: str, value) -> None:
    from .model_picker import normal

    items = _all()
    items[normal(spec)] = value
    theme.settings().setValue(KEY, json.dumps(items))


# ---- the options, in words ----
def label(tokens: int, choice=None) -> str:
    """ "16,384 tokens · 1.6 GB" (the memory where the model's cost is known)."""
    if choice is None:
        return f"{tokens:,} tokens"
    return f"{tokens:,} tokens · {size_text(choice.bytes_at(tokens))}"


def options(choice=None, max_positions: int = 0, current=None) -> list[tuple[str, object, bool]]:
    """(label, value, fits) for "Auto (fits: N tokens)" and the explicit lengths up to the model's own
    (its own too, and `current`, a length chosen before); choice: the model's ContextChoice (None: not
    known, lengths without their memory)."""
    top = choice.cost.max_positions if choice is not None else max_positions or LENGTHS[-1]
    auto = f"Auto (fits: {choice.auto_ctx:,} tokens)" if choice is not None else "Auto (as memory allows)"
    out = [(auto, "auto", True)]
    lengths = {n for n in LENGTHS if n < top} | {top} | ({min(current, top)} if isinstance(current, int) else set())
    lengths = sorted(lengths)
    for n in lengths:
        fits = choice is None or choice.fits <= 0 or n <= choice.fits
        out.append((label(n, choice) + ("" if fits else " (more than memory holds now)"), n, fits))
    return out


def cost_of(spec: str, device: str | None, dtype: str):
    """The context figures of a model not open yet, from its header (a worker thread): what "auto"
    would take now and what each length costs; None where it is not on disk."""
    import torch

    from engine.control.context_fit import choose
    from engine.machine.devices import detect
    from engine.runtime.load import open_checkpoint
    from engine.measures.inputs import default_budgets

    from .hub_search import local_path

    path = local_path(spec)
    if path is None:
        return None
    ck = open_checkpoint(path)
    try:
        accel = detect(device)
        # "auto" is a 16-bit dtype on every device (bf16 or fp16: the same bytes a value; not measured here)
        dt = {"fp32": torch.float32, "fp16": torch.float16}.get(dtype, torch.bfloat16)
        return choose(ck, accel, dt, default_budgets(accel.cpu_only, accel.device), "auto")
    finally:
        ck.close()


def fill(box: QComboBox, choice=None, selected="auto", max_positions: int = 0) -> None:
    """A combo box holding the options, `selected` chosen (a length not listed is added)."""
    box.clear()
    for text, value, fits in options(choice, max_positions, selected):
        box.addItem(text, value)
        if not fits:
            box.model().item(box.count() - 1).setEnabled(False)
    box.setCurrentIndex(max(box.findData(selected), 0))


class ContextButton(QToolButton):
    """The model bar's context: "Context: 16,384 tokens (auto)", a menu of the options; a choice is
    `chosen` (the window sends the SetContext)."""

    chosen = Signal(object)  # "auto" or tokens

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setPopupMode(QToolButton.InstantPopup)
        self.setMenu(QMenu(self))
        self.choice = None  # the ContextChoice of the model in use
        self.hide()

    def show_context(self, choice) -> None:
        self.choice = choice
        if choice is None:
            self.hide()
            return
        self.setText(f"Context: {label(choice.ctx, choice)}" + (" (auto)" if choice.auto else ""))
        self.setToolTip(f"{choice.line()}: {choice.details()}. Choose another length (no reload of the weights)")
        menu = self.menu()
        menu.clear()
        group = QActionGroup(menu)
        for text, value, fits in options(choice, current=None if choice.auto else choice.ctx):
            act = QAction(text, menu, checkable=True)
            act.setChecked(value == ("auto" if choice.auto else choice.ctx))
            act.setEnabled(fits)
            act.triggered.connect(lambda _=False, v=value: self.chosen.emit(v))
            group.addAction(act)
            menu.addAction(act)
        self.show()


class ContextSwitch(QObject):
    """The window's SetContext requests: sent, then remembered for the model once the engine answers
    (a length memory cannot hold is said, and the context stays as it was)."""

    changed = Signal(object)  # the value now in use (after the engine's answer)
    refused = Signal(str)  # the engine's reason (the context stays as it was)

    def __init__(self, send, current_spec, parent=None):
        """send(command) -> request id; current_spec() -> the spec of the model in use."""
        super().__init__(parent)
        self.send, self.current_spec = send, current_spec
        self.pending: dict[int, tuple[object, bool]] = {}  # request id -> (value, remember it)

    def request(self, value, remember_it: bool = True) -> None:
        from engine.protocol import SetContext

        rid = self.send(SetContext(tokens=value))
        self.pending[rid] = (value, remember_it)

    def on_event(self, ev) -> bool:
        """An answer to one of its requests (the engine controller's filter); True when handled here
        (an ErrorEvent goes on to the status line too)."""
        from engine.protocol import ErrorEvent, QueryDone

        rid = getattr(ev, "request_id", None)
        if rid not in self.pending or not isinstance(ev, (QueryDone, ErrorEvent)):
            return False
        value, keep = self.pending.pop(rid)
        if isinstance(ev, QueryDone):
            spec = self.current_spec()
            if keep and spec:
                remember(spec, value)
            self.changed.emit(value)
            return True
        self.refused.emit(ev.message)
        return False
