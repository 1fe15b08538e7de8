"""The GPU runtime in the window: the offer bar ("Use your GPU …: download the CUDA runtime (N GB)")
and Settings > GPU runtime (what torch runs, the GPU found, install with progress and Cancel,
remove, restart). The work runs in a Python thread (engine/tools/runtime); results come back as
Qt signals, so no widget is touched off the GUI thread. The app keeps running on the CPU throughout."""
from __future__ import annotations

import sys
import threading
import time

from PySide6.QtCore import QObject, QProcess, QSettings, Qt, Signal
from PySide6.QtWidgets import (QDialog, QFrame, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton,
                               QVBoxLayout, QWidget)

from engine.tools.runtime import activate as runtime
from engine.tools.runtime.download import Cancelled
from engine.tools.runtime.gpu import default_index, find_nvidia
from engine.tools.runtime.index import RuntimeProblem
from engine.tools.runtime.install import build_name, gb, install, prepare, remove, status

from . import gui_threads

DISMISSED = "gpu_runtime/offer_dismissed"
NO_NVIDIA = ("No NVIDIA GPU found on this machine: Mixdesk runs on the CPU; the GPU runtime is only for "
             "NVIDIA cards")


class RuntimeWorker(QObject):
    """Plans and installs in a thread; every outcome is a signal."""
    planned = Signal(object)            # Offer
    progress = Signal(int, int, str)    # done, total, what
    installed = Signal(dict)            # the runtime's manifest
    failed = Signal(str)                # one line
    busy_changed = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.cancel = threading.Event()
        self.busy = False
        self.offer = None

    def _run(self, fn) -> None:
        if self.busy:
            return
        self.busy = True
        self.cancel.clear()
        self.busy_changed.emit(True)

        def work():
            try:
                fn()
            except Cancelled:
                self.failed.emit("Cancelled. What was downloaded is kept: Install resumes it, Remove deletes it.")
            except RuntimeProblem as e:
                self.failed.emit(str(e))
            except Exception as e:  # noqa: BLE001 - shown as one line; the app goes on on the CPU
                self.failed.emit(f"the GPU runtime could not be fetched: {type(e).__name__}: {e}")
            finally:
                self.busy = False
                self.busy_changed.emit(False)
        gui_threads.start(work, "mixdesk-runtime")  # this object let go of on the GUI thread

    def plan(self, index_url: str | None = None) -> None:
        def go():
            self.offer = prepare(index_url or None, cancel=self.cancel)
            self.planned.emit(self.offer)
        self._run(go)

    def install(self, index_url: str | None = None) -> None:
        def go():
            if self.offer is None or (index_url and self.offer.plan.index_url.rstrip("/") != index_url.rstrip("/")):
                self.offer = prepare(index_url or None, cancel=self.cancel)
                self.planned.emit(self.offer)
            self.installed.emit(install(self.offer, self.progress.emit, self.cancel))
        self._run(go)


def restart_app() -> None:
    """Start Mixdesk again (same arguments) and close this one: the next start loads the new torch."""
    from PySide6.QtWidgets import QApplication

    args = sys.argv[1:] if getattr(sys, "frozen", False) else sys.argv
    QProcess.startDetached(sys.executable, args)
    for w in QApplication.topLevelWidgets():
        if w.inherits("QMainWindow"):
            w.close()


class RuntimeDialog(QDialog):
    """Settings > GPU runtime."""

    def __init__(self, parent=None, worker: RuntimeWorker | None = None, start: bool = False):
        super().__init__(parent)
        self.setWindowTitle("GPU runtime")
        self.setAttribute(Qt.WA_DeleteOnClose)
        self.setMinimumWidth(620)
        self.worker = worker or RuntimeWorker(self)
        lay = QVBoxLayout(self)
        self.info = QLabel(wordWrap=True, textInteractionFlags=Qt.TextSelectableByMouse)
        lay.addWidget(self.info)
        self.no_gpu = QLabel(NO_NVIDIA, wordWrap=True)  # shown instead of a download where NVML finds no GPU
        self.no_gpu.hide()
        lay.addWidget(self.no_gpu)
        self.index_row = QWidget()
        row = QHBoxLayout(self.index_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Package index:"))
        self.index = QLineEdit()
        row.addWidget(self.index, 1)
        lay.addWidget(self.index_row)
        self.offer_label = QLabel(wordWrap=True)
        lay.addWidget(self.offer_label)
        self.bar = QProgressBar()
        self.bar.hide()
        lay.addWidget(self.bar)
        self.error = QLabel(wordWrap=True, textInteractionFlags=Qt.TextSelectableByMouse)
        self.error.setStyleSheet("color: #d33;")
        self.error.hide()
        lay.addWidget(self.error)
        buttons = QHBoxLayout()
        self.check_btn = QPushButton("Check size")
        self.install_btn = QPushButton("Download and install")
        self.cancel_btn = QPushButton("Cancel download")
        self.remove_btn = QPushButton("Remove runtime")
        self.restart_btn = QPushButton("Restart Mixdesk")
        self.close_btn = QPushButton("Close")
        for b in (self.check_btn, self.install_btn, self.cancel_btn, self.remove_btn, self.restart_btn):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.close_btn)
        lay.addLayout(buttons)
        self.cancel_btn.hide()
        self.restart_btn.hide()
        self.check_btn.clicked.connect(lambda: (self._clear(), self.worker.plan(self._url())))
        self.install_btn.clicked.connect(self.start_install)
        self.cancel_btn.clicked.connect(self.worker.cancel.set)
        self.remove_btn.clicked.connect(self.remove)
        self.restart_btn.clicked.connect(restart_app)
        self.close_btn.clicked.connect(self.close)
        self.worker.planned.connect(self._planned)
        self.worker.progress.connect(self._progress)
        self.worker.installed.connect(self._installed)
        self.worker.failed.connect(self._failed)
        self.worker.busy_changed.connect(self._busy)
        self._t0 = time.monotonic()
        self.has_nvidia = True  # refresh() says
        self.refresh()
        if self.worker.offer is not None:
            self._planned(self.worker.offer)
        if start:
            self.start_install()

    def _url(self) -> str | None:
        return self.index.text().strip() or None

    def refresh(self) -> None:
        s = status()
        build = build_name(s["cuda_build"])
        rt = s["runtime"]
        lines = [f"<b>In use:</b> torch {s['torch']} ({build}) from {s['source']}<br><small>{s['torch_path']}</small>",
                 f"<b>GPU:</b> {s['gpu'] if s['has_gpu'] else 'no NVIDIA GPU found'}",
                 "<b>Installed runtime:</b> " + (f"torch {rt['torch']}, {gb(rt['bytes'])}, from {rt['index_url']}"
                                                 if rt else "none")]
        if s["state"] in ("fallback", "off"):
            lines.append(f"<b>Note:</b> {s['activation']}")
        elif rt and s["state"] != "active":
            lines.append("It is used from the next start of Mixdesk.")
        self.info.setText("<br>".join(lines))
        default, why = default_index(s["nvidia"])
        # the engine's reasons name NVML and --index-url (the terminal's words); here, plain ones,
        # with the engine's own in the tooltips
        self.index.setPlaceholderText(default or ("no NVIDIA GPU found: type a package index address to fetch a "
                                                  "GPU runtime anyway" if s["nvidia"] is None else why))
        self.index.setToolTip("Where the GPU build of torch is downloaded from (a pip package index)"
                              + (f"\n{why}" if why else ""))
        self.info.setToolTip("" if s["has_gpu"] else s["gpu"])
        self.remove_btn.setEnabled(rt is not None)
        # no NVIDIA GPU: said plainly, and nothing offered to download (the terminal's `mixdesk runtime
        # install --index-url` still fetches one anyway)
        self.has_nvidia = s["nvidia"] is not None
        self.no_gpu.setVisible(not self.has_nvidia)
        self.no_gpu.setToolTip(s["gpu"] if not self.has_nvidia else "")
        for w in (self.index_row, self.check_btn, self.install_btn):
            w.setVisible(self.has_nvidia)
            w.setEnabled(self.has_nvidia and not self.worker.busy)

    def _clear(self) -> None:
        self.error.hide()

    def start_install(self) -> None:
        if not self.has_nvidia:
            return
        self._clear()
        self._t0 = time.monotonic()
        self.bar.setRange(0, 0)
        self.bar.show()
        self.worker.install(self._url())

    def remove(self) -> None:
        self._clear()
        self.offer_label.setText(remove())
        self.refresh()

    def _busy(self, busy: bool) -> None:
        for b in (self.check_btn, self.install_btn, self.remove_btn):
            b.setEnabled(not busy and (b is self.remove_btn or self.has_nvidia))
        if not busy:
            self.remove_btn.setEnabled(runtime.active_folder() is not None)
        self.cancel_btn.setVisible(busy)
        if not busy:
            self.bar.hide()

    def _planned(self, offer) -> None:
        self.offer_label.setText(f"An install fetches {offer.describe()}.")
        self.install_btn.setText(f"Download and install ({gb(offer.download_bytes - offer.already)})")

    def _progress(self, done: int, total: int, what: str) -> None:
        if what.startswith("unpacked "):
            self.bar.setRange(0, total)
            self.bar.setValue(done)
            self.bar.setFormat("unpacking %v of %m wheels")
            return
        self.bar.setRange(0, 1000)
        self.bar.setValue(int(1000 * done / max(total, 1)))
        rate = done / max(time.monotonic() - self._t0, 1e-3) / 1e6
        self.bar.setFormat(f"{gb(done)} of {gb(total)} · {rate:.0f} MB/s · {what}")

    def _installed(self, doc: dict) -> None:
        p = doc["probe"]
        seen = (f"; it sees {p['device']}" if p.get("cuda_available") else
                "; CUDA is not available to it on this machine" if p.get("cuda_build") else "")
        self.offer_label.setText(f"Installed torch {p['version']}{seen}. Restart Mixdesk to use it.")
        self.install_btn.setText("Reinstall")
        self.restart_btn.show()
        self.refresh()

    def _failed(self, message: str) -> None:
        self.error.setText(message)
        self.error.show()

    def closeEvent(self, e):
        if self.worker.busy:
            self.worker.cancel.set()  # what was downloaded stays for a resume
        super().closeEvent(e)


class GpuOfferBar(QFrame):
    """Above the chat, once: 'Use your GPU (NVIDIA …): download the CUDA runtime (N GB)'. Shown only on a
    machine with an NVIDIA GPU running a CPU torch, when the index answers with a size; or, when the
    runtime could not be used at this start, why."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFrameShape(QFrame.StyledPanel)
        lay = QHBoxLayout(self)
        self.text = QLabel(wordWrap=True)
        lay.addWidget(self.text, 1)
        self.action = QPushButton("Download…")
        self.later = QPushButton("Not now")
        lay.addWidget(self.action)
        lay.addWidget(self.later)
        self.later.clicked.connect(self.dismiss)
        self.hide()
        self.worker = RuntimeWorker(self)
        self.worker.planned.connect(self._planned)
        self.gpu = None

    def check(self) -> None:
        """Decide whether to offer (a thread asks the index for the size; nothing shows if it cannot)."""
        cur = runtime.CURRENT
        if cur.state == "fallback":
            self.text.setText(f"<b>The GPU runtime was not used at this start.</b> {cur.message}")
            self.action.setText("Details…")
            self.show()
            return
        gpu, _ = find_nvidia()
        if gpu is None or cur.state == "active" or runtime.active_folder() is not None:
            return
        import torch

        if torch.version.cuda or QSettings("Mixdesk", "Mixdesk").value(DISMISSED, "") == gpu.name:
            return
        self.gpu = gpu
        self.worker.plan()

    def _planned(self, offer) -> None:
        self.text.setText(f"<b>Use your GPU ({self.gpu.describe().split(';')[0]}):</b> download the CUDA runtime "
                          f"({gb(offer.download_bytes - offer.already)}). Mixdesk runs on the CPU meanwhile.")
        self.action.setText("Download…")
        self.show()

    def dismiss(self) -> None:
        if self.gpu is not None:
            QSettings("Mixdesk", "Mixdesk").setValue(DISMISSED, self.gpu.name)
        self.hide()
