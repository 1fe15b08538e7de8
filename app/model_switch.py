"""Opening a model without losing the one in use: the new model is checked on the engine thread
(the query check_model, engine/runtime/queries.py) while the chat goes on with the old one, then loaded; if
it fails after the old one was let go, the old one comes back (ModelSwitch, the window's File > Open
model and the browser's choice)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def display_name(spec: str) -> str:
    """A model as a person names it: "the demo model", a folder's or file's name, a hub id."""
    if spec == "demo":
        return "the demo model"
    p = Path(spec)
    return p.name if p.is_absolute() or p.exists() else spec


def reason(message: str, spec: str) -> str:
    """An error's first line without the path it starts with (said beside it already): the reason."""
    line = message.splitlines()[0] if message else "unknown error"
    for prefix in (f"{spec} could not be opened: ", f"{spec}: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    head, sep, rest = line.partition(": ")
    if sep and rest and Path(head).name == Path(spec).name:
        return rest
    inside = spec.rstrip("/") + "/"
    if sep and rest and head.startswith(inside):  # a file in the model's folder: named from there
        return f"{head[len(inside):]}: {rest}"
    return line


@dataclass(frozen=True)
class SwitchParts:
    """What a switch uses of the window: its collaborators, and its state as small callables."""
    bridge: object  # the engine bridge: send(command) -> request id; session.last_loaded
    bar: object  # the model bar (app/model_bar.py): setText, show_model
    composer: object  # its send_btn; show_context (app/chat/composer.py)
    progress: object  # the status bar's progress row (app/progress_row.py): hide
    panel: object  # the live panel: reset_speeds
    say: Callable[[str], None]  # on the status line (30 s) and in the log
    log: Callable[[str], None]  # in the log only
    generating: Callable[[], bool]  # a reply is in progress
    remote: Callable[[], bool]  # the chat goes to a served model (its reply is not the local model's)
    set_loading: Callable[[bool], None]  # Send waits for a model (the window's `loading`)


class ModelSwitch:
    """File > Open model (and the picker, a folder, a hub id, the demo), given the window's parts. The model
    in use stays loaded, and the chat usable (Send too), until the new one has been checked
    (the engine's check_model query, engine/runtime/queries.py); only then is it loaded, and Send waits for
    it. A reply sent meanwhile is the old model's: the load waits for it to end (a Load releases the model
    in use, which would cut the reply off). A new model that fails after that (the
    engine lets the old one go before it loads: engine/runtime/session.py _load) brings the previous one
    back, and the window says both: why the new one failed, and that the previous one is back.
    (The engine now validates the folder before it releases the model in use, too; the check here
    also reads the tokenizer and the chat template, which load reads only after the release.)"""

    def __init__(self, parts: SwitchParts):
        self.parts = parts
        self.current: tuple | None = None  # (path, device, dtype, ctx) of the model in use (ctx: "auto" or tokens)
        self.pending: tuple | None = None  # the one being opened
        self.check_id = self.load_id = None  # the engine's ids of the check and the load in progress
        self.building = False  # the engine began the load (its "load" progress): the next Loaded answers it
        self.ready: str | None = None  # the new model's folder, checked, loaded once the reply in progress ends
        self.switched = False  # a model was loaded by this switch: the window's readouts start again (loaded)
        self.failed: tuple[str, str] | None = None  # (spec, why) of a new model given up for the previous one
        self.kv_bits = 16  # the keys-and-values format every model opens with (the window's --kv-bits)

    @property
    def spec(self) -> tuple | None:
        return self.pending or self.current

    @property
    def busy(self) -> bool:
        """A model is being loaded (Send waits for it); not while the new one is only being checked."""
        return self.pending is not None and self.check_id is None and self.ready is None

    def open(self, spec: tuple, check: bool = True) -> None:
        p = self.parts
        self.pending, self.failed, self.ready = spec, None, None
        if self.current is None or not check:  # nothing to keep: load it at once
            self._load(spec[0])
            return
        p.set_loading(False)  # the chat goes on with the model in use while the new one is checked
        p.composer.send_btn.setEnabled(not p.generating())
        p.bar.setText(f"opening {display_name(spec[0])}… (the chat goes on with {display_name(self.current[0])} until it is ready)")
        from engine.protocol import Query

        self.check_id = p.bridge.send(Query(name="check_model", args={"spec": spec[0]}))

    def reply_ended(self) -> None:
        """The window's reply ended: a model checked while it ran is loaded now."""
        if self.ready is not None and self.pending is not None:
            folder, self.ready = self.ready, None
            self._load(folder)

    def restart(self) -> None:
        """A new engine thread holds no model: load the last one again."""
        spec, self.current = self.spec, None
        self.check_id = self.load_id = None
        if spec is not None:
            self.open(spec)

    def _load(self, path: str) -> None:
        """The engine loads it now (it lets the model in use go first): Send waits for it."""
        from engine.protocol import Load

        p = self.parts
        p.set_loading(True)
        p.composer.send_btn.setEnabled(False)
        p.bar.setText(f"loading {display_name(self.pending[0])}…; Send waits for it")
        _, device, dtype, ctx = (*self.pending, "auto")[:4]
        self.building = False
        self.load_id = p.bridge.send(Load(path=path, device=device, dtype=dtype, ctx=ctx, kv_bits=self.kv_bits))

    def on_event(self, ev) -> bool:
        """The window's engine events that answer a switch; True when handled here."""
        from engine.protocol import ErrorEvent, Loaded, Progress, QueryDone

        rid = getattr(ev, "request_id", None)
        if isinstance(ev, QueryDone) and rid is not None and rid == self.check_id:
            self.check_id = None
            p = self.parts
            if p.generating() and not p.remote():  # a reply of the model in use: loading would cut it off
                self.ready = ev.value
                p.bar.setText(f"{display_name(self.pending[0])} is ready: it loads when this reply ends "
                                      f"(the chat goes on with {display_name(self.current[0])} until then)")
            else:
                self._load(ev.value)
            return True
        if isinstance(ev, ErrorEvent) and rid is not None and rid in (self.check_id, self.load_id):
            # a Load that failed before the engine released the model in use leaves it announced
            released = rid == self.load_id and self.parts.bridge.session.last_loaded is None
            self._failed(ev.message, after_unload=released)
            return True
        if isinstance(ev, Progress) and ev.stage == "machine" and self.pending is not None:
            self.parts.bar.setText(f"Measuring this machine once (about 20 s), then opening "
                                       f"{display_name(self.pending[0])}…")
            return False  # the progress row shows it too
        if isinstance(ev, Progress) and ev.stage == "load" and self.load_id is not None:
            self.building = True
            return False
        # a Loaded before that re-announces the model in use (its background calibration ended)
        if isinstance(ev, Loaded) and self.load_id is not None and self.building:
            self.load_id = None
            if self.failed is None:
                from .dialogs.context_choice import remember as remember_context
                from .dialogs.model_picker import remember

                remember(self.pending[0])
                remember_context(self.pending[0], (*self.pending, "auto")[3])  # the context it was opened at
            self.switched = self.current is not None  # it replaced a model (not the first, nor one brought back)
            self.current, self.pending = self.pending, None
            return False  # the window shows it as any Loaded
        return False

    def context_changed(self, value) -> None:
        """The model in use runs at another context now (SetContext): a restart opens it at that one."""
        if self.current is not None:
            self.current = (*self.current[:3], value)

    def _failed(self, message: str, after_unload: bool) -> None:
        p = self.parts
        spec = self.pending
        why = reason(message, spec[0])
        self.check_id = self.load_id = self.ready = None
        p.progress.hide()  # its bar and its Cancel
        p.log(f"error: {spec[0]} could not be opened: {message}")
        if not after_unload and self.current is not None:  # the model in use was never let go
            self.pending = None
            p.set_loading(False)
            p.bar.show_model()
            p.composer.send_btn.setEnabled(not p.generating())
            p.say(f"{why} — {display_name(spec[0])} could not be opened. Still using {display_name(self.current[0])}.")
            return
        previous = self.current
        self.current = None
        if previous is not None and previous != spec and self.failed is None:
            self.failed = (display_name(spec[0]), why)
            self.pending = previous
            self._load(previous[0])
            p.bar.setText(f"{why} — {display_name(spec[0])} could not be loaded. Reopening {display_name(previous[0])}…")
            return
        self.pending = None
        p.set_loading(False)
        if self.failed is not None:
            why = f"{why} (after {self.failed[0]} could not be loaded: {self.failed[1]})"
        p.bar.setText(f"{why} — could not load {display_name(spec[0])}")
        p.say(f"{why} — {display_name(spec[0])} could not be loaded. Open another model (File > Open model…).")

    def loaded(self) -> None:
        """After the window showed a Loaded: the old model's figures go (the chat's context as it
        counted it, its speeds: the new one's come with its first reply); the outcome of a switch
        that fell back is said."""
        if self.switched:
            self.switched = False
            self.parts.composer.show_context(None)
            self.parts.panel.reset_speeds()
        if self.failed is not None and self.pending is None and self.current is not None:
            spec, why = self.failed
            self.failed = None
            self.parts.say(f"{why} — {spec} could not be loaded. {display_name(self.current[0])} is back.")
