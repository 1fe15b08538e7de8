"""Migration while generating, across a full slider sweep (CPU).

    python benchmarks/migration.py [--model PATH] [--tokens 600] [--smoke]

A long greedy generation runs on the engine thread while the slider sweeps 1 -> 0 -> 1 in steps.
Printed: the longest single decode-step stall, the bytes moved (new forms built) and the tiers they
went to, the migration bandwidth achieved (bytes built / seconds spent building them, and / wall
time from the first placement change to the last move), next to the re-quantisation / copy
bandwidth of building one expert of each tier in a loop, measured in the same run; and, for scale,
the longest gap of the same generation with no slider move (on this shared 2-core machine the steps
alone jitter 1.5-1.8x). --model: a GGUF file or model folder (default: the demo); a Q4_K_M file's
fast end moves experts to cpu-3 / cpu-2. The model's first start (measuring the machine,
calibrating) is waited for first: before it the slider trades nothing, and a sweep moved no expert.
--smoke (or --quick): the smallest run through every stage (a test runs it): 120 tokens, 4 slider steps,
recorded where MIXDESK_BENCH_RESULTS says (the test's temporary folder).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a GGUF file or model folder (default: the demo)")
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--smoke", "--quick", dest="quick", action="store_true",
                    help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    n_new = 120 if a.quick else a.tokens

    from engine.sources.demo import demo_dir
    from engine.experts.build import materialise
    from engine.runtime.generate import SamplingParams
    from engine.placement import Tier
    from engine.protocol import Done, Generate, Load, Loaded, MigrationProgress, PlacementChanged, SetSlider, Token
    from engine.runtime.session import Session

    events, lock = [], threading.Lock()
    done = threading.Event()

    def emit(ev):
        with lock:
            events.append((time.perf_counter(), ev))
        if isinstance(ev, (Loaded, Done)):
            done.set()

    s = Session(emit).start()
    s.submit(Load(path=a.model or str(demo_dir()), device="cpu"))
    if not done.wait(1800) or s.loaded is None:
        sys.exit(f"the model did not load: {[e for _, e in events][-3:]}")
    done.clear()
    s.loaded.generator.eos_ids.clear()
    t0 = time.perf_counter()
    while s.controller.calibrating:  # the first start: until it ends, the slider has nothing to trade
        time.sleep(0.5)
    print(f"first start measured in {time.perf_counter() - t0:.0f} s" if time.perf_counter() - t0 > 1 else
          "profile: measured before", flush=True)
    s.submit(SetSlider(value=1.0))
    time.sleep(1.0)
    while s.controller.migrating:
        time.sleep(0.1)
    with lock:
        events.clear()
    s.submit(Generate(prompt_ids=list(range(100, 132)), params=SamplingParams(max_new_tokens=n_new)))
    n = 4 if a.quick else 10
    sweep = [i / n for i in range(n, -1, -1)] + [i / n for i in range(1, n + 1)]
    time.sleep(0.5)
    for v in sweep:
        s.submit(SetSlider(value=v))
        time.sleep(0.6)
    done.wait(600)
    while s.controller.migrating:
        time.sleep(0.1)
    with lock:
        ev = list(events)
        events.clear()
    # baseline: the same generation with no slider move (the machine's own step-to-step jitter)
    done.clear()
    s.submit(Generate(prompt_ids=list(range(100, 132)), params=SamplingParams(max_new_tokens=n_new)))
    done.wait(600)
    with lock:
        quiet = [(t, e) for t, e in events if isinstance(e, Token)]
    q_times = [t for t, _ in quiet]
    q_steps = [e.seconds for _, e in quiet if e.index > 0]
    q_stall = max(b - a for a, b in zip(q_times, q_times[1:]))
    moves = [e for _, e in ev if isinstance(e, MigrationProgress)]
    if not moves:
        s.shutdown()
        sys.exit("the sweep moved no expert: this model's slider trades nothing on this machine "
                 "(`mixdesk plan` shows its frontier)")
    # reference: build one expert of each tier the moves went to, in a loop
    ck, model = s.loaded.ckpt, s.loaded.model
    ref = {}
    for tier in sorted({Tier(m.last_tier) for m in moves}, key=lambda t: t.value):
        t0 = time.perf_counter()
        n, nbytes = 0, 0
        while time.perf_counter() - t0 < 2.0:
            nbytes += materialise(ck, n % ck.dims.layers, 0, tier, model.accel, model.dtype).nbytes
            n += 1
        ref[tier.value] = nbytes / (time.perf_counter() - t0)
    s.shutdown()
    changes = [(t, e) for t, e in ev if isinstance(e, PlacementChanged)]
    tokens = [e for _, e in ev if isinstance(e, Token)]
    steps = [e.seconds for e in tokens if e.index > 0]
    times = [t for t, e in ev if isinstance(e, Token)]
    stall = max(b - a for a, b in zip(times, times[1:]))  # longest gap between tokens, as a user sees it
    # MigrationProgress counters restart at each re-plan: sum the last report of each run
    runs, last = [], None
    for m in moves:
        if last is not None and m.done <= last.done:
            runs.append(last)
        last = m
    if last is not None:
        runs.append(last)
    built = sum(r.bytes_moved for r in runs)
    busy = sum(r.seconds for r in runs)
    t_moves = [t for t, e in ev if isinstance(e, MigrationProgress)]
    wall = (t_moves[-1] - changes[0][0]) if t_moves and changes else float("nan")
    ideal = sum(m.last_bytes / ref[m.last_tier] for m in moves)  # the same moves at the loop's speed
    into = {}
    for m in moves:
        into[m.last_tier] = into.get(m.last_tier, 0) + 1
    name = Path(a.model).name if a.model else "demo"
    rows = [
        f"- slider sweep 1 -> 0 -> 1 in {len(sweep)} steps during a {len(tokens)}-token greedy generation ({name}, CPU)",
        f"- placement changes: {len(changes)}; expert moves: {sum(r.done for r in runs)} (into "
        + ", ".join(f"{t}: {c}" for t, c in sorted(into.items())) + ")",
        f"- longest gap between two tokens: **{stall * 1e3:.0f} ms**, median decode step {statistics.median(steps) * 1e3:.1f} ms: "
        f"**{stall / statistics.median(steps):.1f}x** the median step (target <= 2x); the same generation with no "
        f"slider move: {q_stall * 1e3:.0f} ms, median {statistics.median(q_steps) * 1e3:.1f} ms: "
        f"{q_stall / statistics.median(q_steps):.1f}x (this machine's own jitter)",
        f"- bytes moved (new forms built): {built / 2**20:.0f} MiB",
        f"- migration bandwidth while building: **{built / busy / 1e6:.0f} MB/s**; over the wall time of the sweep "
        f"{built / wall / 1e6:.0f} MB/s (generation shares the 2 cores)",
        "- reference, one expert built in a loop: " + ", ".join(f"{t} {b / 1e6:.0f} MB/s" for t, b in ref.items())
        + f"; the same moves at those speeds would take {ideal:.2f} s, they took {busy:.2f} s: "
        f"**{ideal / busy:.0%}** of the reference bandwidth (target >= 50%)",
    ]
    table = "\n".join(rows)
    print(table)
    figures = {"stall_s": stall, "median_step_s": statistics.median(steps), "quiet_stall_s": q_stall,
               "quiet_median_step_s": statistics.median(q_steps), "bytes": built, "busy_s": busy, "wall_s": wall,
               "ref_bytes_per_s": ref, "moves_into": into, "model": name}
    # a smoke run's record goes to a temporary folder (benchmarks/common.py: RESULTS)
    print(f"recorded {record('migration' if not a.model else f'migration-{Path(a.model).stem}', figures, table)}")


if __name__ == "__main__":
    main()
