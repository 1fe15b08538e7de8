"""Shared by several test modules (moved out of tests/test_window_flows.py, which uses them too): fill_connect, say, second_server."""
import pytest
pytest.importorskip("PySide6")
from PySide6.QtCore import Qt
from engine.runtime.client import Client
from engine.runtime.generate import SamplingParams
from engine.tools.serve import Server
from main_window_helpers import open_window, window  # noqa: E402,F401  (the same window fixture)
from store_helpers import small_disk  # noqa: E402,F401  (a tmpfs that fills)


def say(qtbot, w, text, n=8):
    """Types a message and clicks Send; the reply, once it has ended."""
    w.params = SamplingParams(max_new_tokens=n)
    w.input.setPlainText(text)
    assert w.send_btn.isEnabled()
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    return w.store.messages(w.cid)[-1]


@pytest.fixture
def second_server(tiny):
    """Another Mixdesk serving the tiny model on loopback, with a key (it stands in for vLLM)."""
    other = Client()
    other.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=256)
    other.session.loaded.generator.eos_ids.clear()
    server = Server(other.session, "127.0.0.1", 0, api_key="k3y").start()
    yield server, other
    server.stop()
    other.close()


def fill_connect(url, key, model=""):
    def fill(dlg):
        from app.serving import ConnectDialog

        assert isinstance(dlg, ConnectDialog)
        dlg.url.setText(url)
        dlg.key.setText(key)
        if model:
            dlg.models.setEditText(model)
        dlg.accept()  # with no model named, it asks the server for its list first
    return fill

