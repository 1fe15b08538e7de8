"""The real main window under the offscreen platform, on the tiny model (pytest-qt)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import QMimeData, QPointF, Qt, QTimer, QUrl  # noqa: E402
from PySide6.QtGui import QDropEvent  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.chat import documents  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from main_window_helpers import close_and_delete, open_window, send, window  # noqa: E402,F401 (shared: tests/main_window_helpers.py)


def test_send_streams_tokens_and_saves(qtbot, window, pace):
    window.bridge.session.loaded.generator.eos_ids.clear()
    pace(window.bridge.session.loaded.generator)
    send(qtbot, window, "hello world", 400)
    assert window.generating
    qtbot.waitUntil(lambda: window.chat.flushes >= 2, timeout=60_000)  # text shows while it streams
    assert window.generating
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    assert window.chat.streamed
    msgs = window.store.messages(window.cid)
    assert [m.role for m in msgs] == ["user", "assistant"] and all(m.complete for m in msgs)
    assert msgs[1].content == window.chat.streamed
    assert "tokens/s" in msgs[1].meta["stats"] and "tokens/s" in window.chat.toPlainText()
    assert window.conv_list.count() == 1 and "hello world" in window.conv_list.item(0).text()


def test_stop(qtbot, window, pace):
    window.bridge.session.loaded.generator.eos_ids.clear()
    pace(window.bridge.session.loaded.generator)
    send(qtbot, window, "tell me everything", 100_000)
    qtbot.waitUntil(lambda: len(window.chat.streamed) > 10, timeout=60_000)
    qtbot.mouseClick(window.stop_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
    last = window.store.messages(window.cid)[-1]
    assert last.complete and "cancelled" in last.meta["stats"]


def test_slider_replans_and_map_repaints(qtbot, tiny, tmp_path, window_cache):
    # the tiny model's experts are so small that call overhead hides the 4-bit speed-up on this
    # CPU; give the planner costs where 4-bit pays, so the frontier has more than one point
    window = open_window(qtbot, tiny, tmp_path, tier_costs={"cpu-16": (1e-4, 1e-9), "cpu-4": (1e-5, 1e-10)})
    qtbot.waitUntil(lambda: bool(window.panel.map.tiers), timeout=30_000)
    before, paints = window.panel.map.tiers, window.panel.map.paints
    target = 0.0 if any("16" in t for row in before for t in row) else 1.0
    window.slider.set_value(target)
    qtbot.waitUntil(lambda: window.panel.map.tiers != before, timeout=30_000)
    qtbot.waitUntil(lambda: window.panel.map.paints > paints, timeout=5_000)
    assert "predicted" in window.slider.readout.text()
    window.close()


def make_docs(tmp_path):
    from fpdf import FPDF

    txt = tmp_path / "notes.txt"
    txt.write_text("The capital of France is Paris. " * 20)
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.multi_cell(0, 8, "Mixture of experts models route each token to two experts. " * 5)
    pdf.output(str(tmp_path / "paper.pdf"))
    import docx

    d = docx.Document()
    d.add_paragraph("A report about caching and memory bandwidth.")
    d.add_paragraph("Second paragraph with numbers 1 2 3.")
    d.save(str(tmp_path / "report.docx"))
    return [txt, tmp_path / "paper.pdf", tmp_path / "report.docx"]


def test_dropped_documents_become_chips_with_token_counts(qtbot, window, tmp_path):
    paths = make_docs(tmp_path)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    ev = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    window.dropEvent(ev)
    qtbot.waitUntil(lambda: len(window.chip_widgets()) == 3, timeout=30_000)
    for chip, path in zip(sorted(window.chip_widgets(), key=lambda c: c.text()), sorted(paths, key=lambda p: p.name)):
        want = window.count_tokens(documents.parse(path).text)
        assert chip.property("tokens") == want and f"{want:,} tokens" in chip.text() and path.name in chip.text()
    send(qtbot, window, "summarise", 8)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    user = window.store.messages(window.cid)[0]
    assert "Paris" in user.content and "memory bandwidth" in user.content and not window.chip_widgets()


def test_binary_and_oversized_files_refused(qtbot, window, tmp_path, monkeypatch):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    window.attach(str(binary))
    qtbot.waitUntil(lambda: "blob.bin" in window.statusBar().currentMessage(), timeout=30_000)
    assert "binary" in window.statusBar().currentMessage()
    monkeypatch.setattr(documents, "MAX_BYTES", 1000)
    big = tmp_path / "big.txt"
    big.write_text("x" * 5000)
    window.attach(str(big))
    qtbot.waitUntil(lambda: "big.txt" in window.statusBar().currentMessage(), timeout=30_000)
    assert "limit" in window.statusBar().currentMessage()
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4 this is not really a pdf")
    window.attach(str(broken))
    qtbot.waitUntil(lambda: "broken.pdf" in window.statusBar().currentMessage(), timeout=30_000)
    assert not window.chip_widgets()


def test_event_loop_keeps_to_50ms_ticks_while_generating(qtbot, window):
    window.bridge.session.loaded.generator.eos_ids.clear()
    gaps, last = [], [time.perf_counter()]

    def tick():
        now = time.perf_counter()
        gaps.append(now - last[0])
        if os.environ.get("GAPS_DEBUG") and now - last[0] > 0.02:
            print(f"gap {1e3 * (now - last[0]):.0f} ms, generating={window.generating}, chars={len(window.chat.streamed)}")
        last[0] = now

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(5)
    send(qtbot, window, "go", 1500)
    last[0] = time.perf_counter()
    gaps.clear()
    qtbot.waitUntil(lambda: not window.generating, timeout=120_000)
    timer.stop()
    worst, p95 = max(gaps), sorted(gaps)[int(0.95 * (len(gaps) - 1))]
    print(f"event-loop gaps while generating: worst {worst * 1e3:.1f} ms, 95th percentile {p95 * 1e3:.1f} ms "
          f"over {len(gaps)} ticks")
    # 50 ms for nearly every tick; one tick in twenty may lose its turn to the engine's and the lexers'
    # threads on two busy cores (a single 51-85 ms gap came about one run in five on a loaded machine),
    # but never a pause of the kind this guards against (a full GC: 280-620 ms; a reply rendered anew)
    assert p95 < 0.050 and worst < 0.150, (p95, worst)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtWidgets import QApplication
    from app.main_window import MainWindow
    from app.store.chat_store import Store
    from engine.runtime.generate import SamplingParams
    from engine.protocol import Token
    app = QApplication([])
    w = MainWindow(Store(sys.argv[1]), model=sys.argv[2], device="cpu", dtype="fp32")
    state = {"turn": 0}
    def ready():
        if w.send_btn.isEnabled() and not w.generating:
            if state["turn"] == 0:
                w.params = SamplingParams(max_new_tokens=12)
                w.input.setPlainText("first question"); w.send(); state["turn"] = 1
            elif state["turn"] == 1:
                w.bridge.session.loaded.generator.eos_ids.clear()
                w.params = SamplingParams(max_new_tokens=100000)
                w.input.setPlainText("second question"); w.send(); state["turn"] = 2
    def on_event(ev):
        if state["turn"] == 2 and isinstance(ev, Token) and ev.index == 40:
            print("killing", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    w.bridge.events.connect(lambda b: [on_event(e) for e in b])
    from PySide6.QtCore import QTimer
    t = QTimer(); t.timeout.connect(ready); t.start(50)
    app.exec()
""")


def test_kill_and_restart_keeps_every_completed_message(tiny, tmp_path, window_cache):
    db = tmp_path / "chats.sqlite3"
    env = {**os.environ, "XDG_CACHE_HOME": str(window_cache)}  # measured: the child chats at once
    r = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(db), str(tiny)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    store = Store(db)  # a new process's view of the same file
    conv = store.conversations()
    assert len(conv) == 1
    msgs = store.messages(conv[0].id)
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[0].complete and msgs[1].complete and msgs[1].content and msgs[2].content == "second question"
    assert not msgs[3].complete  # the reply being streamed was saved partially


def test_document_longer_than_the_context_offers_its_first_part(qtbot, window, tmp_path):
    long = tmp_path / "long.txt"
    long.write_text("Paris is the capital of France and its largest city. " * 400)
    window.attach(str(long))
    # (isVisible() of the opened box is unreliable on the offscreen platform after other windows)
    qtbot.waitUntil(lambda: getattr(window, "too_long_box", None) is not None, timeout=30_000)
    assert "context holds" in window.too_long_box.text()
    window.too_long_box.done(window.too_long_box.StandardButton.Yes)
    qtbot.waitUntil(lambda: len(window.chip_widgets()) == 1, timeout=10_000)
    assert window.chip_widgets()[0].property("tokens") <= window.ctx - min(1024, window.ctx // 4)


def test_paste_files_attaches_them(qtbot, window, tmp_path):
    f = tmp_path / "pasted.md"
    f.write_text("# Notes\nPasted from a file manager.")
    mime = QMimeData()  # what a file manager puts on the clipboard (the clipboard itself is left alone)
    mime.setUrls([QUrl.fromLocalFile(str(f))])
    assert window.paste_files(mime)
    qtbot.waitUntil(lambda: len(window.chip_widgets()) == 1, timeout=30_000)
    assert "pasted.md" in window.chip_widgets()[0].text()


def test_remeasure_from_the_tools_menu(window, qtbot):
    from PySide6.QtWidgets import QMenu

    actions = {a.text(): a for m in window.menuBar().findChildren(QMenu) for a in m.actions()}
    loaded_before = sum("loaded " in line for line in window.log_lines)
    actions["Re-measure this machine and model"].trigger()
    assert not window.send_btn.isEnabled()  # until the engine says the model is ready again
    qtbot.waitUntil(lambda: window.send_btn.isEnabled(), timeout=120_000)
    assert any("re-measuring" in line for line in window.log_lines)
    assert sum("loaded " in line for line in window.log_lines) == loaded_before + 1
    assert not any(line.startswith("error") for line in (x[9:] for x in window.log_lines))


def test_errors_in_a_step_and_in_the_template_leave_generating_and_the_engine_serves_on(qtbot, window):
    """Must show 2 (issue 14): a decode step raising a non-Mixdesk exception, then a chat template
    that raises: each reply ends with its error in the window, "generating" ends, and the next
    message gets a reply from the same engine thread."""
    from engine.prompts.chat_template import ChatTemplate
    from engine.protocol import ErrorEvent

    session = window.bridge.session
    thread = session.thread
    gen = session.loaded.generator
    seen = []
    window.bridge.events.connect(lambda batch: seen.extend(e for e in batch if isinstance(e, ErrorEvent)))
    inner, calls = gen.model.forward, []

    def broken(*a, **k):  # the second step of the reply (its first decode step) fails with an error nobody expected
        calls.append(1)
        if len(calls) == 2:
            raise IndexError("injected failure in a decode step")
        return inner(*a, **k)

    gen.eos_ids.clear()
    gen.model.forward = broken
    send(qtbot, window, "first", 20)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    assert seen and "IndexError: injected failure" in seen[-1].message and seen[-1].log
    assert "injected failure" in window.statusBar().currentMessage()
    del gen.model.forward  # the method again

    session.loaded.prompts.template = ChatTemplate(  # the engine's prompts (engine/prompts/prompt.py) render with it
        "{% if 'boom' in messages[-1]['content'] %}{{ raise_exception('no booms here') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}\n{% endfor %}", gen.tok,
        window.bridge.session.loaded.ckpt.folder)
    send(qtbot, window, "boom", 20)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    assert "no booms here" in seen[-1].message
    assert window.send_btn.isEnabled()

    send(qtbot, window, "and now a normal message", 8)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    last = window.store.messages(window.cid)[-1]
    assert last.role == "assistant" and last.complete and "tokens/s" in last.meta["stats"]
    assert session.thread is thread and thread.is_alive()  # the same engine thread served all three


def test_a_dead_engine_thread_is_said_and_can_be_restarted(qtbot, window, monkeypatch):
    """If the engine thread ever ends anyway, the window says so and offers a restart."""
    from engine.runtime import queries
    from engine.protocol import Query

    session = window.bridge.session

    def die(s):
        raise SystemExit("simulated end of the engine thread")  # passes the error boundary on purpose

    monkeypatch.setitem(queries.HANDLERS, "die", die)
    window.bridge.send(Query(name="die"))
    qtbot.waitUntil(lambda: getattr(window, "stopped_box", None) is not None, timeout=30_000)
    assert "engine stopped" in window.model_label.text() and not window.send_btn.isEnabled()
    window.restart_engine()
    qtbot.waitUntil(lambda: window.send_btn.isEnabled(), timeout=120_000)
    assert window.bridge.session is not session and window.bridge.session.thread.is_alive()
    send(qtbot, window, "hello again", 4)
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    assert window.store.messages(window.cid)[-1].complete


def test_a_never_calibrated_model_chats_before_its_calibration_ends(qtbot, tiny, tmp_path, monkeypatch, measured_machine):
    """Issue 15, must show 2: the first start of a model plans from its shape and lets the user
    chat; the calibration runs in the background between requests (slowed down here so that it
    cannot end first), and the planner switches to the measured profile when it is ready."""
    import engine.measures.profile as profile
    from engine.protocol import Loaded, PlacementChanged

    real = profile.build_steps

    def slow(*a, **k):
        time.sleep(0.4)
        return real(*a, **k)

    monkeypatch.setattr(profile, "build_steps", slow)
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    seen = []
    w.bridge.events.connect(lambda batch: seen.extend(batch))
    session = w.bridge.session
    assert session.controller.calibrating  # calibrating, and Send is already enabled
    send(qtbot, w, "hello before calibration", 8)
    qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    assert w.store.messages(w.cid)[-1].complete
    assert session.controller.calibrating  # the reply came while the calibration had not finished
    assert "in the background (you can chat meanwhile)" in w.progress.format()
    qtbot.waitUntil(lambda: any(isinstance(e, PlacementChanged) and e.reason == "profile" for e in seen),
                    timeout=120_000)  # the planner switched to the measured profile
    assert any(isinstance(e, Loaded) for e in seen) and not w.progress.isVisible()
    w.close()


# ---- storage never loses a reply (issue 15) --------------------------------------------------------
def test_a_locked_database_during_a_reply_keeps_the_reply_and_writes_it_later(qtbot, window, pace):
    import sqlite3

    gen = window.bridge.session.loaded.generator
    gen.eos_ids.clear()
    pace(gen)
    send(qtbot, window, "write while locked", 60)
    qtbot.waitUntil(lambda: len(window.chat.streamed) > 5, timeout=60_000)
    other = sqlite3.connect(str(window.store.path), isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # another program holds the write lock while the reply finishes
    try:
        qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
        reply = window.chat.streamed
        assert reply and window.store.pending  # kept, waiting for the lock
        assert window.store.messages(window.cid)[-1].content == reply  # the window's view has it
        qtbot.waitUntil(lambda: "locked" in window.statusBar().currentMessage(), timeout=5_000)
        row = other.execute("SELECT content, complete FROM messages ORDER BY id DESC LIMIT 1").fetchone()
        assert row is None or row != (reply, 1)  # not written yet
    finally:
        other.execute("ROLLBACK")
        other.close()
    qtbot.waitUntil(lambda: not window.store.pending, timeout=10_000)  # written when the lock cleared
    fresh = sqlite3.connect(str(window.store.path))
    content, complete = fresh.execute("SELECT content, complete FROM messages ORDER BY id DESC LIMIT 1").fetchone()
    fresh.close()
    assert content == reply and complete == 1


def test_a_corrupt_database_is_moved_aside_and_the_window_starts(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    db = tmp_path / "chats.sqlite3"
    db.write_bytes(b"this is not a database, just damaged bytes " * 200)
    w = open_window(qtbot, tiny, tmp_path)
    aside = list(tmp_path.glob("chats.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    assert any("moved aside" in line for line in w.log_lines)
    send(qtbot, w, "hello after the damage", 4)
    qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    assert w.store.messages(w.cid)[-1].complete
    w.close()


def test_an_unwritable_data_folder_gets_a_clear_message_and_a_session_store(tmp_path):
    from app.store.chat_store import Store

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    s = Store(blocker / "chats.sqlite3")
    assert s.in_memory and "cannot be written" in s.notices[0]
    cid = s.new_conversation("t")
    s.add_message(cid, "user", "still works")
    assert [m.content for m in s.messages(cid)] == ["still works"]


def test_writes_kept_by_a_lock_at_close_are_written_at_the_next_start(tmp_path):
    import sqlite3

    from app.store.chat_store import Store

    db = tmp_path / "chats.sqlite3"
    s = Store(db)
    cid = s.new_conversation("t")
    other = sqlite3.connect(str(db), isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")
    mid = s.add_message(cid, "assistant", "a reply that must not be lost")
    assert s.pending and s.messages(cid)[-1].content == "a reply that must not be lost"
    s.close()  # still locked: kept in a journal
    other.execute("ROLLBACK")
    other.close()
    s2 = Store(db)
    assert not s2.pending and [m.id for m in s2.messages(cid)] == [mid]
    assert not list(tmp_path.glob("*.pending.json"))


# ---- documents never hurt the window (issue 15) -------------------------------------------------------
def test_a_19_mb_text_file_never_stalls_the_window(qtbot, window, tmp_path):
    big = tmp_path / "huge.txt"
    line = "The router sends each token to two of the eight experts in every layer. "
    with open(big, "w") as f:
        for _ in range(19 * 2**20 // len(line)):
            f.write(line)
    assert big.stat().st_size > 18 * 2**20
    gaps, last = [], [time.perf_counter()]

    def tick():
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer(interval=10)
    timer.timeout.connect(tick)
    timer.start()
    window.attach(str(big))
    qtbot.waitUntil(lambda: getattr(window, "too_long_box", None) is not None, timeout=60_000)
    qtbot.wait(200)
    timer.stop()
    assert "more than" in window.too_long_box.text() and "huge.txt" in window.too_long_box.text()
    print(f"longest event-loop gap while attaching 19 MB: {max(gaps) * 1e3:.0f} ms")
    assert max(gaps) < 0.100, f"the event loop stalled {max(gaps) * 1e3:.0f} ms"
    window.too_long_box.done(QMessageBox.Yes)
    qtbot.waitUntil(lambda: len(window.chip_widgets()) == 1, timeout=10_000)
    assert window.count_tokens(window.docs[0].text) <= window.ctx


def test_the_model_bar_speaks_to_people_and_follows_the_placement(qtbot, window):
    qtbot.waitUntil(lambda: "experts at 16-bit" in window.model_label.text(), timeout=30_000)
    text = window.model_label.text()
    assert window.model_info.name in text and "parameters" in text and "CPU only" in text
    assert "torch." not in text and "placement:" in window.model_label.toolTip()  # the technical line
    session = window.bridge.session
    d = session.loaded.ckpt.dims

    def follows():  # once the migration in flight has ended, the bar shows the placement in use
        if session.controller.migrating:
            return False
        n16 = sum(1 for _, _, t in session.loaded.model.placement.items() if t.bits == 16)
        return f"{n16} experts at 16-bit, {d.layers * d.experts - n16} at 4-bit" in window.model_label.text()

    qtbot.waitUntil(follows, timeout=30_000)


def test_the_model_picker_offers_recent_models_and_opens_one(qtbot, window, tiny):
    from PySide6.QtCore import Qt as QtNS

    window.pick_model()
    picker = window.picker
    specs = [picker.list.item(i).data(QtNS.UserRole) for i in range(picker.list.count())]
    assert specs[0] == "demo" and str(tiny) in specs  # the model just loaded is a recent one
    picker.list.setCurrentRow(specs.index(str(tiny)))
    loads = []
    window.load_model = lambda *a, **k: loads.append((a, k))
    picker._pick(picker.list.currentItem().data(QtNS.UserRole))
    assert loads == [((str(tiny),), {"ctx": "auto"})]  # at the context its Context box shows (app/dialogs/context_choice.py)


def test_a_damaged_page_is_reported_never_a_crash(tmp_path):
    from app.store.chat_store import Store

    db = tmp_path / "chats.sqlite3"
    s = Store(db)
    cid = s.new_conversation("many")
    for i in range(400):
        s.add_message(cid, "user", f"message {i} " + "x" * 500)
    s.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    raw = bytearray(db.read_bytes())
    page = 4096
    raw[page * 20: page * 21] = b"\xde\xad\xbe\xef" * (page // 4)  # one page in the middle, overwritten
    db.write_bytes(bytes(raw))
    s2 = Store(db)  # no exception: the damage is found, said, and the window gets a working store
    assert any("damaged" in n for n in s2.notices)
    assert list(tmp_path.glob("chats.sqlite3.corrupt-*"))
    s2.add_message(s2.new_conversation("fresh"), "user", "works")


def test_slider_says_when_a_plan_is_for_requests_together(qtbot):
    """A plan made for concurrent requests (the local server's) shows its rate as theirs together."""
    from app.panel.quality_slider import QualitySlider
    from engine.placement import Placement, Tier
    from engine.protocol import PlacementChanged

    w = QualitySlider()
    qtbot.addWidget(w)
    pl = Placement.uniform(2, 4, Tier.CPU4)
    for streams, want in ((1, None), (3, "(3 requests together)")):
        w.show_plan(PlacementChanged(placement=pl, moves=0, reason="streams", predicted_tok_s=42.0,
                                     predicted_loss=0.01, frontier=((0.01, 42.0),), streams=streams))
        text = w.readout.text()
        assert "predicted 42.0 tok/s" in text and ("together" not in text if want is None else want in text)


@pytest.mark.slow  # a measurement (the README's figure): pytest -m slow tests/test_app.py -k streaming_render -s
def test_streaming_render_stays_responsive_and_flat_over_a_2000_token_reply(qtbot, tmp_path, monkeypatch):
    """A 2,000-token reply of paragraphs, lists, tables and fenced code, streamed through the real
    window: the worst event-loop gap stays under 50 ms, and the chat view's render time per token
    (CPU time of the GUI thread in ChatView._flush, which includes the document layout its edits
    cause, and in the paint that follows it) over the last 200 tokens is within 1.5x of the first 200.
    Tokens come at one steady rate (one every 6 ms, the tiny model's step included), so that the
    two ends compare the view's cost, not the engine's speed: a flush's cost has a part that does not
    depend on how many tokens it shows, and with a sleep after each step the later, slower steps
    (a longer context) made the same view cost 1.5x more per token.
    Printed too: the GUI thread's own CPU time in the worst gap (the rest of a gap is time the thread
    waited: for a CPU on a loaded machine, or for the GIL) and the load average."""
    import bisect

    from scripted_chat import script, write_chat_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = write_chat_model(tmp_path / "qwen3", "qwen3")
    w = open_window(qtbot, folder, tmp_path)
    gen = w.bridge.session.loaded.generator
    section = ("## Part {i}\n\nThe **planner** moves `expert {i}` to the *GPU* when it pays.\n\n"
               "- first point {i}\n- second point with `code`\n\n"
               "| tier | experts |\n|---|---|\n| gpu-16 | {i} |\n| cpu-4 | 8 |\n\n"
               "```python\ndef step_{i}(x):\n    return x * {i}  # scaled\n```\n\n")
    text, i = "", 0
    while len(gen.tok.encode(text, add_special_tokens=False)) < 2000:
        text += section.format(i=i)
        i += 1
    ids = gen.tok.encode(text, add_special_tokens=False)[:2000]
    text = gen.tok.decode(ids)
    ends = [len(gen.tok.decode(ids[:k + 1])) for k in range(len(ids))]  # characters shown after token k
    script(gen, text)
    inner, due = gen.retrying, [None]

    def steady(step):  # every forward pass goes through it (tests/conftest.py _pace)
        now = time.perf_counter()
        due[0] = (due[0] or now) + 0.006
        if due[0] > now:
            time.sleep(due[0] - now)
        return inner(step)

    gen.retrying = steady
    gaps, last, busy = [], [time.perf_counter()], []
    cpu = [time.thread_time()]

    def tick():
        now, used = time.perf_counter(), time.thread_time()
        gaps.append(now - last[0])
        busy.append(used - cpu[0])
        cpu[0] = used
        if os.environ.get("GAPS_DEBUG") and now - last[0] > 0.02:
            print(f"gap {1e3 * (now - last[0]):.0f} ms, generating={w.generating}, chars={len(w.chat.streamed)}")
        last[0] = now

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(5)
    send(qtbot, w, "go", 2100)
    last[0], cpu[0] = time.perf_counter(), time.thread_time()
    gaps.clear()
    busy.clear()
    qtbot.waitUntil(lambda: not w.generating, timeout=300_000)
    timer.stop()
    log = w.chat.flush_log
    shown = [(bisect.bisect_right(ends, chars), s) for chars, s in log]  # tokens shown after each flush
    n = len(ids)

    def per_token(lo, hi):
        """Render seconds per token for the flushes that showed tokens lo..hi."""
        before = max([t for t, _ in shown if t <= lo] or [0])
        inside = [(t, s) for t, s in shown if lo < t <= hi]
        return sum(s for _, s in inside) / max(max(t for t, _ in inside) - before, 1)

    first, final = per_token(0, 200), per_token(n - 200, n)
    worst = max(gaps)
    print(f"\nstreaming render: {n} tokens, {len(log)} flushes, worst event-loop gap {worst * 1e3:.1f} ms "
          f"(GUI thread busy {busy[gaps.index(worst)] * 1e3:.1f} ms of it; load {os.getloadavg()[0]:.2f}); "
          f"render time per token: first 200 {first * 1e6:.0f} us, last 200 {final * 1e6:.0f} us "
          f"(ratio {final / first:.2f}); whole reply {1e3 * sum(s for _, s in log):.0f} ms in flushes and their paints")
    assert w.store.messages(w.cid)[-1].content == text
    assert "```" not in w.chat.toPlainText() and "**" not in w.chat.toPlainText()
    assert worst < 0.050
    assert final <= 1.5 * first
    w.close()
