"""The GPU validation run (issues 9 and 30), one command on a lent device:

    python benchmarks/gpu_check.py --out "$OUT"            # on the device (scripts/device_check.sh)
    python benchmarks/gpu_check.py --out /tmp/g --small    # the CPU rehearsal of every stage (tests/test_gpu_check.py)
    python benchmarks/gpu_check.py --smoke                 # the same rehearsal, its report in MIXDESK_BENCH_RESULTS

Stages, most telling first, each in benchmarks/gpu_check_<concept>.py:
  machine       the CPU (model, AVX-512/AMX), the native kernels' path, the GPU, the hardware profile
  native        CUDA experts beside native CPU experts in one decode step: parity, routes
  gpu_tests     pytest -m gpu tests/test_gpu.py tests/test_torch_dequant.py
  mixtral_24gb  Mixtral-8x7B shape on a 24 GB card: slider sweep, predictions, bandwidth bound, peaks
  budget_drop   the VRAM budget falls from 24 to 12 GB mid-reply, through the engine thread
  qwen3_24gb    Qwen3-30B-A3B shape (48 x 128 small experts, top-8) on the 24 GB card: the sweep
  batched       1 and 4 streams decoding together on that model, with GPU experts
  gguf          a Q4_K_M GGUF (the Qwen3 shape cut to 2 layers) with experts on both sides; a CPU expert's
                file rows copied to the GPU and dequantised there for a prefill, timed against the CPU
  mixtral_12gb, qwen3_12gb   both shapes on a 12 GB card
Every model is synthetic (engine/sources/synthetic.py): weights made on demand by name, never written.

How it runs: this process only plans and records. Consecutive stages on the same card run in one
child process (`--child`), which emulates the card (gpu_check_memory.emulate_card: a per-process
setting) and lets a stage hand its loaded model to the next (the Qwen3 sweep to batched decode).
The child reports each result as it comes (a status file this process polls); the report in OUT is
rewritten on each (gpu_check_report.py). Each stage has a time budget: the child stops a sweep
early as its budget nears, this process kills a child whose stage overruns it, or that crashes,
and starts the group's remaining stages in a new child. The run as a whole stops at --budget-s,
skipping the stages it no longer has time for, so a kill from outside still finds every result
that was reached.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# run as a script, this folder would come first on the path, and its kernels.py would then stand in
# for the `kernels` package that bitsandbytes looks for: only the repository root goes on it
if sys.path and Path(sys.path[0]).resolve() == HERE:
    sys.path.pop(0)
sys.path.insert(0, str(ROOT))
from benchmarks.gpu_check_context import Context, Skip
from benchmarks.gpu_check_report import Report

RESERVE_S = 8   # the end of the run kept for the last report
GRACE_S = 10    # past a stage's budget before its child is killed (it stops itself at the budget)...
KILL_AT_S = 3   # ...or this long before the run's end, whichever comes first
MIN_START_S = 5  # the rehearsal's need_s: its stages take seconds


def _sweep(key: str, model: str, card: str, settings: str, keep: bool = False):
    def run(ctx):
        from benchmarks import gpu_check_sweep

        return gpu_check_sweep.run(ctx, key, model, getattr(ctx.opts, card), getattr(ctx.opts, settings), keep)
    return run


def _module(name: str):
    def run(ctx):
        import importlib

        return importlib.import_module(f"benchmarks.gpu_check_{name}").run(ctx)
    return run


@dataclass(frozen=True)
class Stage:
    name: str
    card: str | None  # the option holding its card's size ("card_gb", "drop_to_gb"), or None: the whole device
    budget_s: int     # its limit on the device
    need_s: int       # the least time on the device in which it shows anything (else it is not started)
    small_s: int      # its limit in the rehearsal
    estimate: str     # expected on the H200 (16 cores, 128 GB RAM), and what it is made of
    run: Callable = field(compare=False)


# The estimates assume what such hosts show (the first device run replaces them with its figures):
# pageable copies GPU<->host ~15 GB/s; the native cpu-4 quantiser ~0.4 s per Mixtral expert on 16
# threads (3.2 s measured on 2 cores: 55 M parameters/s); synthetic weights made on the GPU at well
# under 1 ms a matrix; the placements the planner chose here for each shape and card with the
# reference GPU's assumed costs (engine/measures/inputs.py REFERENCE_GPU). They add up to ~600 s, past
# the run's 510: the 12 GB stages, last, are the ones a first run leaves out (scripts/device_check.sh
# says how to run them after).
STAGES = [
    Stage("machine", None, 60, 20, 60, "25 s: start and CUDA ~5 s; the hardware profile (4 tiers, 2 sizes, batch "
          "scaling to 256 tokens; 9 s for the CPU tiers alone on 2 cores) ~15 s", _module("machine")),
    Stage("native", None, 30, 10, 30, "10 s: a 4-layer 256-wide model built 3 times, 40 forwards", _module("native")),
    Stage("gpu_tests", None, 120, 40, 60, "60 s: pytest start ~10 s; tiny-model parity; the VRAM-hog test loads a "
          "4-layer 1024-wide model through the session and waits up to 15 s", _module("tests")),
    Stage("mixtral_24gb", "card_gb", 180, 90, 60, "170 s: load at slider 0 ~45 s (256 experts made on the GPU, "
          "90 GB through the host ~6 s, ~70 cpu-4 experts quantised ~30 s, ~185 gpu-4); inputs ~15 s (256-token "
          "capture, 128 timed steps, 4 prefills); 4 settings fastest first, the middle ones quantising ~70 more "
          "cpu-4 experts (~30 s each), each a 128-token prefill ~3 s and 24 tokens at 1-10 tok/s: the budget may "
          "end it before slider 1", _sweep("mixtral_24gb", "mixtral", "card_gb", "settings")),
    Stage("budget_drop", "card_gb", 100, 45, 60, "60 s: load at slider 1 from the sweep's profile (16-bit only, "
          "nothing quantised; ~72 GB through the host ~15 s); 40 tokens at ~2 tok/s; ~10 GB of experts moved "
          "off the GPU at the drop", _module("drop")),
    Stage("qwen3_24gb", "card_gb", 110, 50, 60, "100 s: load at slider 0 (6,144 experts of 9.4 MB, ~5,800 of "
          "them gpu-4) ~25 s; inputs ~10 s; slider 0.5 quantises ~3,900 cpu-4 experts (18 G parameters) ~40 s; "
          "slider 1 copies them to cpu-16 ~15 s", _sweep("qwen3_24gb", "qwen3", "card_gb", "settings_other", keep=True)),
    Stage("batched", "card_gb", 40, 10, 30, "20 s: 1 and 4 streams x 24 tokens at 10-20 tok/s a stream", _module("batched")),
    Stage("gguf", "card_gb", 75, 35, 60, "45 s: 1.9 G parameters written as bf16 safetensors ~10 s, quantised to "
          "Q4_K_M ~10 s (1 GB); loading dequantises the GPU tiers in numpy (~60 M params/s) ~15 s",
          _module("gguf")),
    Stage("mixtral_12gb", "drop_to_gb", 120, 80, 60, "100 s: as at 24 GB, but ~175 cpu-4 experts to quantise "
          "(~70 s); 2 settings", _sweep("mixtral_12gb", "mixtral", "drop_to_gb", "settings_12gb")),
    Stage("qwen3_12gb", "drop_to_gb", 80, 50, 60, "60 s: as at 24 GB, 2 settings",
          _sweep("qwen3_12gb", "qwen3", "drop_to_gb", "settings_12gb")),
]
BY_NAME = {s.name: s for s in STAGES}


def options(a) -> argparse.Namespace:
    """The run's sizes: the device's, or the rehearsal's (--small) where not given."""
    small = a.small
    return argparse.Namespace(
        card_gb=a.vram_cap, drop_to_gb=a.drop_to, settings=a.settings, settings_other=3, settings_12gb=2,
        prompt_tokens=a.prompt_tokens or (32 if small else 128), new_tokens=a.new_tokens or (16 if small else 24),
        calib_tokens=64 if small else 256, drop_at=16, drop_tokens=48 if small else 40,
        bandwidth_mib=256 if small else 1024)  # read-bandwidth buffers: past the caches either way


def limit_s(stage: Stage, small: bool) -> int:
    return stage.small_s if small else stage.budget_s


def need_s(stage: Stage, small: bool) -> int:
    return MIN_START_S if small else stage.need_s


# ---- the child: one group's stages, in order ----------------------------------------------------

def child(a) -> None:
    faulthandler.enable()  # a crash in native code still leaves a Python traceback in the log
    from benchmarks.gpu_check_memory import emulate_card

    ctx = Context(a.small, Path(a.work), options(a), Path(a.status), (a.run_stages or "").split(","))
    names = a.stages.split(",")
    card = BY_NAME[names[0]].card
    ctx.card = emulate_card(getattr(ctx.opts, card) if card else None)
    for name in names:
        stage, now = BY_NAME[name], time.time()
        ends = min(now + limit_s(stage, a.small), a.deadline - RESERVE_S)
        if ends - now < need_s(stage, a.small):
            ctx.mark(name, status="skipped", why=f"{ends - now:.0f} s left of the run; it needs about {need_s(stage, a.small)} s")
            continue
        ctx.deadline = ends
        ctx.mark(name, status="running", started=now)
        try:
            stage.run(ctx)
            ctx.mark(name, status="ok", seconds=round(time.time() - now, 1))
        except Skip as e:
            ctx.mark(name, status="skipped", why=str(e), seconds=round(time.time() - now, 1))
        except Exception as e:  # noqa: BLE001 - one stage's failure is its result; the next one runs
            ctx.results[name] = {**(ctx.results.get(name) or {}), "error": f"{type(e).__name__}: {e}",
                                 "traceback": traceback.format_exc()[-3000:]}
            ctx.mark(name, status="error", seconds=round(time.time() - now, 1))
            print(traceback.format_exc(), file=sys.stderr, flush=True)


# ---- the parent -----------------------------------------------------------------------------------

def groups(stages: list[Stage]) -> list[list[Stage]]:
    out: list[list[Stage]] = []
    for s in stages:
        if out and out[-1][-1].card == s.card:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_child(group: list[Stage], a, report: Report, work: Path, deadline: float) -> list[Stage]:
    """Run the group's stages in one child; returns those it did not reach (after a kill or a crash)."""
    status = work / f"status-{group[0].name}.json"
    status.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--stages", ",".join(s.name for s in group),
           "--status", str(status), "--work", str(work), "--deadline", str(deadline), "--out", a.out,
           "--run-stages", ",".join(s.name for s in wanted(a)),
           "--vram-cap", str(a.vram_cap), "--drop-to", str(a.drop_to), "--settings", str(a.settings)]
    cmd += ["--small"] * a.small + [f"--{k}={v}" for k, v in (("prompt-tokens", a.prompt_tokens),
                                                               ("new-tokens", a.new_tokens)) if v]
    p = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)  # its own group: a kill ends all it started
    killed = None
    while True:
        rc = p.poll()
        st = read_status(status)
        report.update(st.get("results"), st.get("stages"))
        running = [n for n, s in st.get("stages", {}).items() if s.get("status") == "running"]
        if rc is not None:
            break
        if running:
            started = st["stages"][running[0]]["started"]
            ends = min(started + limit_s(BY_NAME[running[0]], a.small), deadline - RESERVE_S)
            if time.time() > min(ends + GRACE_S, deadline - KILL_AT_S):
                killed = running[0]
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                break
        time.sleep(0.2)
    st = read_status(status)
    report.update(st.get("results"), st.get("stages"))
    ended = {n for n, s in st.get("stages", {}).items() if s.get("status") in ("ok", "error", "skipped")}
    for n in [n for n, s in st.get("stages", {}).items() if s.get("status") == "running"]:
        why = "timed out: killed past its budget" if n == killed else f"crashed: the child ended with {p.returncode}"
        report.update(stages={n: {"status": why, "seconds": round(time.time() - st["stages"][n]["started"], 1)}})
        ended.add(n)
    remaining = [s for s in group if s.name not in ended]
    if not ended and remaining:  # it ended before its first stage began: that stage is not retried
        report.update(stages={remaining[0].name: {"status": f"not started: the child ended with {p.returncode}"}})
        remaining = remaining[1:]
    return remaining


def wanted(a) -> list[Stage]:
    return [s for s in STAGES if (not a.only or s.name in a.only.split(",")) and not (a.skip_tests and s.name == "gpu_tests")]


def header(a) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=ROOT,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python " + " ".join(sys.argv), "small": a.small,
            "budget_s": a.budget_s, "commit": commit}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="the report's folder (required; with --smoke the default is "
                    "benchmarks/common.py RESULTS: MIXDESK_BENCH_RESULTS)")
    ap.add_argument("--small", action="store_true", help="rehearse every stage on tiny shapes (any machine)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    ap.add_argument("--budget-s", type=float, default=None, help="the whole run's time (default 510 s; 300 with --small)")
    ap.add_argument("--only", default="", help="comma-separated stages to run (default: all)")
    ap.add_argument("--skip-tests", action="store_true", help="leave out the gpu_tests stage")
    ap.add_argument("--vram-cap", type=float, default=24.0, help="the card of the 24 GB stages, GB")
    ap.add_argument("--drop-to", type=float, default=12.0, help="the card the budget drops to, and of the 12 GB stages")
    ap.add_argument("--settings", type=int, default=4, help="slider settings of the Mixtral 24 GB sweep")
    ap.add_argument("--new-tokens", type=int, default=0)
    ap.add_argument("--prompt-tokens", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stages", help=argparse.SUPPRESS)
    ap.add_argument("--status", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--run-stages", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.smoke:
        a.small = True
        if a.out is None:
            from benchmarks.common import RESULTS

            a.out = str(RESULTS)
    if a.out is None:
        ap.error("the following arguments are required: --out")
    if a.child:
        return child(a)
    a.budget_s = a.budget_s or (300.0 if a.small else 510.0)
    deadline = time.time() + a.budget_s
    report = Report(Path(a.out), header(a))
    report.update(stages={s.name: {"status": "waiting", "budget_s": limit_s(s, a.small), "estimate": s.estimate}
                          for s in wanted(a)})
    work = Path(tempfile.mkdtemp(prefix="mixdesk-gpu-check-"))
    try:
        for group in groups(wanted(a)):
            while group and deadline - time.time() > RESERVE_S + need_s(group[0], a.small):
                group = run_child(group, a, report, work, deadline)
            report.update(stages={s.name: {"status": "skipped", "why": "the run's budget was spent"} for s in group})
            report.plot()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        report.update()
    print(f"report: {report.json_path}, {report.md_path}", flush=True)


if __name__ == "__main__":
    main()
