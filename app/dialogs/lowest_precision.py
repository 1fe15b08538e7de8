"""Settings > Lowest precision for experts: how far the slider's fastest end may take experts on the
CPU, 4, 3 or 2 bits a weight (tiers cpu-4, cpu-3, cpu-2: GGUF's Q4_K, Q3_K and Q2_K; the planner
still picks per expert by its measured sensitivity, so the slider's quality end is unchanged).
Remembered across starts (QSettings), and sent to the engine with the slider's value as it changes
and once the window is built (SetSlider(lowest_bits=...))."""
from __future__ import annotations

from typing import Callable

from PySide6.QtGui import QAction, QActionGroup

from engine.placement import DEFAULT_LOWEST_BITS, LOWEST_BITS
from engine.protocol import SetSlider

from .. import theme

KEY = "window/lowest_bits"
LABELS = {4: "4-bit (best quality at the fast end)", 3: "3-bit", 2: "2-bit (fastest)"}
TIP = ("How low the slider's fast end may go for experts held in CPU memory. Lower bits read fewer bytes a "
       "token (faster decode on a CPU) and answer less exactly; the planner lowers the experts that are "
       "rarely used and least sensitive first.")


def saved() -> int:
    try:
        v = int(theme.settings().value(KEY, DEFAULT_LOWEST_BITS))
    except (TypeError, ValueError):
        return DEFAULT_LOWEST_BITS
    return v if v in LOWEST_BITS else DEFAULT_LOWEST_BITS


class LowestPrecision:
    """The submenu's three checkable actions (one checked), kept by the window."""

    def __init__(self, parent, settings_menu, slider_value: Callable[[], float], send: Callable[[object], object]):
        self.slider_value, self.send = slider_value, send
        menu = settings_menu.addMenu("Lowest precision for experts")
        menu.setToolTipsVisible(True)
        menu.setToolTip(TIP)
        self.group = QActionGroup(parent)
        self.actions: dict[int, QAction] = {}
        self.bits = saved()
        for b in LOWEST_BITS:
            a = QAction(LABELS[b], parent, checkable=True, checked=b == self.bits)
            a.setToolTip(TIP)
            a.triggered.connect(lambda _checked=False, b=b: self.choose(b))
            self.group.addAction(a)
            menu.addAction(a)
            self.actions[b] = a
        self.menu = menu

    def choose(self, bits: int) -> None:
        """The user picked `bits`: remembered, checked, and sent to the engine (it re-plans)."""
        self.bits = bits
        self.actions[bits].setChecked(True)
        theme.settings().setValue(KEY, int(bits))
        self.announce()

    def announce(self) -> None:
        self.send(SetSlider(value=float(self.slider_value()), lowest_bits=self.bits))
