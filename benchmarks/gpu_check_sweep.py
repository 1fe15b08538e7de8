"""The sweep stages: one synthetic model on one card, across slider settings, each setting's measured
decode and prefill beside the cost model's prediction (mixtral_24gb, qwen3_24gb, mixtral_12gb,
qwen3_12gb).

1. Load at the fastest setting (slider 0) under the card's budgets (load's auto placement: the
   model's shape and this machine's measured tier costs), timed, with its progress recorded so a
   stage cut short by its budget still says how far the load got.
2. The planner's inputs, measured on the loaded model as the app measures them after a first start:
   the random router's popularity over random tokens (capture), the time outside the experts of a
   decode step and of a prompt token (measure_dense_s, measure_dense_prefill_s). They are saved as
   the model's profile, so a later stage on the same model (the budget drop) plans from them.
3. The frontier under the budgets; then per setting, fastest first (the most telling one, kept if
   the budget ends the sweep early): migrate to the setting's placement (timed), read a prompt and
   decode (Generator.stream: greedy, no end-of-sequence stop).

Per setting: predicted and measured decode tok/s and prefill seconds; the bandwidth bound: the
bytes a token reads in each memory (the dense weights, and each expert's bytes times how often it
is routed to) over that memory's measured read bandwidth, summed; and the fraction of it reached.
Over the sweep: Spearman's rank correlation of predicted and measured decode, and the worst
relative error of each.
"""
from __future__ import annotations

import gc
import time
from dataclasses import replace

import torch

from benchmarks import gpu_check_shapes as shapes
from benchmarks.gpu_check_machine import bandwidths
from benchmarks.gpu_check_memory import PeakWatch

GB = 10**9


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho (ties take their mean rank); None below two points or for a constant series."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else None


def summarise(rows: list[dict]) -> dict:
    """Over the settings measured (a setting that ran out of memory has no figures)."""
    failed = [r["slider"] for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]

    def worst(measured: str, predicted: str):
        errs = [abs(r[measured] / r[predicted] - 1) for r in rows if r.get(predicted)]
        return round(max(errs), 3) if errs else None

    rho = spearman([r["predicted_tok_s"] for r in rows], [r["decode_tok_s"] for r in rows])
    return {"settings": len(rows), "failed_sliders": failed, "spearman_decode": None if rho is None else round(rho, 3),
            "worst_decode_error": worst("decode_tok_s", "predicted_tok_s"),
            "worst_prefill_error": worst("prefill_s", "predicted_prefill_s")}


class LoadProgress:
    """load()'s progress callback: the load's timeline, sent on at most every few seconds."""

    def __init__(self, ctx, key: str, res: dict, every_s: float = 3.0):
        self.ctx, self.key, self.res, self.every_s = ctx, key, res, every_s
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done: int, total: int, what: str = "") -> None:
        now = time.perf_counter()
        self.res["load"] = {"seconds": round(now - self.t0, 1), "done": done, "total": total, "at": what}
        if now - self.last >= self.every_s:
            self.last = now
            self.ctx.emit(self.key, self.res, show={"load": self.res["load"]})


def measured_inputs(loaded, prompt: int, calib_tokens: int):
    """The planner's inputs for the loaded model, measured on it (see the docstring), and their
    timings; saved as the model's profile."""
    from engine.measures.hardware import load_or_measure
    from engine.measures.inputs import (
        from_dims,
        measure_dense_prefill_s,
        measure_dense_s,
    )
    from engine.measures.profile import capture, save_dense_timings, uniform_profile
    from engine.experts.tier_bytes import tier_bytes

    m, ck = loaded.model, loaded.ckpt
    d, dev = ck.dims, m.accel
    hw = load_or_measure(dev)
    t0 = time.perf_counter()
    ids = torch.randint(3, d.vocab, (calib_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    counts = [torch.bincount(idx.reshape(-1).cpu(), minlength=d.experts).tolist() for _, idx, _, _ in capture(m, ids)]
    share = tuple(tuple(c / max(sum(row), 1) for c in row) for row in counts)
    t1 = time.perf_counter()
    dense_s, dense_prefill_s = measure_dense_s(m, hw), measure_dense_prefill_s(m, hw, tokens=prompt)
    itemsize = m.dtype.itemsize
    inp = replace(from_dims(d, hw, itemsize, sizes=tier_bytes(ck, itemsize)), share=share, dense_s=dense_s,
                  dense_prefill_s=dense_prefill_s)
    if dev.type != "cuda":
        inp = replace(inp, cpu_only=True)
    mp = uniform_profile(m)
    mp.popularity = counts
    save_dense_timings(mp, ck.folder, dev, m.dtype, (dense_s, dense_prefill_s))
    return inp, {"popularity_tokens": calib_tokens, "capture_s": round(t1 - t0, 1),
                 "dense_timing_s": round(time.perf_counter() - t1, 1), "dense_s": dense_s,
                 "dense_prefill_s_per_token": dense_prefill_s}


def bound_s(inp, placement, bw: dict, cuda: bool) -> float:
    """Seconds per token at the read bandwidth of each memory (see the docstring)."""
    dense_side = "accelerator" if cuda and not inp.cpu_only else "host"
    nbytes = {"accelerator": 0.0, "host": 0.0}
    nbytes[dense_side] += inp.dense_bytes
    for l, e, t in placement.items():
        side = "accelerator" if t.on_accelerator and cuda else "host"
        nbytes[side] += inp.share[l][e] * inp.top_k * inp.expert_bytes[t.value]
    return sum(b / bw[side] for side, b in nbytes.items() if b)


def setting(loaded, inp, plan, budgets, bw: dict, prompt_ids: list[int], new_tokens: int) -> dict:
    from engine.runtime.generate import SamplingParams
    from engine.planning.planner import prefill_s

    m, gen = loaded.model, loaded.generator
    cuda = m.accel.type == "cuda"
    t0 = time.perf_counter()
    built = m.apply(plan.placement)
    if cuda:
        torch.cuda.synchronize()
    moved_s = time.perf_counter() - t0
    fin = list(gen.stream(prompt_ids, SamplingParams(max_new_tokens=new_tokens)))[-1]
    b = bound_s(inp, m.placement, bw, cuda)
    return {"tiers": {t.value: n for t, n in m.placement.counts().items() if n}, "fits": plan.fits,
            "planned_vram_gb": round(plan.vram / GB, 4), "planned_ram_gb": round(plan.ram / GB, 4),
            "within_budgets": plan.vram <= budgets.vram and plan.ram <= budgets.ram,
            "predicted_tok_s": round(plan.tok_s, 3), "decode_tok_s": round(fin.decode_tok_s, 3),
            "decode_error": round(fin.decode_tok_s / plan.tok_s - 1, 3) if plan.tok_s else None,
            "prompt_tokens": len(prompt_ids), "predicted_prefill_s": round(prefill_s(inp, m.placement, len(prompt_ids)), 3),
            "prefill_s": round(fin.prefill_s, 3), "new_tokens": len(fin.token_ids),
            "bound_tok_s": round(1 / b, 3), "of_bound": round(fin.decode_tok_s * b, 3),
            "migration_s": round(moved_s, 2), "migrated_gb": round(built / GB, 2)}


def run(ctx, key: str, model: str, card_gb: float, settings: int, keep: bool = False) -> dict:
    """One sweep stage; with keep, the loaded model and its inputs stay in ctx.keep[model] for the
    stage after (batched decode), else they are freed."""
    from engine import native
    from engine.runtime.load import load
    from engine.planning.planner import choose, frontier

    cuda = torch.cuda.is_available()
    o = ctx.opts
    watch = PeakWatch().start()
    budgets, why = shapes.budgets(model, card_gb, ctx.small)
    res = {"model": shapes.label(model, ctx.small), "card": ctx.card, "budgets_gb": {"vram": round(budgets.vram / GB, 4),
           "ram": round(budgets.ram / GB, 4)}, "budgets": why, "rows": []}
    bw = bandwidths(o.bandwidth_mib)  # before the model: room for the GPU buffer under the card
    res["bandwidth_gb_s"] = {k: None if v is None else round(v / GB, 1) for k, v in bw.items()}
    folder = shapes.synthetic(ctx.work, model, ctx.small)
    loaded = load(folder, "auto", None if cuda else "cpu", budgets=budgets, slider=0.0,
                  ctx=o.prompt_tokens + o.new_tokens + 16, progress=LoadProgress(ctx, key, res))
    res["load"] = {**res.get("load", {}), "placement": loaded.model.placement.summary(), "native": native.status()}
    res["peak_vram"] = watch.result(card_gb if cuda else None)
    ctx.emit(key, res)
    loaded.generator.eos_ids.clear()
    inp, res["inputs"] = measured_inputs(loaded, o.prompt_tokens, o.calib_tokens)
    ctx.emit(key, res)
    pts = frontier(inp, budgets)
    prompt = torch.randint(3, loaded.ckpt.dims.vocab, (o.prompt_tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    sliders = [k / (settings - 1) for k in range(settings)] if settings > 1 else [0.0]
    last_s = 0.0
    for s in sliders:
        if ctx.left() < 1.5 * last_s + 5:
            res["not_run"] = {"sliders": [x for x in sliders if x >= s], "why": f"{ctx.left():.0f} s left of the stage's budget"}
            break
        t0 = time.perf_counter()
        try:
            row = {"slider": round(s, 3), **setting(loaded, inp, choose(pts, s, inp), budgets, bw, prompt, o.new_tokens)}
        except torch.cuda.OutOfMemoryError as e:  # the card was too small for this setting: the next may fit
            row = {"slider": round(s, 3), "error": f"CUDA out of memory: {str(e).splitlines()[0]}",
                   "tiers": {t.value: n for t, n in loaded.model.placement.counts().items() if n}}
            release()
        last_s = time.perf_counter() - t0
        row["seconds"] = round(last_s, 1)
        res["rows"].append(row)
        res["summary"] = summarise(res["rows"])
        res["peak_vram"] = watch.result(card_gb if cuda else None)
        ctx.emit(key, res)
    watch.stop()
    if keep:
        ctx.keep[model] = (loaded, inp)
    else:
        loaded.ckpt.close()
        del loaded
        release()
    return res


def release() -> None:
    """Memory of models no longer referred to, back to the system (and the card) before the next stage."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
