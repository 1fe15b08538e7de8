"""Issue 37, item 2: window flows a new user found broken, each through the real widget or QAction."""
import pytest

pytest.importorskip("PySide6")
from PySide6.QtGui import QPalette, QTextFrame  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from main_window_helpers import send, window  # noqa: E402,F401  (the window fixture)
from window_helpers import menu_actions  # noqa: E402


def frames(doc):
    out, stack = [], [doc.rootFrame()]
    while stack:
        f = stack.pop()
        out.append(f)
        stack.extend(f.childFrames())
    return out


def colours(view):
    """(the user bubble's background, the text colour of its first character, the view's base)."""
    doc = view.document()
    bubble = next(f for f in frames(doc) if f is not doc.rootFrame())
    cur = bubble.firstCursorPosition()
    cur.movePosition(cur.MoveOperation.NextCharacter, cur.MoveMode.KeepAnchor)
    fg = cur.charFormat().foreground().color()
    if cur.charFormat().foreground().style() == 0:  # no brush: the palette's text
        fg = view.palette().color(QPalette.Text)
    return bubble.frameFormat().background().color(), fg, view.viewport().palette().color(QPalette.Base)


def test_a_chat_on_screen_follows_a_theme_change(qtbot, window):
    acts = menu_actions(window)
    acts["Settings/Theme/Light"].trigger()
    send(qtbot, window, "hello in the light", 8)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    bg, fg, base = colours(window.chat)
    assert bg.lightness() > 128 and base.lightness() > 128
    acts["Settings/Theme/Dark"].trigger()
    QApplication.processEvents()
    bg, fg, base = colours(window.chat)
    assert base.lightness() < 128, "the view's background stayed light"
    assert bg.lightness() < 128, f"the user's bubble stayed light ({bg.name()})"
    assert fg.lightness() - bg.lightness() > 100, f"text {fg.name()} on {bg.name()} is unreadable"


def test_a_theme_change_while_a_reply_streams_applies_when_it_ends(qtbot, window, pace):
    acts = menu_actions(window)
    acts["Settings/Theme/Light"].trigger()
    window.bridge.session.loaded.generator.eos_ids.clear()
    pace(window.bridge.session.loaded.generator)
    send(qtbot, window, "a long one", 120)
    qtbot.waitUntil(lambda: len(window.chat.streamed) > 5, timeout=60_000)
    acts["Settings/Theme/Dark"].trigger()
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    QApplication.processEvents()
    bg, fg, base = colours(window.chat)
    assert bg.lightness() < 128 and fg.lightness() - bg.lightness() > 100
    assert window.store.messages(window.cid)[-1].complete


def test_a_first_start_says_it_measures_the_machine_and_names_the_model(qtbot, tiny, tmp_path, monkeypatch):
    """The first start's measuring (about 20 s on a machine of this kind) is said in words, in the
    model bar and the progress row, and the model is named, not shown as its folder's path."""
    import engine.measures.hardware as hardware
    from app.main_window import MainWindow
    from app.store.chat_store import Store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing measured yet
    real = hardware.measure

    def slow(*a, **k):  # long enough for the test to look while it measures
        import time

        time.sleep(2.0)
        return real(*a, **k)

    monkeypatch.setattr(hardware, "measure", slow)
    w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(tiny), session_kwargs={"poll_s": 0.1},
                   device="cpu", dtype="fp32")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: "Measuring this machine" in w.model_label.text(), timeout=30_000)
    assert str(tiny) not in w.model_label.text() and tiny.name in w.model_label.text()
    assert w.progress.isVisible() and "Measuring this machine" in w.progress.format()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    assert "Measuring this machine" not in w.model_label.text()
    w.close()


def test_an_idle_throughput_chart_stops_and_says_idle(qtbot, window, pace):
    """After a reply the chart drew a flat 'writing N tokens/s' line for as long as the window was
    open; now it draws while a reply runs, and the readout says the figures are the last reply's."""
    import time

    panel = window.panel
    window.bridge.session.loaded.generator.eos_ids.clear()
    pace(window.bridge.session.loaded.generator)  # ~0.6 s: Stats go out while it runs
    send(qtbot, window, "some words", 120)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    qtbot.waitUntil(lambda: panel.rate.text().startswith("idle · last reply: writing"), timeout=10_000)
    points = panel.decode_series.count()
    assert points > 0  # drawn while it ran
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # Stats keep coming (the memory monitor's readings)
        qtbot.wait(100)
    assert panel.decode_series.count() == points


def test_the_slider_caption_keeps_its_height_and_says_re_planning_until_the_plan_comes(qtbot, window):
    from engine.protocol import PlacementChanged

    slider = window.slider
    window.resize(1000, 700)
    qtbot.waitUntil(lambda: "predicted" in slider.readout.text(), timeout=30_000)
    heights = set()
    for v in (0, 10, 50, 99, 100):
        slider.slider.setValue(v)
        QApplication.processEvents()
        heights.add((slider.meaning.height(), slider.chart.y()))
    assert len(heights) == 1, heights  # nothing below it jumps while the handle moves
    # on this CPU-only machine the fastest end does not speak of a GPU
    slider.slider.setValue(0)
    assert slider.meaning.text().startswith("Fastest") and "GPU" not in slider.meaning.text()
    plans = []
    window.engine.placement_changed.connect(plans.append)
    said = []  # the readout as the move is sent to the engine (the plan comes back within ms here)
    slider.changed.connect(lambda _v: said.append(slider.readout.text()))
    slider.slider.setValue(40)
    qtbot.waitUntil(lambda: bool(said) and bool(plans), timeout=30_000)
    assert "re-planning" in said[0]
    assert isinstance(plans[-1], PlacementChanged) and "re-planning" not in slider.readout.text()


def test_edit_last_keeps_the_turn_until_sent_focuses_the_composer_and_can_be_cancelled(qtbot, window):
    from PySide6.QtCore import Qt

    send(qtbot, window, "first question", 6)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    window.input.setPlainText("a thought in progress")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    window.chat.setFocus()  # the reader was reading the reply
    qtbot.mouseClick(window.composer.edit_btn, Qt.LeftButton)
    assert window.input.toPlainText() == "first question"
    assert [m.role for m in window.store.messages(window.cid)] == ["user", "assistant"]  # nothing deleted yet
    assert window.composer.edit_btn.text() == "Cancel edit"
    assert window.input.hasFocus()  # typing goes to the message being edited
    qtbot.mouseClick(window.composer.edit_btn, Qt.LeftButton)  # Cancel edit
    assert window.input.toPlainText() == "a thought in progress"
    assert [m.content for m in window.store.messages(window.cid) if m.role == "user"] == ["first question"]
    qtbot.mouseClick(window.composer.edit_btn, Qt.LeftButton)
    window.input.setPlainText("second question")
    window.params = window.params.__class__(max_new_tokens=6)
    qtbot.mouseClick(window.send_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    msgs = window.store.messages(window.cid)
    assert [(m.role, m.content) for m in msgs][0] == ("user", "second question") and len(msgs) == 2
    assert window.composer.edit_btn.text() == "Edit last"


def test_each_chat_keeps_its_own_draft_and_staged_documents(qtbot, window, tmp_path):
    from PySide6.QtCore import Qt

    doc = tmp_path / "notes.txt"
    doc.write_text("remember the milk")
    send(qtbot, window, "chat one", 4)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    first = window.cid
    window.input.setPlainText("unsent in chat one")
    window.attach(str(doc))
    qtbot.waitUntil(lambda: len(window.docs) == 1, timeout=30_000)
    menu_actions(window)["File/New chat"].trigger()
    assert window.input.toPlainText() == "" and window.docs == []  # a new chat starts empty
    window.input.setPlainText("unsent in chat two")
    second = window.cid
    item = next(window.conv_list.item(i) for i in range(window.conv_list.count())
                if window.conv_list.item(i).data(Qt.UserRole) == first)
    window.conv_list.setCurrentItem(item)
    qtbot.waitUntil(lambda: window.cid == first, timeout=10_000)
    assert window.input.toPlainText() == "unsent in chat one" and [d.name for d in window.docs] == ["notes.txt"]
    window.open_chat(second)
    assert window.input.toPlainText() == "unsent in chat two" and window.docs == []


def test_regenerate_keeps_the_earlier_answers_as_versions_to_switch_between(qtbot, window):
    from PySide6.QtCore import Qt

    from engine.runtime.generate import SamplingParams

    send(qtbot, window, "tell me something", 6)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    first = window.store.messages(window.cid)[-1]
    window.params = SamplingParams(max_new_tokens=9, temperature=1.0, seed=7)  # another answer
    qtbot.mouseClick(window.composer.regen_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    msgs = window.store.messages(window.cid)
    assert [m.role for m in msgs] == ["user", "assistant"]
    second = msgs[-1]
    assert [v["content"] for v in second.meta["versions"]] == [first.content, second.content]
    assert "answer 1 of 2" not in window.chat.toPlainText() and "answer 2 of 2" in window.chat.toPlainText()
    window.chat.anchorClicked.emit(__import__("PySide6.QtCore", fromlist=["QUrl"]).QUrl(f"version:{second.id}:0"))
    shown = window.store.messages(window.cid)[-1]
    assert shown.content == first.content and "answer 1 of 2" in window.chat.toPlainText()
    assert window.history()[-1]["content"] == first.content  # the next turn sends the version shown
    # greedy decoding gives the same answer again: it is still a version of its own, nothing overwritten
    window.params = SamplingParams(max_new_tokens=6)  # as the first answer was asked
    qtbot.mouseClick(window.composer.regen_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    third = window.store.messages(window.cid)[-1]
    assert [v["content"] for v in third.meta["versions"]] == [first.content, second.content, first.content]
    assert "answer 3 of 3" in window.chat.toPlainText()


def test_help_log_scrolls_shows_the_whole_reason_and_copies(qtbot, window):
    """A refused model's reason was only in Help > Log, a message box that cut long lines and could
    not scroll; the log is now a view that scrolls, wraps and copies."""
    from PySide6.QtWidgets import QPlainTextEdit

    from app.dialogs.log_view import LogView
    from window_helpers import on_modal

    long_reason = "x.gguf: the file says its architecture is 'nonesuch', which Mixdesk does not run " * 3
    for i in range(300):
        window.log_line(f"line {i}")
    window.log_line(f"error: {long_reason}")
    seen = []

    def look(d):
        seen.append((d.text(), d.view.verticalScrollBar().maximum(), isinstance(d.view, QPlainTextEdit)))
        d.copy_btn.click()
        seen.append(d.copy_btn.text())
        d.reject()

    on_modal(look, LogView)
    menu_actions(window)["Help/Log"].trigger()
    (text, scroll_max, plain), said = seen
    assert long_reason.strip() in text and "line 0" in text  # nothing cut
    assert plain and scroll_max > 0  # it scrolls
    assert said == "Copied" and long_reason.strip() in QApplication.clipboard().text()
