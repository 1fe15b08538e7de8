"""The model bar above the chat, for people: the model's name and size, where it runs, and its
current mix of 16- and 4-bit experts (from the engine's Stats), with the technical description in
its tooltip. A served model elsewhere shows its name and address instead (app/chat/remote.py)."""
from __future__ import annotations

from PySide6.QtWidgets import QLabel

from .panel import plain_words


def size_words(params: int) -> str:
    return (f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M" if params >= 1e6
            else f"{params / 1e3:.0f}K") + " parameters"


class ModelBar(QLabel):
    def __init__(self, parent=None):
        super().__init__("loading…", parent)
        self.setWordWrap(True)
        self.info = None  # the Loaded event of the model in use
        self.tiers: dict = {}  # experts per tier, as the engine last reported
        self.remote = False  # the chat goes to a served model: its own line stays

    def follow(self, engine) -> None:
        engine.loaded.connect(self.on_loaded)
        engine.stats.connect(self.on_stats)

    def on_loaded(self, ev) -> None:
        self.info = ev
        self.setToolTip(ev.description)  # the technical line
        if not self.remote:
            self.show_model()

    def on_stats(self, ev) -> None:
        if ev.tiers != self.tiers:
            self.tiers = dict(ev.tiers)
            if not self.remote:
                self.show_model()

    def closed(self, message: str) -> None:
        """The engine closed the model (its file changed on disk): say so until another one loads; the
        Stats still on their way describe the model that was."""
        self.info = None
        self.setText(message)

    def show_model(self) -> None:
        ev = self.info
        if ev is None:
            return
        where = "CPU only" if ev.cpu_only else "GPU + CPU"
        n16 = sum(n for t, n in self.tiers.items() if t.endswith("16"))
        n4 = sum(n for t, n in self.tiers.items() if t.endswith("-4"))
        mix = f" · {n16} {'expert' if n16 == 1 else 'experts'} at 16-bit, {n4} at 4-bit" if n16 + n4 else ""
        if ev.weights:  # a GGUF file: its own precision, and what the slider re-quantised
            requantised = plain_words.requantised_words(n4, ev.weights_bits) if not ev.weights_4bit else ""
            mix = f" · {ev.weights}" + (f" · {requantised}" if requantised else "")
        self.setText(f"<b>{ev.name}</b> · {size_words(ev.params)} · {where}{mix}")
