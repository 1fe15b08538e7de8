"""The main window's wiring: what it hands each of its helpers, which never see the window. A part
of MainWindow (it inherits this class), kept apart so that app/main_window.py holds the layout and
the window's own state: ModelSwitch (app/model_switch.py) and Connect to a server (app/chat/remote.py)
get frozen dataclasses of collaborators and small callables; the menus (app/menus.py) a table of
commands; the Chat settings… and Defaults for new chats… dialogs (app/dialogs/chat_settings.py,
app/chat/defaults.py) what they edit, and the window is updated here from what they say changed;
and Tools > Local server's switch (app/serving.py)."""
from __future__ import annotations

from .chat import defaults as chat_defaults, remote
from .dialogs import chat_settings as chat_settings_dialog
from . import menus
from .model_switch import SwitchParts
from .serving import ServerDialog, ask_connection


class WindowWiring:
    def switch_parts(self) -> SwitchParts:
        """File > Open model's: the engine bridge, the model bar, the composer, the progress row, the panel."""
        return SwitchParts(
            self.bridge, self.model_label, self.composer, self.progress_row, self.panel,
            say=lambda text: (self.statusBar().showMessage(text, 30000), self.log_line(text)),
            log=lambda text: self.log_line(text),
            generating=lambda: self.generating,
            remote=lambda: self.remote is not None,
            set_loading=lambda on: setattr(self, "loading", on))

    def remote_parts_of(self) -> remote.RemoteParts:
        """File > Connect to a server's and Use the local model's; each RemoteChat is a child of the
        engine controller that takes its events."""
        return remote.RemoteParts(
            self.engine, self.model_label, self.composer, self.slider, self.panel,
            current=lambda: self.remote,
            use=lambda chat: setattr(self, "remote", chat),
            ask=lambda: ask_connection(self),
            generating=lambda: self.generating,
            stop=lambda: self.stop(),
            local_ready=lambda: self.model_info is not None and not self.loading,
            say=lambda text: self.statusBar().showMessage(text, 8000),
            log=lambda text: self.log_line(text),
            owner=self.engine)

    def menu_commands(self) -> menus.Commands:
        """What each of the window's menu items does (read when triggered: the chat open, the store...)."""
        def say(text: str, ms: int = 8000) -> None:
            self.statusBar().showMessage(text, ms)

        return menus.Commands(
            new_chat=self.new_chat, pick_model=self.pick_model,
            open_folder=lambda: menus.open_folder(self, self.load_model),
            open_gguf=lambda: menus.open_gguf(self, self.load_model),
            open_demo=lambda: self.load_model("demo"),
            open_hub=lambda: menus.open_hub(self, self.load_model),
            connect_remote=self.connect_remote, disconnect_remote=self.disconnect_remote,
            export_markdown=lambda: menus.export(self, self.store, self.cid, "md", say),
            export_json=lambda: menus.export(self, self.store, self.cid, "json", say),
            quit=self.close,
            find_chats=lambda: menus.find_chats(self.search), paste_files=self.paste_files,
            view_actions=[self.panel_switch.action],  # Show live panel (app/panel/switch.py)
            send=self.send, stop=self.stop, regenerate=self.reply.regenerate, edit_last=self.reply.edit_last,
            chat_settings=self.edit_chat_settings, chat_defaults=self.edit_new_chat_defaults,
            remeasure=lambda: menus.remeasure(self.send_btn, self.generating, say, self.log_line, self.bridge.send),
            toggle_server=self.toggle_server,
            gpu_runtime=self.gpu_runtime,
            set_enter_sends=self.composer.set_enter_sends, enter_sends=True,  # remembered: app/window_state.py
            set_theme=self.set_theme,
            show_shortcuts=lambda: menus.show_shortcuts(self.menuBar(), self.composer.enter_sends, self),
            show_log=lambda: menus.show_log(self.log_lines, self),
            about=lambda: menus.about(self),
        )

    def edit_chat_settings(self) -> None:
        """Chat > Chat settings…: the current chat's (a new one if none is open)."""
        if self.cid is None:
            self.new_chat()
        cid = self.cid
        if chat_settings_dialog.edit(self, self.store, cid, self.ctx, self.params):
            self.statusBar().showMessage("settings saved for this chat", 8000)
            if cid == self.cid:  # the context indicator counts against the chat's memory
                self.composer.show_context(self.composer.used, limit=self.chat_session.context(self.ctx))

    def edit_new_chat_defaults(self) -> None:
        """Chat > Defaults for new chats…: the chats made before keep what they had."""
        changed = chat_defaults.edit(self, self.store, self.params, self.ctx)
        if changed is not None:
            self.params, note = changed
            self.statusBar().showMessage(note, 8000)
            self.log_line(note)

    # ---- Tools > Local server (app/serving.py) ----
    def toggle_server(self, on: bool, port: int | None = None, api_key: str = "") -> None:
        if not on:
            self.server.stop()
            self.server_box.stop()
            return
        if port is None:
            dlg = ServerDialog(self)
            if not menus.run_modal(dlg):
                self.server_action.setChecked(False)
                return
            port, api_key = dlg.port.value(), dlg.key.text().strip()
        try:
            url = self.server.start(self.bridge.session, port, api_key)
        except (OSError, ValueError) as e:
            self.statusBar().showMessage(f"the local server could not start: {e}", 15000)
            self.server_action.setChecked(False)
            return
        self.server_action.blockSignals(True)  # started from code: the menu shows it too
        self.server_action.setChecked(True)
        self.server_action.blockSignals(False)
        self.server_box.show_server(self.server.server, self.model_info.name if self.model_info else "(loading)")
        self.log_line(f"local server at {url}")
