"""The settings new chats start from (Chat > Defaults for new chats…), remembered across starts in
the app's QSettings (app/theme.py settings()).

Built in: a mild repetition penalty, 1.1, as llama.cpp and LM Studio use by default: without one a
small model asked for a table repeated its rows for 756 tokens. The user's own replace them once set
(the sampling settings only: a system prompt is never carried into a new topic unseen, see
app/chat/settings.py).

A chat stores only what differs from the defaults (app/chat/settings.py), so a chat nobody set up
follows them. When the user changes them, every chat there is keeps the values it had: each is
given, as its own, whatever differs from the new defaults."""
from __future__ import annotations

import json
from dataclasses import replace

from engine.runtime.generate import SamplingParams

from .. import theme
from .settings import DEFAULTS, SAMPLING_KEYS, default_values, overrides, read
from ..dialogs.chat_settings import ChatSettingsDialog

KEY = "chat/new_chat_defaults"
BUILT_IN = DEFAULTS  # repetition penalty 1.1, the longest reply 1,024 tokens


def saved() -> SamplingParams:
    """New chats' defaults: the user's, where set (and valid), over the built-in ones."""
    try:
        raw = json.loads(theme.settings().value(KEY, "{}") or "{}")
    except (TypeError, ValueError):
        raw = {}
    return replace(BUILT_IN, **{k: v for k, v in read(raw).items() if k in SAMPLING_KEYS})


def save(values: dict) -> SamplingParams:
    """Remember values ({key: value}, as the dialog gives them) as new chats' defaults."""
    own = {k: v for k, v in overrides(values, BUILT_IN).items() if k in SAMPLING_KEYS}
    theme.settings().setValue(KEY, json.dumps(own))
    return saved()


def keep_chats(store, before: SamplingParams, after: SamplingParams) -> int:
    """Every chat keeps what it had under the defaults `before` now that they are `after`: the
    values that differ from `after` become its own. Returns how many chats were written."""
    had_by_default = default_values(before)
    changed = 0
    for c in store.conversations():
        mine = read(c.settings)
        keep = overrides({**had_by_default, **mine}, after)
        if keep != mine:
            store.set_settings(c.id, keep)
            changed += 1
    return changed


def edit(parent, store, params: SamplingParams, model_ctx: int = 0) -> tuple[SamplingParams, str] | None:
    """Chat > Defaults for new chats…: the dialog of Chat settings…, over `parent`, for the chats created
    from now on; params: the defaults in use, model_ctx: the model's context length (0: not known).
    Accepted: (the new defaults, a note to show the user), every chat in store keeping what it had
    (keep_chats); cancelled: None, nothing changed."""
    from ..menus import run_modal

    current = {k: getattr(params, k) for k in SAMPLING_KEYS}
    dlg = ChatSettingsDialog(parent, "", current, "", model_ctx, BUILT_IN, for_new_chats=True)
    if not run_modal(dlg):
        return None
    after = save(dlg.values())
    new = replace(params, **{k: getattr(after, k) for k in SAMPLING_KEYS})
    kept = keep_chats(store, params, new)
    return new, "new chats start from these settings" + ("; the chats made before keep what they had" if kept else "")
