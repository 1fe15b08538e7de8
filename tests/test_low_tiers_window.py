"""The window's lowest precision for experts (issue 46, must-show 4): Settings > Lowest precision for
experts, through its real QActions, moves the experts of the fast end to 2 bits live (the placement map
and the panel say so) and back, and is remembered for the next start."""
import pytest

pytest.importorskip("PySide6")
from engine import native  # noqa: E402

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

# costs where the lower tiers pay (the tiny experts' call overhead hides it on a real CPU)
COSTS = {"cpu-16": (1e-4, 1e-9), "cpu-4": (1e-5, 4e-10), "cpu-3": (1e-5, 3e-10), "cpu-2": (1e-5, 2e-10)}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("wide"), layers=2, hidden=256, ffn=256, experts=8)


def held(w) -> set:
    return {t for row in w.panel.map.current for t in row}


def test_the_fast_ends_lowest_precision_moves_experts_live_and_is_remembered(qtbot, wide, tmp_path, measured_machine):
    from app.dialogs import lowest_precision
    from app.main_window import MainWindow
    from app.store.chat_store import Store

    w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(wide), device="cpu", dtype="bf16",
                   session_kwargs={"poll_s": 0.1, "tier_costs": COSTS})
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    qtbot.waitUntil(lambda: not w.bridge.session.controller.calibrating, timeout=120_000)
    acts = w.lowest.actions
    assert acts[2].isChecked() and w.lowest.menu.title() == "Lowest precision for experts"
    assert [a.text() for a in acts.values()] == ["4-bit (best quality at the fast end)", "3-bit", "2-bit (fastest)"]
    # the moves below take 5-15 s alone; a full run's other worker on the same 2 cores once held one past 60 s
    w.slider.set_value(0.0)  # the fast end
    qtbot.waitUntil(lambda: "cpu-2" in held(w), timeout=180_000)
    assert "at 2-bit" in w.panel.tiers.text()

    acts[4].trigger()  # the user allows no less than 4 bits: every 2- and 3-bit expert goes back up, live
    assert acts[4].isChecked() and not acts[2].isChecked() and lowest_precision.saved() == 4
    qtbot.waitUntil(lambda: held(w) and not held(w) & {"cpu-3", "cpu-2"}, timeout=180_000)
    assert w.bridge.session.controller.inputs.lowest_bits == 4
    assert "2-bit" not in w.panel.tiers.text() and "3-bit" not in w.panel.tiers.text()

    acts[3].trigger()
    qtbot.waitUntil(lambda: "cpu-3" in held(w) and "cpu-2" not in held(w), timeout=180_000)
    assert "at 3-bit" in w.panel.tiers.text()
    w.close()

    again = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(wide), device="cpu", dtype="bf16",
                       session_kwargs={"poll_s": 0.1, "tier_costs": COSTS})
    qtbot.addWidget(again)
    assert again.lowest.actions[3].isChecked() and again.lowest.bits == 3  # remembered across starts
    qtbot.waitUntil(lambda: again.send_btn.isEnabled(), timeout=120_000)
    assert again.bridge.session.controller.profiling.lowest_bits == 3
    again.close()
