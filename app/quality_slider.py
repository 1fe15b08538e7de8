"""The quality <-> speed slider: 0 fastest, 1 best quality. Moving it re-plans live (no reload).
The predicted tok/s and quality sit at the handle; the frontier is drawn beneath it."""
from __future__ import annotations

from PySide6.QtCore import QPointF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget


class FrontierStrip(QWidget):
    """Predicted tok/s along the slider's axis, one dot per frontier point."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list[tuple[float, float]] = []  # (slider position, tok/s)
        self.setFixedHeight(36)

    def set_points(self, frontier, scale) -> None:
        """frontier: ((loss, tok/s), ...); scale: the planner's SliderScale (None: all at 1)."""
        self.points = [(scale.position(loss) if scale is not None else 1.0, t) for loss, t in frontier]
        self.update()

    def paintEvent(self, _):
        if not self.points:
            return
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        top = max(t for _, t in self.points) or 1.0
        pen = QPen(QColor("#1565c0"))
        pen.setWidth(3)
        p.setPen(pen)
        w, h = self.width() - 12, self.height() - 6
        for x, t in self.points:
            p.drawPoint(QPointF(6 + x * w, 3 + h * (1 - t / top)))
        p.end()


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
        self.slider.setToolTip("Quality ↔ speed: where each expert lives and at what precision. Applies live.")
        row.addWidget(self.slider, 1)
        row.addWidget(QLabel("Best quality"))
        lay.addLayout(row)
        self.strip = FrontierStrip()
        lay.addWidget(self.strip)
        self.readout = QLabel("")
        self.readout.setAlignment(Qt.AlignCenter)
        lay.addWidget(self.readout)
        self._debounce = QTimer(self, singleShot=True, interval=120)
        self._debounce.timeout.connect(lambda: self.changed.emit(self.value()))
        self.slider.valueChanged.connect(lambda _: self._debounce.start())

    def value(self) -> float:
        return self.slider.value() / 100

    def set_value(self, v: float) -> None:
        self.slider.setValue(round(v * 100))

    def show_plan(self, ev) -> None:
        self.strip.set_points(ev.frontier, ev.slider_scale)
        counts = " · ".join(f"{n} {t.value}" for t, n in ev.placement.counts().items() if n)
        limit = "  — limited by memory budget, not by the slider" if ev.limited_by_budget else ""
        together = f" ({ev.streams} requests together)" if ev.streams > 1 else ""
        self.readout.setText(f"predicted {ev.predicted_tok_s:.1f} tok/s{together} · quality loss (KL) {ev.predicted_loss:.4f} · "
                             f"{counts}{limit}")
