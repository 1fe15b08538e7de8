"""Screenshots of the per-chat settings (Chat > Chat settings…) in the real window on the demo
model: a chat set up for writing (randomness 0.7, a word pool, a repetition penalty, a shorter
memory) with a system prompt picked from saved presets.

The presets and the chat are written into throwaway folders (the user's own settings and chats are
not touched). Needs the demo built (`mixdesk demo-model`); without it, a tiny random model is written.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/shots_settings.py   # -> docs/screenshots
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRESETS = {
    "Travel planner": "You plan trips. Ask for dates and budget first, then answer with a day-by-day plan "
                      "in short bullet points.",
    "Code reviewer": "You review code. Point out bugs first, then style, each with the line it concerns.",
    "Concise": "Answer in at most three sentences.",
}
SETTINGS = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.15, "max_new_tokens": 512,
            "context": 2048}


from shot_wait import wait as _wait  # noqa: E402


def shoot(out: Path, theme_name: str) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings, QStandardPaths
    from PySide6.QtWidgets import QApplication

    from app.dialogs import chat_settings as chat_settings_dialog
    from app.main_window import MainWindow
    from app.store.chat_store import Store

    app = QApplication.instance() or QApplication([])
    # the presets go to a throwaway settings folder (app/theme.py settings() is QSettings' user scope)
    QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope, tempfile.mkdtemp(prefix="mixdesk-shots-config-"))
    for name, text in PRESETS.items():
        chat_settings_dialog.save_preset(name, text)
    store = Store(Path(tempfile.mkdtemp(prefix="mixdesk-shots-chats-")) / "chats.sqlite3")
    cid = store.new_conversation("A weekend in Lisbon")
    store.set_system_prompt(cid, PRESETS["Travel planner"])
    store.set_settings(cid, SETTINGS)
    store.add_message(cid, "user", "Plan two days in Lisbon for me, please.")
    store.add_message(cid, "assistant", "Happy to! What dates, and roughly what budget per day?",
                      meta={"stats": "seeded example reply"})
    w = MainWindow(store, model=_demo_or_tiny())
    shots = []
    try:
        w.set_theme(theme_name, remember=False)
        w.resize(1400, 860)
        w.show()
        if not _wait(app, lambda: w.send_btn.isEnabled() and w.ctx > 0, 600):
            raise RuntimeError("the model did not load")
        w.cid = cid
        w.refresh_conversations()
        w.chat.show_messages(store.messages(cid))
        c = store.conversation(cid)
        dlg = chat_settings_dialog.ChatSettingsDialog(w, c.title, c.settings, c.system_prompt, w.ctx, w.params)
        dlg.preset.setCurrentIndex(dlg.preset.findText("Travel planner"))  # the preset its prompt came from
        dlg.delete_btn.setEnabled(True)
        dlg.show()
        _wait(app, lambda: False, 1.0)  # laid out and painted
        path = out / f"chat-settings-{theme_name.lower()}.png"
        dlg.grab().save(str(path))
        shots.append(path)
        dlg.reject()
    finally:
        w.close()
        app.processEvents()
        QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope,
                          QStandardPaths.writableLocation(QStandardPaths.GenericConfigLocation))
    return shots


def _demo_or_tiny() -> str:
    demo = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "mixdesk" / "models"
    if any(demo.glob("demo-*")):
        return "demo"
    from engine.sources.tiny_model import write_tiny_mixtral

    return str(write_tiny_mixtral(Path(tempfile.mkdtemp(prefix="mixdesk-shots-tiny-"))))


if __name__ == "__main__":
    target = ROOT / "docs" / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    for theme_name in ("Light", "Dark"):
        for p in shoot(target, theme_name):
            print(p)
