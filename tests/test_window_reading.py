"""A long prompt's reading, and each chat's cache kept, in the window (issue 45, Must show 3), through the
real widgets on the tiny model: the line where the reply will appear says how far the prompt (or the
document) has been read and the time left; Stop while it is read ends the reply and keeps the chunks
read, and Regenerate reads only the rest; a return to an earlier chat reads only the new tokens; a
restart (a new window on the same user folders) restores the chat's cache from its file. How many
prompt tokens were reused is the reply's own count (its stats' detail)."""
import logging
import re

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QPushButton  # noqa: E402


from main_window_helpers import open_window, send, window  # noqa: E402,F401  (the same window fixture)
from window_helpers import no_uncaught_exceptions  # noqa: E402

LONG = "Tell me about this: " + " ".join(f"item {i} of the list" for i in range(20))  # about 300 tokens
OTHER = "Something else: " + " ".join(f"entry {i} in the table" for i in range(20))
CHUNK = 16


def reading_slowly(w, pace, per_step_s=0.04) -> None:
    """Chunks of CHUNK tokens, each forward held to per_step_s: a prompt is read over about a second."""
    s = w.bridge.session
    s.scheduler.chunk = s.scheduler.solo_chunk = CHUNK
    s.loaded.generator.eos_ids.clear()
    pace(s.loaded.generator, per_step_s)


def say(qtbot, w, text, n=4):
    send(qtbot, w, text, n)
    qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    return w.store.messages(w.cid)[-1]


def reused(reply) -> int:
    """The prompt tokens the reply did not read again (its stats' detail, the footer's tooltip)."""
    m = re.search(r"; (\d+) already read", reply.meta["stats_detail"])
    return int(m.group(1)) if m else 0


def prompt_tokens(reply) -> int:
    return int(re.search(r"prompt: (\d+) tokens", reply.meta["stats_detail"]).group(1))


def test_the_progress_line_says_tokens_and_time_left_where_the_reply_will_appear(qtbot, window, pace, tmp_path):
    reading_slowly(window, pace)
    doc = tmp_path / "notes.txt"
    doc.write_text(LONG + "\n")
    with no_uncaught_exceptions():
        window.attach(str(doc))
        qtbot.waitUntil(lambda: len(window.docs) == 1, timeout=30_000)
        send(qtbot, window, "What does it say?", 4)
        qtbot.waitUntil(lambda: "left" in window.chat.reading, timeout=30_000)
        line = window.chat.reading
        assert re.fullmatch(r"Reading the document: [\d,]+ of [\d,]+ tokens · about \d+ (s|min) left", line), line
        read, total = (int(x.replace(",", "")) for x in re.findall(r"[\d,]+(?= (?:of|tokens))", line))
        assert 0 < read < total and total > 250
        assert line in window.chat.toPlainText()  # in the reply's place, under its header
        qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    assert not window.chat.reading and "Reading the" not in window.chat.toPlainText()  # the reply took its place
    new_chat(qtbot, window)
    say(qtbot, window, OTHER, 2)  # no document in this chat: the prompt
    assert window.reply.read is not None and window.reply.read.describe().startswith("Reading the prompt: ")


def test_stop_while_the_prompt_is_read_keeps_what_was_read_and_regenerate_reads_only_the_rest(qtbot, window, pace):
    reading_slowly(window, pace, 0.08)
    with no_uncaught_exceptions():
        send(qtbot, window, LONG, 4)
        qtbot.waitUntil(lambda: window.reply.read is not None and window.reply.read.read >= 3 * CHUNK,
                        timeout=30_000)
        assert window.chat.reading.startswith("Reading the prompt: ")
        qtbot.mouseClick(window.stop_btn, Qt.LeftButton)
        qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    stopped = window.store.messages(window.cid)[-1]
    assert stopped.role == "assistant" and stopped.content == ""
    assert "stopped while reading the prompt" in stopped.meta["stats"]
    cache = window.bridge.session.scheduler.caches.kept[f"chat:{window.cid}"].cache
    read = len(cache.tokens)
    assert read % CHUNK == 0 and 3 * CHUNK <= read < prompt_tokens(stopped)  # the chunks read, and no more
    qtbot.mouseClick(window.composer.regen_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    again = window.store.messages(window.cid)[-1]
    assert again.content and reused(again) == read  # only the rest was read


def new_chat(qtbot, w):
    qtbot.mouseClick(next(b for b in w.sidebar.findChildren(QPushButton) if b.text() == "New chat"), Qt.LeftButton)


def open_from_sidebar(qtbot, w, cid):
    item = next(w.conv_list.item(i) for i in range(w.conv_list.count()) if w.conv_list.item(i).data(Qt.UserRole) == cid)
    w.conv_list.setCurrentItem(item)
    qtbot.waitUntil(lambda: w.cid == cid, timeout=10_000)


def test_a_return_to_an_earlier_chat_reads_only_the_new_tokens(qtbot, window):
    session = window.bridge.session
    session.loaded.generator.eos_ids.clear()
    session.scheduler.caches.budget = 1 << 30  # both chats' caches stay in memory (the tiny context holds one)
    first = say(qtbot, window, LONG)
    a = window.cid
    new_chat(qtbot, window)
    other = say(qtbot, window, OTHER)
    assert reused(other) < 10  # another chat: nothing of the first one's
    assert {f"chat:{a}", f"chat:{window.cid}"} <= set(session.scheduler.caches.kept)
    open_from_sidebar(qtbot, window, a)
    follow = say(qtbot, window, "And then?")
    assert reused(follow) >= prompt_tokens(first)  # the document was not read again
    assert prompt_tokens(follow) - reused(follow) < 30


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_restart_restores_the_chats_cache_from_disk(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    w = open_window(qtbot, tiny, tmp_path)
    try:
        w.bridge.session.loaded.generator.eos_ids.clear()
        first = say(qtbot, w, LONG)
        cid = w.cid
    finally:
        w.close()  # the engine stops: the chat's cache file is complete
    assert list((window_cache / "mixdesk" / "kv").glob("*.safetensors"))
    said, kv = Lines(), logging.getLogger("mixdesk.kv")
    kv.addHandler(said)
    monkeypatch.setattr(kv, "level", logging.INFO)
    w = open_window(qtbot, tiny, tmp_path)  # the same chats and user cache folder
    try:
        w.bridge.session.loaded.generator.eos_ids.clear()
        open_from_sidebar(qtbot, w, cid)
        follow = say(qtbot, w, "And then?")
    finally:
        w.close()
        kv.removeHandler(said)
    assert reused(follow) >= prompt_tokens(first)
    assert any("KV cache restored" in m for m in said.lines)
