"""Issue 37, item 1: a fresh start answers as the all-16-bit model does until its calibration has
measured what 4 bits would cost, served and in the window.

Before, the first plan (from the model's shape, with a guessed uniform 4-bit sensitivity) put
experts at cpu-4 blindly: on the demo, 133 of 240 experts, two of whose layers turned out 8x more
sensitive than the rest, and "What is the capital of France?" got a French loop for the minute the
calibration took. A model wide enough that 4 bits pay on this machine class (hidden 256, ffn 512:
the old first plan put half its experts at cpu-4) stands in for the demo here; its greedy tokens
must equal `--placement cpu`'s while the calibration (slowed down, so that it cannot end first) runs.
"""
import http.client
import json
import time
from urllib.parse import urlsplit

import pytest

from engine.runtime.client import Client
from engine.runtime.generate import SamplingParams
from engine.placement import Tier
from engine.protocol import PlacementChanged

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOKENS = 24


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("wide"), hidden=256, ffn=512, seed=3)


@pytest.fixture(scope="module")
def reference(wide, tmp_path_factory):
    """The reply with every expert pinned at 16 bits on the CPU (`--placement cpu`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("pinned-cache")))
        client = Client()
        try:
            client.load(str(wide), placement="cpu", device="cpu", dtype="fp32", ctx=256)
            client.session.loaded.generator.eos_ids.clear()  # every reply runs to TOKENS
            done = client.generate(messages=QUESTION, params=SamplingParams(max_new_tokens=TOKENS), fresh=True)
        finally:
            client.close()
    assert len(done.token_ids) == TOKENS
    return done


@pytest.fixture
def fresh(measured_machine, monkeypatch):
    """A cache where the model has nothing measured (the machine has: conftest.measured_machine), and a
    calibration that takes at least ~10 s."""
    import engine.measures.profile as profile

    real = profile.build_steps

    def slow(*a, **k):
        time.sleep(1.2)
        return real(*a, **k)

    monkeypatch.setattr(profile, "build_steps", slow)


def all_16_bit(placement) -> bool:
    return all(t.bits == 16 for _, _, t in placement.items())


def test_a_served_fresh_start_answers_as_the_16_bit_model_while_it_calibrates(wide, reference, fresh):
    from engine.tools.serve import Server

    client = Client()
    server = None
    try:
        client.load(str(wide), placement="auto", device="cpu", dtype="fp32", ctx=256)
        session = client.session
        session.loaded.generator.eos_ids.clear()
        server = Server(session, "127.0.0.1", 0).start()
        u = urlsplit(server.url)
        for _ in range(2):  # the first request, and one after the plan has settled
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
            conn.request("POST", u.path + "/chat/completions", headers={"Content-Type": "application/json"},
                         body=json.dumps({"model": wide.name, "messages": QUESTION, "temperature": 0,
                                          "max_tokens": TOKENS}))
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            assert resp.status == 200, body
            assert body["choices"][0]["message"]["content"] == reference.content
        assert session.controller.calibrating  # both answers came before the calibration ended
        assert all_16_bit(session.loaded.model.placement)
        assert session.controller.inputs.provisional and all_16_bit(session.controller.target)
    finally:
        if server is not None:
            server.stop()
        client.close()


def test_the_window_on_a_fresh_start_answers_as_the_16_bit_model_while_it_calibrates(qtbot, wide, reference,
                                                                                        fresh, tmp_path):
    pytest.importorskip("PySide6")
    from main_window_helpers import open_window, send

    w = open_window(qtbot, wide, tmp_path, calibrated=False)
    session = w.bridge.session
    assert session.controller.calibrating
    session.loaded.generator.eos_ids.clear()
    send(qtbot, w, QUESTION[0]["content"], TOKENS)
    qtbot.waitUntil(lambda: not w.generating, timeout=120_000)
    reply = w.store.messages(w.cid)[-1]
    assert reply.role == "assistant" and reply.complete
    assert reply.content == reference.content
    assert session.controller.calibrating
    assert all_16_bit(session.loaded.model.placement)
    # the slider's readout says why the plan is at full precision for now
    assert "measured" in w.slider.readout.text()
    w.close()


def test_the_slider_trades_quality_once_the_calibration_has_measured_it(wide, measured_machine):
    """When the calibration ends, the plan follows the slider again (provisional no more); the
    fastest end then uses 4 bits where they pay."""
    from engine.protocol import SetSlider

    plans = []
    client = Client(on_event=lambda ev: plans.append(ev) if isinstance(ev, PlacementChanged) else None)
    try:
        client.load(str(wide), placement="auto", device="cpu", dtype="fp32", ctx=256)
        client.session.submit(SetSlider(value=0.0))
        client.wait_calibrated()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (plans and not plans[-1].provisional):
            time.sleep(0.05)
        assert plans[0].provisional and all_16_bit(plans[0].placement)
        assert not plans[-1].provisional and plans[-1].reason == "profile"
    finally:
        client.close()
