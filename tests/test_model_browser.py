"""The model browser (File > Open model…) through the real window, against a hub-speaking server on
loopback (tests/hub_server.py): typing a query lists the hub's models with their files and sizes
and the planner's prediction for each on this machine, from its config.json alone; no weight file
is fetched until one is chosen, and choosing one downloads and opens it."""
import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402

from app.main_window import MainWindow  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.measures import fit  # noqa: E402
from engine.planning.planner import Budgets  # noqa: E402
from hub_server import Declared, HubServer  # noqa: E402
from window_helpers import menu_actions, no_uncaught_exceptions  # noqa: E402

RES = Path(__file__).resolve().parents[1] / "resources"
GB = 10**9
BUDGETS = Budgets(vram=0, ram=20 * GB)  # the machine the predictions are for (what fit.machine_budgets says)


def repos(tiny: Path, gguf: Path | None = None) -> dict:
    qwen = {"config.json": (RES / "qwen3-30b-a3b-config.json").read_bytes(), "README.md": b"# Qwen3-30B-A3B",
            **{f"model-{i:05d}-of-00016.safetensors": Declared(4 * GB) for i in range(1, 17)},
            "model.safetensors.index.json": b"{}"}
    oss = {"config.json": (RES / "gpt-oss-20b-config.json").read_bytes(),
           **{f"model-{i:05d}-of-00003.safetensors": Declared(int(4.5 * GB)) for i in range(1, 4)}}
    small = {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()}
    ggufs = {"tiny-moe-Q8_0.gguf": gguf.read_bytes() if gguf else Declared(3 * 10**6),
             "tiny-moe-F16.gguf": Declared(60 * GB), "README.md": b"# GGUF"}
    return {"acme/Qwen3-30B-A3B": qwen, "acme/gpt-oss-20b": oss, "acme/tiny-moe": small,
            "acme/tiny-moe-GGUF": ggufs, "other/dense-llama": {"config.json": b"{}"}}


MEMORY = {"low": Budgets(vram=0, ram=8 * GB), "high": Budgets(vram=0, ram=96 * GB)}  # pinned, not this machine's


@pytest.fixture
def env(qtbot, tiny, tmp_path, monkeypatch, window_cache, request):
    """A window on the tiny model whose hub is the loopback server (HF_ENDPOINT), with its own HF
    cache, and predictions for a CPU-only machine of 20 GB (or the test's `memory`, pinned low or
    high: never the memory this machine happens to have free)."""
    import huggingface_hub.constants as hf

    budgets = MEMORY[request.getfixturevalue("memory")] if "memory" in request.fixturenames else BUDGETS
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(fit, "machine_budgets", lambda hw, **kw: budgets)
    state = {"hub": None}

    def start(gguf=None):
        hub = HubServer(repos(tiny, gguf)).serve()
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(tiny), session_kwargs={"poll_s": 0.1},
                       device="cpu", dtype="fp32")
        qtbot.addWidget(w)
        w.show()
        qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
        state.update(hub=hub, w=w)
        return hub, w
    yield start
    if state["hub"] is not None:
        state["w"].close()
        state["hub"].close()


def open_browser(qtbot, w):
    menu_actions(w)["File/Open model…"].trigger()
    picker = w.picker
    qtbot.waitUntil(picker.isVisible, timeout=10_000)
    return picker


def search(qtbot, picker, text):
    picker.hub.setFocus()
    qtbot.keyClicks(picker.hub, text)
    b = picker.browser
    qtbot.waitUntil(lambda: b.results.topLevelItemCount() > 0 or "No model" in b.status.text(), timeout=30_000)
    qtbot.waitUntil(lambda: all("reading its files" not in v[1] for v in b.row_texts().values()), timeout=60_000)
    return b.row_texts()


@pytest.mark.parametrize("memory", ["low", "high"])
def test_a_search_lists_files_sizes_and_the_planners_fit_without_fetching_weights(qtbot, env, memory):
    from engine.measures import hardware

    budgets = MEMORY[memory]
    hub, w = env()
    with no_uncaught_exceptions():
        picker = open_browser(qtbot, w)
        rows = search(qtbot, picker, "acme")
        hw = hardware.cached()  # the profile the engine measured when the window started
        assert set(rows) == {"acme/Qwen3-30B-A3B", "acme/gpt-oss-20b", "acme/tiny-moe", "acme/tiny-moe-GGUF"}
        qwen = rows["acme/Qwen3-30B-A3B"]
        assert qwen[0] == "64 GB"  # 16 shards of 4 GB
        assert qwen[1] == fit.predict(json.loads((RES / "qwen3-30b-a3b-config.json").read_text()), hw, budgets).line()
        if memory == "high":  # room for its experts at 16 bits, or at 4
            assert qwen[1].startswith("CPU only: ") and "tok/s" in qwen[1]
        else:  # 8 GB: not even its 4-bit experts and the dense part
            assert qwen[1].startswith("does not fit: needs "), qwen[1]
        assert "model-00001-of-00016.safetensors 4.0 GB" in qwen[2:]
        oss = rows["acme/gpt-oss-20b"]
        assert oss[0] == "14 GB" and oss[1] == fit.predict(RES / "gpt-oss-20b-config.json", hw, budgets).line()
        assert rows["acme/tiny-moe"][1] == fit.predict(w.models.current[0], hw, budgets).line()
        gguf = rows["acme/tiny-moe-GGUF"]
        assert "GGUF files" in gguf[1]
        ram = fit.size_text(budgets.ram)
        assert f"tiny-moe-Q8_0.gguf 3.0 MB fits in memory by its size: 3.0 MB of this machine's {ram} RAM" in gguf[2:]
        f16 = (f"fits in memory by its size: 60 GB of this machine's {ram} RAM" if memory == "high" else
               f"does not fit: needs 60 GB, this machine has {ram} RAM")
        assert f"tiny-moe-F16.gguf 60 GB {f16}" in gguf[2:], gguf
        # only config.json was fetched, once per repo with safetensors; never a weight file
        assert hub.fetched() and set(hub.fetched()) == {"config.json"}
        assert not any(n.endswith((".safetensors", ".gguf")) for n in hub.fetched())
        assert any("search=acme" in p for p in hub.api_log)


def test_choosing_a_candidate_downloads_and_opens_it(qtbot, env):
    hub, w = env()
    with no_uncaught_exceptions():
        picker = open_browser(qtbot, w)
        search(qtbot, picker, "tiny-moe")
        item = next(picker.browser.results.topLevelItem(i) for i in range(picker.browser.results.topLevelItemCount())
                    if picker.browser.results.topLevelItem(i).text(0) == "acme/tiny-moe")
        where = picker.browser.results.visualItemRect(item).center()
        qtbot.mouseClick(picker.browser.results.viewport(), Qt.LeftButton, pos=where)  # a double-click's first press
        qtbot.mouseDClick(picker.browser.results.viewport(), Qt.LeftButton, pos=where)
        assert picker.choice == "acme/tiny-moe"
        qtbot.waitUntil(lambda: w.models.current and w.models.current[0] == "acme/tiny-moe", timeout=60_000)
        assert not picker.isVisible()
        assert "model.safetensors" in hub.fetched()  # now, and only now, the weights


def test_a_gguf_file_of_a_hub_repo_opens_alone(qtbot, env, tiny, tmp_path):
    from gguf import GGMLQuantizationType as GT
    from gguf_files import hf_to_gguf

    path = hf_to_gguf(tiny, tmp_path / "tiny-moe-Q8_0.gguf", qtype=GT.Q8_0)
    hub, w = env(gguf=path)
    with no_uncaught_exceptions():
        picker = open_browser(qtbot, w)
        search(qtbot, picker, "GGUF")
        top = picker.browser.results.topLevelItem(0)
        child = next(top.child(k) for k in range(top.childCount()) if top.child(k).text(0) == "tiny-moe-Q8_0.gguf")
        picker.browser.results.setCurrentItem(child)
        qtbot.mouseClick(picker.get, Qt.LeftButton)  # Download and open
        spec = "acme/tiny-moe-GGUF/tiny-moe-Q8_0.gguf"
        qtbot.waitUntil(lambda: w.models.current and w.models.current[0] == spec, timeout=120_000)
        assert hub.fetched().count("tiny-moe-Q8_0.gguf") >= 1 and "tiny-moe-F16.gguf" not in hub.fetched()


def test_typing_is_debounced_and_only_the_last_query_is_listed(qtbot, env):
    hub, w = env()
    picker = open_browser(qtbot, w)
    rows = search(qtbot, picker, "gpt-oss")  # seven keys typed quickly
    searches = [p for p in hub.api_log if p.startswith("/api/models?")]
    assert len(searches) == 1 and "search=gpt-oss" in searches[0]
    assert list(rows) == ["acme/gpt-oss-20b"]
    picker.hub.clear()
    qtbot.keyClicks(picker.hub, "nothing-like-it")
    qtbot.waitUntil(lambda: "No model on the hub matches “nothing-like-it”" in picker.browser.status.text(), timeout=30_000)
    assert picker.browser.results.topLevelItemCount() == 0


def test_a_hub_that_does_not_answer_is_said_in_one_line(qtbot, env):
    hub, w = env()
    hub.hang = True
    with no_uncaught_exceptions():
        picker = open_browser(qtbot, w)
        picker.browser.deadline_s = 1.0
        qtbot.keyClicks(picker.hub, "mixtral")
        qtbot.waitUntil(lambda: "did not answer within 1 s" in picker.browser.status.text(), timeout=15_000)
        status = picker.browser.status.text()
        assert hub.endpoint in status and "\n" not in status and "Traceback" not in status
        # the dialog still works: a recent model opens
        assert picker.list.count() >= 2
        picker.reject()


def test_recent_models_show_their_size_on_disk_and_fit(qtbot, env, tiny):
    from engine.measures import hardware

    hub, w = env()
    picker = open_browser(qtbot, w)
    specs = [picker.list.item(i).data(Qt.UserRole) for i in range(picker.list.count())]
    row = picker.list.item(specs.index(str(tiny)))
    qtbot.waitUntil(lambda: "on disk" in row.text(), timeout=30_000)
    size = sum(p.stat().st_size for p in tiny.iterdir() if p.is_file())
    from app.dialogs.hub_search import size_text

    assert f"{size_text(size)} on disk · {fit.predict(tiny, hardware.cached(), BUDGETS).line()}" in row.text()
    picker.reject()
