"""The live panel: memory meters, a tok/s chart, migration progress and the placement map.

It follows the engine controller (`follow(engine)`): Stats fill the meters, the chart and the
count of experts per tier in use now; PlacementChanged starts (or, re-planned mid-way, continues)
a migration, shown as one progress per move and on the map as current and target together;
each MigrationProgress lands one expert; calibration_finished is said once."""
from __future__ import annotations

import time

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QValueAxis
from PySide6.QtCore import QMargins, Qt, QTimer
from PySide6.QtGui import QFontMetrics, QPainter
from PySide6.QtWidgets import QFormLayout, QFrame, QGroupBox, QLabel, QProgressBar, QScrollArea, QVBoxLayout, QWidget

from . import plain_words
from ..elided_bar import ElidedBar
from .placement_map import PlacementLegend, PlacementMap

GIB = 2**30
CALIBRATED = "Calibration finished: predictions now measured"
NOTICE_MS = 30_000  # how long the calibration notice stays


def _nice(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above v (an axis top whose ticks read well)."""
    import math

    if v <= 1:
        return 1.0
    base = 10 ** math.floor(math.log10(v))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= v)


def _meter() -> QProgressBar:
    bar = ElidedBar()  # a narrow column elides its text ("0.00 GiB of 17.8 G…"), the whole in the tooltip
    bar.setTextVisible(True)
    bar.setRange(0, 1000)
    return bar


MAPPED_TIP = ("The model's weights used as the file holds them are read straight from the file, not copied: "
              "the system keeps the parts in use in RAM as file cache, shares it, and frees it when other "
              "programs need memory (then reads it again from disk, slower). They do not count against the "
              "RAM budget above, which is the memory Mixdesk owns.")

class LivePanel(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        outer = QVBoxLayout(self)  # the window inserts the Local server box at its top (above the scroll)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        body = QWidget()
        self.scroll.setWidget(body)
        outer.addWidget(self.scroll, 1)
        lay = QVBoxLayout(body)
        lay.setContentsMargins(0, 0, 0, 0)  # the outer layout's margins hold both the server box and this
        mem = QGroupBox("Memory")
        form = QFormLayout(mem)
        form.setRowWrapPolicy(QFormLayout.WrapAllRows)  # each meter under its name: the column's whole width
        self.vram_ours, self.vram_others, self.vram_free, self.ram = _meter(), _meter(), _meter(), _meter()
        form.addRow("VRAM, Mixdesk", self.vram_ours)
        form.addRow("VRAM, others", self.vram_others)
        form.addRow("VRAM, free", self.vram_free)
        form.addRow("RAM, model", self.ram)
        self.mapped = _meter()  # the model's bytes served from its file, and how much of them is in RAM now
        self.mapped.setToolTip(MAPPED_TIP)
        form.addRow("Mapped from the file", self.mapped)
        self._mapped_label = form.labelForField(self.mapped)
        self.mapped.hide()
        self._mapped_label.hide()
        self.mode = QLabel("")
        self.mode.setWordWrap(True)
        form.addRow(self.mode)
        lay.addWidget(mem)

        speed = QGroupBox("Throughput")
        sl = QVBoxLayout(speed)
        self.rate = QLabel("writing — tokens/s · reading the prompt — tokens/s")
        self.rate.setWordWrap(True)  # a longer line must not widen the column past what the scroll area shows
        self.rate.setToolTip("Writing: decode speed, the reply's tokens per second.\n"
                             "Reading the prompt: prefill speed, the prompt's tokens per second.\n"
                             "Context: tokens of the model's context window in use.")
        sl.addWidget(self.rate)
        self.kernel = QLabel("")  # which CPU expert kernel runs (native AVX-512 / AVX2 / C, or torch)
        self.kernel.setWordWrap(True)
        sl.addWidget(self.kernel)
        self.decode_series, self.prefill_series = QLineSeries(name="writing"), QLineSeries(name="reading the prompt")
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
        self.chart_view.setMinimumHeight(170)
        # the ticks fit again once a resize settles (not on plotAreaChanged: each new interval lays the
        # chart out again, and following that signal stalled the GUI thread while a reply streamed)
        self._refit = QTimer(self, singleShot=True, interval=50)
        self._refit.timeout.connect(self._fit_ticks)
        sl.addWidget(self.chart_view)
        lay.addWidget(speed)

        mig = self.placement_box = QGroupBox("Placement")
        ml = QVBoxLayout(mig)
        self.notice = QLabel("")  # "Calibration finished: predictions now measured", for a while
        self.notice.setWordWrap(True)
        self.notice.hide()
        ml.addWidget(self.notice)
        self.said: list[str] = []  # every notice shown (tests: said once)
        self._notice_timer = QTimer(self, singleShot=True, interval=NOTICE_MS)
        self._notice_timer.timeout.connect(self.notice.hide)
        self.migration = ElidedBar()  # shown only while experts move
        self.migration.setFormat("moving experts: %v of %m")
        self.migration.setToolTip("Migration: the experts whose tier changes with the new placement, moved "
                                  "between decode steps while the chat goes on.")
        self.migration.hide()
        ml.addWidget(self.migration)
        self.tiers = QLabel("no model loaded")  # the placement in use (and, while moving, the target)
        self.tiers.setWordWrap(True)
        ml.addWidget(self.tiers)
        self.map = PlacementMap()
        ml.addWidget(self.map, 1)
        self.legend = PlacementLegend()
        ml.addWidget(self.legend)
        lay.addWidget(mig, 1)
        # the column is never narrower than what it holds (the scroll area scrolls only up and down)
        self.scroll.setMinimumWidth(body.minimumSizeHint().width() + self.scroll.verticalScrollBar().sizeHint().width())
        self._t0 = time.monotonic()
        self.loaded = False  # a model is loaded (before: the placement rows say so and show no migration)
        self.counts_now: dict = {}  # experts per tier in use, as the last Stats said
        self.plan = None  # the last PlacementChanged
        self.moving = (0, 0)  # (done, total) of the migration in flight; (0, 0): none

    def follow(self, engine) -> None:
        """Subscribe to the engine controller's signals (app/engine_controller.py)."""
        engine.stats.connect(self.show_stats)
        engine.loaded.connect(self.show_loaded)
        engine.placement_changed.connect(self.show_plan)
        engine.migration_progress.connect(self.show_progress)
        engine.calibration_finished.connect(self.calibration_finished)

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
        self.ram.setToolTip(f"RAM the model holds, its own memory: {self.ram.format()}")
        mapped = getattr(s, "ram_mapped", 0)
        self.mapped.setVisible(mapped > 0)
        self._mapped_label.setVisible(mapped > 0)
        if mapped:
            resident = min(getattr(s, "rss_file", 0), mapped)  # the process's file pages (libraries too)
            self.mapped.setValue(int(1000 * resident / mapped))
            self.mapped.setFormat(f"{mapped / GIB:.1f} GiB · about {resident / GIB:.1f} GiB of it in RAM now")
        rates = f"writing {s.decode_tok_s:.1f} tokens/s · reading the prompt {s.prefill_tok_s:.0f} tokens/s"
        if not s.generating:  # the speeds are the last reply's; the chart draws only while one runs
            rates = f"idle · last reply: {rates}" if s.decode_tok_s else "idle"
        self.rate.setText(f"{rates} · context {s.ctx_used:,}/{s.ctx_max:,}")
        self.kernel.setText(f"CPU experts: {s.cpu_kernel}" if s.cpu_kernel else "")
        self.counts_now = dict(s.tiers)
        self._say_tiers()
        t = time.monotonic() - self._t0
        if not s.generating:
            return
        if s.decode_tok_s:
            self._append(self.decode_series, t, s.decode_tok_s)
        if s.prefill_tok_s:
            self._append(self.prefill_series, t, s.prefill_tok_s)

    def reset_speeds(self) -> None:
        """Another model is in use: the last one's speeds and chart go ("idle" until it replies)."""
        self.rate.setText("idle")
        self.decode_series.clear()
        self.prefill_series.clear()

    def _append(self, series: QLineSeries, t: float, v: float) -> None:
        series.append(t, v)
        if series.count() > 300:
            series.removePoints(0, series.count() - 300)
        pts = [p for s in (self.decode_series, self.prefill_series) for p in s.points()]
        lo, hi = int(min(p.x() for p in pts)), max(int(t) + 1, int(min(p.x() for p in pts)) + 2)
        self._fit_ticks((lo, hi), (0, _nice(max(p.y() for p in pts) * 1.15)))

    def _fit_ticks(self, x: tuple | None = None, y: tuple | None = None) -> None:
        """The axes' ranges (x, y: new ones, else as they are) with as many ticks as their labels fit
        side by side (time) and one above another (tok/s) in the plot as wide and tall as it is now:
        more would draw the labels over each other. Of an interval and its range, the one set first
        is the one that makes fewer ticks meanwhile: a range set under the interval of a far narrower
        one makes thousands of ticks for a moment (measured: the GUI thread held 0.4-1 s)."""
        plot, fm = self.chart.plotArea(), QFontMetrics(self.ax_x.labelsFont())
        x = x or (self.ax_x.min(), self.ax_x.max())
        y = y or (self.ax_y.min(), self.ax_y.max())
        label = max(fm.horizontalAdvance(f"{int(v)} s") for v in x) + 12
        across, up = max(int(plot.width() // label) - 1, 1), max(int(plot.height() // (fm.height() + 4)) - 1, 1)
        for ax, (lo, hi), room in ((self.ax_x, x, across), (self.ax_y, y, up)):
            step, old = _nice((hi - lo) / room), ax.tickInterval()
            span = ax.max() - ax.min()
            if old > 0 and span / step > (hi - lo) / old:  # the range first, under the old interval
                ax.setRange(lo, hi)
            if old != step:  # each change lays the chart out again
                ax.setTickInterval(step)
            if (ax.min(), ax.max()) != (lo, hi):
                ax.setRange(lo, hi)

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self._refit.start()

    def set_dark(self, dark: bool) -> None:
        self.chart.setTheme(QChart.ChartThemeDark if dark else QChart.ChartThemeLight)
        for series, colour in ((self.decode_series, "#3b82f6"), (self.prefill_series, "#22c55e")):
            series.setColor(colour)

    # ---- placement and migration ----
    def show_loaded(self, ev) -> None:
        self.loaded = True
        self.map.set_share(ev.share)
        self._say_tiers()

    def show_plan(self, ev) -> None:
        """A new plan: the map shows where experts are and where they go; the bar starts a
        migration of ev.moves, or (a re-plan mid-way) continues the one in flight from ev.moved."""
        self.loaded = True
        self.plan = ev
        self.map.set_plan(ev.current, ev.placement)
        self.show_migration(ev.moved, ev.moved + ev.moves)

    def show_progress(self, ev) -> None:
        """One expert landed (MigrationProgress)."""
        if ev.layer >= 0 and ev.expert >= 0 and ev.last_tier:
            self.map.moved(ev.layer, ev.expert, ev.last_tier)
        self.show_migration(ev.done, ev.total)

    def show_migration(self, done: int, total: int) -> None:
        """The bar shows while experts move (done < total), one total per migration."""
        going = self.loaded and total > 0 and done < total
        self.moving = (done, total) if going else (0, 0)
        if going:
            self.migration.setRange(0, total)
            self.migration.setValue(done)
        else:
            self.map.settle()
        self.migration.setVisible(going)
        self.legend.set_modes(popularity=bool(self.map.share) and not self.map.aggregate, moving=going)
        self._say_tiers()

    def _say_tiers(self) -> None:
        """The placement in use in plain words; while moving, where it goes too (tiers in the tooltip)."""
        if not self.loaded:
            self.tiers.setText("no model loaded")
            self.tiers.setToolTip("")
            return
        now = _counts(self.map.current) if self.map.current else self.counts_now  # the map's is per move
        text = plain_words.placement_words(now)
        tip = "in use: " + plain_words.placement_tooltip(now)
        if self.moving != (0, 0) and self.plan is not None:
            target = self.plan.placement.counts()
            text = f"now: {text}<br>moving to: {plain_words.placement_words(target)}"
            tip += "\ntarget: " + plain_words.placement_tooltip(target)
        self.tiers.setText(text)
        self.tiers.setToolTip(tip)

    def calibration_finished(self) -> None:
        """Said once per calibration: the plan (and the predictions) now use measured figures."""
        self.said.append(CALIBRATED)
        self.notice.setText(f"<b>{CALIBRATED}</b>")
        self.notice.setToolTip("The background calibration measured how often the router picks each expert "
                               "and how much 4-bit costs each layer (KL divergence); the map's brightness and "
                               "the slider's predictions come from these measurements now.")
        self.notice.show()
        self._notice_timer.start()

    def clear(self) -> None:
        """No model (the engine restarted): nothing to show until one is loaded."""
        self.loaded, self.plan, self.counts_now, self.moving = False, None, {}, (0, 0)
        self.map.clear()
        self.migration.hide()
        self._say_tiers()


def _counts(grid) -> dict:
    out: dict = {}
    for row in grid:
        for t in row:
            out[t] = out.get(t, 0) + 1
    return out
