"""The placement map: a layers x experts grid coloured by tier and shaded by popularity, and its
legend (the tiers in plain words, the popularity scale, what an outlined cell means).

During a migration the map shows both placements: each cell is filled with the tier its expert is
in now, and a cell still to move is outlined (and hatched) in the colour of the tier it is going
to; it fills as its expert lands (MigrationProgress names the expert)."""
from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from .plain_words import TIER_NAMES

TIER_COLOURS = {"gpu-16": QColor("#2e7d32"), "gpu-4": QColor("#81c784"),
                "cpu-16": QColor("#1565c0"), "cpu-4": QColor("#64b5f6"), "cpu-3": QColor("#26c6da"),
                "cpu-2": QColor("#b2ebf2")}
ORDER = ("gpu-16", "gpu-4", "cpu-16", "cpu-4", "cpu-3", "cpu-2")
MIN_CELL_PX = 4  # narrower cells than this (hundreds of experts a layer) cannot be told apart: aggregate
LOW_ALPHA = 0.35  # the least picked expert of a layer is drawn at this opacity, the most picked opaque


def shade(tier: str, share: float) -> QColor:
    """The colour of an expert of `tier` picked `share` (0..1 of its layer's most picked) of the time."""
    c = QColor(TIER_COLOURS.get(tier, QColor("gray")))
    c.setAlphaF(LOW_ALPHA + (1 - LOW_ALPHA) * min(max(share, 0.0), 1.0))
    return c


class PlacementMap(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.current: list[list[str]] = []  # [layer][expert] the tier each expert is in now
        self.target: list[list[str]] = []  # where the plan wants it (== current when settled)
        self.share: list[list[float]] = []
        self.paints = 0  # for tests: how many times it repainted
        self.drawn: dict[tuple[int, int], tuple[str, str | None]] = {}  # (l, e) -> (fill, outline) last painted
        self.aggregate = False  # True when each layer is drawn as the bar of its tier mix
        self.setMinimumSize(140, 90)  # the panel's column holds it from a 900 px window up
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self._tooltip()

    @property
    def tiers(self) -> list[list[str]]:
        """What the map fills each cell with: the placement in use now."""
        return self.current

    def pending(self) -> set[tuple[int, int]]:
        """The experts still to move: in one tier now, planned for another."""
        return {(l, e) for l, (now, want) in enumerate(zip(self.current, self.target))
                for e, (a, b) in enumerate(zip(now, want)) if a != b}

    # ---- what it shows ----
    def set_share(self, share) -> None:
        self.share = [list(r) for r in share]
        self.update()

    def set_placement(self, placement) -> None:
        """A settled placement: current and target are both it."""
        self.set_plan(placement, placement)

    def set_plan(self, current, target) -> None:
        """A new plan: `current` (None: the map's own, or the target when it has none) becomes
        `target` as experts move."""
        grid = [[t.value for t in row] for row in target.tiers]
        if current is not None:
            self.current = [[t.value for t in row] for row in current.tiers]
        elif len(self.current) != len(grid) or (grid and len(self.current[0]) != len(grid[0])):
            self.current = [list(r) for r in grid]
        self.target = grid
        self._tooltip()
        self.update()

    def moved(self, layer: int, expert: int, tier: str) -> None:
        """One expert landed in `tier`."""
        if 0 <= layer < len(self.current) and 0 <= expert < len(self.current[layer]):
            self.current[layer][expert] = tier
            self.update()

    def settle(self) -> None:
        """The migration ended: what is in use is the target."""
        if self.current != self.target:
            self.current = [list(r) for r in self.target]
            self.update()

    def clear(self) -> None:
        self.current, self.target, self.share = [], [], []
        self.update()

    def _tooltip(self) -> None:
        many = bool(self.current) and len(self.current[0]) * MIN_CELL_PX > max(self.width(), 1)
        names = ", ".join(f"{TIER_NAMES[t]} ({t})" for t in ORDER)
        self.setToolTip(
            ("Placement map: one bar per layer (rows), its length split by how many of the layer's "
             f"{len(self.current[0])} experts are in each tier.\n" if many else
             "Placement map: one cell per expert (rows: layers, columns: experts).\n")
            + f"Colour: where and how the expert is kept: {names}."
            + ("" if many else "\nBrightness: how often the router picks the expert (its routing share in the "
                               "calibration text, relative to the layer's most picked).")
            + "\nOutlined and hatched: moving to the outline's tier; it fills in when the expert lands.")

    # ---- painting ----
    def grid_rect(self) -> QRectF:
        return QRectF(self.rect())

    def cell_rect(self, layer: int, expert: int) -> QRectF:
        rows, cols = len(self.current), len(self.current[0])
        w, h = self.width() / cols, self.height() / rows
        return QRectF(expert * w + 0.5, layer * h + 0.5, max(w - 1, 1), max(h - 1, 1))

    def paintEvent(self, _):
        self.paints += 1
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.window())
        if not self.current:
            p.setPen(pal.windowText().color())
            p.drawText(self.rect(), Qt.AlignCenter, "no model loaded")
            p.end()
            return
        rows, cols = len(self.current), len(self.current[0])
        w, h = self.width() / cols, self.height() / rows
        self.aggregate = w < MIN_CELL_PX
        self.drawn = {}
        if self.aggregate:  # e.g. Qwen3-30B-A3B's 48 x 128: each layer is a bar of its tier mix
            for l, row in enumerate(self.current):
                x = 0.0
                for tier in ORDER:
                    n = row.count(tier)
                    if n:
                        width = self.width() * n / cols
                        p.fillRect(QRectF(x, l * h + 0.5, width, max(h - 1, 1)), TIER_COLOURS[tier])
                        x += width
                going = sum(a != b for a, b in zip(row, self.target[l])) if l < len(self.target) else 0
                if going:  # the share of the layer still to move, as an outlined stretch at its end
                    pen = QPen(pal.windowText().color(), 1.5, Qt.DashLine)
                    p.setPen(pen)
                    p.setBrush(Qt.NoBrush)
                    p.drawRect(QRectF(self.width() * (1 - going / cols) + 1, l * h + 1,
                                      self.width() * going / cols - 2, max(h - 2, 1)))
            p.end()
            return
        p.setRenderHint(QPainter.Antialiasing)
        for l, row in enumerate(self.current):
            top = max(self.share[l]) if l < len(self.share) and self.share[l] else 0.0
            for e, tier in enumerate(row):
                share = self.share[l][e] / top if top else 1.0
                r = self.cell_rect(l, e)
                p.fillRect(r, shade(tier, share))
                want = self.target[l][e] if l < len(self.target) else tier
                if want != tier:  # still to move: hatched and outlined in the tier it goes to
                    colour = TIER_COLOURS.get(want, QColor("gray"))
                    p.fillRect(r, QBrush(colour, Qt.BDiagPattern))
                    pen = QPen(colour, max(1.5, min(r.width(), r.height()) / 6))
                    pen.setJoinStyle(Qt.MiterJoin)
                    p.setPen(pen)
                    p.setBrush(Qt.NoBrush)
                    inset = pen.widthF() / 2
                    p.drawRect(r.adjusted(inset, inset, -inset, -inset))
                self.drawn[(l, e)] = (tier, want if want != tier else None)
        p.end()


class PlacementLegend(QWidget):
    """The map's key, below it (never over it): the four tiers in plain words, the popularity
    scale, and the outline that marks an expert still moving."""

    SWATCH = 12

    def __init__(self, parent=None):
        super().__init__(parent)
        self.popularity = True  # the shading scale is shown (not while the map aggregates layers)
        self.moving = False  # the outline's key is shown (while a migration is under way)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        self.setToolTip("Where each expert is kept (the engine's tiers: " + ", ".join(ORDER) + ") and how "
                        "often the router picks it (brightness).")

    def labels(self) -> list[str]:
        """The words the legend draws (tests)."""
        out = [TIER_NAMES[t] for t in ORDER]
        if self.popularity:
            out += ["rarely picked", "often picked"]
        if self.moving:
            out.append("outlined: still moving there")
        return out

    def _rows(self) -> int:
        return 3 + int(self.popularity) + int(self.moving)

    def sizeHint(self) -> QSize:
        line = self.fontMetrics().height() + 4
        return QSize(200, self._rows() * line + 2)

    def minimumSizeHint(self) -> QSize:
        return QSize(120, self.sizeHint().height())

    def set_modes(self, popularity: bool, moving: bool) -> None:
        if (popularity, moving) != (self.popularity, self.moving):
            self.popularity, self.moving = popularity, moving
            self.updateGeometry()
            self.update()

    def paintEvent(self, _):
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        pal = self.palette()
        fm = self.fontMetrics()
        line, s = fm.height() + 4, self.SWATCH
        half = self.width() / 2
        p.setPen(pal.windowText().color())
        for i, tier in enumerate(ORDER):  # GPU on the left, CPU on the right; then CPU 3-bit | CPU 2-bit
            x, y = ((i // 2) * half, (i % 2) * line) if i < 4 else ((i - 4) * half, 2 * line)
            p.fillRect(QRectF(x + 1, y + (line - s) / 2, s, s), TIER_COLOURS[tier])
            text = fm.elidedText(TIER_NAMES[tier], Qt.ElideRight, int(half - s - 8))
            p.drawText(QRectF(x + s + 6, y, half - s - 6, line), Qt.AlignVCenter | Qt.AlignLeft, text)
        y = 3 * line
        x = 1.0
        if self.popularity:
            lo, hi = "rarely picked", "often picked"
            bar_w = max(min(half - 8, 120), 40)
            lw = fm.horizontalAdvance(lo) + 6
            p.drawText(QRectF(x, y, lw, line), Qt.AlignVCenter | Qt.AlignLeft, lo)
            grad = QLinearGradient(x + lw, 0, x + lw + bar_w, 0)
            grad.setColorAt(0, shade("cpu-16", 0.0))
            grad.setColorAt(1, shade("cpu-16", 1.0))
            p.fillRect(QRectF(x + lw, y + (line - s) / 2, bar_w, s), grad)
            p.drawText(QRectF(x + lw + bar_w + 6, y, fm.horizontalAdvance(hi) + 4, line),
                       Qt.AlignVCenter | Qt.AlignLeft, hi)
            y += line
        if self.moving:
            r = QRectF(x, y + (line - s) / 2, s, s)
            pen = QPen(pal.windowText().color(), 2)
            p.setPen(pen)
            p.fillRect(r, QBrush(pal.windowText().color(), Qt.BDiagPattern))
            p.drawRect(r)
            text = fm.elidedText("outlined: still moving there", Qt.ElideRight, int(max(self.width() - x - s - 6, 0)))
            p.drawText(QRectF(x + s + 6, y, self.width() - x - s - 6, line), Qt.AlignVCenter | Qt.AlignLeft, text)
        p.end()
