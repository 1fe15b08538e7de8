"""The GPU runtime in the window: the offer on an NVIDIA machine running a CPU torch, the install
from Settings with progress, offline, and a runtime that could not be used at start. This machine
kind has no NVIDIA driver, so NVML's answer (engine/tools/runtime/gpu.find_nvidia) is given here;
everything else is real: a loopback package index, the download, the unpack and the child probe."""
import json

import pytest

pytest.importorskip("PySide6")
from PySide6.QtCore import Qt  # noqa: E402

import app.gpu_runtime  # noqa: E402
import engine.tools.runtime.install  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.tools.runtime import activate as act  # noqa: E402
from engine.tools.runtime.gpu import NvidiaGpu  # noqa: E402
from pkgindex import PackageIndex, make_wheel  # noqa: E402
from runtime_helpers import STANDIN_TORCH  # noqa: E402

RTX = NvidiaGpu("NVIDIA GeForce RTX 4090", 24 << 30, "570.86.10", (12, 8))


@pytest.fixture
def nvidia(monkeypatch, tmp_path, window_cache):
    """NVML says: an RTX 4090. The runtime folder and the default index are this test's."""
    for mod in (app.gpu_runtime, engine.tools.runtime.install):
        monkeypatch.setattr(mod, "find_nvidia", lambda: (RTX, ""))
    monkeypatch.setenv("MIXDESK_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setattr(act, "CURRENT", act.Activation("none", "no GPU runtime installed"))
    return tmp_path / "runtime"


def open_window(qtbot, tiny, tmp_path):
    w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(tiny), session_kwargs={"poll_s": 0.1},
                   device="cpu", dtype="fp32")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    return w


def chats(qtbot, w):
    w.params = SamplingParams(max_new_tokens=6)
    w.input.setPlainText("still here?")
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.generating and w.cid is not None and len(w.store.messages(w.cid)) == 2,
                    timeout=60_000)
    return w.store.messages(w.cid)[1].complete


def test_the_window_offers_the_gpu_and_installs_the_runtime(qtbot, tiny, tmp_path, nvidia, monkeypatch):
    wheels = [make_wheel(tmp_path, "torch", "2.13.0", files=STANDIN_TORCH, requires=["mdk-cuda-libs"]),
              make_wheel(tmp_path, "mdk-cuda-libs", "1.0", files={"mdk_cuda_libs/lib.bin": "x" * (2 << 20)})]
    ix = PackageIndex(wheels=wheels).start()
    monkeypatch.setenv("MIXDESK_RUNTIME_INDEX_URL", ix.url)
    try:
        w = open_window(qtbot, tiny, tmp_path)
        qtbot.waitUntil(lambda: w.gpu_offer.isVisible(), timeout=30_000)
        text = w.gpu_offer.text.text()
        assert "Use your GPU (NVIDIA GeForce RTX 4090, 24 GB)" in text and "download the CUDA runtime (" in text
        assert "MB)" in text and "runs on the CPU meanwhile" in text
        seen = []
        # the dialog's worker is the offer bar's: heard from before the click, so that a fast
        # download's first reports are not missed
        w.gpu_offer.worker.progress.connect(lambda d, t, what: seen.append((d, t, what)))
        qtbot.mouseClick(w.gpu_offer.action, Qt.LeftButton)  # Download…: the dialog opens and starts at once
        dlg = w.runtime_dialog
        assert dlg.worker is w.gpu_offer.worker
        assert chats(qtbot, w)  # the chat goes on during the download
        qtbot.waitUntil(lambda: dlg.restart_btn.isVisible() or dlg.error.isVisible(), timeout=60_000)
        assert not dlg.error.isVisible(), dlg.error.text()
        assert "Installed torch 2.13.0+cu999" in dlg.offer_label.text() and "Restart Mixdesk" in dlg.offer_label.text()
        assert seen and any(not what.startswith("unpacked") for _, _, what in seen)
        assert json.loads((nvidia / "active.json").read_text())["folder"].startswith("torch-2.13.0")
        assert "Installed runtime:</b> torch 2.13.0" in dlg.info.text()
        qtbot.mouseClick(dlg.remove_btn, Qt.LeftButton)
        assert "removed the GPU runtime" in dlg.offer_label.text() and not nvidia.exists()
    finally:
        ix.stop()


def test_offline_the_window_offers_nothing_and_settings_says_why(qtbot, tiny, tmp_path, nvidia, monkeypatch):
    monkeypatch.setenv("MIXDESK_RUNTIME_INDEX_URL", "http://127.0.0.1:9/simple")  # port 9: refused
    w = open_window(qtbot, tiny, tmp_path)
    qtbot.waitUntil(lambda: not w.gpu_offer.worker.busy, timeout=30_000)
    assert not w.gpu_offer.isVisible()
    dlg = w.gpu_runtime()
    assert "NVIDIA GeForce RTX 4090" in dlg.info.text() and "CPU build" in dlg.info.text()
    qtbot.mouseClick(dlg.check_btn, Qt.LeftButton)
    qtbot.waitUntil(dlg.error.isVisible, timeout=30_000)
    assert dlg.error.text().startswith("cannot reach 127.0.0.1:9: connection refused")
    assert chats(qtbot, w) and not nvidia.exists()


def test_not_now_is_remembered(qtbot, tiny, tmp_path, nvidia, monkeypatch):
    ix = PackageIndex(wheels=[make_wheel(tmp_path, "torch", "2.13.0", files=STANDIN_TORCH)]).start()
    monkeypatch.setenv("MIXDESK_RUNTIME_INDEX_URL", ix.url)
    try:
        w = open_window(qtbot, tiny, tmp_path)
        qtbot.waitUntil(lambda: w.gpu_offer.isVisible(), timeout=30_000)
        qtbot.mouseClick(w.gpu_offer.later, Qt.LeftButton)
        assert not w.gpu_offer.isVisible()
        w.gpu_offer.check()
        qtbot.wait(300)
        assert not w.gpu_offer.isVisible() and not w.gpu_offer.worker.busy
    finally:
        ix.stop()


def test_a_runtime_not_used_at_start_is_said(qtbot, tiny, tmp_path, nvidia, monkeypatch):
    why = ("the GPU runtime in /x was not used: its torch failed to import (ImportError: libcudart.so.13); "
           "running on the bundled torch")
    monkeypatch.setattr(act, "CURRENT", act.Activation("fallback", why))
    w = open_window(qtbot, tiny, tmp_path)
    assert w.gpu_offer.isVisible() and "libcudart.so.13" in w.gpu_offer.text.text()
    qtbot.mouseClick(w.gpu_offer.action, Qt.LeftButton)  # Details…
    assert "libcudart.so.13" in w.runtime_dialog.info.text() and not w.runtime_dialog.worker.busy
