"""The GUI's only door to the engine: commands go into the engine thread's queue; its events come
back as a Qt signal, which Qt queues onto the GUI thread. No widget is touched off that thread."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from engine.session import Session


class EngineBridge(QObject):
    event = Signal(object)

    def __init__(self, session_kwargs: dict | None = None, parent=None):
        super().__init__(parent)
        self.session = Session(self.event.emit, **(session_kwargs or {}))
        self.session.start()

    def send(self, cmd) -> None:
        self.session.submit(cmd)

    def shutdown(self, timeout: float = 10.0) -> bool:
        return self.session.shutdown(timeout)
