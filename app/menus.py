"""The main window's menu bar, its shortcuts, and the small dialogs the menus open (system prompt,
sampling, export, log, about).

Every action's handler is called with no argument: QAction.triggered passes `checked` (a bool),
which a handler with an optional first parameter took for its argument (File > Connect to a server
got `False` for its choice and opened no dialog). Only the Local server switch, a checkable action,
takes the state it is toggled to."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QShortcut
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from . import theme


def run_modal(dlg) -> int:
    """dlg.exec(), then the dialog deleted by this (the GUI) thread's event loop: read what it holds
    before control returns there. PySide's exec() hands a dialog's ownership to Python, so without
    this the C++ widget dies with the last Python reference to it, wherever that goes: a reference
    held in a cycle is dropped by the cyclic garbage collector on whichever thread it runs, the engine
    thread as often as not, and a widget destroyed there races the GUI thread in Qt's own data (heap
    corruption, a segfault in the main thread's event loop; tests/test_dialog_lifetime.py)."""
    try:
        return dlg.exec()
    finally:
        dlg.deleteLater()


def action(window, text: str, fn: Callable[[], object], menu=None, tip: str = "") -> QAction:
    """A menu action that calls fn() (never fn(checked))."""
    a = QAction(text, window)
    a.triggered.connect(lambda _checked=False: fn())
    if tip:
        a.setToolTip(tip)
    if menu is not None:
        menu.addAction(a)
    return a


def menu(window, title: str, *items: tuple[str, Callable[[], object]]):
    m = window.menuBar().addMenu(title)
    for text, fn in items:
        action(window, text, fn, m)
    return m


def build(w) -> None:
    """The menus and shortcuts of MainWindow w."""
    menu(w, "&File", ("Open model…", w.pick_model), ("Open model folder…", lambda: open_folder(w)),
         ("Open GGUF file…", lambda: open_gguf(w)),
         ("Open demo model", lambda: w.load_model("demo")), ("Open Hugging Face model…", lambda: open_hub(w)),
         ("Connect to a server…", w.connect_remote), ("Use the local model", w.disconnect_remote),
         ("Export chat as Markdown…", lambda: export(w, "md")), ("Export chat as JSON…", lambda: export(w, "json")))
    menu(w, "&Chat", ("System prompt…", lambda: edit_system_prompt(w)), ("Sampling settings…", lambda: edit_sampling(w)))
    tools = w.menuBar().addMenu("&Tools")
    action(w, "Re-measure this machine and model", lambda: remeasure(w), tools,
           tip="Measure each tier's speed and calibrate the model again, then re-plan (when the predictions look "
               "off, e.g. after the machine was busy during the first measurement)")
    w.server_action = QAction("Local server (OpenAI-compatible API)", w, checkable=True)
    w.server_action.toggled.connect(lambda on: w.toggle_server(bool(on)))
    tools.addAction(w.server_action)
    settings = w.menuBar().addMenu("&Settings")
    action(w, "GPU runtime…", w.gpu_runtime, settings)
    theme_menu = settings.addMenu("Theme")
    group = QActionGroup(w)
    w.theme_actions = {}
    for name in theme.THEMES:
        a = QAction(name, w, checkable=True)
        a.triggered.connect(lambda _checked=False, n=name: w.set_theme(n))
        group.addAction(a)
        theme_menu.addAction(a)
        w.theme_actions[name] = a
    menu(w, "&Help", ("Log", lambda: show_log(w)), ("About Mixdesk", lambda: about(w)))
    for keys, fn in (("Ctrl+Return", w.send), ("Ctrl+Enter", w.send), ("Escape", w.stop), ("Ctrl+N", w.new_chat),
                     ("Ctrl+O", w.pick_model), ("Ctrl+Shift+V", w.paste_files)):
        QShortcut(QKeySequence(keys), w, activated=lambda fn=fn: fn())


def remeasure(w) -> None:
    from engine.protocol import Reprofile

    if not w.send_btn.isEnabled() or w.generating:
        w.statusBar().showMessage("Re-measuring needs a loaded model and no reply in progress", 8000)
        return
    w.send_btn.setEnabled(False)  # until the engine says the model is ready again (Loaded)
    w.log_line("re-measuring this machine and the model")
    w.bridge.send(Reprofile())


def open_folder(w) -> None:
    d = QFileDialog.getExistingDirectory(w, "Open a model folder (Mixtral, Qwen3-MoE, OLMoE or Qwen2-MoE)")
    if d:
        w.load_model(d)


GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
GGUF_TITLE = "Open a GGUF file (Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE or gpt-oss; split files: the first part)"


def open_gguf(w) -> None:
    path, _ = QFileDialog.getOpenFileName(w, GGUF_TITLE, "", GGUF_FILTER)
    if path:
        w.load_model(path)


def open_hub(w) -> None:
    repo, ok = QInputDialog.getText(w, "Hugging Face model", "Repo id (owner/name):")
    if ok and repo.strip():
        w.load_model(repo.strip())


def edit_system_prompt(w) -> None:
    if w.cid is None:
        w.new_chat()
    text, ok = QInputDialog.getMultiLineText(w, "System prompt", "System prompt for this chat:",
                                             w.store.conversation(w.cid).system_prompt)
    if ok:
        w.store.set_system_prompt(w.cid, text)
        w.statusBar().showMessage("system prompt set for this chat" if text.strip() else "system prompt cleared", 8000)


def edit_sampling(w) -> None:
    t, ok = QInputDialog.getDouble(w, "Sampling", "Temperature (0 = greedy):", w.params.temperature, 0, 2, 2)
    if ok:
        w.params = replace(w.params, temperature=t, top_p=0.95 if t > 0 else 1.0)
        w.statusBar().showMessage(f"temperature {t:g}" + (" (greedy)" if t == 0 else ""), 8000)


def export(w, kind: str) -> None:
    if w.cid is None:
        w.statusBar().showMessage("No chat to export: open or start one first", 8000)
        return
    path, _ = QFileDialog.getSaveFileName(w, "Export chat", f"chat.{kind}")
    if path:
        text = w.store.export_markdown(w.cid) if kind == "md" else w.store.export_json(w.cid)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            w.statusBar().showMessage(f"could not write {path}: {e.strerror or e}", 15000)
            return
        w.statusBar().showMessage(f"chat exported to {path}", 8000)


def show_log(w) -> None:
    box = QMessageBox(w)
    box.setWindowTitle("Mixdesk log")
    box.setText("\n".join(w.log_lines[-200:]) or "(empty)")
    run_modal(box)


def about(w) -> None:
    import platform

    import PySide6
    import torch
    import transformers

    QMessageBox.about(w, "About Mixdesk", f"Mixdesk 0.1 — chat with Mixture-of-Experts models that do not fit "
                      f"in your GPU.\n\ntorch {torch.__version__} (CUDA: {torch.cuda.is_available()})\n"
                      f"transformers {transformers.__version__}\nPySide6 {PySide6.__version__}\n"
                      f"Python {platform.python_version()}")
