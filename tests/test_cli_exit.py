"""Every command ends with its threads (issue 25): `mixdesk plan` on fresh user folders, on a busy
machine, printed its table and then died at exit with "terminate called without an active
exception" (exit 134). The engine thread was still inside the first calibration step (timing the
dense layers: 17-21 s on a busy machine) when Client.close gave up waiting after 10 s; the
interpreter's exit then killed it as it came back from a torch op (pthread_exit through a C++
noexcept frame: std::terminate). Client.close now waits for the engine thread and its helpers.

The slow step is reproduced here on the tiny model: the first calibration step is made to spend
SLOW_STEP_S inside torch ops (longer than the 10 s the old close waited), which made the old code
abort on most runs."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLOW_STEP_S = 12.0

# the command, with measure_dense_s (the first background calibration step) slowed down inside torch
# when MIXDESK_TEST_SLOW_STEP is set: a loop of matrix products, the GIL released most of the time
RUNNER = """
import os, sys, time
slow = float(os.environ.get("MIXDESK_TEST_SLOW_STEP", "0"))
if slow:
    import torch
    import engine.measures.inputs as inputs
    import threading
    import engine.runtime.client as client
    real = inputs.measure_dense_s
    begun = threading.Event()
    def measure_dense_s(*a, **k):
        begun.set()
        q, t0 = torch.randn(1, 8, 256, 64), time.perf_counter()
        while time.perf_counter() - t0 < slow:  # the op the engine thread was in when the tester's run aborted
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return real(*a, **k)
    inputs.measure_dense_s = measure_dense_s
    real_load = client.Client.load
    def load(self, *a, **k):  # the command goes on once the slow step runs: it ends inside it
        out = real_load(self, *a, **k)
        begun.wait(60)
        return out
    client.Client.load = load
if sys.argv[1] == "window":  # the desktop app, closed as soon as its first calibration step runs
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.store.chat_store import Store

    app = QApplication([])
    w = MainWindow(Store(os.path.join(os.getcwd(), "chats.sqlite3")), model=sys.argv[2], device="cpu", dtype="fp32")
    w.show()

    def close_when_calibrating():
        if w.progress.isVisible() and "in the background" in w.progress.format():
            print("closing while calibrating", flush=True)
            w.close()
            app.quit()
        else:
            QTimer.singleShot(50, close_when_calibrating)
    QTimer.singleShot(50, close_when_calibrating)
    sys.exit(app.exec())
from engine.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


def fresh_env(folder: Path, slow: float = 0.0) -> dict:
    """The user folders of a first start (platformdirs reads the XDG variables on Linux)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    for name in ("CACHE", "DATA", "STATE", "CONFIG"):
        env[f"XDG_{name}_HOME"] = str(folder / name.lower())
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if slow:
        env["MIXDESK_TEST_SLOW_STEP"] = str(slow)
    return env


def commands(model: Path) -> dict[str, list[str]]:
    m = ["--model", str(model), "--dtype", "fp32"]
    return {"plan": ["plan", *m],
            "chat": ["chat", *m, "--prompt", "hello", "--max-new-tokens", "4"],
            "bench": ["bench", *m, "--prompt-tokens", "8", "--new-tokens", "4", "--repeats", "1"],
            "eval": ["eval", *m, "--tokens", "32", "--new-tokens", "4"]}


def run(args: list[str], folder: Path, slow: float = 0.0, timeout: float = 600) -> subprocess.CompletedProcess:
    cwd = folder / "cwd"
    cwd.mkdir(parents=True)
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=cwd, env=fresh_env(folder, slow),
                          capture_output=True, text=True, timeout=timeout)


def test_each_command_exits_0_and_plan_writes_no_file_unasked(tiny, tmp_path):
    """plan here (chat, bench and eval: tests/test_cli.py, and the slow tests below)."""
    for name, args in [(n, a) for n, a in commands(tiny).items() if n == "plan"]:
        r = run(args, tmp_path / name)
        assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert "terminate called" not in r.stderr
        assert list((tmp_path / name / "cwd").iterdir()) == [], f"{name} wrote into the current folder"
        if name == "plan":  # after the first start's calibration: the measured profiles
            assert "tok/s (pred.)" in r.stdout and "profiles measured on this machine" in r.stdout
    # --png PATH writes the plot: tests/test_cli.py


@pytest.mark.slow  # 23 s; the default run keeps the quick test above (the 10 s wait it proves needs a 12 s step)
def test_a_command_ending_during_a_long_calibration_step_waits_for_it_and_exits_0(tiny, tmp_path):
    """chat --prompt on a first start: the reply comes, the command ends while the calibration's
    first step still runs (inside torch, for longer than the 10 s the old close waited)."""
    t0 = time.perf_counter()
    r = run(commands(tiny)["chat"] + ["--quiet"], tmp_path / "chat", slow=SLOW_STEP_S)
    took = time.perf_counter() - t0
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-2000:]}"
    assert "terminate called" not in r.stderr and r.stdout.strip()
    assert took > SLOW_STEP_S  # it waited for the step instead of leaving the thread inside it


def _busy_cores(n: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


@pytest.mark.slow
def test_twenty_plans_and_a_few_of_each_command_on_a_busy_machine_all_exit_0(tiny, tmp_path):
    """Must show (issue 25): 20 runs of `mixdesk plan` on fresh user folders while two other
    processes keep both cores busy all exit 0; likewise chat --prompt, bench and eval, 3 runs each.
    Each run's first calibration step lasts SLOW_STEP_S (as the demo's did on the tester's busy
    machine). Prints the exit codes and times."""
    busy = _busy_cores()
    results = []
    try:
        plan = commands(tiny)["plan"]
        others = [(name, args) for name, args in commands(tiny).items() if name != "plan"]
        runs = [("plan", plan)] * 20 + [item for item in others for _ in range(3)]
        for i, (name, args) in enumerate(runs):
            t0 = time.perf_counter()
            r = run(args, tmp_path / f"{i:02d}-{name}", slow=SLOW_STEP_S)
            results.append((name, r.returncode, time.perf_counter() - t0, "terminate called" in r.stderr))
            print(f"{name:5} exit {r.returncode:3}  {results[-1][2]:6.1f} s", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    for name in ("plan", "chat", "bench", "eval"):
        mine = [x for x in results if x[0] == name]
        print(f"{name}: {sum(rc == 0 for _, rc, _, _ in mine)}/{len(mine)} exit 0, "
              f"{sum(t for _, _, t, _ in mine):.0f} s in all")
    assert all(rc == 0 and not term for _, rc, _, term in results), results


@pytest.mark.slow  # 20 s: out of the default run (the commands' test above covers the same wait)
def test_the_window_closed_during_a_long_calibration_step_exits_0(tiny, tmp_path):
    """The window's exit path: closed while the first calibration step runs inside torch for longer
    than the 10 s its close used to wait, it waits for the step and the process exits 0."""
    pytest.importorskip("PySide6")
    t0 = time.perf_counter()
    env = {**fresh_env(tmp_path, SLOW_STEP_S), "QT_QPA_PLATFORM": "offscreen"}
    (tmp_path / "cwd").mkdir()
    r = subprocess.run([sys.executable, "-c", RUNNER, "window", str(tiny)], cwd=tmp_path / "cwd", env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-2000:]}"
    assert "closing while calibrating" in r.stdout and "terminate called" not in r.stderr
    assert time.perf_counter() - t0 > SLOW_STEP_S
