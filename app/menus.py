"""The menu bar, its shortcuts, and the small dialogs the menus open (export, log, about; Chat
settings… is app/chat/settings.py).

build(menu_bar, commands) is handed the menu bar to fill and a Commands table: the callable each
action triggers and the checked states the checkable ones start in (app/window_wiring.py builds it
from the main window). It returns the actions their owner keeps (MenuActions); it never sees the
window. The helpers below take what they use: a parent widget for their dialogs, the store, a chat
id, `say(text, ms)` for the status bar, `load_model(spec)`.

Every action's handler is called with no argument: QAction.triggered passes `checked` (a bool),
which a handler with an optional first parameter took for its argument (File > Connect to a server
got `False` for its choice and opened no dialog). Only the checkable actions (the Local server
switch, Settings > Enter sends message) take the state they are toggled to."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from . import theme

Say = Callable[..., object]  # say(text, ms): a status-bar message shown for ms milliseconds


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


@dataclass
class Commands:
    """What each menu item does (each called with no argument unless said), and the checked states
    the checkable items start in."""
    # File
    new_chat: Callable[[], object]
    pick_model: Callable[[], object]
    open_folder: Callable[[], object]
    open_gguf: Callable[[], object]
    open_demo: Callable[[], object]
    open_hub: Callable[[], object]
    connect_remote: Callable[[], object]
    disconnect_remote: Callable[[], object]
    export_markdown: Callable[[], object]
    export_json: Callable[[], object]
    quit: Callable[[], object]
    # Edit
    find_chats: Callable[[], object]
    paste_files: Callable[[], object]
    # Chat
    send: Callable[[], object]
    stop: Callable[[], object]
    regenerate: Callable[[], object]
    edit_last: Callable[[], object]
    chat_settings: Callable[[], object]
    chat_defaults: Callable[[], object]
    # Tools
    remeasure: Callable[[], object]
    toggle_server: Callable[[bool], object]  # the Local server switch, with the state it is toggled to
    # Settings
    gpu_runtime: Callable[[], object]
    set_enter_sends: Callable[[bool], object]  # Enter sends message, with the state it is toggled to
    set_theme: Callable[[str], object]  # a Theme item, with its name
    # Help
    show_shortcuts: Callable[[], object]
    show_log: Callable[[], object]
    about: Callable[[], object]
    # View: actions made elsewhere, added as they are (Show live panel: app/panel/switch.py)
    view_actions: list[QAction] = field(default_factory=list)
    enter_sends: bool = True  # Enter sends message, checked at first (app/window_state.py restores it)


@dataclass
class MenuActions:
    """The actions build() made that their owner keeps: to check or uncheck them from code."""
    server: QAction  # Tools > Local server (OpenAI-compatible API)
    enter_sends: QAction  # Settings > Enter sends message
    themes: dict[str, QAction]  # Settings > Theme > each of theme.THEMES
    settings: object = None  # the Settings menu (a QMenu): others add their items (app/dialogs/lowest_precision.py)


def action(parent, text: str, fn: Callable[[], object], menu=None, tip: str = "", keys=()) -> QAction:
    """A menu action (owned by parent) that calls fn() (never fn(checked)); keys: its shortcuts, the
    first shown in the menu beside it."""
    a = QAction(text, parent)
    a.triggered.connect(lambda _checked=False: fn())
    if tip:
        a.setToolTip(tip)
    if keys:
        a.setShortcuts([QKeySequence(k) for k in ((keys,) if isinstance(keys, (str, QKeySequence.StandardKey)) else keys)])
    if menu is not None:
        menu.addAction(a)
    return a


def menu(menu_bar, title: str, *items):
    """A menu of menu_bar, of (text, fn) or (text, fn, keys) items; None: a separator."""
    m = menu_bar.addMenu(title)
    for item in items:
        if item is None:
            m.addSeparator()
            continue
        text, fn, *keys = item
        action(menu_bar, text, fn, m, keys=keys[0] if keys else ())
    return m


def checkable(parent, text: str, checked: bool, on_toggled: Callable[[bool], object], menu, tip: str = "") -> QAction:
    """A checkable action in menu that calls on_toggled(state) when toggled (by the user or by code)."""
    a = QAction(text, parent, checkable=True, checked=checked)
    if tip:
        a.setToolTip(tip)
    a.toggled.connect(lambda on: on_toggled(bool(on)))
    menu.addAction(a)
    return a


def build(menu_bar, c: Commands) -> MenuActions:
    """Fills menu_bar (a QMenuBar) with the menus, each item doing what c says; every shortcut belongs
    to a menu item, which shows it."""
    menu(menu_bar, "&File", ("New chat", c.new_chat, QKeySequence.New), None,
         ("Open model…", c.pick_model, QKeySequence.Open), ("Open model folder…", c.open_folder),
         ("Open GGUF file…", c.open_gguf),
         ("Open demo model", c.open_demo), ("Open Hugging Face model…", c.open_hub), None,
         ("Connect to a server…", c.connect_remote), ("Use the local model", c.disconnect_remote), None,
         ("Export chat as Markdown…", c.export_markdown), ("Export chat as JSON…", c.export_json),
         None, ("Quit", c.quit, ("Ctrl+Q",)))
    menu(menu_bar, "&Edit", ("Find chats", c.find_chats, ("Ctrl+F",)),
         ("Paste files as attachments", c.paste_files, ("Ctrl+Shift+V",)))
    view = menu_bar.addMenu("&View")
    for a in c.view_actions:
        view.addAction(a)
    menu(menu_bar, "&Chat", ("Send", c.send, ("Ctrl+Return", "Ctrl+Enter")), ("Stop the reply", c.stop, ("Escape",)),
         ("Regenerate the last reply", c.regenerate, ("Ctrl+Shift+R",)),
         ("Edit the last message", c.edit_last, ("Ctrl+Shift+E",)), None,
         ("Chat settings…", c.chat_settings, ("Ctrl+,",)),
         ("Defaults for new chats…", c.chat_defaults))
    tools = menu_bar.addMenu("&Tools")
    action(menu_bar, "Re-measure this machine and model", c.remeasure, tools,
           tip="Measure each tier's speed and calibrate the model again, then re-plan (when the predictions look "
               "off, e.g. after the machine was busy during the first measurement)")
    server = checkable(menu_bar, "Local server (OpenAI-compatible API)", False, c.toggle_server, tools)
    settings = menu_bar.addMenu("&Settings")
    action(menu_bar, "GPU runtime…", c.gpu_runtime, settings)
    enter_sends = checkable(menu_bar, "Enter sends message", c.enter_sends, c.set_enter_sends, settings,
                            tip="On: Enter sends, Shift+Enter adds a line. Off: Enter adds a line. "
                                "Ctrl+Enter always sends.")
    theme_menu = settings.addMenu("Theme")
    group = QActionGroup(menu_bar)
    themes = {}
    for name in theme.THEMES:
        a = QAction(name, menu_bar, checkable=True)
        a.triggered.connect(lambda _checked=False, n=name: c.set_theme(n))
        group.addAction(a)
        theme_menu.addAction(a)
        themes[name] = a
    menu(menu_bar, "&Help", ("Keyboard shortcuts…", c.show_shortcuts, ("Ctrl+/", "F1")),
         ("Log", c.show_log), ("About Mixdesk", c.about))
    return MenuActions(server=server, enter_sends=enter_sends, themes=themes, settings=settings)


def find_chats(search) -> None:
    """Edit > Find chats (Ctrl+F): the sidebar's search field (a QLineEdit), its text selected."""
    search.setFocus()
    search.selectAll()


def show_shortcuts(menu_bar, enter_sends: bool, parent=None) -> None:
    """Help > Keyboard shortcuts… (app/dialogs/shortcuts_help.py): menu_bar's shortcuts, and the message box's
    keys (enter_sends: whether Enter sends a message now)."""
    from .dialogs.shortcuts_help import ShortcutsDialog

    run_modal(ShortcutsDialog(menu_bar, enter_sends, parent))


def remeasure(send_btn, busy: bool, say: Say, log_line: Callable[[str], object], send: Callable[[object], object]) -> None:
    """Tools > Re-measure: send(Reprofile()) to the engine, unless no model is ready (send_btn
    disabled) or a reply is in progress (busy); send_btn stays disabled until the model is ready again."""
    from engine.protocol import Reprofile

    if not send_btn.isEnabled() or busy:
        say("Re-measuring needs a loaded model and no reply in progress", 8000)
        return
    send_btn.setEnabled(False)  # until the engine says the model is ready again (Loaded)
    log_line("re-measuring this machine and the model")
    send(Reprofile())


def open_folder(parent, load_model: Callable[[str], object]) -> None:
    d = QFileDialog.getExistingDirectory(parent, "Open a model folder (Mixtral, Qwen3-MoE, OLMoE or Qwen2-MoE)")
    if d:
        load_model(d)


GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
GGUF_TITLE = "Open a GGUF file (Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE or gpt-oss; split files: the first part)"


def open_gguf(parent, load_model: Callable[[str], object]) -> None:
    path, _ = QFileDialog.getOpenFileName(parent, GGUF_TITLE, "", GGUF_FILTER)
    if path:
        load_model(path)


def open_hub(parent, load_model: Callable[[str], object]) -> None:
    repo, ok = QInputDialog.getText(parent, "Hugging Face model", "Repo id (owner/name):")
    if ok and repo.strip():
        load_model(repo.strip())


def export(parent, store, cid: int | None, kind: str, say: Say) -> None:
    """File > Export chat as Markdown (kind "md") or JSON ("json"): chat cid of store, to a file picked
    in a dialog over parent; say(text, ms): what became of it."""
    if cid is None:
        say("No chat to export: open or start one first", 8000)
        return
    path, _ = QFileDialog.getSaveFileName(parent, "Export chat", f"chat.{kind}")
    if path:
        text = store.export_markdown(cid) if kind == "md" else store.export_json(cid)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            say(f"could not write {path}: {e.strerror or e}", 15000)
            return
        say(f"chat exported to {path}", 8000)


def show_log(lines: list[str], parent=None) -> None:
    from .dialogs.log_view import LogView

    run_modal(LogView(lines, parent))


def about(parent) -> None:
    import platform

    import PySide6
    import torch
    import transformers

    QMessageBox.about(parent, "About Mixdesk", f"Mixdesk 0.1 — chat with Mixture-of-Experts models that do not fit "
                      f"in your GPU.\n\ntorch {torch.__version__} (CUDA: {torch.cuda.is_available()})\n"
                      f"transformers {transformers.__version__}\nPySide6 {PySide6.__version__}\n"
                      f"Python {platform.python_version()}")
