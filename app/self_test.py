"""`mixdesk --self-test`: checks a bundle or an install, headless, in seconds. It writes a tiny
random Mixtral to a temporary folder (never the install folder), loads it through the engine
thread, generates 8 tokens, prints what it found (torch, CUDA, NVML, Qt) and exits 0 on success."""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time


def _nvml() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return f"present ({n} device{'s' if n != 1 else ''})"
    except Exception as e:  # no driver: NVMLError_LibraryNotFound, or no package
        return f"absent ({type(e).__name__})"


def _qt() -> str:
    import os

    if sys.platform.startswith("linux") and not any(os.environ.get(v) for v in
                                                    ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # headless: Qt would abort the process without a display
    try:
        import PySide6
        from PySide6.QtWidgets import QApplication

        app = QApplication.instance() or QApplication(["mixdesk-self-test"])
        return f"PySide6 {PySide6.__version__}, platform {app.platformName()}"
    except Exception as e:
        return f"unavailable ({type(e).__name__}: {e})"


def run() -> int:
    t0 = time.perf_counter()
    import torch

    from engine.machine.devices import detect
    from engine.runtime.generate import SamplingParams
    from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded
    from engine.runtime.session import Session
    from engine.sources.tiny_model import write_tiny_mixtral

    from engine.tools.runtime import activate as runtime
    from engine.tools.runtime.gpu import find_nvidia
    from engine.tools.runtime.install import advice, build_name

    acc = detect()
    build = build_name(torch.version.cuda)
    source = "the GPU runtime" if runtime.CURRENT.state == "active" else (
        "the bundle" if getattr(sys, "frozen", False) else "this Python environment")
    print(f"torch {torch.__version__} ({build}) from {source}: {os.path.dirname(torch.__file__)}")
    print(f"CUDA {'available: ' + acc.name if acc.is_cuda else 'not available'}")
    if runtime.CURRENT.state != "none":
        print(runtime.CURRENT.message)
    print(f"NVML {_nvml()}")
    gpu, _ = find_nvidia()
    if gpu is not None and not torch.version.cuda:
        print(f"tip: {advice(gpu)}")
    from engine import native

    print(f"CPU expert kernel: {native.status()}")
    print(f"Qt {_qt()}")
    print(acc.describe())
    events, done = [], threading.Event()

    def emit(ev):
        events.append(ev)
        if isinstance(ev, (Loaded, Done, ErrorEvent)):
            done.set()

    with tempfile.TemporaryDirectory(prefix="mixdesk-self-test-") as tmp:
        os.environ.setdefault("XDG_CACHE_HOME", os.path.join(tmp, "cache"))  # keep the user's cache clean
        path = write_tiny_mixtral(os.path.join(tmp, "tiny"))
        s = Session(emit, poll_s=0.2).start()
        s.submit(Load(path=str(path), dtype="fp32"))
        ok = done.wait(300) and not any(isinstance(e, ErrorEvent) for e in events)
        if ok:
            done.clear()
            s.loaded.generator.eos_ids.clear()
            s.submit(Generate(prompt_ids=[5, 6, 7, 8], params=SamplingParams(max_new_tokens=8)))
            ok = done.wait(120)
        served = _serve_check(s) if ok else ""
        s.shutdown()
    fin = next((e for e in events if isinstance(e, Done)), None)
    errors = [e.message for e in events if isinstance(e, ErrorEvent)]
    if not ok or fin is None or len(fin.token_ids) != 8:
        print(f"SELF-TEST FAILED: {errors or 'no reply'}", file=sys.stderr)
        return 1
    print(f"generated {len(fin.token_ids)} tokens on the tiny test model ({fin.decode_tok_s:.0f} tok/s)")
    if not served.startswith("local server"):
        print(f"SELF-TEST FAILED: the local server: {served}", file=sys.stderr)
        return 1
    print(served)
    print(f"self-test passed in {time.perf_counter() - t0:.1f} s")
    return 0


def _serve_check(session) -> str:
    """The local server (mixdesk serve) answers GET /v1/models on loopback: its stack is there."""
    import http.client
    import json

    from engine.tools.serve import Server

    try:
        server = Server(session, "127.0.0.1", 0).start()
    except Exception as e:  # noqa: BLE001 - reported as the check's one line
        return f"could not start ({e})"
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/v1/models")
        ids = [m["id"] for m in json.loads(conn.getresponse().read())["data"]]
        return f"local server answered on {server.url}: {ids}"
    except OSError as e:
        import errno

        if e.errno in (errno.ENETUNREACH, errno.EADDRNOTAVAIL):  # a sandbox with its loopback down
            return f"local server: not checked, this machine's loopback is down ({e})"
        return f"did not answer ({e})"
    except Exception as e:  # noqa: BLE001
        return f"did not answer ({e})"
    finally:
        server.stop()
