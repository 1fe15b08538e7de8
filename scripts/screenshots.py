"""Screenshots of the real window on the demo model, for the README.

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python scripts/screenshots.py docs/screenshots

Starts the app (a real xcb window under Xvfb), sends a prompt, moves the slider towards speed,
waits for the migration, and saves window.png, chat.png, panel.png and placement-map.png.
Needs Debian's xvfb and Qt's xcb libraries (see ../shared/MACHINE-NOTES.md or the README).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.main_window import MainWindow  # noqa: E402
from app.store import Store  # noqa: E402
from engine.generate import SamplingParams  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv)
    app.setApplicationName("Mixdesk")
    w = MainWindow(Store(Path(tempfile.mkdtemp()) / "chats.sqlite3"), model="demo")
    w.resize(1400, 860)
    w.show()
    state = {"step": 0, "ticks": 0}

    def tick():
        state["ticks"] += 1
        s = state["step"]
        if s == 0 and w.send_btn.isEnabled():
            w.params = SamplingParams(max_new_tokens=120)
            w.input.setPlainText("What is the capital of France? Answer in two sentences.")
            w.send()
            state["step"] = 1
        elif s == 1 and not w.generating:
            w.input.setPlainText("And of Italy?")
            w.send()
            state["step"] = 2
        elif s == 2 and not w.generating:
            w.slider.set_value(0.2)
            state["step"], state["wait"] = 3, state["ticks"]
        elif s == 3 and state["ticks"] - state["wait"] > 40 and not w.bridge.session.moves:
            for name, widget in (("window", w), ("chat", w.chat), ("panel", w.panel), ("placement-map", w.panel.map)):
                widget.grab().save(str(out / f"{name}.png"))
            print(f"saved screenshots to {out}")
            w.close()
            app.quit()
        elif state["ticks"] > 6000:
            print("timed out", file=sys.stderr)
            app.exit(1)

    t = QTimer()
    t.timeout.connect(tick)
    t.start(100)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
