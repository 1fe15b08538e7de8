"""The live panel: memory meters, a tok/s chart, migration progress and the placement map."""
from __future__ import annotations

import time

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QValueAxis
from PySide6.QtCore import QMargins, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QProgressBar, QVBoxLayout, QWidget

from .placement_map import TIER_COLOURS, PlacementMap

GIB = 2**30


def _nice(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above v (an axis top whose ticks read well)."""
    import math

    if v <= 1:
        return 1.0
    base = 10 ** math.floor(math.log10(v))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= v)


def _meter() -> QProgressBar:
    bar = QProgressBar()
    bar.setTextVisible(True)
    bar.setRange(0, 1000)
    return bar


class LivePanel(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        mem = QGroupBox("Memory")
        form = QFormLayout(mem)
        self.vram_ours, self.vram_others, self.vram_free, self.ram = _meter(), _meter(), _meter(), _meter()
        form.addRow("VRAM, Mixdesk", self.vram_ours)
        form.addRow("VRAM, others", self.vram_others)
        form.addRow("VRAM, free", self.vram_free)
        form.addRow("RAM, model", self.ram)
        self.mode = QLabel("")
        self.mode.setWordWrap(True)
        form.addRow(self.mode)
        lay.addWidget(mem)

        speed = QGroupBox("Throughput")
        sl = QVBoxLayout(speed)
        self.rate = QLabel("decode — tok/s · prefill — tok/s")
        sl.addWidget(self.rate)
        self.kernel = QLabel("")  # which CPU expert kernel runs (native AVX-512 / AVX2 / C, or torch)
        self.kernel.setWordWrap(True)
        sl.addWidget(self.kernel)
        self.decode_series, self.prefill_series = QLineSeries(name="decode"), QLineSeries(name="prefill")
        chart = QChart()
        chart.addSeries(self.decode_series)
        chart.addSeries(self.prefill_series)
        self.ax_x, self.ax_y = QValueAxis(), QValueAxis()
        # whole numbers and few ticks: at the panel's width, default labels were elided to "…"
        self.ax_y.setTitleText("tok/s")  # the time axis says its unit in its labels ("10 s")
        for ax in (self.ax_x, self.ax_y):
            ax.setTickType(QValueAxis.TicksDynamic)  # ticks on round values, set in _append
            ax.setTickAnchor(0)
            ax.setTruncateLabels(False)
            font = ax.labelsFont()
            font.setPointSizeF(max(font.pointSizeF() - 1, 7))
            ax.setLabelsFont(font)
            ax.setTitleFont(font)
        self.ax_x.setLabelFormat("%d s")
        self.ax_y.setLabelFormat("%g")
        self.chart = chart
        chart.addAxis(self.ax_x, Qt.AlignBottom)
        chart.addAxis(self.ax_y, Qt.AlignLeft)
        for series in (self.decode_series, self.prefill_series):
            series.attachAxis(self.ax_x)
            series.attachAxis(self.ax_y)
        chart.legend().setAlignment(Qt.AlignBottom)
        chart.setMargins(QMargins(0, 0, 0, 0))
        self.chart_view = QChartView(chart)
        self.chart_view.setRenderHint(QPainter.Antialiasing)
        self.chart_view.setMinimumHeight(140)
        sl.addWidget(self.chart_view)
        lay.addWidget(speed)

        mig = self.placement_box = QGroupBox("Placement")
        ml = QVBoxLayout(mig)
        self.migration = QProgressBar()
        self.migration.setFormat("migration %v/%m")
        self.migration.setRange(0, 1)
        self.migration.setValue(1)
        ml.addWidget(self.migration)
        self.tiers = QLabel("")
        self.tiers.setWordWrap(True)
        ml.addWidget(self.tiers)
        self.map = PlacementMap()
        ml.addWidget(self.map, 1)
        legend = "  ".join(f"<span style='color:{c.name()}'>■</span> {t}" for t, c in TIER_COLOURS.items())
        ml.addWidget(QLabel(legend))
        lay.addWidget(mig, 1)
        self._t0 = time.monotonic()

    def show_stats(self, s) -> None:
        total_vram = s.vram_held + s.vram_others + s.vram_free
        if s.cpu_only:
            self.mode.setText("CPU-only: no NVIDIA GPU found. Every expert runs on the CPU; the slider trades "
                              "precision only.")
            for bar in (self.vram_ours, self.vram_others, self.vram_free):
                bar.setValue(0)
                bar.setFormat("no GPU")
        else:
            self.mode.setText("")
            for bar, v in ((self.vram_ours, s.vram_held), (self.vram_others, s.vram_others), (self.vram_free, s.vram_free)):
                bar.setValue(int(1000 * v / total_vram) if total_vram else 0)
                bar.setFormat(f"{v / GIB:.2f} GiB")
        self.ram.setValue(int(1000 * s.ram_held / max(s.ram_budget, 1)))
        self.ram.setFormat(f"{s.ram_held / GIB:.2f} GiB of {s.ram_budget / GIB:.1f} GiB budget")
        self.rate.setText(f"decode {s.decode_tok_s:.1f} tok/s · prefill {s.prefill_tok_s:.0f} tok/s · "
                          f"context {s.ctx_used}/{s.ctx_max}")
        self.kernel.setText(f"CPU experts: {s.cpu_kernel}" if s.cpu_kernel else "")
        self.tiers.setText(" · ".join(f"{n} {t}" for t, n in sorted(s.tiers.items())))
        t = time.monotonic() - self._t0
        if s.decode_tok_s:
            self._append(self.decode_series, t, s.decode_tok_s)
        if s.prefill_tok_s:
            self._append(self.prefill_series, t, s.prefill_tok_s)

    def _append(self, series: QLineSeries, t: float, v: float) -> None:
        series.append(t, v)
        if series.count() > 300:
            series.removePoints(0, series.count() - 300)
        pts = [p for s in (self.decode_series, self.prefill_series) for p in s.points()]
        lo, hi = int(min(p.x() for p in pts)), max(int(t) + 1, int(min(p.x() for p in pts)) + 2)
        self.ax_x.setRange(lo, hi)
        self.ax_x.setTickInterval(_nice((hi - lo) / 5))
        top = _nice(max(p.y() for p in pts) * 1.15)
        self.ax_y.setRange(0, top)
        self.ax_y.setTickInterval(top / 5)

    def set_dark(self, dark: bool) -> None:
        self.chart.setTheme(QChart.ChartThemeDark if dark else QChart.ChartThemeLight)
        for series, colour in ((self.decode_series, "#3b82f6"), (self.prefill_series, "#22c55e")):
            series.setColor(colour)

    def show_migration(self, done: int, total: int) -> None:
        self.migration.setRange(0, max(total, 1))
        self.migration.setValue(done if total else 1)
