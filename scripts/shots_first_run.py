"""Screenshots of what a new user meets (issue 37), in the real window on the demo model, light and
dark, at 1600x1000 and at 1000x700:
- first-start-<theme>-<size>.png: the first seconds of a first start (nothing measured: an empty
  cache folder), while the machine is measured and the model opens;
- first-ready-<theme>-<size>.png: the moment the model can chat (Send enabled, some seconds in), its
  calibration starting in the background;
- first-answer-<theme>-<size>.png: the first answer of that start, while the model's calibration
  still runs in the background (the plan stays at full precision until it has measured);
- versions-<theme>-<size>.png: a chat whose last reply was regenerated, showing its versions (‹ 2/2 ›);
- panel-hidden-<theme>-<size>.png: the same chat with the live panel hidden (View > Show live panel).

Everything is written into throwaway folders (the user's settings, cache and chats are not touched).
Needs the demo built (`mixdesk demo-model`); without it, a tiny random model is written.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/shots_first_run.py   # -> docs/screenshots
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from shot_wait import wait  # noqa: E402
from shots_settings import _demo_or_tiny  # noqa: E402

SIZES = ((1600, 1000), (1000, 700))
QUESTION = "What is the capital of France?"


def _grab(w, path: Path) -> Path:
    w.grab().save(str(path))
    return path


def _window(theme_name: str, size: tuple[int, int]):
    """The app's window on the demo (a throwaway chat database), in a theme and a size, shown."""
    from app.main_window import MainWindow
    from app.store.chat_store import Store

    store = Store(Path(tempfile.mkdtemp(prefix="mixdesk-shots-chats-")) / "chats.sqlite3")
    w = MainWindow(store, model=_demo_or_tiny())
    w.set_theme(theme_name, remember=False)
    w.resize(*size)
    w.show()
    return w, store, f"{theme_name.lower()}-{size[0]}x{size[1]}"


def first_start(app, out: Path, theme_name: str, size: tuple[int, int]) -> list[Path]:
    from engine.protocol.sampling import SamplingParams

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="mixdesk-shots-cache-")  # nothing measured yet
    w, store, tag = _window(theme_name, size)
    shots = []
    try:
        wait(app, lambda: "Measuring this machine" in w.model_label.text(), 60)
        wait(app, lambda: False, 1.5)
        shots.append(_grab(w, out / f"first-start-{tag}.png"))
        if not wait(app, lambda: w.send_btn.isEnabled() and w.ctx > 0, 600):
            raise RuntimeError("the model did not load")
        wait(app, lambda: False, 0.5)
        shots.append(_grab(w, out / f"first-ready-{tag}.png"))
        w.params = SamplingParams(max_new_tokens=40)
        w.input.setPlainText(QUESTION)
        w.send()
        wait(app, lambda: not w.generating, 300)
        wait(app, lambda: False, 1.0)
        shots.append(_grab(w, out / f"first-answer-{tag}.png"))
        print(f"{tag}: calibrating={w.bridge.session.controller.calibrating} "
              f"answer={store.messages(w.cid)[-1].content!r}")
    finally:
        w.close()
        app.processEvents()
    return shots


def versions_and_panel(app, out: Path, theme_name: str, size: tuple[int, int]) -> list[Path]:
    from engine.protocol.sampling import SamplingParams
    from window_helpers import menu_actions

    w, store, tag = _window(theme_name, size)
    shots = []
    try:
        if not wait(app, lambda: w.send_btn.isEnabled() and w.ctx > 0, 600):
            raise RuntimeError("the model did not load")
        w.params = SamplingParams(max_new_tokens=60)
        w.input.setPlainText("Give me a name for a friendly robot.")
        w.send()
        wait(app, lambda: not w.generating, 300)
        w.params = SamplingParams(max_new_tokens=60, temperature=0.9, seed=11)  # another answer
        w.reply.regenerate()
        wait(app, lambda: not w.generating, 300)
        wait(app, lambda: False, 1.0)
        shots.append(_grab(w, out / f"versions-{tag}.png"))
        menu_actions(w)["View/Show live panel"].trigger()
        wait(app, lambda: False, 1.0)
        shots.append(_grab(w, out / f"panel-hidden-{tag}.png"))
        menu_actions(w)["View/Show live panel"].trigger()  # as the user left it
    finally:
        w.close()
        app.processEvents()
    return shots


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path.insert(0, str(ROOT / "tests"))
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope, tempfile.mkdtemp(prefix="mixdesk-shots-config-"))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    for theme_name in ("Light", "Dark"):
        for size in SIZES:
            for p in first_start(app, out, theme_name, size) + versions_and_panel(app, out, theme_name, size):
                print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
