"""The window and the network (app/serving.py, app/chat/remote.py), offscreen: it chats with a remote
OpenAI-compatible endpoint (a second Mixdesk server on loopback stands in for vLLM), says "remote"
and hides the placement controls; and its Local server switch serves the engine the chat uses, to
the official openai client, with a request log in the panel."""
import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402

from engine.runtime.client import Client  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.tools.serve import Server  # noqa: E402

from main_window_helpers import window  # noqa: E402,F401  (the same window fixture)


def say(qtbot, w, text, n=16):
    w.params = SamplingParams(max_new_tokens=n)
    w.input.setPlainText(text)
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    return w.store.messages(w.cid)[-1]


def test_the_window_chats_with_a_remote_endpoint(qtbot, window, tiny):
    other = Client()  # "vLLM": a second engine, served on loopback with a key
    other.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=256)
    other.session.loaded.generator.eos_ids.clear()
    server = Server(other.session, "127.0.0.1", 0, api_key="k3y").start()
    try:
        window.connect_remote((server.url, "k3y", tiny.name))
        assert not window.slider.isVisible() and not window.panel.placement_box.isVisible()
        assert window.panel.mode.text().startswith("remote: ") and server.url in window.panel.mode.text()
        reply = say(qtbot, window, "hello from the window", 12)
        assert reply.role == "assistant" and reply.complete and reply.content
        assert "12 tokens" in reply.meta["stats"]
        want = other.generate(messages=[{"role": "user", "content": "hello from the window"}],
                              params=SamplingParams(max_new_tokens=12))
        assert reply.content == want.text  # the remote model's reply, greedy, as it gives it
        assert any(e.path == "/v1/chat/completions" and e.status == 200 for e in server.log)
        # a wrong key is one line in the window, and the chat stays usable
        window.connect_remote((server.url, "wrong", tiny.name))
        say(qtbot, window, "again", 4)
        assert "HTTP 401" in window.statusBar().currentMessage()
        window.disconnect_remote()
        assert window.slider.isVisible() and window.panel.placement_box.isVisible()
        local = say(qtbot, window, "and locally", 6)
        assert local.complete and "6 tokens" in local.meta["stats"]
    finally:
        server.stop()
        other.close()


def test_the_local_server_switch_serves_the_chats_engine(qtbot, window, tiny):
    openai = pytest.importorskip("openai")
    window.toggle_server(True, port=0)
    assert window.server.running and window.server_box.isVisible()
    url = window.server.server.url
    assert window.server_box.url.full == url and tiny.name in window.server_box.model.full  # elided, whole in tooltips
    from engine.protocol import Done, Token

    seen = []
    window.bridge.events.connect(lambda batch: seen.extend(batch))
    c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    r = c.chat.completions.create(model=tiny.name, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert r.usage.completion_tokens <= 5
    qtbot.waitUntil(lambda: window.server_box.log.count() >= 1, timeout=10_000)
    assert "POST /v1/chat/completions 200" in window.server_box.log.item(0).text()
    assert not [e for e in seen if isinstance(e, (Token, Done))]  # the server's replies go to the server alone
    reply = say(qtbot, window, "the chat works beside it", 6)  # the same engine serves the chat
    assert reply.complete
    window.server_action.setChecked(False)
    assert not window.server.running and not window.server_box.isVisible()


def test_a_remote_reasoning_model_is_shown_as_the_local_one(qtbot, window, tmp_path):
    """A served model's reasoning_content goes to the folded block, its content to the answer."""
    from scripted_chat import script, write_chat_model

    folder = write_chat_model(tmp_path / "qwen", "qwen3")
    other = Client()
    other.load(str(folder), placement="cpu", device="cpu", dtype="fp32", ctx=2048)
    script(other.session.loaded.generator, "<think>\nCount the letters.\n</think>\n\nThree.")
    server = Server(other.session, "127.0.0.1", 0).start()
    try:
        window.connect_remote((server.url, "", folder.name))
        reply = say(qtbot, window, "How many letters in 'cat'?", 64)
        assert reply.content == "Three." and "<think>" not in reply.content
        assert reply.meta.get("reasoning") == "Count the letters."
    finally:
        window.disconnect_remote()
        server.stop()
        other.close()
