"""The frontier under the slider, as a small chart with labelled axes: predicted speed (tok/s, up)
against quality (right: the slider's best-quality end), one dot per frontier point, the plan in use
marked. x is the slider position each point sits at, so the chart reads like the slider above it."""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

CURRENT = QColor("#f59e0b")  # the plan in use: amber reads on both themes' backgrounds


def _nice_top(v: float) -> float:
    """The smallest of 1, 2, 5 x 10^n at or above v (an axis top whose label reads well)."""
    import math

    if v <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(v))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= v - 1e-12)


def _fmt(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}".rstrip("0").rstrip(".") if v else "0"


class FrontierChart(QWidget):
    X_TITLE = "quality →"
    Y_TITLE = "tok/s"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.points: list[tuple[float, float]] = []  # (slider position, tok/s), fastest last
        self.current: tuple[float, float] | None = None  # the plan in use
        self.top = 1.0
        self.setMinimumHeight(84)
        self.setMaximumHeight(110)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        self.setToolTip("The frontier: each dot is a placement no other beats on both predicted speed and "
                        "predicted quality under the current memory budget. Up: faster (predicted tok/s). "
                        "Right: closer to the 16-bit model's answers (less predicted KL divergence). "
                        "The ringed dot is the placement in use.")

    def set_points(self, frontier, scale, current: tuple[float, float] | None = None) -> None:
        """frontier: ((loss, tok/s), ...); scale: the planner's SliderScale (None: all at 1);
        current: (loss, tok/s) of the plan in use."""
        pos = (lambda loss: scale.position(loss)) if scale is not None else (lambda loss: 1.0)
        self.points = sorted(((pos(loss), t) for loss, t in frontier), key=lambda p: p[0])
        self.current = (pos(current[0]), current[1]) if current is not None else None
        tops = [t for _, t in self.points] + ([self.current[1]] if self.current else [])
        self.top = _nice_top(max(tops) * 1.05) if tops else 1.0
        self.update()

    def axis_labels(self) -> dict[str, list[str]]:
        """What the axes say (tests): their titles and tick labels."""
        return {"x": [self.X_TITLE, "fastest", "best"], "y": [self.Y_TITLE, "0", _fmt(self.top / 2), _fmt(self.top)]}

    def plot_rect(self) -> QRectF:
        fm = self.fontMetrics()
        left = fm.horizontalAdvance(_fmt(self.top)) + fm.height() + 8  # tick labels + the rotated title
        return QRectF(left, fm.height() / 2 + 2, max(self.width() - left - 10, 10),
                      max(self.height() - 2 * fm.height() - 8, 10))

    def to_px(self, x: float, tok_s: float) -> QPointF:
        r = self.plot_rect()
        return QPointF(r.left() + x * r.width(), r.bottom() - (tok_s / self.top) * r.height())

    def paintEvent(self, _):
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        pal = self.palette()
        text = pal.color(QPalette.WindowText)
        grid = QColor(text)
        grid.setAlphaF(0.18)
        axis = QColor(text)
        axis.setAlphaF(0.6)
        fm = self.fontMetrics()
        r = self.plot_rect()
        font = p.font()
        # grid lines and y ticks
        for frac in (0.0, 0.5, 1.0):
            y = r.bottom() - frac * r.height()
            p.setPen(QPen(grid if frac else axis, 1))
            p.drawLine(QPointF(r.left(), y), QPointF(r.right(), y))
            p.setPen(text)
            label = _fmt(self.top * frac)
            p.drawText(QRectF(fm.height() + 2, y - fm.height() / 2, r.left() - fm.height() - 6, fm.height()),
                       Qt.AlignRight | Qt.AlignVCenter, label)
        p.setPen(QPen(axis, 1))
        p.drawLine(QPointF(r.left(), r.top()), QPointF(r.left(), r.bottom()))
        # axis titles: y rotated on the left, x under the plot between its ends
        p.setPen(text)
        p.save()
        p.translate(2, r.center().y())
        p.rotate(-90)
        p.drawText(QRectF(-r.height() / 2, 0, r.height(), fm.height()), Qt.AlignCenter, self.Y_TITLE)
        p.restore()
        below = QRectF(r.left(), r.bottom() + 3, r.width(), fm.height())
        p.drawText(below, Qt.AlignLeft | Qt.AlignVCenter, "fastest")
        p.drawText(below, Qt.AlignRight | Qt.AlignVCenter, "best")
        p.drawText(below, Qt.AlignHCenter | Qt.AlignVCenter, self.X_TITLE)
        if not self.points:
            p.drawText(r, Qt.AlignCenter, "no plan yet")
            p.end()
            return
        # the frontier: a line through the points, a dot on each
        line = pal.color(QPalette.Highlight)
        path = QPainterPath(self.to_px(*self.points[0]))
        for x, t in self.points[1:]:
            path.lineTo(self.to_px(x, t))
        p.setPen(QPen(line, 1.5))
        p.setBrush(Qt.NoBrush)
        p.drawPath(path)
        p.setPen(Qt.NoPen)
        p.setBrush(line)
        for x, t in self.points:
            p.drawEllipse(self.to_px(x, t), 2.5, 2.5)
        if self.current is not None:
            c = self.to_px(*self.current)
            p.setBrush(CURRENT)
            p.setPen(QPen(text, 1.2))
            p.drawEllipse(c, 5, 5)
            p.setFont(font)
            label = f"now: {_fmt(self.current[1])} tok/s"
            w = fm.horizontalAdvance(label) + 4
            x = c.x() + 8 if c.x() + 8 + w <= r.right() else c.x() - 8 - w
            y = max(r.top(), min(c.y() - fm.height() - 2, r.bottom() - fm.height()))
            p.setPen(text)
            p.drawText(QRectF(x, y, w, fm.height()), Qt.AlignLeft | Qt.AlignVCenter, label)
        p.end()
