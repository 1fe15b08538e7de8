"""Start the desktop app: a Qt window on a qasync event loop, the engine on its own thread."""
from __future__ import annotations

import asyncio
import logging
import sys


def store_path():
    from platformdirs import user_data_path

    return user_data_path("mixdesk", appauthor=False) / "chats.sqlite3"


def run(model: str = "demo", device: str | None = None, ctx=None, kv_bits: int = 16) -> int:
    """ctx: the context to open the model at ("auto" or tokens; None: the one chosen for it last);
    kv_bits: the keys-and-values format (16 or 8)."""
    import qasync
    from PySide6.QtWidgets import QApplication

    from .main_window import MainWindow
    from .store.chat_store import Store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Mixdesk")
    app.setOrganizationName("Mixdesk")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    win = MainWindow(Store(store_path()), model=model, device=device, ctx=ctx, kv_bits=kv_bits)
    win.show()
    with loop:
        loop.run_until_complete(closed.wait())
    return 0
