"""The quality <-> speed slider: 0 fastest, 1 best quality. Moving it re-plans live (no reload).
Beneath it: the frontier drawn with labelled axes and the plan in use marked (app/panel/frontier_chart.py),
and the plan in plain words ("about the same answers, 1.6x faster than best quality"), with the
technical figures in the tooltip."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QRect, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from . import plain_words
from .frontier_chart import FrontierChart


def _mix(a: QColor, b: QColor, t: float) -> str:
    """a blended towards b by t, as a style sheet colour."""
    return QColor(round(a.red() + (b.red() - a.red()) * t), round(a.green() + (b.green() - a.green()) * t),
                  round(a.blue() + (b.blue() - a.blue()) * t)).name()


def groove_style(pal: QPalette) -> str:
    """The slider drawn from the palette: a groove a third of the way from the window's colour to
    its text's (visible on both themes), the part left of the handle in the highlight colour."""
    window, text = pal.color(QPalette.Window), pal.color(QPalette.WindowText)
    return (f"QSlider::groove:horizontal {{ height: 6px; border-radius: 3px; background: {_mix(window, text, 0.35)}; }}"
            f"QSlider::sub-page:horizontal {{ height: 6px; border-radius: 3px; "
            f"background: {pal.color(QPalette.Highlight).name()}; }}"
            f"QSlider::handle:horizontal {{ width: 16px; margin: -6px 0; border-radius: 8px; "
            f"background: {pal.color(QPalette.Button).name()}; border: 1px solid {_mix(window, text, 0.6)}; }}")


class QualitySlider(QWidget):
    changed = Signal(float)  # debounced slider value in [0, 1]

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Fastest"))
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setRange(0, 100)
        self.slider.setValue(50)
        self.slider.setToolTip(plain_words.SLIDER_TIP)
        row.addWidget(self.slider, 1)
        row.addWidget(QLabel("Best quality"))
        lay.addLayout(row)
        self.cpu_only = False  # the model in use runs on the CPU alone (its Loaded says)
        self.meaning = QLabel(plain_words.position_words(self.value()))  # what this position asks for
        self.meaning.setAlignment(Qt.AlignCenter)
        self.meaning.setWordWrap(True)
        lay.addWidget(self.meaning)
        self.chart = self.strip = FrontierChart()
        lay.addWidget(self.chart)
        self.readout = QLabel("")
        self.readout.setAlignment(Qt.AlignCenter)
        self.readout.setWordWrap(True)
        lay.addWidget(self.readout)
        self._styled_for = None
        self._style()
        self._debounce = QTimer(self, singleShot=True, interval=120)
        self._debounce.timeout.connect(lambda: self.changed.emit(self.value()))
        self.slider.valueChanged.connect(lambda _: self._debounce.start())
        self.slider.valueChanged.connect(lambda _: self._say_position())
        self.changed.connect(lambda _: self._replanning())
        self.shown = None  # the plan the readout shows (None: none yet)
        self.plan = None  # the last PlacementChanged
        self.file_bits: str | None = None  # a GGUF file's precision above 4 bits ("8-bit"), which 4-bit re-quantises

    def _say_position(self) -> None:
        self.meaning.setText(plain_words.position_words(self.value(), self.cpu_only))

    def _replanning(self) -> None:
        """Between a move and the engine's new plan the readout's figures are the old plan's: say so."""
        if self.shown is not None:
            self._say(f"<i>re-planning…</i><br><small>{self.shown}</small>")

    def _say(self, html: str) -> None:
        """The readout, which only grows: a shorter text does not pull what is below it up."""
        self.readout.setText(html)
        self.readout.setMinimumHeight(max(self.readout.minimumHeight(), self.readout.sizeHint().height()))

    def _fit_caption(self) -> None:
        """The caption keeps the height of its longest wording at this width, so that the chart and
        the chat below it do not jump while the handle moves."""
        width = max(self.meaning.width(), 50)
        fm = self.meaning.fontMetrics()
        h = max(fm.boundingRect(QRect(0, 0, width, 10_000), Qt.TextWordWrap, plain_words.position_words(v, c)).height()
                for v in (0.0, 0.55, 1.0) for c in (False, True))
        self.meaning.setFixedHeight(h + 2)

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self._fit_caption()

    def follow(self, engine) -> None:
        """Subscribe to the engine controller (app/engine_controller.py): each plan's frontier and figures."""
        engine.placement_changed.connect(self.show_plan)
        engine.loaded.connect(self._on_loaded)

    def _on_loaded(self, ev) -> None:
        self.cpu_only = bool(ev.cpu_only)
        self.file_bits = ev.weights_bits if ev.weights and not ev.weights_4bit else None
        self._say_position()
        if self.plan is not None:  # its plan came before its Loaded: said again, for this file
            self.show_plan(self.plan)

    def value(self) -> float:
        return self.slider.value() / 100

    def set_value(self, v: float) -> None:
        self.slider.setValue(round(v * 100))

    def show_plan(self, ev) -> None:
        self.plan = ev
        self.chart.set_points(ev.frontier, ev.slider_scale, (ev.predicted_loss, ev.predicted_tok_s))
        together = f" ({ev.streams} requests together)" if ev.streams > 1 else ""
        limit = " — memory limits it, not the slider" if ev.limited_by_budget else ""
        if getattr(ev, "provisional", False):  # no quality traded before the calibration has measured it
            limit = " — full precision until this model's 4-bit sensitivity is measured (about a minute)"
        self.shown = plain_words.placement_words(ev.placement.counts())
        requantised = ""
        if self.file_bits is not None:  # a GGUF file held above 4 bits: never re-quantised silently
            advice = ("memory leaves no room for the file's precision" if ev.limited_by_budget
                      else "move the slider right to keep the file's precision")
            n4 = plain_words.four_bit_experts(ev.placement.counts())
            requantised = plain_words.requantised_words(n4, self.file_bits, advice)
        self._say(f"predicted {ev.predicted_tok_s:.1f} tok/s{together} · {plain_words.plan_words(ev)}"
                  f"{limit}" + (f"<br><b>{requantised}</b>" if requantised else "") + f"<br><small>{self.shown}</small>")
        self.readout.setToolTip(plain_words.plan_tooltip(ev))

    # ---- the groove follows the theme ----
    def _style(self) -> None:
        key = (self.palette().color(QPalette.Window).rgb(), self.palette().color(QPalette.WindowText).rgb())
        if key != self._styled_for:
            self._styled_for = key
            self.slider.setStyleSheet(groove_style(self.palette()))

    def changeEvent(self, e) -> None:
        if e.type() == QEvent.PaletteChange:
            self._style()
        super().changeEvent(e)
