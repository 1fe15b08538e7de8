"""The batched stage: 1 and 4 requests decoding together, on the Qwen3-30B-A3B shape under the
24 GB card with experts on the GPU, as the Qwen3 sweep before it left the model (its last setting;
loaded afresh at the fastest setting where the sweep did not run in this process).

A decode step of B requests is one forward of B tokens, each at its own position in its own KV
cache (engine/runtime/scheduler.py): the dense weights, and every expert any of the B tokens chose, are
read once for all of them. The engine's Scheduler is driven here as the engine thread drives it
(admit, then step), without the session around it, so no migration moves the placement measured.

Per stream count: aggregate decode tok/s (the tokens decoded after the last request's first token,
over the time from that token to the last one, as benchmarks/concurrent_streams.py counts), per-
stream tok/s (one over each request's median gap between tokens, the slowest request's), and the
planner's predicted aggregate (its cost model of batched decode, PlanInputs.streams).
"""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import replace

import torch

GB = 10**9


def one_round(sched, n: int, prompt_tokens: int, new_tokens: int, vocab: int, deadline) -> dict:
    from engine.runtime.generate import Done, SamplingParams, Token
    from engine.protocol import ErrorEvent, Generate

    times = {i: [] for i in range(n)}
    ended, errors = set(), []

    def reply(i):
        def hear(ev):
            if isinstance(ev, Token) and ev.token_id >= 0:
                times[i].append(time.perf_counter())
            elif isinstance(ev, (Done, ErrorEvent)):
                ended.add(i)
                if isinstance(ev, ErrorEvent):
                    errors.append(ev.message)
        return hear

    g = torch.Generator().manual_seed(100 + n)
    for i in range(n):  # a prompt of its own each: no request reuses another's cached prefix
        ids = torch.randint(3, vocab, (prompt_tokens,), generator=g).tolist()
        sched.enqueue(sched.new(Generate(prompt_ids=ids, slot="pool", params=SamplingParams(max_new_tokens=new_tokens)),
                                reply(i)))
    while len(ended) < n and deadline() > 0:
        sched.admit()
        sched.step()
    if len(ended) < n:
        sched.stop()
        while sched.busy:
            sched.step()
    start = max(ts[0] for ts in times.values() if ts) if all(times.values()) else None
    end = max(ts[-1] for ts in times.values() if ts) if start else None
    decoded = sum(sum(1 for t in ts if t > start) for ts in times.values()) if start else 0
    gaps = [statistics.median([b - a for a, b in itertools.pairwise(ts[1:])]) for ts in times.values() if len(ts) > 2]
    return {"streams": n, "tokens": [len(ts) for ts in times.values()], "errors": errors,
            "aggregate_tok_s": round(decoded / (end - start), 2) if start and end > start else None,
            "per_stream_tok_s": round(1 / max(gaps), 2) if gaps else None,
            "finished": len(ended) == n and not errors}


def run(ctx, streams=(1, 4)) -> dict:
    from benchmarks import gpu_check_sweep as sweep
    from engine.planning.planner import decode_tok_s
    from engine.runtime.scheduler import Scheduler

    o = ctx.opts
    kept = ctx.keep.pop("qwen3", None)
    how = "the Qwen3 sweep's model, at its last setting"
    if kept is None and "qwen3_24gb" in ctx.run_stages:
        from benchmarks.gpu_check_context import (
            Skip,  # a sweep that failed to leave a model would fail here too
        )

        raise Skip("the Qwen3 sweep of this run left no model (it did not end in this process)")
    if kept is None:
        from benchmarks import gpu_check_shapes as shapes
        from engine.runtime.load import load

        budgets, _ = shapes.budgets("qwen3", o.card_gb, ctx.small)
        dev = None if torch.cuda.is_available() else "cpu"
        ld = load(shapes.synthetic(ctx.work, "qwen3", ctx.small), "auto", dev, budgets=budgets, slider=0.0,
                  ctx=o.prompt_tokens + o.new_tokens + 16)
        kept = (ld, sweep.measured_inputs(ld, o.prompt_tokens, o.calib_tokens)[0])
        how = "loaded here at the fastest setting (the sweep did not run in this process)"
    loaded, inp = kept
    loaded.generator.eos_ids.clear()
    res = {"model": how, "tiers": {t.value: c for t, c in loaded.model.placement.counts().items() if c}, "rows": []}
    sched = Scheduler(max_streams=max(streams))
    sched.attach(loaded.generator)
    try:
        for n in streams:
            if ctx.left() < 5:
                res["not_run"] = {"streams": n, "why": f"{ctx.left():.0f} s left of the stage's budget"}
                break
            row = one_round(sched, n, o.prompt_tokens, o.new_tokens, loaded.ckpt.dims.vocab, lambda: ctx.left() - 3)
            row["predicted_tok_s"] = round(decode_tok_s(replace(inp, streams=n), loaded.model.placement), 2)
            res["rows"].append(row)
            ctx.emit("batched", res)
    finally:
        sched.detach()
        loaded.ckpt.close()
        del loaded, kept
        sweep.release()
    one = next((r["aggregate_tok_s"] for r in res["rows"] if r["streams"] == 1), None)
    for r in res["rows"]:
        r["x_one_stream"] = round(r["aggregate_tok_s"] / one, 2) if one and r["aggregate_tok_s"] else None
    ctx.emit("batched", res)
    return res
