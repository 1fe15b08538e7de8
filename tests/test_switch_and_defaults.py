"""Flows a new user found broken, walked through the real window (its QActions, dialogs and buttons):

1. While File > Open… only checks the new model (on the engine thread, before its Load), the chat goes
   on with the old one: Send stays enabled, and a message sent then is answered by the old model; the
   new one is loaded after that reply, and only then does Send wait.
2. After another model is loaded, the composer's context indicator and the panel's speeds no longer
   show the old model's figures.
3. A GGUF file held above 4 bits (Q8_0) is not re-quantised silently: the first (provisional) plan
   keeps the file's precision, and a plan that re-quantises says so in the slider's readout and the
   model bar.
4. New chats get a mild repetition penalty (1.1); Chat > Defaults for new chats… changes what chats
   created afterwards get (remembered across starts), and an older chat keeps its own."""
import shutil
import threading

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402

from app.chat import settings as chat_settings  # noqa: E402
from app.dialogs.chat_settings import ChatSettingsDialog  # noqa: E402
from app import theme  # noqa: E402
from engine.runtime import queries  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.protocol import Load  # noqa: E402

from main_window_helpers import open_window  # noqa: E402
from chat_settings_helpers import click, open_settings, record_generates, select_chat, type_into  # noqa: E402
from window_helpers import menu_actions, no_uncaught_exceptions, on_modal  # noqa: E402

NEW_CHATS_KEY = "chat/new_chat_defaults"  # app/chat/defaults.py: where the defaults are remembered


from server_window_helpers import say  # noqa: E402  (types a message, clicks Send, returns the reply)


def open_hub(qtbot, w, spec: str) -> None:
    """File > Open Hugging Face model… with spec typed into its dialog (a folder works as well)."""
    seen = on_modal(lambda d: (d.setTextValue(spec), d.accept()))
    menu_actions(w)["File/Open Hugging Face model…"].trigger()
    assert seen, "no dialog opened"


# ---- 1 ----
def test_the_chat_goes_on_with_the_old_model_while_the_new_one_is_checked(qtbot, tiny, tmp_path, monkeypatch,
                                                                          window_cache):
    gate, checking = threading.Event(), threading.Event()
    real = queries.HANDLERS["check_model"]

    def slow_check(session, spec):  # the check of a large download, held until the test has sent
        checking.set()
        gate.wait(60)
        return real(session, spec)
    monkeypatch.setitem(queries.HANDLERS, "check_model", slow_check)  # the engine's query (app/model_switch.py)
    w = open_window(qtbot, tiny, tmp_path)
    old = w.bridge.session.loaded
    answered_by_old = []
    sequence = old.generator.sequence
    old.generator.sequence = lambda *a, **k: (answered_by_old.append(k.get("request_id")), sequence(*a, **k))[1]
    loads = []  # (Send enabled, a reply in progress) as each Load goes to the engine
    send = w.bridge.send

    def spy(cmd):
        if isinstance(cmd, Load):
            loads.append((w.send_btn.isEnabled(), w.generating))
        return send(cmd)
    w.bridge.send = spy
    try:
        with no_uncaught_exceptions():
            open_hub(qtbot, w, str(tiny))  # the same model again: checked, then loaded
            assert checking.wait(30)
            assert "the chat goes on with" in w.model_label.text()
            assert w.send_btn.isEnabled(), "Send was disabled while the new model was only being checked"
            w.params = SamplingParams(max_new_tokens=6)
            w.input.setPlainText("still you?")
            qtbot.mouseClick(w.send_btn, Qt.LeftButton)
            assert w.generating
            gate.set()
            qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
            reply = w.store.messages(w.cid)[-1]
            assert reply.complete and "tokens/s" in reply.meta["stats"], reply.meta
            assert answered_by_old, "the reply did not come from the model in use"
            qtbot.waitUntil(lambda: w.bridge.session.loaded is not old and w.models.pending is None
                            and w.send_btn.isEnabled(), timeout=120_000)
            assert loads == [(False, False)], loads  # loaded after the reply, Send waiting for it
            assert say(qtbot, w, "and now?", 4).complete
    finally:
        gate.set()
        w.close()


def test_send_waits_once_the_new_model_loads(qtbot, window_cache, tiny, tmp_path):
    """The model bar says so while the engine loads the new one."""
    w = open_window(qtbot, tiny, tmp_path)
    said = []
    w.model_label.setText = (lambda f: lambda text: (said.append((text, w.send_btn.isEnabled())), f(text))[1])(
        w.model_label.setText)
    try:
        with no_uncaught_exceptions():
            open_hub(qtbot, w, str(tiny))
            qtbot.waitUntil(lambda: w.models.pending is None and w.send_btn.isEnabled(), timeout=120_000)
            loading = [(t, on) for t, on in said if t.startswith("loading")]
            assert loading and all("Send waits for it" in t and not on for t, on in loading), said
    finally:
        w.close()


# ---- 2 ----
def test_a_new_model_clears_the_old_models_context_and_speeds(qtbot, tiny, tmp_path, window_cache):
    other = tmp_path / "another-tiny"
    shutil.copytree(tiny, other)
    w = open_window(qtbot, tiny, tmp_path)
    w.bridge.session.loaded.generator.eos_ids.clear()
    try:
        with no_uncaught_exceptions():
            say(qtbot, w, "hello there", 24)
            qtbot.waitUntil(lambda: "tokens/s" in w.panel.rate.text(), timeout=10_000)
            assert w.composer.context_label.text().startswith("context ")
            assert "writing" in w.panel.rate.text()
            stats = []
            w.engine.stats.connect(stats.append)
            open_hub(qtbot, w, str(other))
            qtbot.waitUntil(lambda: w.model_info.name == other.name and w.models.pending is None, timeout=120_000)
            assert w.composer.context_label.text() == "", w.composer.context_label.text()
            assert "tokens/s" not in w.panel.rate.text() and w.panel.rate.text().startswith("idle"), w.panel.rate.text()
            n = len(stats)
            qtbot.waitUntil(lambda: len(stats) > n, timeout=10_000)  # the new model's engine says so too
            assert "tokens/s" not in w.panel.rate.text(), w.panel.rate.text()
            first = w.cid
            menu_actions(w)["File/New chat"].trigger()
            select_chat(qtbot, w, first)  # opened again: its figure was the old model's
            assert w.composer.context_label.text() == "", w.composer.context_label.text()
            reply = say(qtbot, w, "and from you?", 8)
            assert reply.complete and w.composer.context_label.text().startswith("context ")
            qtbot.waitUntil(lambda: "tokens/s" in w.panel.rate.text(), timeout=10_000)
    finally:
        w.close()


# ---- 3 ----
def test_a_q8_0_gguf_keeps_its_precision_and_a_re_quantisation_is_said(qtbot, tiny, tmp_path, monkeypatch,
                                                                      window_cache):
    from gguf import GGMLQuantizationType as GT

    import engine.measures.inputs as inputs
    from gguf_files import hf_to_gguf

    path = hf_to_gguf(tiny, tmp_path / "tiny-Q8_0.gguf", qtype=GT.Q8_0, extra_kv={"general.file_type": 7})  # MOSTLY_Q8_0
    gate = threading.Event()
    real = inputs.measure_dense_s

    def held(*a, **k):  # the calibration's first step waits: the plan stays provisional meanwhile
        gate.wait(60)
        return real(*a, **k)
    monkeypatch.setattr(inputs, "measure_dense_s", held)
    theme.settings().setValue("window/slider", 0.0)  # the slider at "Fastest" since the last start
    # costs under which 4 bits pay on this CPU (as tests/test_app.py's slider test)
    w = open_window(qtbot, path, tmp_path, calibrated=False,
                    tier_costs={"cpu-16": (1e-4, 1e-9), "cpu-4": (1e-5, 1e-10)})
    plans = []
    w.engine.placement_changed.connect(plans.append)
    try:
        with no_uncaught_exceptions():
            assert w.slider.value() == 0.0 and "Q8_0 GGUF" in w.model_label.text()
            qtbot.waitUntil(lambda: "predicted" in w.slider.readout.text(), timeout=30_000)
            placement = w.bridge.session.loaded.model.placement  # the engine waits in the calibration's first step
            assert not any(t.bits == 4 for _, _, t in placement.items()), placement.counts()
            assert "full precision until" in w.slider.readout.text() and "re-quantised" not in w.model_label.text()
            gate.set()
            qtbot.waitUntil(lambda: not w.bridge.session.controller.calibrating, timeout=120_000)
            qtbot.waitUntil(lambda: bool(plans) and not plans[-1].provisional
                            and any(t.bits == 4 for _, _, t in plans[-1].placement.items()), timeout=30_000)
            n4 = sum(1 for _, _, t in plans[-1].placement.items() if t.bits == 4)
            want = f"{n4} experts re-quantised from the file's 8-bit to 4-bit"
            readout = w.slider.readout.text()
            assert want in readout and "move the slider right to keep the file's precision" in readout, readout
            qtbot.waitUntil(lambda: want in w.model_label.text(), timeout=30_000)
            w.slider.set_value(1.0)
            qtbot.waitUntil(lambda: not any(t.bits == 4 for _, _, t in plans[-1].placement.items()), timeout=30_000)
            assert "re-quantised" not in w.slider.readout.text()
    finally:
        gate.set()
        w.close()


# ---- 4 ----
def test_new_chats_get_a_mild_repetition_penalty_and_the_defaults_the_user_sets(qtbot, tiny, tmp_path,
                                                                              window_cache):
    theme.settings().remove(NEW_CHATS_KEY)
    w = open_window(qtbot, tiny, tmp_path, calibrated=False)
    w2 = None
    try:
        with no_uncaught_exceptions():
            sent = record_generates(w)
            menu_actions(w)["File/New chat"].trigger()
            old = w.cid
            assert chat_settings.params_for(w.store, old, w.params).repetition_penalty == pytest.approx(1.1)
            open_settings(qtbot, w, lambda d: (type_into(qtbot, d.fields["max_new_tokens"], "5"), click(qtbot, d.buttons.button(
                d.buttons.StandardButton.Save))))
            w.input.setPlainText("a table please")
            click(qtbot, w.send_btn)
            qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
            assert sent[-1].params.repetition_penalty == pytest.approx(1.1) and sent[-1].params.max_new_tokens == 5

            def fill(dlg):
                assert isinstance(dlg, ChatSettingsDialog)
                assert dlg.fields["repetition_penalty"].value() == pytest.approx(1.1)
                assert not dlg.prompt.isVisibleTo(dlg)  # a system prompt is never carried into new chats
                type_into(qtbot, dlg.fields["repetition_penalty"], "1.3")
                type_into(qtbot, dlg.fields["temperature"], "0.5")
                click(qtbot, dlg.buttons.button(dlg.buttons.StandardButton.Save))
            seen = on_modal(fill, ChatSettingsDialog)
            menu_actions(w)["Chat/Defaults for new chats…"].trigger()
            assert seen, "no dialog opened"
            menu_actions(w)["File/New chat"].trigger()
            new = w.cid
            assert new != old
            p = chat_settings.params_for(w.store, new, w.params)
            assert p.repetition_penalty == pytest.approx(1.3) and p.temperature == pytest.approx(0.5)
            mine = chat_settings.params_for(w.store, old, w.params)  # the old chat keeps its own
            assert (mine.repetition_penalty, mine.temperature, mine.max_new_tokens) == (pytest.approx(1.1), 0.0, 5)
            select_chat(qtbot, w, old)
            w.input.setPlainText("again")
            click(qtbot, w.send_btn)
            qtbot.waitUntil(lambda: not w.generating, timeout=60_000)
            g = sent[-1].params
            assert (g.repetition_penalty, g.temperature, g.max_new_tokens) == (pytest.approx(1.1), 0.0, 5)
        w.close()
        w2 = open_window(qtbot, tiny, tmp_path, calibrated=False)  # remembered across starts
        with no_uncaught_exceptions():
            menu_actions(w2)["File/New chat"].trigger()
            p = chat_settings.params_for(w2.store, w2.cid, w2.params)
            assert p.repetition_penalty == pytest.approx(1.3) and p.temperature == pytest.approx(0.5)
            mine = chat_settings.params_for(w2.store, old, w2.params)
            assert (mine.repetition_penalty, mine.temperature, mine.max_new_tokens) == (pytest.approx(1.1), 0.0, 5)
    finally:
        theme.settings().remove(NEW_CHATS_KEY)
        w.close()
        if w2 is not None:
            w2.close()
