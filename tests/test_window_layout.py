"""What a new user found broken in the window's layout, through the real window: the live panel's
column from 900×600 up (its widgets kept inside it, View > Show live panel hiding it and remembered
across starts, the splitter's handle collapsing it), the status line beside the progress row, and
the name of the model that wrote each reply."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QFontMetrics, QMouseEvent  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel, QProgressBar, QSizeGrip, QWidget  # noqa: E402

from engine.protocol import Progress  # noqa: E402
from main_window_helpers import open_window, send, window  # noqa: E402,F401  (the window fixture)
from window_helpers import menu_actions  # noqa: E402

SIZES = ((900, 600), (1000, 700), (1600, 1000))
USABLE = 380  # px the chat view and the composer keep at least


def settle(qtbot, ms: int = 60) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(ms // 3)


def right_edge(widget: QWidget, ancestor: QWidget) -> int:
    """The x just past widget's right edge, in ancestor's coordinates."""
    return widget.mapTo(ancestor, QPoint(widget.width(), 0)).x()


def overflow(panel) -> list[str]:
    """Every visible widget of the panel that reaches past its column (the panel's width; inside the
    scroll area: its viewport's), a meter whose text is cut, a label that neither wraps nor fits."""
    problems = []
    body, viewport = panel.scroll.widget(), panel.scroll.viewport()
    for c in panel.findChildren(QWidget):
        if not c.isVisibleTo(panel):
            continue
        name = f"{type(c).__name__} {c.objectName() or ''}".strip()
        if right_edge(c, panel) > panel.width():
            problems.append(f"{name} ends at x={right_edge(c, panel)}, the panel is {panel.width()} wide")
        if body.isAncestorOf(c) and right_edge(c, viewport) > viewport.width():
            problems.append(f"{name} ends at x={right_edge(c, viewport)}, the column shows {viewport.width()}")
        if isinstance(c, QProgressBar) and c.isTextVisible():
            need = c.fontMetrics().horizontalAdvance(c.text())
            if need > c.width() - 6:
                problems.append(f"meter text {c.text()!r} needs {need} px, its bar is {c.width()}")
        if isinstance(c, QLabel) and c.text() and not c.wordWrap():
            need = c.fontMetrics().horizontalAdvance(c.text())
            if need > c.width():
                problems.append(f"label {c.text()!r} needs {need} px, it has {c.width()}")
    return problems


def axis_crowding(panel) -> list[str]:
    """The throughput chart's time labels, side by side, must fit the plot's width (and the rate
    labels its height): more ticks than room draws them over each other."""
    chart, problems = panel.chart, []
    plot = chart.plotArea()
    for ax, room, along in ((panel.ax_x, plot.width(), "wide"), (panel.ax_y, plot.height(), "tall")):
        lo, hi, step = ax.min(), ax.max(), ax.tickInterval()
        if step <= 0 or hi <= lo:
            continue
        ticks = int((hi - lo) / step + 1e-9) + 1
        fm = QFontMetrics(ax.labelsFont())
        fmt = ax.labelFormat().replace("%g", "%d" if step >= 1 else "%.1f")
        size = (max(fm.horizontalAdvance(fmt % v) for v in (lo, hi)) + 6 if ax is panel.ax_x
                else fm.height())
        if ticks * size > room:
            problems.append(f"{ticks} {ax.labelFormat()} labels of {size} px on a plot {room:.0f} px {along}")
    return problems


def test_the_panel_keeps_to_its_column_from_900x600_up(qtbot, window, pace):
    window.bridge.session.loaded.generator.eos_ids.clear()
    pace(window.bridge.session.loaded.generator)  # ~1 s: the chart draws while it runs
    send(qtbot, window, "fill the meters and the chart", 200)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    qtbot.waitUntil(lambda: window.panel.rate.text().startswith("idle · last reply"), timeout=10_000)
    assert window.panel.decode_series.count() > 0
    panel = window.panel
    for w, h in SIZES:
        window.resize(w, h)
        settle(qtbot)
        problems = [] if (window.width(), window.height()) == (w, h) else [
            f"the window asked for {w}×{h} is {window.width()}×{window.height()} (its minimum: "
            f"{window.minimumSizeHint().width()}×{window.minimumSizeHint().height()})"]
        problems += overflow(panel) + axis_crowding(panel)
        if min(window.chat.width(), window.composer.width()) < USABLE:
            problems.append(f"the chat is {window.chat.width()} px, the composer {window.composer.width()} px")
        if panel.map.width() < 120 or right_edge(panel.map, panel) > panel.width():
            problems.append(f"the placement map is {panel.map.width()} px wide, ends at {right_edge(panel.map, panel)}")
        assert not problems, f"at {w}×{h}:\n" + "\n".join(problems)


def test_view_show_live_panel_hides_it_gives_the_chat_the_room_and_is_remembered(qtbot, tiny, tmp_path, window_cache):
    w = open_window(qtbot, tiny, tmp_path)
    show = menu_actions(w)["View/Show live panel"]
    assert show.isCheckable() and show.isChecked() and w.panel.isVisible()
    assert show.shortcut().toString() == "Ctrl+Shift+P"
    w.resize(1000, 700)
    settle(qtbot)
    chat, panel = w.chat.width(), w.panel.width()
    show.trigger()
    settle(qtbot)
    assert not w.panel.isVisible() and not show.isChecked()
    assert w.chat.width() >= chat + panel - 20, "the chat did not get the panel's room"
    w.activateWindow()
    w.input.setFocus()
    qtbot.keyClick(w.input, Qt.Key_P, Qt.ControlModifier | Qt.ShiftModifier)  # the shortcut shows it again
    settle(qtbot)
    assert w.panel.isVisible() and show.isChecked() and w.panel.width() >= panel - 20
    show.trigger()
    settle(qtbot)
    w.close()

    w2 = open_window(qtbot, tiny, tmp_path)  # the next start: still hidden
    show2 = menu_actions(w2)["View/Show live panel"]
    settle(qtbot)
    assert not w2.panel.isVisible() and not show2.isChecked()
    show2.trigger()
    settle(qtbot)
    assert w2.panel.isVisible() and w2.panel.width() >= 200 and w2.chat.width() >= USABLE
    w2.close()


def drag(handle: QWidget, to_x: int) -> None:
    """The splitter's handle pressed, dragged to x (the handle's coordinates) and released."""
    y = handle.height() // 2
    for kind, x, buttons in ((QEvent.MouseButtonPress, 2, Qt.LeftButton), (QEvent.MouseMove, to_x, Qt.LeftButton),
                             (QEvent.MouseButtonRelease, to_x, Qt.NoButton)):
        local = QPointF(x, y)
        ev = QMouseEvent(kind, local, QPointF(handle.mapToGlobal(local.toPoint())), Qt.LeftButton, buttons,
                         Qt.NoModifier)
        QApplication.sendEvent(handle, ev)


def test_dragging_the_splitter_handle_to_the_edge_collapses_the_panel(qtbot, window):
    show = menu_actions(window)["View/Show live panel"]
    window.resize(1000, 700)
    settle(qtbot)
    drag(window.splitter.handle(2), window.panel.width() + 40)
    settle(qtbot)
    assert window.splitter.sizes()[2] == 0 and not show.isChecked()
    show.trigger()  # the menu brings it back at a usable width
    settle(qtbot)
    assert window.panel.isVisible() and window.panel.width() >= 200 and window.chat.width() >= USABLE


MESSAGE = "Chat exported to /home/someone/Documents/mixdesk/notes-on-mixtral-routing.md: ok"


def message_area(bar) -> int:
    """The width QStatusBar draws its message in: from 6 px to 2 px before the first widget shown
    on its right (QStatusBarPrivate::messageRect)."""
    right = bar.width() - 12
    for c in bar.findChildren(QWidget, options=Qt.FindDirectChildrenOnly):
        if c.isVisible() and not isinstance(c, QSizeGrip):
            right = min(right, c.x() - 2)
    return right - 6


def test_a_status_message_stays_readable_beside_the_progress_row(qtbot, window):
    assert len(MESSAGE) == 80
    window.resize(1000, 700)
    settle(qtbot)
    window.on_events([Progress(stage="load", done=1, total=10, what="x")])
    window.statusBar().showMessage(MESSAGE, 15_000)
    settle(qtbot)
    bar = window.statusBar()
    assert window.progress.isVisible() and bar.currentMessage() == MESSAGE
    need = bar.fontMetrics().horizontalAdvance(MESSAGE)
    assert message_area(bar) >= need, f"the message needs {need} px, the status line shows {message_area(bar)}"
    shown = window.progress.text()  # the progress row still says what it does, whole or elided, not cut
    assert window.progress.fontMetrics().horizontalAdvance(shown) <= window.progress.width() - 6
    assert shown.startswith("Loading") and shown.endswith("10%")


def test_each_reply_names_the_model_that_wrote_it_also_when_reopened(qtbot, window, tiny):
    name = tiny.name
    assert window.model_info.name == name
    send(qtbot, window, "hello", 8)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    reply = window.store.messages(window.cid)[-1]
    assert reply.meta.get("model") == name
    assert name in window.chat.toPlainText(), "the reply does not say which model wrote it"
    window.open_chat(window.cid)
    assert name in window.chat.toPlainText()
    # a chat saved before replies kept their model's name shows none
    old = window.store.new_conversation("from before")
    window.store.add_message(old, "user", "an old question")
    stats = "5.0 tokens/s · 3 tokens · stopped: end of answer"
    window.store.add_message(old, "assistant", "an old answer", meta={"stats": stats})
    window.open_chat(old)
    lines = window.chat.toPlainText().splitlines()
    assert stats in lines and name not in window.chat.toPlainText()


class FakeServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that answers every chat with two words, streamed."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in ({"choices": [{"delta": {"content": "Far away"}}]},
                      {"choices": [{"delta": {}, "finish_reason": "stop"}],
                       "usage": {"completion_tokens": 2, "prompt_tokens": 5}}):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_a_reply_from_a_server_names_the_servers_model(qtbot, window, tiny):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        window.connect_remote((f"http://127.0.0.1:{server.server_port}/v1", "", "far-away-moe-8x22b"))
        send(qtbot, window, "hello over there", 8)
        qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
        reply = window.store.messages(window.cid)[-1]
        assert reply.content == "Far away" and reply.meta.get("model") == "far-away-moe-8x22b"
        assert "far-away-moe-8x22b" in window.chat.toPlainText() and tiny.name not in window.chat.toPlainText()
        window.open_chat(window.cid)
        assert "far-away-moe-8x22b" in window.chat.toPlainText()
    finally:
        window.disconnect_remote()
        server.shutdown()
        server.server_close()
