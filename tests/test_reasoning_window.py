"""The window speaks the models' own formats (issue 28), walked as a user walks it: a Qwen3-style and
a harmony-style tiny model with the published chat templates, their replies scripted
(tests/scripted_chat.py), messages typed into the composer and sent with its Send button, the
reasoning block unfolded with a mouse click on its header, chats reopened from the sidebar, the
Think switch clicked. The reasoning shows folded above the answer and is stored with the message but
never sent back; a tool call shows as a call, not as markup."""
import json
import time

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtGui import QTextCursor  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.chat.view import ChatView  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.chat.reasoning_view import NOT_RUN  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.protocol import Generate  # noqa: E402
from scripted_chat import script, write_chat_model  # noqa: E402
from window_helpers import no_uncaught_exceptions  # noqa: E402
from server_window_helpers import say  # noqa: E402

QWEN_REPLY = "<think>\nLet me think about the greeting.\n</think>\n\nHello **there**!"
HARMONY_REPLY = ("<|channel|>analysis<|message|>The user greets me. Greet back.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>Hi there!")
TOOL_REPLY = ('<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
BROKEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'


def wait(cond, timeout_s=180.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        QApplication.processEvents()
        time.sleep(0.01)


def open_on(style, tmp_path_factory):
    """A window on a tiny model of the style, ready and calibrated, with the sent commands recorded."""
    folder = write_chat_model(tmp_path_factory.mktemp(style), style)
    store_path = tmp_path_factory.mktemp(style + "-chats") / "chats.sqlite3"
    w = MainWindow(Store(store_path), model=str(folder), session_kwargs={"poll_s": 0.1}, device="cpu", dtype="fp32")
    w.show()
    wait(lambda: w.send_btn.isEnabled())
    wait(lambda: not w.bridge.session.controller.calibrating)
    w.sent = []
    send = w.bridge.send
    w.bridge.send = lambda cmd: (w.sent.append(cmd), send(cmd))[1]
    w.store_path = store_path
    return w


@pytest.fixture(scope="module")
def qwen(qapp, tmp_path_factory):
    w = open_on("qwen3", tmp_path_factory)
    yield w
    w.close()


@pytest.fixture(scope="module")
def harmony(qapp, tmp_path_factory):
    w = open_on("harmony", tmp_path_factory)
    yield w
    w.close()


def generator(w):
    return w.bridge.session.loaded.generator


def send_text(qtbot, w, text, n=200):
    return say(qtbot, w, text, n)  # typed, sent, and the reply once it has ended


def new_chat(qtbot, w):
    from PySide6.QtWidgets import QPushButton

    button = next(b for b in w.sidebar.findChildren(QPushButton) if b.text() == "New chat")
    qtbot.mouseClick(button, Qt.LeftButton)


def header_point(view: ChatView, words: str, last=True) -> QPoint:
    """Where a reasoning block's header (its text starting with `words`) is, in the viewport, scrolled
    into view: where a user clicks."""
    doc = view.document()
    found, cur = [], QTextCursor(doc)
    while True:
        cur = doc.find(words, cur)
        if cur.isNull():
            break
        found.append(cur.selectionStart())
    assert found, f"no {words!r} in {view.toPlainText()!r}"
    at = QTextCursor(doc)
    at.setPosition(found[-1 if last else 0] + 1)
    view.setTextCursor(at)
    view.ensureCursorVisible()
    point = view.cursorRect(at).center() + QPoint(2, 0)
    assert view.anchorAt(point).startswith("think:"), view.anchorAt(point)
    return point


def click_header(qtbot, view, words):
    qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=header_point(view, words))


def select_chat(qtbot, w, cid):
    lst = w.conv_list
    item = next(lst.item(i) for i in range(lst.count()) if lst.item(i).data(Qt.UserRole) == cid)
    qtbot.mouseClick(lst.viewport(), Qt.LeftButton, pos=lst.visualItemRect(item).center())
    qtbot.waitUntil(lambda: w.cid == cid, timeout=5_000)


def test_a_qwen3_reply_shows_its_reasoning_folded_above_the_answer_and_a_click_unfolds_it(qtbot, qwen):
    with no_uncaught_exceptions():
        new_chat(qtbot, qwen)
        script(generator(qwen), QWEN_REPLY)
        msg = send_text(qtbot, qwen, "Hi!")
        assert msg.content == "Hello **there**!" and msg.complete
        assert msg.meta["reasoning"].strip() == "Let me think about the greeting." and msg.meta["thought_s"] > 0
        shown = qwen.chat.toPlainText()
        assert "▸ Thought for" in shown and "Hello there!" in shown
        assert "Let me think" not in shown and "<think>" not in shown and "</think>" not in shown
        assert shown.index("Thought for") < shown.index("Hello there!")  # above the answer
        click_header(qtbot, qwen.chat, "▸ Thought for")
        shown = qwen.chat.toPlainText()
        assert "▾ Thought for" in shown and "Let me think about the greeting." in shown
        assert shown.index("Let me think") < shown.index("Hello there!")
        click_header(qtbot, qwen.chat, "▾ Thought for")
        assert "Let me think" not in qwen.chat.toPlainText()


def test_the_reasoning_streams_folded_and_unfolds_while_it_streams(qtbot, qwen, pace):
    gen = generator(qwen)
    inner = gen.retrying
    long = " ".join(f"step {i}." for i in range(60))
    try:
        pace(gen, 0.01)
        with no_uncaught_exceptions():
            new_chat(qtbot, qwen)
            script(gen, f"<think>\n{long}\n</think>\n\nDone thinking.")
            qwen.params = SamplingParams(max_new_tokens=600)
            qwen.input.setPlainText("Think long")
            qtbot.mouseClick(qwen.send_btn, Qt.LeftButton)
            qtbot.waitUntil(lambda: "Thinking…" in qwen.chat.toPlainText(), timeout=60_000)
            assert qwen.generating and "step 0." not in qwen.chat.toPlainText()  # folded while it streams
            click_header(qtbot, qwen.chat, "▸ Thinking…")
            qtbot.waitUntil(lambda: "step 1." in qwen.chat.toPlainText(), timeout=30_000)
            assert qwen.generating  # unfolded live, the reasoning still coming
            qtbot.waitUntil(lambda: not qwen.generating, timeout=120_000)
            shown = qwen.chat.toPlainText()
            assert "▾ Thought for" in shown and "step 59." in shown and "Done thinking." in shown
            assert shown.count("step 30.") == 1
    finally:
        gen.retrying = inner


def test_the_stored_chat_reopens_with_its_block_folded_and_later_turns_send_no_reasoning(qtbot, qwen):
    with no_uncaught_exceptions():
        new_chat(qtbot, qwen)
        script(generator(qwen), QWEN_REPLY, "<think>\nSecond thoughts.\n</think>\n\nAgain!")
        send_text(qtbot, qwen, "Hi!")
        cid = qwen.cid
        click_header(qtbot, qwen.chat, "▸ Thought for")  # unfolded here...
        new_chat(qtbot, qwen)
        select_chat(qtbot, qwen, cid)  # ...and reopened from the sidebar: folded again
        shown = qwen.chat.toPlainText()
        assert "▸ Thought for" in shown and "Hello there!" in shown and "Let me think" not in shown
        click_header(qtbot, qwen.chat, "▸ Thought for")
        assert "Let me think about the greeting." in qwen.chat.toPlainText()
        # the database as another start of the app reads it
        again = Store(qwen.store_path)
        view = ChatView()
        qtbot.addWidget(view)
        view.show_messages(again.messages(cid))
        assert "▸ Thought for" in view.toPlainText() and "Let me think" not in view.toPlainText()
        again.close()

        before = len(qwen.sent)
        send_text(qtbot, qwen, "And again?")
        gen_cmd = [c for c in qwen.sent[before:] if isinstance(c, Generate)][-1]
        assert [m["role"] for m in gen_cmd.messages] == ["user", "assistant", "user"]
        assert gen_cmd.messages[1]["content"] == "Hello **there**!"
        assert "Let me think" not in json.dumps(gen_cmd.messages) and "think>" not in json.dumps(gen_cmd.messages)
        shown = qwen.chat.toPlainText()
        assert shown.count("Thought for") == 2 and "Again!" in shown and "Second thoughts" not in shown


def test_the_think_switch_off_asks_for_no_reasoning_and_the_chat_remembers_it(qtbot, qwen):
    gen = generator(qwen)
    prompts, pipeline = [], qwen.bridge.session.loaded.prompts  # the engine's one prompt pipeline (engine/prompts/prompt.py)
    inner = pipeline.chat

    def recorded(messages, **kw):
        ids = inner(messages, **kw)
        prompts.append(gen.tok.decode(ids, skip_special_tokens=False))
        return ids

    pipeline.chat = recorded
    try:
        with no_uncaught_exceptions():
            think = qwen.composer.think_btn
            assert qwen.model_info.thinking_switch and think.isVisible() and think.isChecked()
            new_chat(qtbot, qwen)
            qtbot.mouseClick(think, Qt.LeftButton)
            assert not think.isChecked()
            script(gen, "Quick answer.")
            before = len(qwen.sent)
            msg = send_text(qtbot, qwen, "Quick, please")
            gen_cmd = [c for c in qwen.sent[before:] if isinstance(c, Generate)][-1]
            assert gen_cmd.thinking is False
            assert prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            assert msg.content == "Quick answer." and "reasoning" not in msg.meta
            assert "Thought for" not in qwen.chat.toPlainText()
            off = qwen.cid
            new_chat(qtbot, qwen)  # a new chat thinks
            assert think.isChecked()
            script(gen, QWEN_REPLY)
            before = len(qwen.sent)
            send_text(qtbot, qwen, "Hi!")
            assert [c for c in qwen.sent[before:] if isinstance(c, Generate)][-1].thinking is None
            assert prompts[-1].endswith("<|im_start|>assistant\n")
            on = qwen.cid
            select_chat(qtbot, qwen, off)  # the switch as each chat left it
            assert not think.isChecked()
            select_chat(qtbot, qwen, on)
            assert think.isChecked()
            qtbot.mouseClick(think, Qt.LeftButton)  # switched off and left without sending: remembered too
            select_chat(qtbot, qwen, off)
            select_chat(qtbot, qwen, on)
            assert not think.isChecked()
            qtbot.mouseClick(think, Qt.LeftButton)
    finally:
        pipeline.chat = inner


def test_a_tool_call_shows_as_a_call_and_a_malformed_one_as_a_quiet_note(qtbot, qwen):
    with no_uncaught_exceptions():
        new_chat(qtbot, qwen)
        script(generator(qwen), TOOL_REPLY, BROKEN_CALL)
        msg = send_text(qtbot, qwen, "Weather in Paris?")
        assert msg.content == "" and [c["name"] for c in msg.meta["tool_calls"]] == ["get_weather"]
        assert json.loads(msg.meta["tool_calls"][0]["arguments"]) == {"city": "Paris"}
        shown = qwen.chat.toPlainText()
        assert 'Called get_weather({"city": "Paris"})' in shown and NOT_RUN in shown
        assert "<tool_call>" not in shown and '"arguments"' not in shown and "▸ Thought for" in shown
        msg = send_text(qtbot, qwen, "Try again")
        assert msg.meta["notes"] and "could not be read" in msg.meta["notes"][0]
        shown = qwen.chat.toPlainText()
        assert "Note: the model's tool call could not be read" in shown
        assert shown.count("Called get_weather") == 1  # the malformed one is no call: its text is the answer
        cid = qwen.cid
        new_chat(qtbot, qwen)
        select_chat(qtbot, qwen, cid)  # stored with the message
        shown = qwen.chat.toPlainText()
        assert 'Called get_weather({"city": "Paris"})' in shown and "Note: the model's tool call" in shown


def test_a_harmony_reply_shows_its_analysis_as_reasoning_and_its_final_channel_as_the_answer(qtbot, harmony):
    with no_uncaught_exceptions():
        assert harmony.model_info.reply_format == "harmony"
        assert not harmony.composer.think_btn.isVisible()  # gpt-oss's template has no switch
        new_chat(qtbot, harmony)
        script(generator(harmony), HARMONY_REPLY, "<|channel|>final<|message|>Fine, thanks.")
        before = len(harmony.sent)
        msg = send_text(qtbot, harmony, "Hello")
        assert [c for c in harmony.sent[before:] if isinstance(c, Generate)][-1].thinking is None
        assert msg.content == "Hi there!" and msg.meta["reasoning"] == "The user greets me. Greet back."
        shown = harmony.chat.toPlainText()
        assert "▸ Thought for" in shown and "Hi there!" in shown and "The user greets" not in shown
        assert "<|" not in shown and "analysis" not in shown and "final" not in shown
        click_header(qtbot, harmony.chat, "▸ Thought for")
        assert "The user greets me. Greet back." in harmony.chat.toPlainText()
        before = len(harmony.sent)
        msg = send_text(qtbot, harmony, "How are you?")
        assert msg.content == "Fine, thanks." and "reasoning" not in msg.meta
        gen_cmd = [c for c in harmony.sent[before:] if isinstance(c, Generate)][-1]
        assert "The user greets" not in json.dumps(gen_cmd.messages)
        assert harmony.chat.toPlainText().count("Thought for") == 1
