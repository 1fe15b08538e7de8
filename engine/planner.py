"""The planner: a pure function of (model profile, hardware costs, budgets, slider) -> placement.

Cost model (per decoded token):
    time = dense_s + sum over layers l, experts e of share[l][e] * top_k * t(tier(l, e))
    t(tier) = fixed_s[tier] + s_per_byte[tier] * expert_bytes[tier]
where share[l][e] is the fraction of layer l's routing slots that went to expert e on the
calibration text. Quality model: loss = sum over 4-bit experts of share[l][e] * sensitivity.

The frontier: candidate placements come from a grid of prices -- a price on quality loss (lambda)
and on VRAM and RAM bytes (mu) -- under which every expert independently picks the tier with the
least time + lambda*loss + mu_v*vram + mu_r*ram. The grid does not depend on the budgets, so a
bigger budget only ever adds feasible candidates. Candidates over a budget are dropped, then the
dominated ones. The slider s in [0, 1] sets a quality target, loss <= (1 - s) * (loss with every
expert at its best 4-bit tier), and the plan is the fastest frontier point that meets it (the one
with least loss when none does).

Everything here is numpy on small arrays: no torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .placement import Placement, Tier

GRID_LAMBDA = 48
GRID_MU = 10


@dataclass(frozen=True)
class PlanInputs:
    layers: int
    experts: int
    top_k: int
    share: tuple[tuple[float, ...], ...]  # [L][E], each row sums to 1
    sensitivity: dict  # tier value -> [L][E] (4-bit tiers only)
    expert_bytes: dict  # tier value -> bytes of one expert in that tier
    tier_costs: dict  # tier value -> (fixed_s, s_per_byte) of one expert at batch 1
    dense_bytes: int  # non-expert weights, on the accelerator (RAM when CPU-only)
    dense_s: float  # time per token outside the experts
    cpu_only: bool

    @property
    def tiers(self) -> list[Tier]:
        return [Tier(t) for t in self.tier_costs if not (self.cpu_only and Tier(t).on_accelerator)]


@dataclass(frozen=True)
class Budgets:
    vram: int
    ram: int


@dataclass(frozen=True)
class Plan:
    placement: Placement
    tok_s: float
    loss: float
    vram: int
    ram: int
    fits: bool = True

    def counts(self) -> dict[str, int]:
        return {t.value: n for t, n in self.placement.counts().items() if n}


def _tables(inp: PlanInputs):
    tiers = inp.tiers
    share = np.asarray(inp.share, dtype=np.float64).reshape(-1)  # [N]
    n = share.size
    time = np.empty((n, len(tiers)))
    loss = np.zeros((n, len(tiers)))
    vram = np.zeros((n, len(tiers)))
    ram = np.zeros((n, len(tiers)))
    for j, t in enumerate(tiers):
        fixed, per_byte = inp.tier_costs[t.value]
        b = inp.expert_bytes[t.value]
        time[:, j] = share * inp.top_k * (fixed + per_byte * b)
        if t.bits < 16:
            loss[:, j] = share * np.asarray(inp.sensitivity[t.value], dtype=np.float64).reshape(-1)
        (vram if t.on_accelerator else ram)[:, j] = b
    return tiers, time, loss, vram, ram


def _fixed_memory(inp: PlanInputs) -> tuple[int, int]:
    return (0, inp.dense_bytes) if inp.cpu_only else (inp.dense_bytes, 0)


def _greedy(inp: PlanInputs, budgets: Budgets, time, loss, vram, ram, lam_grid) -> np.ndarray:
    """Budget-filling candidates, one per quality price lambda: experts in order of popularity
    take their best tier (least time + lambda*loss) that still leaves room for every later expert
    at its smallest form. The price grid alone gives every identical expert the same tier; this
    mixes tiers within the budget."""
    n, _ = time.shape
    order = np.argsort(-np.asarray(inp.share).reshape(-1), kind="stable")
    fv, fr = _fixed_memory(inp)
    # the smallest form an expert can take in each pool (experts of one model share their sizes)
    sv = float(np.where(vram > 0, vram, np.inf).min()) if (vram > 0).any() else np.inf
    sr = float(np.where(ram > 0, ram, np.inf).min()) if (ram > 0).any() else np.inf

    def slots(lv: float, lr: float) -> float:  # how many smallest-form experts still fit
        return (lv // sv if np.isfinite(sv) and lv > 0 else 0) + (lr // sr if np.isfinite(sr) and lr > 0 else 0)

    out = []
    for lam in lam_grid:
        pref = np.argsort(time + lam * loss, axis=1, kind="stable")  # [N, T] best first
        left_v, left_r = float(budgets.vram - fv), float(budgets.ram - fr)
        row = np.zeros(n, dtype=np.int64)
        for k, i in enumerate(order):
            later = n - k - 1
            row[i] = int(np.argmin(vram[i] + ram[i]))  # if nothing fits (then the plan won't either)
            for j in pref[i]:
                lv, lr = left_v - vram[i, j], left_r - ram[i, j]
                if lv >= 0 and lr >= 0 and slots(lv, lr) >= later:
                    row[i] = j
                    break
            left_v -= vram[i, row[i]]
            left_r -= ram[i, row[i]]
        out.append(row)
    return np.array(out)


def candidates(inp: PlanInputs, budgets: Budgets | None = None) -> tuple[list[Tier], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Budget-independent candidate placements: choice [G, N] (tier index per expert) and their
    totals (time, loss, vram, ram), duplicates removed."""
    tiers, time, loss, vram, ram = _tables(inp)
    n = time.shape[0]
    # price scales that make each term comparable to time
    t_span = max(float(time.max() - time.min()), 1e-12)
    l_span = max(float(loss.max()), 1e-12)
    b_span = max(float(max(vram.max(), ram.max())), 1.0)
    lam = np.concatenate([[0.0], np.logspace(-4, 4, GRID_LAMBDA - 2) * t_span / l_span, [1e12]])
    mu = np.concatenate([[0.0], np.logspace(-3, 3, GRID_MU - 1) * t_span / b_span])
    L, MV, MR = np.meshgrid(lam, mu if not inp.cpu_only else [0.0], mu, indexing="ij")
    f32 = np.float32  # the choice only needs ranking; fp32 halves the work on the [G, N, T] grid
    L, MV, MR = (a.reshape(-1, 1, 1).astype(f32) for a in (L, MV, MR))
    score = time.astype(f32)[None] + L * loss.astype(f32)[None] + MV * vram.astype(f32)[None] \
        + MR * ram.astype(f32)[None]  # [G, N, T]
    choice = score.argmin(-1)  # [G, N]
    extremes = [np.full(n, j) for j in range(len(tiers))]  # every expert in one tier
    extra = [] if budgets is None else [_greedy(inp, budgets, time, loss, vram, ram, lam[::3])]
    choice = np.vstack([choice, *extremes, *extra])  # duplicates are harmless: the Pareto filter drops them
    rows = np.arange(n)[None, :]

    def pick(tab: np.ndarray) -> np.ndarray:
        return tab[rows, choice].sum(-1)  # [G]

    fv, fr = _fixed_memory(inp)
    return tiers, choice, pick(time) + inp.dense_s, pick(loss), pick(vram) + fv, pick(ram) + fr


def _to_plan(inp: PlanInputs, tiers, choice_row, t, l, v, r, fits=True) -> Plan:
    rows = np.asarray(tiers, dtype=object)[choice_row].reshape(inp.layers, inp.experts)
    pl = Placement(tuple(map(tuple, rows.tolist())))
    return Plan(pl, 1.0 / t, float(l), int(v), int(r), fits)


def _pareto(t: np.ndarray, l: np.ndarray, ok: np.ndarray) -> list[int]:
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((t[idx], l[idx]))]  # by loss, then time
    keep, best_t = [], np.inf
    for i in order:
        if t[i] < best_t - 1e-15:  # strictly faster than every plan with less or equal loss
            keep.append(int(i))
            best_t = t[i]
    return keep


def _between(inp: PlanInputs, tabs, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Placements on the way from vertex a (better quality) to vertex b (faster): the experts that
    differ switch one at a time, the most time saved per loss added first."""
    time, loss, vram, ram = tabs
    rows = np.arange(a.size)
    diff = np.flatnonzero(a != b)
    dt = time[rows, a][diff] - time[rows, b][diff]
    dl = loss[rows, b][diff] - loss[rows, a][diff]
    ratio = -dt / np.maximum(dl, 1e-18)
    dv = vram[rows, b][diff] - vram[rows, a][diff]
    outs = []
    # two orders: best ratio first; and VRAM-freeing moves first (so GPU moves that need room
    # come after the ones that make it), each by ratio within
    for order in (diff[np.argsort(ratio, kind="stable")], diff[np.lexsort((ratio, dv))]):
        out = np.repeat(a[None], max(len(order) - 1, 0), axis=0)
        for k in range(len(order) - 1):
            out[k:, order[k]] = b[order[k]]
        outs.append(out)
    return np.vstack(outs)


def frontier(inp: PlanInputs, budgets: Budgets) -> list[Plan]:
    """Non-dominated feasible plans, sorted from best quality (least loss) to fastest.
    When nothing fits, one plan: the least-memory candidate, marked fits=False."""
    tiers, choice, t, l, v, r = candidates(inp, budgets)
    ok = (v <= budgets.vram) & (r <= budgets.ram)
    if not ok.any():
        i = int(np.argmin(v + r))
        return [_to_plan(inp, tiers, choice[i], t[i], l[i], v[i], r[i], fits=False)]
    keep = _pareto(t, l, ok)
    # fill the segments between vertices, so the slider moves in small steps
    _, time, loss, vram, ram = _tables(inp)
    mids = [_between(inp, (time, loss, vram, ram), choice[i], choice[j]) for i, j in zip(keep, keep[1:])]
    mids = [m for m in mids if len(m)]
    if mids:
        extra = np.vstack(mids)
        rows = np.arange(extra.shape[1])[None, :]
        fv, fr = _fixed_memory(inp)
        choice = np.vstack([choice[keep], extra])
        t = np.concatenate([t[keep], time[rows, extra].sum(-1) + inp.dense_s])
        l = np.concatenate([l[keep], loss[rows, extra].sum(-1)])
        v = np.concatenate([v[keep], vram[rows, extra].sum(-1) + fv])
        r = np.concatenate([r[keep], ram[rows, extra].sum(-1) + fr])
        keep = _pareto(t, l, (v <= budgets.vram) & (r <= budgets.ram))
    return [_to_plan(inp, tiers, choice[i], t[i], l[i], v[i], r[i]) for i in keep]


def reference_loss(inp: PlanInputs) -> float:
    """Loss with every expert at its least-loss 4-bit tier: the slider's scale, budget-free."""
    four = [t for t in inp.tiers if t.bits < 16]
    if not four:
        return 0.0
    share = np.asarray(inp.share).reshape(-1)
    sens = np.min([np.asarray(inp.sensitivity[t.value]).reshape(-1) for t in four], axis=0)
    return float((share * sens).sum())


def choose(points: list[Plan], slider: float, inp: PlanInputs) -> Plan:
    s = min(max(float(slider), 0.0), 1.0)
    target = (1.0 - s) * reference_loss(inp)
    meeting = [p for p in points if p.loss <= target + 1e-15]
    if not meeting:
        return points[0]  # the least loss the budget allows
    return max(meeting, key=lambda p: p.tok_s)


def plan(inp: PlanInputs, budgets: Budgets, slider: float) -> Plan:
    return choose(frontier(inp, budgets), slider, inp)
