"""The main window's menu bar, its shortcuts, and the small dialogs the menus open (export, log,
about; Chat settings… is app/chat_settings.py).

Every action's handler is called with no argument: QAction.triggered passes `checked` (a bool),
which a handler with an optional first parameter took for its argument (File > Connect to a server
got `False` for its choice and opened no dialog). Only the checkable actions (the Local server
switch, Settings > Enter sends message) take the state they are toggled to."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from . import chat_defaults, chat_settings, theme


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


def action(window, text: str, fn: Callable[[], object], menu=None, tip: str = "", keys=()) -> QAction:
    """A menu action that calls fn() (never fn(checked)); keys: its shortcuts, the first shown in
    the menu beside it."""
    a = QAction(text, window)
    a.triggered.connect(lambda _checked=False: fn())
    if tip:
        a.setToolTip(tip)
    if keys:
        a.setShortcuts([QKeySequence(k) for k in ((keys,) if isinstance(keys, (str, QKeySequence.StandardKey)) else keys)])
    if menu is not None:
        menu.addAction(a)
    return a


def menu(window, title: str, *items):
    """A menu of (text, fn) or (text, fn, keys) items; None: a separator."""
    m = window.menuBar().addMenu(title)
    for item in items:
        if item is None:
            m.addSeparator()
            continue
        text, fn, *keys = item
        action(window, text, fn, m, keys=keys[0] if keys else ())
    return m


def find_chats(w) -> None:
    """Edit > Find chats (Ctrl+F): the sidebar's search field, its text selected."""
    w.search.setFocus()
    w.search.selectAll()


def show_shortcuts(w) -> None:
    """Help > Keyboard shortcuts… (app/shortcuts_help.py)."""
    from .shortcuts_help import ShortcutsDialog

    run_modal(ShortcutsDialog(w))


def build(w) -> None:
    """The menus of MainWindow w; every shortcut belongs to a menu item, which shows it."""
    menu(w, "&File", ("New chat", w.new_chat, QKeySequence.New), None,
         ("Open model…", w.pick_model, QKeySequence.Open), ("Open model folder…", lambda: open_folder(w)),
         ("Open GGUF file…", lambda: open_gguf(w)),
         ("Open demo model", lambda: w.load_model("demo")), ("Open Hugging Face model…", lambda: open_hub(w)), None,
         ("Connect to a server…", w.connect_remote), ("Use the local model", w.disconnect_remote), None,
         ("Export chat as Markdown…", lambda: export(w, "md")), ("Export chat as JSON…", lambda: export(w, "json")),
         None, ("Quit", w.close, ("Ctrl+Q",)))
    menu(w, "&Edit", ("Find chats", lambda: find_chats(w), ("Ctrl+F",)),
         ("Paste files as attachments", w.paste_files, ("Ctrl+Shift+V",)))
    w.menuBar().addMenu("&View").addAction(w.panel_switch.action)  # Show live panel (app/panel_switch.py)
    menu(w, "&Chat", ("Send", w.send, ("Ctrl+Return", "Ctrl+Enter")), ("Stop the reply", w.stop, ("Escape",)),
         ("Regenerate the last reply", w.reply.regenerate, ("Ctrl+Shift+R",)),
         ("Edit the last message", w.reply.edit_last, ("Ctrl+Shift+E",)), None,
         ("Chat settings…", lambda: chat_settings.edit(w), ("Ctrl+,",)),
         ("Defaults for new chats…", lambda: chat_defaults.edit(w)))
    tools = w.menuBar().addMenu("&Tools")
    action(w, "Re-measure this machine and model", lambda: remeasure(w), tools,
           tip="Measure each tier's speed and calibrate the model again, then re-plan (when the predictions look "
               "off, e.g. after the machine was busy during the first measurement)")
    w.server_action = QAction("Local server (OpenAI-compatible API)", w, checkable=True)
    w.server_action.toggled.connect(lambda on: w.toggle_server(bool(on)))
    tools.addAction(w.server_action)
    settings = w.menuBar().addMenu("&Settings")
    action(w, "GPU runtime…", w.gpu_runtime, settings)
    w.enter_sends_action = QAction("Enter sends message", w, checkable=True, checked=True)  # remembered: window_state
    w.enter_sends_action.setToolTip("On: Enter sends, Shift+Enter adds a line. Off: Enter adds a line. "
                                    "Ctrl+Enter always sends.")
    w.enter_sends_action.toggled.connect(w.composer.set_enter_sends)
    settings.addAction(w.enter_sends_action)
    theme_menu = settings.addMenu("Theme")
    group = QActionGroup(w)
    w.theme_actions = {}
    for name in theme.THEMES:
        a = QAction(name, w, checkable=True)
        a.triggered.connect(lambda _checked=False, n=name: w.set_theme(n))
        group.addAction(a)
        theme_menu.addAction(a)
        w.theme_actions[name] = a
    menu(w, "&Help", ("Keyboard shortcuts…", lambda: show_shortcuts(w), ("Ctrl+/", "F1")),
         ("Log", lambda: show_log(w)), ("About Mixdesk", lambda: about(w)))


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
    from .log_view import LogView

    run_modal(LogView(w.log_lines, w))


def about(w) -> None:
    import platform

    import PySide6
    import torch
    import transformers

    QMessageBox.about(w, "About Mixdesk", f"Mixdesk 0.1 — chat with Mixture-of-Experts models that do not fit "
                      f"in your GPU.\n\ntorch {torch.__version__} (CUDA: {torch.cuda.is_available()})\n"
                      f"transformers {transformers.__version__}\nPySide6 {PySide6.__version__}\n"
                      f"Python {platform.python_version()}")
