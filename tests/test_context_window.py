"""The context through the real window (issue 45, Must-show 3's context part, and item 7): chosen when a
model opens (File > Open model…'s Context box, with what each length costs) and remembered for that
model; changed from the model bar without a reload; a 12K-token document attached whole where the
context allows it, and one longer than the context offered a longer context; a prompt longer than
the context said with its figures. The model: the tiny Mixtral with 65,536 positions in its config."""
import json
import re

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402

from app.dialogs import context_choice, model_picker  # noqa: E402
from app.chat.attachments import context_for, room_of  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.sources.tiny_model import write_tiny_mixtral  # noqa: E402

from main_window_helpers import close_and_delete, open_window  # noqa: E402
from window_helpers import no_uncaught_exceptions  # noqa: E402

PER_TOKEN = 2 * 2 * (16 + 16) * 4  # the tiny Mixtral's keys and values a token at fp32


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    folder = write_tiny_mixtral(tmp_path_factory.mktemp("long-window"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 65536
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def opened():
    """The windows a test opened, closed and destroyed in its teardown (after pytest-qt closes them)."""
    windows = []
    yield windows
    for w in windows:
        close_and_delete(w)


@pytest.fixture(autouse=True)
def _forget_contexts():
    yield
    from app import theme

    theme.settings().remove(context_choice.KEY)


def document(tmp_path, w, tokens: int):
    """A text file of about `tokens` tokens of the model's tokenizer, and its exact count."""
    line = "Paris is the capital of France and its largest city.\n"
    n = max(1, tokens // w.count_tokens(line))
    path = tmp_path / "report.txt"
    path.write_text(line * n)
    return path, w.count_tokens(line * n)


def test_the_context_chosen_when_a_model_opens_is_used_and_remembered(qtbot, opened, tiny, long_tiny, tmp_path,
                                                                      window_cache):
    w = open_window(qtbot, tiny, tmp_path)
    opened.append(w)
    with no_uncaught_exceptions():
        model_picker.remember(str(long_tiny))
        w.pick_model()
        picker = w.picker
        row = next(i for i in range(picker.list.count())
                   if picker.list.item(i).data(Qt.UserRole) == model_picker.normal(str(long_tiny)))
        picker.list.setCurrentRow(row)
        box = picker.context_box
        # what each length costs, from the model's header (a worker thread)
        qtbot.waitUntil(lambda: "MB" in box.itemText(max(box.findData(8192), 0)), timeout=30_000)
        assert box.itemText(0).startswith("Auto (fits: ") and box.currentData() == "auto"
        assert box.itemText(box.findData(8192)) == "8,192 tokens · 4.2 MB"
        assert box.findData(65536) > 0  # the model's own, the longest offered
        box.setCurrentIndex(box.findData(8192))
        picker.findChild(QDialogButtonBox).button(QDialogButtonBox.Open).click()
        qtbot.waitUntil(lambda: w.models.current and w.models.current[0] == str(long_tiny) and not w.loading,
                        timeout=120_000)
        assert w.ctx == 8192 == w.bridge.session.loaded.generator.ctx  # Loaded.ctx: the choice at open
        assert w.context_button.text() == "Context: 8,192 tokens · 4.2 MB"
        assert context_choice.remembered(str(long_tiny)) == 8192
        w.load_model(str(tiny))  # another model, then this one again: opened at the context chosen for it
        qtbot.waitUntil(lambda: w.models.current[0] == str(tiny) and not w.loading and w.ctx == 512,
                        timeout=120_000)
        w.load_model(str(long_tiny))
        qtbot.waitUntil(lambda: w.models.current[0] == str(long_tiny) and not w.loading, timeout=120_000)
        assert w.ctx == 8192


def test_the_model_bar_changes_the_context_without_reading_the_weights_again(qtbot, opened, long_tiny, tmp_path,
                                                                             window_cache):
    w = open_window(qtbot, long_tiny, tmp_path, calibrated=False)
    opened.append(w)
    with no_uncaught_exceptions():
        ev = w.model_info
        assert ev.context.auto and w.ctx == ev.context.auto_ctx  # auto by default: the model's own, as memory allows
        assert w.context_button.text().endswith("(auto)") and w.context_button.isVisible()
        model = w.bridge.session.loaded.model
        experts = [ex for block in model.moe for ex in block.experts]
        act = next(a for a in w.context_button.menu().actions() if a.text().startswith("4,096 tokens"))
        assert act.text() == "4,096 tokens · 2.1 MB"
        act.trigger()
        qtbot.waitUntil(lambda: w.ctx == 4096, timeout=60_000)
        assert w.bridge.session.loaded.model is model  # no reload
        after = [ex for block in model.moe for ex in block.experts]
        # the experts are re-planned beside the new reservation (and a calibration may re-quantize some
        # meanwhile): one whose tier stayed is the very object it was, nothing read from the files again
        kept = [(a, b) for a, b in zip(experts, after) if a.tier == b.tier]
        assert all(a is b for a, b in kept)
        assert w.context_button.text() == "Context: 4,096 tokens · 2.1 MB"
        assert context_choice.remembered(str(long_tiny)) == 4096 and w.models.current[3] == 4096
        reply = say(qtbot, w, "hello")  # it chats at the new context
        assert reply.role == "assistant" and reply.complete


def say(qtbot, w, text, n=4):
    w.params = SamplingParams(max_new_tokens=n)
    w.input.setPlainText(text)
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=60_000)
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.generating, timeout=120_000)
    return w.store.messages(w.cid)[-1]


def test_a_12k_token_document_attaches_whole_where_the_context_allows(qtbot, opened, long_tiny, tmp_path, window_cache):
    w = open_window(qtbot, long_tiny, tmp_path, calibrated=False)
    opened.append(w)
    assert room_of(w.ctx) > 13_000  # auto: its own 65,536 tokens (34 MB) fit on any machine that runs the tests
    path, tokens = document(tmp_path, w, 12_000)
    assert 11_500 < tokens < 12_500
    w.attach(str(path))
    qtbot.waitUntil(lambda: len(w.chip_widgets()) == 1, timeout=30_000)
    assert w.too_long_box is None and w.chip_widgets()[0].property("tokens") == tokens


def test_a_document_longer_than_the_context_offers_a_longer_context_and_attaches_it_whole(qtbot, opened, long_tiny,
                                                                                          tmp_path, window_cache):
    w = MainWindowAt(qtbot, long_tiny, tmp_path, 4096)
    opened.append(w)
    with no_uncaught_exceptions():
        assert w.ctx == 4096
        model = w.bridge.session.loaded.model
        path, tokens = document(tmp_path, w, 12_000)
        w.attach(str(path))
        qtbot.waitUntil(lambda: w.too_long_box is not None, timeout=30_000)
        box = w.too_long_box
        need = context_for(tokens, w.model_info.context)
        assert need == -(-(tokens + 1024) // 1024) * 1024  # the shortest round context whose room holds it
        gb = context_choice.size_text(need * PER_TOKEN)
        assert f"is {tokens:,} tokens; the context holds 4,096" in box.text()
        assert box.longer_button.text() == f"Open with a longer context (needs {gb})"
        box.longer_button.click()
        qtbot.waitUntil(lambda: len(w.chip_widgets()) == 1, timeout=60_000)
        assert w.ctx == need and w.chip_widgets()[0].property("tokens") == tokens  # the whole document
        assert w.bridge.session.loaded.model is model
        assert context_choice.remembered(str(long_tiny)) == 4096  # a document's context is not the model's choice


def test_a_prompt_longer_than_the_context_is_said_with_its_figures(qtbot, opened, long_tiny, tmp_path, window_cache):
    w = MainWindowAt(qtbot, long_tiny, tmp_path, 2048)
    opened.append(w)
    with no_uncaught_exceptions():
        assert w.ctx == 2048
        w.params = SamplingParams(max_new_tokens=4)
        w.input.setPlainText("word " * 700)
        qtbot.mouseClick(w.send_btn, Qt.LeftButton)
        qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
        said = w.statusBar().currentMessage()
        assert re.fullmatch(r"the prompt is \d,\d{3} tokens; the context holds 2,048: shorten it or remove "
                            r"attached documents", said), said


def MainWindowAt(qtbot, model, tmp_path, ctx):
    """The window opened at a context given (the command line's --ctx)."""
    from app.main_window import MainWindow
    from app.store.chat_store import Store

    w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(model), session_kwargs={"poll_s": 0.1},
                   device="cpu", dtype="fp32", ctx=ctx)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    return w
