"""The gpu-tests stage: `pytest -m gpu tests/test_gpu.py tests/test_torch_dequant.py` (CUDA parity of
the 16-bit tiers against transformers, the copy path, the budgeted auto placement, bf16 generation,
another process taking VRAM; a GGUF expert's file rows dequantised on the GPU for a prefill), in a
process of its own, its summary and the tail of its output kept.

Also a pytest plugin (`-p benchmarks.gpu_check_tests`) for the device image, which has no PySide6:
tests/conftest.py's autouse fixture imports app.window_state (a Qt module) after every test, so each
test there would pass and then error at teardown. Where PySide6 is missing the plugin puts a
stand-in for app.window_state, whose only use in that fixture is forget(), in sys.modules first.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")


def pyside_missing() -> bool:
    return importlib.util.find_spec("PySide6") is None


def pytest_configure(config) -> None:  # the plugin's one hook
    if pyside_missing() and "app.window_state" not in sys.modules:
        stand_in = types.ModuleType("app.window_state")
        stand_in.forget = lambda: None
        sys.modules["app.window_state"] = stand_in


def summary(text: str) -> dict:
    """Counts from pytest's closing line ('3 passed, 1 failed in 4.2s')."""
    lines = [ln for ln in text.strip().splitlines() if COUNTS.search(ln)]
    if not lines:
        return {}
    counts = {("errors" if k.startswith("error") else k): int(n) for n, k in COUNTS.findall(lines[-1])}
    return {"line": lines[-1].strip("= "), **counts}


def run(ctx) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfEs", "-p", "no:cacheprovider",
           "-p", "benchmarks.gpu_check_tests", str(ROOT / "tests" / "test_gpu.py"),
           str(ROOT / "tests" / "test_torch_dequant.py")]
    t0 = time.time()
    out = {"command": "python " + " ".join(cmd[1:]), "window_state_stand_in": pyside_missing()}
    # its own process group, so that a timeout ends the tests' own children too (the VRAM hog)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                         start_new_session=True)
    try:
        # the stage's limit less a margin, so that its result is recorded before the parent's kill
        text, _ = p.communicate(timeout=max(ctx.left() - 5, 5))
        out.update(rc=p.returncode, **summary(text))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        out.update(rc=None, timed_out=True)
    out["seconds"] = round(time.time() - t0, 1)
    out["tail"] = text[-4000:]
    ctx.emit("gpu_tests", out)
    return out
