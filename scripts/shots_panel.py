"""Screenshots of the live panel caught mid-migration and of the slider with its frontier chart, in
the real window on the demo model (a tiny random model when the demo is not built).

The slider is moved to the end that moves the most experts, and the migration is held a third of
the way (the engine's safe points swap in nothing more until the shot is taken), so the map shows
both placements: cells filled with where each expert is, outlined where it is going.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/shots_panel.py   # -> docs/screenshots

Writes panel-migration-<theme>.png and slider-frontier-<theme>.png.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from shot_wait import wait as _wait  # noqa: E402


def _model() -> str:
    from engine.sources.demo import demo_dir, is_valid

    try:
        if is_valid(demo_dir()):
            return "demo"
    except Exception:  # noqa: BLE001 - no demo: a tiny model stands in
        pass
    from engine.sources.tiny_model import write_tiny_mixtral

    return str(write_tiny_mixtral(Path(tempfile.mkdtemp(prefix="mixdesk-shots-model-")), layers=6, experts=8))


class Hold:
    """Lets `permits` experts be swapped in at the engine's safe points, then holds the rest."""

    def __init__(self, controller, permits: int):
        self.ctl, self.real, self.permits, self.lock = controller, controller.safe_point, permits, threading.Lock()
        self.open = False
        controller.safe_point = self.safe_point

    def safe_point(self, busy, step_s):
        with self.lock:
            if self.open:
                return self.real(busy, step_s)
            if self.permits <= 0:
                time.sleep(0.005)
                return 0
        n = self.ctl.migrator.install_ready(0.0, 1e-6)  # at most one swap a call
        with self.lock:
            self.permits -= n
        return n

    def release(self) -> None:
        with self.lock:
            self.open = True


def shoot(out: Path, theme_name: str) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.store.chat_store import Store

    app = QApplication.instance() or QApplication([])
    out.mkdir(parents=True, exist_ok=True)
    store = Store(Path(tempfile.mkdtemp(prefix="mixdesk-shots-chats-")) / "chats.sqlite3")
    w = MainWindow(store, model=_model())
    shots: list[Path] = []
    hold = None
    try:
        w.set_theme(theme_name, remember=False)
        w.resize(1400, 860)
        w.show()
        ctl = w.bridge.session.controller
        if not _wait(app, lambda: w.send_btn.isEnabled() and w.panel.plan is not None, 600):
            raise RuntimeError("the model did not load")
        _wait(app, lambda: not ctl.calibrating and not ctl.migrating and not w.panel.migration.isVisible(), 600)
        _wait(app, lambda: False, 0.5)
        grid = w.panel.map.tiers
        n16 = sum(t.endswith("16") for row in grid for t in row)
        end = 0 if n16 * 2 >= sum(len(r) for r in grid) else 100
        before = ctl.target
        hold = Hold(ctl, 0)
        w.slider.slider.setValue(end)  # as a user drags it to one end
        if not _wait(app, lambda: ctl.target is not before and w.panel.migration.isVisible(), 60):
            raise RuntimeError("the slider move planned no migration")
        with hold.lock:
            hold.permits = max(1, w.panel.migration.maximum() // 3)
        want = hold.permits
        _wait(app, lambda: w.panel.migration.value() >= want, 120)
        _wait(app, lambda: False, 0.8)  # the map and the legend repaint
        for name, widget in (("panel-migration", w.panel), ("slider-frontier", w.slider)):
            path = out / f"{name}-{theme_name.lower()}.png"
            widget.grab().save(str(path))
            shots.append(path)
    finally:
        if hold is not None:
            hold.release()
        w.close()
    return shots


if __name__ == "__main__":
    target = ROOT / "docs" / "screenshots"
    for theme in ("Light", "Dark"):
        for p in shoot(target, theme):
            print(p)
