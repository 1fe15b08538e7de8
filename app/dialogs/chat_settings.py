"""Chat > Chat settings… and the defaults' dialog (app/chat/defaults.py): the values of
app/chat/settings.py in a form, with the system prompt's named presets, kept across starts in the
app's QSettings (app/theme.py settings())."""
from __future__ import annotations

import json

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QGridLayout, QHBoxLayout,
                               QInputDialog, QLabel, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout)

from engine.protocol.sampling import SamplingParams

from .. import theme
from ..chat.settings import DEFAULTS, SAMPLING_KEYS, SETTINGS, default_values, overrides, read

PRESETS_KEY = "chat/system_prompt_presets"


# ---- system prompt presets (kept across starts) ----
def presets() -> dict[str, str]:
    try:
        raw = json.loads(theme.settings().value(PRESETS_KEY, "{}") or "{}")
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(raw, dict) else {}


def save_preset(name: str, text: str) -> None:
    kept = presets()
    kept[name] = text
    theme.settings().setValue(PRESETS_KEY, json.dumps(kept, ensure_ascii=False))


def delete_preset(name: str) -> None:
    kept = presets()
    kept.pop(name, None)
    theme.settings().setValue(PRESETS_KEY, json.dumps(kept, ensure_ascii=False))


# ---- the dialog ----
class ChatSettingsDialog(QDialog):
    """One chat's settings; accepted, `values()` and `system_prompt()` hold what to store."""

    PICK = "Choose a preset…"

    def __init__(self, parent, title: str, settings: dict, system_prompt: str, model_ctx: int = 0,
                 defaults: SamplingParams = DEFAULTS, for_new_chats: bool = False):
        """for_new_chats: the defaults new chats start from (app/chat/defaults.py): the sampling
        settings only (no system prompt, no memory), `defaults` being the built-in ones."""
        super().__init__(parent)
        self.setWindowTitle("Defaults for new chats" if for_new_chats else "Chat settings")
        self.defaults = default_values(defaults)
        lay = QVBoxLayout(self)
        head = QLabel("For chats created from now on; the chats you have keep their own settings." if for_new_chats
                      else f"For the chat <b>{_escape(title)}</b>. New chats start from the defaults "
                           "(Chat > Defaults for new chats…).")
        head.setWordWrap(True)
        lay.addWidget(head)
        form = QGridLayout()
        form.setColumnStretch(1, 1)
        self.fields: dict[str, QSpinBox | QDoubleSpinBox] = {}
        for i, s in enumerate(SETTINGS):
            box = QDoubleSpinBox(decimals=s.decimals) if s.decimals else QSpinBox()
            hi = model_ctx if model_ctx > 0 and s.key == "context" else s.hi  # a reply stops at the model's anyway
            box.setRange(s.lo, hi)
            box.setSingleStep(s.step)
            box.setSuffix(s.suffix)
            if s.at_lo:
                box.setSpecialValueText(s.at_lo)
            elif s.key == "context":
                box.setSpecialValueText(f"the model's ({model_ctx:,} tokens)" if model_ctx else "the model's")
            box.setToolTip(s.tip)
            box.setAccessibleName(s.label)
            label = QLabel(s.label + ":")
            label.setToolTip(s.tip)
            hint = QLabel(s.hint)
            hint.setForegroundRole(QPalette.PlaceholderText)  # quiet, in either theme
            hint.setToolTip(s.tip)
            form.addWidget(label, i, 0)
            form.addWidget(box, i, 1)
            form.addWidget(hint, i, 2)
            self.fields[s.key] = box
            if for_new_chats and s.key not in SAMPLING_KEYS:
                for widget in (label, box, hint):
                    widget.hide()
        lay.addLayout(form)
        self.fields["temperature"].valueChanged.connect(self._randomness)

        prompt_label = QLabel("System prompt (what the model is told before the chat):")
        lay.addWidget(prompt_label)
        row = QHBoxLayout()
        self.preset = QComboBox()
        self.preset.setToolTip("Saved system prompts: picking one puts its text below")
        self.preset.activated.connect(self._pick)  # the user's pick (again, too), not a listing
        row.addWidget(self.preset, 1)
        self.save_btn = QPushButton("Save as preset…")
        self.save_btn.setToolTip("Keep the text below as a named preset, for any chat")
        self.save_btn.clicked.connect(self._save)
        row.addWidget(self.save_btn)
        self.delete_btn = QPushButton("Delete preset")
        self.delete_btn.clicked.connect(self._delete)
        row.addWidget(self.delete_btn)
        lay.addLayout(row)
        self.prompt = QPlainTextEdit(placeholderText="e.g. You are a helpful assistant. Answer briefly.")
        self.prompt.setPlainText(system_prompt)
        lay.addWidget(self.prompt, 1)
        self._list_presets()
        if for_new_chats:  # a system prompt is never carried into a new topic unseen (see the module's docstring)
            for widget in (prompt_label, self.preset, self.save_btn, self.delete_btn, self.prompt):
                widget.hide()
            lay.addStretch(1)

        self.buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults)
        self.reset_btn = self.buttons.button(QDialogButtonBox.RestoreDefaults)
        self.reset_btn.setText("Reset to defaults")
        self.reset_btn.setToolTip("Put every number back to its default (the system prompt stays)")
        self.reset_btn.clicked.connect(self.reset)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.set_values({**self.defaults, **read(settings)})
        self.resize(640, 560)

    def set_values(self, values: dict) -> None:
        for key, box in self.fields.items():
            box.setValue(values.get(key, self.defaults[key]))
        self._randomness()

    def values(self) -> dict:
        return {k: (round(b.value(), 4) if isinstance(b, QDoubleSpinBox) else b.value()) for k, b in self.fields.items()}

    def system_prompt(self) -> str:
        return self.prompt.toPlainText().strip()

    def reset(self) -> None:
        self.set_values(self.defaults)

    def _randomness(self) -> None:
        greedy = self.fields["temperature"].value() == 0
        for key in ("top_p", "top_k"):
            self.fields[key].setEnabled(not greedy)

    def _list_presets(self, current: str = "") -> None:
        self.preset.blockSignals(True)  # listing picks nothing: the text below stays
        self.preset.clear()
        names = sorted(presets(), key=str.lower)
        self.preset.addItem(self.PICK if names else "No presets yet")
        self.preset.addItems(names)
        if current in names:
            self.preset.setCurrentIndex(names.index(current) + 1)
        self.preset.blockSignals(False)
        self.delete_btn.setEnabled(self.preset.currentIndex() > 0)

    def _pick(self, index: int) -> None:
        name = self.preset.itemText(index) if index > 0 else ""
        if name:
            self.prompt.setPlainText(presets().get(name, ""))
        self.delete_btn.setEnabled(bool(name))

    def _save(self) -> None:
        text = self.system_prompt()
        if not text:
            self.prompt.setPlaceholderText("Write a system prompt first, then save it as a preset.")
            return
        current = self.preset.currentText() if self.preset.currentIndex() > 0 else ""
        name, ok = QInputDialog.getText(self, "Save preset", "Name of the preset:", text=current)
        name = name.strip()
        if ok and name:
            save_preset(name, text)
            self._list_presets(name)

    def _delete(self) -> None:
        if self.preset.currentIndex() > 0:
            delete_preset(self.preset.currentText())
            self._list_presets()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def edit(parent, store, cid: int, model_ctx: int = 0, defaults: SamplingParams = DEFAULTS) -> bool:
    """Chat > Chat settings…: chat `cid`'s, in a dialog over `parent`; model_ctx: the model's context
    length (0: not known), defaults: what the chat's settings differ from. Accepted, they are stored
    and True returned (the caller shows it: the context indicator counts against the chat's memory,
    context_for); cancelled, False and nothing changes."""
    from ..menus import run_modal

    c = store.conversation(cid)
    dlg = ChatSettingsDialog(parent, c.title, c.settings, c.system_prompt, model_ctx, defaults)
    if not run_modal(dlg):
        return False
    store.set_settings(cid, overrides(dlg.values(), defaults))
    if dlg.system_prompt() != c.system_prompt:
        store.set_system_prompt(cid, dlg.system_prompt())
    return True
