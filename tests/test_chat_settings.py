"""Per-chat settings (issue 29): Chat > Chat settings… sets the chat's longest reply, randomness,
word pool, repetition penalty, memory (context length) and system prompt (with presets); the engine's
Generate carries them; they stay with the chat across a chat switch and a restart; a chat longer
than its memory is sent without its oldest turns, and the window says so.

The window tests go through the real MainWindow on the tiny model: the menu's QAction, the dialog's
fields typed into, its buttons clicked; what the engine received is read from the commands the
window sent (a spy on the bridge) and from the reply the store kept."""
import sqlite3

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QAbstractButton, QDialogButtonBox, QInputDialog  # noqa: E402

from app.chat import settings as cs  # noqa: E402
from app.dialogs import chat_settings as csd  # noqa: E402
from app import theme  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.protocol import Generate  # noqa: E402

from main_window_helpers import open_window  # noqa: E402
from window_helpers import menu_actions, no_uncaught_exceptions, on_modal  # noqa: E402

PRESET = "Answer in one word."
from chat_settings_helpers import click, open_settings, record_generates, select_chat, type_into  # noqa: E402,F401 (shared: tests/chat_settings_helpers.py)


# ---- the model of the settings, without a window ----
def test_read_keeps_only_values_the_widgets_could_hold():
    raw = {"max_new_tokens": 5, "top_k": 3.0, "repetition_penalty": 1.3, "temperature": "hot", "top_p": 0,
           "context": -4, "seed": 7, "top_k_extra": 1, "max_new_tokens_": True}
    assert cs.read(raw) == {"max_new_tokens": 5, "top_k": 3, "repetition_penalty": 1.3}
    assert cs.read("not a dict") == {} and cs.read({"top_k": True}) == {} and cs.read({"top_k": 2.5}) == {}


def test_overrides_store_only_what_differs_from_the_defaults():
    d = SamplingParams(max_new_tokens=1024)
    values = {**cs.default_values(d), "top_k": 3}
    assert cs.overrides(values, d) == {"top_k": 3}
    assert cs.overrides(cs.default_values(d), d) == {}


def test_params_for_a_chat_and_for_no_chat(tmp_path):
    s = Store(tmp_path / "c.sqlite3")
    cid = s.new_conversation()
    defaults = SamplingParams(max_new_tokens=77, seed=4)
    assert cs.params_for(s, None, defaults) == defaults == cs.params_for(s, cid, defaults)
    s.set_settings(cid, {"max_new_tokens": 5, "top_k": 3, "context": 64})
    p = cs.params_for(s, cid, defaults)
    assert (p.max_new_tokens, p.top_k, p.seed) == (5, 3, 4) and p.check() is p
    s.set_settings(cid, {"max_new_tokens": "five", "top_k": -1})  # damaged by hand: the defaults
    assert cs.params_for(s, cid, defaults) == defaults
    s.close()


def test_context_length_is_the_chats_and_never_above_the_models(tmp_path):
    s = Store(tmp_path / "c.sqlite3")
    cid = s.new_conversation()
    assert cs.context_for(s, cid, 4096) == 4096 and cs.context_for(s, cid, 0) == 0
    s.set_settings(cid, {"context": 1000})
    assert cs.context_for(s, cid, 4096) == 1000 and cs.context_for(s, cid, 512) == 512
    assert cs.context_for(s, cid, 0) == 1000  # a served model: its own context is not known here
    s.close()


def chat_of(s: Store, turns: int, size: int = 100) -> int:
    cid = s.new_conversation()
    s.set_system_prompt(cid, "You are terse.")
    for i in range(turns):
        s.add_message(cid, "user", f"question {i} " + "q" * size)
        s.add_message(cid, "assistant", f"answer {i} " + "a" * size)
    return cid


def test_messages_for_leaves_out_whole_old_turns_never_the_system_prompt_or_the_newest_message(tmp_path):
    s = Store(tmp_path / "c.sqlite3")
    cid = chat_of(s, 6)
    s.add_message(cid, "user", "the newest " + "n" * 300)
    s.add_message(cid, "assistant", "", complete=False)  # the reply about to stream: never sent
    s.set_settings(cid, {"context": 800, "max_new_tokens": 100})
    h = cs.messages_for(s, cid, len, 0)  # one token a character; no template known: estimated
    assert h[0] == {"role": "system", "content": "You are terse."}
    assert h[-1]["content"].startswith("the newest")
    assert [m["role"] for m in h[1:]] == ["user", "assistant"] * ((len(h) - 2) // 2) + ["user"]
    assert h.dropped == 13 - (len(h) - 1) and h.dropped >= 2 and h.dropped % 2 == 0
    assert [m["content"] for m in h[1:-1]] == [m.content for m in s.messages(cid)[h.dropped:-2]]  # the newest kept
    fixed, per = cs.EST_FIXED, cs.EST_PER_MESSAGE
    used = fixed + sum(len(m["content"]) + per for m in h)
    assert used <= 800 - 100 < used + 2 * (112 + per)  # as many turns as fit, and no fewer
    assert "left out" in h.note and "800" in h.note
    # a chat within its memory: all of it, nothing said
    s.set_settings(cid, {})
    h = cs.messages_for(s, cid, len, 100_000)
    assert len(h) == 14 and h.dropped == 0 and h.note == ""
    # the system prompt and the newest message alone are longer than the memory: both stay
    s.set_settings(cid, {"context": 50})
    h = cs.messages_for(s, cid, len, 0)
    assert [m["role"] for m in h] == ["system", "user"] and h.dropped == 12
    s.close()


def test_without_a_tokenizer_nothing_is_left_out(tmp_path):
    s = Store(tmp_path / "c.sqlite3")
    cid = chat_of(s, 4)
    s.set_settings(cid, {"context": 10})
    assert len(cs.messages_for(s, cid, None, 512)) == 9
    s.close()


def test_presets_are_kept_and_a_damaged_list_reads_as_none():
    theme.settings().remove(csd.PRESETS_KEY)
    csd.save_preset("Brief", PRESET)
    csd.save_preset("Pirate", "Talk like a pirate.")
    csd.delete_preset("Pirate")
    csd.delete_preset("never saved")
    assert csd.presets() == {"Brief": PRESET}
    theme.settings().setValue(csd.PRESETS_KEY, "{not json")
    assert csd.presets() == {}
    theme.settings().setValue(csd.PRESETS_KEY, '["a list"]')
    assert csd.presets() == {}
    theme.settings().remove(csd.PRESETS_KEY)


# ---- through the real window ----


def pick(qtbot, combo, text: str) -> None:
    """Open the list and click the entry, as a user does."""
    combo.showPopup()
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5_000)
    rect = view.visualRect(view.model().index(combo.findText(text), 0))
    qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5_000)


def save_button(dlg) -> QAbstractButton:
    return dlg.buttons.button(QDialogButtonBox.Save)


def shown(qtbot, w) -> dict:
    """What the dialog shows for the current chat (then cancelled)."""
    got = {}

    def read(dlg):
        got.update(dlg.values(), prompt=dlg.system_prompt(), presets=[dlg.preset.itemText(i)
                                                                      for i in range(dlg.preset.count())])
        dlg.reject()
    open_settings(qtbot, w, read)
    return got


def send_and_wait(qtbot, w, text: str):
    w.input.setPlainText(text)
    click(qtbot, w.send_btn)
    qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
    return w.store.messages(w.cid)[-1]


def test_chat_settings_reach_the_engine_stay_with_the_chat_and_survive_a_restart(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    theme.settings().remove(csd.PRESETS_KEY)
    w = open_window(qtbot, tiny, tmp_path)
    w.bridge.session.loaded.generator.eos_ids.clear()  # the reply runs to its longest
    sent = record_generates(w)

    def fill(dlg):
        f = dlg.fields
        type_into(qtbot, f["max_new_tokens"], "5")
        type_into(qtbot, f["temperature"], "0.8")
        type_into(qtbot, f["top_k"], "3")
        type_into(qtbot, f["repetition_penalty"], "1.3")
        qtbot.keyClicks(dlg.prompt, PRESET)
        named = on_modal(lambda d: (d.setTextValue("Brief"), d.accept()), QInputDialog)
        click(qtbot, dlg.save_btn)  # Save as preset… asks for its name
        assert named and csd.presets() == {"Brief": PRESET}
        dlg.prompt.clear()
        pick(qtbot, dlg.preset, "Brief")
        assert dlg.system_prompt() == PRESET
        click(qtbot, save_button(dlg))

    with no_uncaught_exceptions():
        open_settings(qtbot, w, fill)
        a = w.cid
        assert a is not None and "saved for this chat" in w.statusBar().currentMessage()
        assert w.store.conversation(a).settings == {"max_new_tokens": 5, "temperature": 0.8, "top_k": 3,
                                                    "repetition_penalty": 1.3}
        reply = send_and_wait(qtbot, w, "hello there")
        g = sent[-1]
        assert (g.params.max_new_tokens, g.params.top_k, g.params.repetition_penalty) == (5, 3, 1.3)
        assert g.params.temperature == pytest.approx(0.8)
        assert g.messages[0] == {"role": "system", "content": PRESET}
        assert g.messages[-1] == {"role": "user", "content": "hello there"}
        assert reply.complete and "· 5 tokens ·" in reply.meta["stats"] and "length" in reply.meta["stats"]

        # another chat starts from the defaults; back in the first, its own settings
        click(qtbot, next(b for b in w.sidebar.findChildren(QAbstractButton) if b.text() == "New chat"))
        b = w.cid
        assert b != a
        other = shown(qtbot, w)
        assert other["max_new_tokens"] == w.params.max_new_tokens and other["top_k"] == 0 and other["prompt"] == ""
        send_and_wait(qtbot, w, "and you?")
        assert sent[-1].params == w.params and sent[-1].messages[0]["role"] == "user"
        select_chat(qtbot, w, a)
        mine = shown(qtbot, w)
        assert (mine["max_new_tokens"], mine["top_k"], mine["repetition_penalty"], mine["prompt"]) == (5, 3, 1.3, PRESET)
        send_and_wait(qtbot, w, "once more")
        assert sent[-1].params.top_k == 3 and sent[-1].messages[0]["content"] == PRESET
    w.close()

    # a restart on the same database: still the chat's, and the preset is still there
    w2 = open_window(qtbot, tiny, tmp_path)
    try:
        with no_uncaught_exceptions():
            w2.bridge.session.loaded.generator.eos_ids.clear()
            sent2 = record_generates(w2)
            select_chat(qtbot, w2, a)
            after = shown(qtbot, w2)
            assert (after["max_new_tokens"], after["top_k"], after["repetition_penalty"]) == (5, 3, 1.3)
            assert after["prompt"] == PRESET and "Brief" in after["presets"]
            reply = send_and_wait(qtbot, w2, "after the restart")
            assert sent2[-1].params.max_new_tokens == 5 and sent2[-1].params.top_k == 3
            assert "· 5 tokens ·" in reply.meta["stats"]
    finally:
        w2.close()
        theme.settings().remove(csd.PRESETS_KEY)


def test_reset_to_defaults_and_cancel(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    try:
        with no_uncaught_exceptions():
            def fill(dlg):
                assert not dlg.fields["top_k"].isEnabled()  # no effect at randomness 0 (the default): shown so
                type_into(qtbot, dlg.fields["temperature"], "0.5")
                type_into(qtbot, dlg.fields["top_k"], "7")
                type_into(qtbot, dlg.fields["temperature"], "0")
                assert not dlg.fields["top_k"].isEnabled() and dlg.fields["top_k"].value() == 7
                qtbot.keyClicks(dlg.prompt, "Be kind.")
                click(qtbot, save_button(dlg))
            open_settings(qtbot, w, fill)  # no chat open: the settings make one
            cid = w.cid
            assert cid is not None and w.store.conversation(cid).settings == {"top_k": 7}
            assert w.store.conversation(cid).system_prompt == "Be kind."

            def cancel(dlg):
                type_into(qtbot, dlg.fields["top_k"], "9")
                dlg.reject()
            open_settings(qtbot, w, cancel)
            assert w.store.conversation(cid).settings == {"top_k": 7}

            def reset(dlg):
                assert dlg.fields["top_k"].value() == 7
                click(qtbot, dlg.reset_btn)
                assert dlg.values() == cs.default_values(w.params) and dlg.system_prompt() == "Be kind."
                click(qtbot, save_button(dlg))
            open_settings(qtbot, w, reset)
            assert w.store.conversation(cid).settings == {}
            # the memory field cannot go past the model's own context
            got = {}
            open_settings(qtbot, w, lambda d: (got.update(max=d.fields["context"].maximum(),
                                                          special=d.fields["context"].specialValueText()), d.reject()))
            assert got["max"] == w.ctx == 512 and "512" in got["special"]
    finally:
        w.close()


def test_a_chat_longer_than_its_memory_is_sent_without_its_oldest_turns_and_the_window_says_so(
        qtbot, tiny, tmp_path, monkeypatch, window_cache):
    s = Store(tmp_path / "chats.sqlite3")
    cid = chat_of(s, 6, size=60)
    s.close()
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    try:
        with no_uncaught_exceptions():
            w.bridge.session.loaded.generator.eos_ids.clear()
            sent = record_generates(w)
            select_chat(qtbot, w, cid)

            def fill(dlg):
                type_into(qtbot, dlg.fields["context"], "400")
                type_into(qtbot, dlg.fields["max_new_tokens"], "8")
                click(qtbot, save_button(dlg))
            open_settings(qtbot, w, fill)
            said = []
            w.statusBar().messageChanged.connect(said.append)
            reply = send_and_wait(qtbot, w, "the newest question")
            g = sent[-1].messages
            assert g[0] == {"role": "system", "content": "You are terse."}
            assert g[-1] == {"role": "user", "content": "the newest question"}
            assert g[1]["role"] == "user" and not g[1]["content"].startswith("question 0")
            assert [m["role"] for m in g[1:]] == ["user", "assistant"] * ((len(g) - 2) // 2) + ["user"]
            dropped = 13 - (len(g) - 1)
            assert dropped >= 2
            assert any(f"{dropped} older messages left out" in m and "400" in m for m in said), said
            assert any("left out" in line for line in w.log_lines)
            # the prompt the engine rendered fits in the memory less the reply's room, and one more
            # turn would not have
            ids = w.model_info.prompt_ids
            budget = 400 - 8
            assert len(ids(g)) <= budget
            older = [{"role": m.role, "content": m.content} for m in w.store.messages(cid)[dropped - 2:dropped]]
            assert len(ids(g[:1] + older + g[1:])) > budget - 2 * 2 * cs.template_cost(ids, w.count_tokens)[1]
            assert reply.complete and "· 8 tokens ·" in reply.meta["stats"]
    finally:
        w.close()


def test_a_damaged_settings_value_opens_with_the_defaults(qtbot, tiny, tmp_path, monkeypatch, window_cache):
    s = Store(tmp_path / "chats.sqlite3")
    cid = s.new_conversation("hand-edited")
    s.close()
    db = sqlite3.connect(str(tmp_path / "chats.sqlite3"))
    db.execute("UPDATE conversations SET settings=? WHERE id=?", ('{"top_k": "lots", "max_new_tokens": 6', cid))
    db.commit()
    db.close()
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    try:
        with no_uncaught_exceptions():
            select_chat(qtbot, w, cid)
            got = shown(qtbot, w)
            assert got["top_k"] == 0 and got["max_new_tokens"] == w.params.max_new_tokens
            assert send_and_wait(qtbot, w, "hi").complete
    finally:
        w.close()


def test_the_context_indicator_counts_against_the_chats_memory(qtbot, tiny, tmp_path, window_cache):
    """A chat whose memory (Chat settings…) is shorter than the model's context shows what it takes
    of that memory, not of the model's 512 tokens; another chat keeps the model's."""
    w = open_window(qtbot, tiny, tmp_path)
    label = w.composer.context_label
    try:
        with no_uncaught_exceptions():
            w.params = SamplingParams(max_new_tokens=6)
            send_and_wait(qtbot, w, "hello there")
            first = w.cid
            assert label.text().endswith("/512 tokens"), label.text()

            def memory(dlg):
                type_into(qtbot, dlg.fields["context"], "256")
                click(qtbot, save_button(dlg))
            open_settings(qtbot, w, memory)
            assert w.store.conversation(first).settings.get("context") == 256
            assert label.text().endswith("/256 tokens") and "this chat's memory (256" in label.toolTip()
            send_and_wait(qtbot, w, "and again")
            assert label.text().endswith("/256 tokens"), label.text()  # after a reply too

            menu_actions(w)["File/New chat"].trigger()
            send_and_wait(qtbot, w, "a new chat")
            assert label.text().endswith("/512 tokens") and "memory" not in label.toolTip()
            select_chat(qtbot, w, first)  # opened again from the sidebar
            assert label.text().endswith("/256 tokens"), label.text()
    finally:
        w.close()
