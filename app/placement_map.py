"""The placement map: a layers x experts grid coloured by tier and shaded by popularity."""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

TIER_COLOURS = {"gpu-16": QColor("#2e7d32"), "gpu-4": QColor("#81c784"),
                "cpu-16": QColor("#1565c0"), "cpu-4": QColor("#64b5f6")}
ORDER = ("gpu-16", "gpu-4", "cpu-16", "cpu-4")
MIN_CELL_PX = 4  # narrower cells than this (hundreds of experts a layer) cannot be told apart: aggregate


class PlacementMap(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.tiers: list[list[str]] = []
        self.share: list[list[float]] = []
        self.paints = 0  # for tests: how many times it repainted
        self.aggregate = False  # True when each layer is drawn as the bar of its tier mix
        self.setMinimumSize(160, 120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self.setToolTip("Placement map: one cell per expert (rows: layers, columns: experts).\n"
                        "Colour: tier (dark green gpu-16, light green gpu-4, dark blue cpu-16, light blue cpu-4).\n"
                        "Brightness: how often the router picks the expert.")

    def set_share(self, share) -> None:
        self.share = [list(r) for r in share]
        self.update()

    def set_placement(self, placement) -> None:
        self.tiers = [[t.value for t in row] for row in placement.tiers]
        many = len(self.tiers[0]) * MIN_CELL_PX > self.width() if self.tiers else False
        self.setToolTip(
            ("Placement map: one bar per layer (rows), its length split by how many of the layer's "
             f"{len(self.tiers[0])} experts are in each tier.\n" if many else
             "Placement map: one cell per expert (rows: layers, columns: experts).\n")
            + "Colour: tier (dark green gpu-16, light green gpu-4, dark blue cpu-16, light blue cpu-4)."
            + ("" if many else "\nBrightness: how often the router picks the expert."))
        self.update()

    def paintEvent(self, _):
        self.paints += 1
        p = QPainter(self)
        p.fillRect(self.rect(), self.palette().window())
        if not self.tiers:
            p.drawText(self.rect(), Qt.AlignCenter, "no model loaded")
            return
        rows, cols = len(self.tiers), len(self.tiers[0])
        w, h = self.width() / cols, self.height() / rows
        self.aggregate = w < MIN_CELL_PX
        if self.aggregate:  # e.g. Qwen3-30B-A3B's 48 x 128: each layer is a bar of its tier mix
            for l, row in enumerate(self.tiers):
                x = 0.0
                for tier in ORDER:
                    n = row.count(tier)
                    if n:
                        width = self.width() * n / cols
                        p.fillRect(QRectF(x, l * h + 0.5, width, max(h - 1, 1)), TIER_COLOURS[tier])
                        x += width
            p.end()
            return
        for l, row in enumerate(self.tiers):
            top = max(self.share[l]) if self.share and self.share[l] else 1.0
            for e, tier in enumerate(row):
                c = QColor(TIER_COLOURS.get(tier, QColor("gray")))
                if self.share:
                    c.setAlphaF(0.35 + 0.65 * (self.share[l][e] / top if top else 1.0))
                p.fillRect(QRectF(e * w + 0.5, l * h + 0.5, max(w - 1, 1), max(h - 1, 1)), c)
        p.end()
