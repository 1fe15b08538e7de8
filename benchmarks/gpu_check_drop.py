"""The budget-drop stage: the VRAM budget falls from a 24 GB card's to a 12 GB card's in the middle
of a reply, through the engine thread (engine/runtime/session.py: the path a game taking VRAM takes, there
through the monitor's readings, here through SetBudgets), on the Mixtral-8x7B shape at slider 1.

Each Token event is heard on the engine thread, where the bytes the placement holds in the pool
(controller.held) are read at that moment, with torch's allocated bytes beside them: one reading
per decode step. The drop is sent from the listener of token `drop_at`, so it lands between two
steps whatever the model's speed (the rehearsal's decodes thousands of tokens a second).

What is checked (DESIGN.md's invariants): held is above the new budget for at most one decode step
after the drop; every token of the reply arrives (the Token events, the Done's token list and the
tokens asked for agree); no error. The model plans from the profile the Mixtral sweep saved when it
ran; otherwise from a uniform one whose dense timings are estimated from the tier costs (what the
engine assumes before it has measured; this stage checks memory, not speed).
"""
from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace

import torch

from benchmarks import gpu_check_shapes as shapes

GB = 10**9


def ensure_profile(folder) -> str:
    """A profile with dense timings for this device, so loading does not stop to measure them."""
    from engine.native.dense_linear import auto_dtype
    from engine.measures.hardware import load_or_measure
    from engine.measures.inputs import dense_bytes_of
    from engine.measures.profile import (
        cached_profile,
        dense_timings,
        save_dense_timings,
        uniform_profile,
    )
    from engine.sources.synthetic import SyntheticCheckpoint

    ck = SyntheticCheckpoint(folder)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = auto_dtype(dev)
    mp = cached_profile(ck)
    if mp is not None and dense_timings(mp, dev, dtype) is not None:
        return "the Mixtral sweep's (measured popularity and dense timings)"
    hw = load_or_measure(dev)
    fixed, per_byte = hw.tier_costs["gpu-16" if dev.type == "cuda" else "cpu-16"]
    step = dense_bytes_of(ck.dims, dtype) * per_byte + ck.dims.layers * fixed
    mp = uniform_profile(SimpleNamespace(dims=ck.dims, ckpt=ck, dtype=dtype))  # what it reads of a model
    save_dense_timings(mp, folder, dev, dtype, (step, step / 8))
    return "uniform, dense timings estimated from the tier costs (the sweep did not run first)"


class Listener:
    """The session's events; per token, the reading described in the docstring."""

    def __init__(self, pool: int, drop_at: int, on_drop):
        self.pool, self.drop_at, self.on_drop = pool, drop_at, on_drop
        self.session = None
        self.events, self.readings = [], []  # readings: (seconds, token index, held bytes, allocated bytes)
        self.loaded, self.done = threading.Event(), threading.Event()
        self.t0 = None
        self.dropped_at = None  # (seconds, token index)

    def __call__(self, ev) -> None:
        from engine.protocol import Done, ErrorEvent, Loaded, Token

        self.events.append(ev)
        if isinstance(ev, (Loaded, ErrorEvent)):
            self.loaded.set()
        if isinstance(ev, Token) and ev.token_id >= 0 and self.t0 is not None:
            now = time.perf_counter() - self.t0
            allocated = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
            self.readings.append((now, ev.index, self.session.controller.held[self.pool], allocated))
            if ev.index == self.drop_at:
                self.dropped_at = (now, ev.index)
                self.on_drop()
        if isinstance(ev, (Done, ErrorEvent)) and self.t0 is not None:
            self.done.set()


def run(ctx) -> dict:
    from engine.runtime.generate import SamplingParams
    from engine.protocol import Done, ErrorEvent, Generate, Load, SetBudgets
    from engine.runtime.session import Session

    cuda = torch.cuda.is_available()
    o = ctx.opts
    folder = shapes.synthetic(ctx.work, "mixtral", ctx.small)
    pool_name, before, after = shapes.drop_budgets("mixtral", ctx.small, o.card_gb, o.drop_to_gb)
    pool = 0 if pool_name == "vram" else 1
    res = {"model": shapes.label("mixtral", ctx.small), "card": ctx.card, "pool": pool_name,
           "budget_before_gb": round(before / GB, 3), "budget_after_gb": round(after / GB, 3),
           "profile": ensure_profile(folder)}
    budget = (lambda b: SetBudgets(vram=b)) if cuda else (lambda b: SetBudgets(ram=b))
    ear = Listener(pool, o.drop_at, lambda: ear.session.submit(budget(after)))
    s = ear.session = Session(ear, poll_s=0.1, slider=1.0).start()
    try:
        t0 = time.perf_counter()
        s.submit(budget(before))
        s.submit(Load(path=str(folder), device=None if cuda else "cpu", ctx=o.prompt_tokens + o.drop_tokens + 16))
        ear.loaded.wait(max(ctx.left() - 10, 1))
        errors = [e.message for e in ear.events if isinstance(e, ErrorEvent)]
        if errors or s.loaded is None:
            res["error"] = errors or ["the model did not load within the stage's budget"]
            return res
        res["load_s"] = round(time.perf_counter() - t0, 1)
        while s.controller.migrating and ctx.left() > 20:  # a plan from the profile may still be moving
            time.sleep(0.1)
        res["settle_s"] = round(time.perf_counter() - t0 - res["load_s"], 1)
        res["placement_before"] = s.loaded.model.placement.summary()
        ctx.emit("budget_drop", res)
        s.loaded.generator.eos_ids.clear()  # random weights: the reply runs to its length
        ear.t0 = time.perf_counter()
        s.submit(Generate(prompt_ids=list(range(3, 3 + o.prompt_tokens)), params=SamplingParams(max_new_tokens=o.drop_tokens)))
        if not ear.done.wait(max(ctx.left() - 5, 1)):
            res["error"] = ["the reply did not finish within the stage's budget"]
        res.update(verdict(ear, after, o.drop_tokens, [e for e in ear.events if isinstance(e, Done)]))
        res["placement_after"] = s.loaded.model.placement.summary() if s.loaded is not None else None
        res["errors"] = [e.message for e in ear.events if isinstance(e, ErrorEvent)]
    finally:
        res["shutdown_clean"] = s.shutdown(timeout=30)
        ctx.emit("budget_drop", res)
    return res


def verdict(ear: Listener, after: int, asked: int, done: list) -> dict:
    r = ear.readings
    if not r:
        return {"tokens": 0}
    over = [x for x in r if ear.dropped_at and x[1] > ear.dropped_at[1] and x[2] > after]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(r)]
    finished = len(done[-1].token_ids) if done else None
    keep = max(len(r) // 200, 1)
    return {"tokens_asked": asked, "tokens": len(r), "finished_tokens": finished,
            "no_token_lost": finished == len(r) == asked,
            "dropped_at_s": round(ear.dropped_at[0], 3) if ear.dropped_at else None,
            "dropped_after_token": ear.dropped_at[1] if ear.dropped_at else None,
            "held_before_gb": round(r[0][2] / GB, 3), "held_after_gb": round(r[-1][2] / GB, 3),
            "steps_over_new_budget": len(over), "within_one_step": len(over) <= 1,
            "within_new_budget_at_end": r[-1][2] <= after,
            "median_gap_s": round(sorted(gaps)[len(gaps) // 2], 4) if gaps else None,
            "max_gap_s": round(max(gaps), 4) if gaps else None,
            # (seconds, token, held GB, allocated GB), at most 200 points
            "timeline": [(round(t, 3), i, round(h / GB, 3), round(a / GB, 3)) for t, i, h, a in r[::keep]]}
