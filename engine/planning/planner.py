"""The planner: a pure function of (model profile, hardware costs, budgets, slider) -> placement.

Cost model (per decoded token, one stream):
    time = dense_s + sum over layers l, experts e of share[l][e] * top_k * t(tier(l, e))
    t(tier) = fixed_s[tier] + s_per_byte[tier] * expert_bytes[tier]
where share[l][e] is the fraction of layer l's routing slots that went to expert e on the
calibration text. With S streams decoding together (a batched step, engine/runtime/scheduler.py), each of the
S tokens picks expert e with probability p = top_k * share, the n ~ Binomial(S, p) that do are
run at once (its weights read once), and the step costs
    dense_s * r16(S) + sum over l, e of t(tier) * E[r_tier(n)]
per S tokens, with r the measured batch scaling of the hardware profile (time at n tokens / at
one; r16 that of the 16-bit tier where the dense weights live). At S = 1 it is the formula above.
Per prompt (prefill_s): the dense part per token plus each expert's expected batch at its tier's
measured batch scaling. Quality model: loss = sum over 4-bit experts of share[l][e] * sensitivity, where
the profile scales sensitivity to measured per-layer KL divergence (engine/profile.py), so the loss
is a predicted KL divergence in nats per token.

The frontier: candidate placements come from a grid of prices -- a price on quality loss (lambda)
and on VRAM and RAM bytes (mu) -- under which every expert independently picks the tier with the
least time + lambda*loss + mu_v*vram + mu_r*ram. The grid does not depend on the budgets, so a
bigger budget only ever adds feasible candidates. Budget-filling greedy candidates mix tiers among
experts the grid treats alike, and the segments between neighbouring frontier vertices are walked one
expert at a time (including a walk that alternates freeing VRAM and using it). Candidates over a
budget are dropped, then the dominated ones.

The slider s in [0, 1] sets a quality target that does not depend on the budgets (SliderScale: the
loss at position s along the unlimited-memory frontier), and the plan is the fastest frontier point
that meets it (the one with least loss when none does). Budget-free targets are what make "a bigger
budget is never slower at the same slider" hold.

Everything here is numpy on small arrays: no torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from ..placement import DEFAULT_LOWEST_BITS, LOW_TIERS, Placement, Tier
from .batch_scaling import batch_ratio, batch_ratios, expected_runs  # noqa: F401 - the cost model's batches

GRID_LAMBDA = 48
GRID_MU = 10


@dataclass(frozen=True)
class PlanInputs:
    layers: int
    experts: int
    top_k: int
    share: tuple[tuple[float, ...], ...]  # [L][E], each row sums to 1
    sensitivity: dict  # tier value -> [L][E] (tiers below 16 bits only)
    expert_bytes: dict  # tier value -> bytes of one expert in that tier
    tier_costs: dict  # tier value -> (fixed_s, s_per_byte) of one expert at batch 1
    dense_bytes: int  # non-expert weights, on the accelerator (RAM when CPU-only)
    dense_s: float  # time per token outside the experts
    cpu_only: bool
    batch_scale: dict = field(default_factory=dict)  # tier -> batch scaling (see batch_ratio)
    dense_prefill_s: float = 0.0  # time per prompt token outside the experts, in a prefill
    unit: int = 1  # experts per planning unit (a reduced problem, see `reduced`): memory scales by it
    streams: int = 1  # sequences decoding together (the cost model's batch > 1, see above)
    provisional: bool = False  # sensitivities ASSUMED until calibrated: `choose` trades no quality
    # of expert_bytes, per CPU tier, the bytes served from the mapped model file (its own blocks:
    # page cache, not RAM the process owns; engine/files/gguf/reader.py): they cost no RAM budget. A file
    # larger than free memory pages, as llama.cpp's does (engine/experts/tier_bytes.py paging)
    mapped_bytes: dict = field(default_factory=dict)
    dense_mapped: int = 0  # of dense_bytes, likewise (a CPU-only plan's dense part)
    lowest_bits: int = DEFAULT_LOWEST_BITS  # the user's "lowest precision for experts" (4, 3 or 2)

    @property
    def tiers(self) -> list[Tier]:
        """The tiers planned: those with costs (no GPU tier on a CPU-only machine); of the CPU tiers
        below 4 bits, those the user allows, measured (sensitivity and bytes known), and smaller
        than the CPU tier above them (else they offer nothing: a file already that small, or a
        model whose matrices are not whole 256-weight blocks)."""
        low, above = set(), self.expert_bytes.get("cpu-4")
        for t in LOW_TIERS:  # 3 bits, then 2
            b = self.expert_bytes.get(t.value)
            if (t.value in self.tier_costs and t.bits >= self.lowest_bits and t.value in self.sensitivity
                    and b is not None and above is not None and b < above):
                low.add(t)
                above = b
        return [t for t in map(Tier, self.tier_costs)
                if not (self.cpu_only and t.on_accelerator) and (t not in LOW_TIERS or t in low)]

    @property
    def dense_token_s(self) -> float:
        """The dense part's time per token at `streams` streams: dense_s at one, and with S the
        step's dense matmuls read their weights once for the S tokens, as a 16-bit expert of one
        layer's dense bytes scales (the 16-bit tier where the dense weights are)."""
        if self.streams <= 1:
            return self.dense_s
        tier = "cpu-16" if self.cpu_only else "gpu-16"
        r = batch_ratio(self.batch_scale.get(tier), self.streams, self.dense_bytes / max(self.layers, 1))
        return self.dense_s * r / self.streams


@dataclass(frozen=True)
class Budgets:
    vram: int
    ram: int


@dataclass(frozen=True)
class Plan:
    """One point of the frontier. Its placement is built when first asked for: a frontier of
    Qwen3-30B-A3B holds hundreds of points of 6,144 experts each, and the caller takes one."""
    tok_s: float
    loss: float
    vram: int
    ram: int
    fits: bool = True
    choice: np.ndarray = field(default=None, repr=False, compare=False)   # tier index per unit
    tiers: tuple = field(default=(), repr=False, compare=False)
    shape: tuple = (0, 0)  # (layers, experts)
    unit_of: np.ndarray | None = field(default=None, repr=False, compare=False)  # expert -> unit, if reduced

    @cached_property
    def placement(self) -> Placement:
        row = self.choice if self.unit_of is None else self.choice[self.unit_of]
        rows = np.asarray(self.tiers, dtype=object)[row].reshape(self.shape)
        return Placement(tuple(map(tuple, rows.tolist())))

    def counts(self) -> dict[str, int]:
        row = self.choice if self.unit_of is None else self.choice[self.unit_of]
        n = np.bincount(row, minlength=len(self.tiers))
        return {t.value: int(c) for t, c in zip(self.tiers, n) if c}


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
        # a planning unit of m alike experts costs m times one of its mean share (exact at one stream)
        p = share * inp.top_k / inp.unit
        runs = expected_runs(p, inp.streams, inp.batch_scale.get(t.value), b) / max(inp.streams, 1)
        time[:, j] = inp.unit * runs * (fixed + per_byte * b)
        if t.bits < 16:
            loss[:, j] = share * np.asarray(inp.sensitivity[t.value], dtype=np.float64).reshape(-1)
        if t.on_accelerator:
            vram[:, j] = b * inp.unit
        else:
            ram[:, j] = (b - inp.mapped_bytes.get(t.value, 0)) * inp.unit
    return tiers, time, loss, vram, ram


def _fixed_memory(inp: PlanInputs) -> tuple[int, int]:
    return (0, inp.dense_bytes - inp.dense_mapped) if inp.cpu_only else (inp.dense_bytes, 0)


def _greedy(inp: PlanInputs, budgets: Budgets, time, loss, vram, ram, lam_grid) -> np.ndarray:
    """Budget-filling candidates, two per quality price lambda: experts in turn take their best
    tier (least time + lambda*loss) that still leaves room for every later expert at its smallest
    form. The price grid alone gives every identical expert the same tier; this mixes tiers within
    the budget. Two orders: by popularity, and by what the best tier gains over the smallest form
    per extra byte (the knapsack order: under a tight budget and a high lambda it keeps at 16 bits
    the experts whose 4-bit form would cost the most quality)."""
    n, _ = time.shape
    popular = np.argsort(-np.asarray(inp.share).reshape(-1), kind="stable")
    fv, fr = _fixed_memory(inp)
    size = vram + ram
    small = size.argmin(1)  # [N] each expert's smallest form
    rows_n = np.arange(n)
    # the smallest form an expert can take in each pool (experts of one model share their sizes)
    sv = float(np.where(vram > 0, vram, np.inf).min()) if (vram > 0).any() else np.inf
    sr = float(np.where(ram > 0, ram, np.inf).min()) if (ram > 0).any() else np.inf

    fin_v, fin_r = bool(np.isfinite(sv)), bool(np.isfinite(sr))
    sv, sr = float(sv), float(sr)
    vram_l, ram_l, small_l = vram.tolist(), ram.tolist(), small.tolist()

    def slots(lv: float, lr: float) -> float:  # how many smallest-form experts still fit
        return (lv // sv if fin_v and lv > 0 else 0) + (lr // sr if fin_r and lr > 0 else 0)

    out = []
    for lam, by_density in ((lam, d) for lam in lam_grid for d in (False, True)):
        score = time + lam * loss
        pref = np.argsort(score, axis=1, kind="stable")  # [N, T] best first
        if by_density:
            best = pref[:, 0]
            gain = score[rows_n, small] - score[rows_n, best]
            extra = np.maximum(size[rows_n, best] - size[rows_n, small], 0.0)
            order = np.argsort(-(gain / np.maximum(extra, 1.0)), kind="stable")
        else:
            order = popular
        left_v, left_r = float(budgets.vram - fv), float(budgets.ram - fr)
        row = [0] * n
        pref_l = pref.tolist()  # plain Python in the loop: numpy scalars cost ~1 us each here
        for k, i in enumerate(order.tolist()):
            later = n - k - 1
            pick = small_l[i]  # if nothing fits (then the plan won't either)
            for j in pref_l[i]:
                lv, lr = left_v - vram_l[i][j], left_r - ram_l[i][j]
                if lv >= 0 and lr >= 0 and slots(lv, lr) >= later:
                    pick = j
                    break
            row[i] = pick
            left_v -= vram_l[i][pick]
            left_r -= ram_l[i][pick]
        out.append(row)
    return np.array(out, dtype=np.int64)


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
    lam_g = np.concatenate([lam[::3], lam[-1:]])
    extra = [] if budgets is None else [_greedy(inp, budgets, time, loss, vram, ram, lam_g)]
    choice = np.vstack([choice, *extremes, *extra])  # duplicates are harmless: the Pareto filter drops them
    rows = np.arange(n)[None, :]

    def pick(tab: np.ndarray) -> np.ndarray:
        return tab[rows, choice].sum(-1)  # [G]

    fv, fr = _fixed_memory(inp)
    return tiers, choice, pick(time) + inp.dense_token_s, pick(loss), pick(vram) + fv, pick(ram) + fr


def _to_plan(inp: PlanInputs, tiers, choice_row, t, l, v, r, fits=True) -> Plan:
    return Plan(1.0 / t, float(l), int(v), int(r), fits, np.asarray(choice_row), tuple(tiers),
                (inp.layers, inp.experts))


MAX_UNITS = 512  # above this many experts, the planner works on groups of alike experts (`reduced`)


def reduced(inp: PlanInputs, units: int = 256) -> tuple[PlanInputs, np.ndarray]:
    """The same problem over `units` groups of equally many experts alike in popularity (sorted by
    share, then cut in equal runs), and which group each expert is in. A group takes one tier for
    all its experts; its time and quality loss are the sums of its members' (exact for any grouped
    placement), its memory its members' sizes times their count. Qwen3-30B-A3B's 6,144 experts
    become 256 groups of 24: the frontier's granularity of Mixtral's 256 experts, at its cost."""
    n = inp.layers * inp.experts
    share = np.asarray(inp.share, dtype=np.float64).reshape(-1)
    # groups must share one size: the smallest group size that divides n into at most MAX_UNITS groups
    m = next(m for m in range(max(1, -(-n // units)), n + 1) if n % m == 0 and n // m <= MAX_UNITS)
    units = n // m
    order = np.argsort(-share, kind="stable")
    unit_of = np.empty(n, dtype=np.int64)
    unit_of[order] = np.arange(n) // m
    u_share = np.bincount(unit_of, weights=share, minlength=units)
    sens = {}
    for t, table in inp.sensitivity.items():
        w = share * np.asarray(table, dtype=np.float64).reshape(-1)
        sens[t] = (np.bincount(unit_of, weights=w, minlength=units) / np.maximum(u_share, 1e-300))[None].tolist()
    small = PlanInputs(1, units, inp.top_k, (tuple(u_share.tolist()),), sens, inp.expert_bytes, inp.tier_costs,
                       inp.dense_bytes, inp.dense_s, inp.cpu_only, inp.batch_scale, inp.dense_prefill_s, unit=m,
                       streams=inp.streams, mapped_bytes=inp.mapped_bytes, dense_mapped=inp.dense_mapped,
                       lowest_bits=inp.lowest_bits)
    return small, unit_of


def _pareto(t: np.ndarray, l: np.ndarray, ok: np.ndarray) -> list[int]:
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((t[idx], l[idx]))]  # by loss, then time
    keep, best_t = [], np.inf
    for i in order:
        if t[i] < best_t - 1e-15:  # strictly faster than every plan with less or equal loss
            keep.append(int(i))
            best_t = t[i]
    return keep


def _interleaved(moves: np.ndarray, ratio: np.ndarray, dv: np.ndarray, room: float) -> np.ndarray:
    """An order of the moves in which every VRAM-using move comes as soon as there is room for it
    and a VRAM-freeing move (best ratio first) makes room only when the next one does not fit."""
    free_o = np.flatnonzero(dv < 0)[np.argsort(ratio[dv < 0], kind="stable")].tolist()
    use_o = np.flatnonzero(dv >= 0)[np.argsort(ratio[dv >= 0], kind="stable")].tolist()
    seq, i, j = [], 0, 0
    while i < len(free_o) or j < len(use_o):
        if j < len(use_o) and (dv[use_o[j]] <= room or i == len(free_o)):
            k, j = use_o[j], j + 1
        else:
            k, i = free_o[i], i + 1
        seq.append(k)
        room -= dv[k]
    return moves[np.asarray(seq, dtype=np.int64)]


def _between(inp: PlanInputs, tabs, a: np.ndarray, b: np.ndarray, room_v: float) -> np.ndarray:
    """Placements on the way from vertex a (better quality) to vertex b (faster): the experts that
    differ switch one at a time, the most time saved per loss added first. room_v: the VRAM the
    budget leaves at a."""
    time, loss, vram, ram = tabs
    rows = np.arange(a.size)
    diff = np.flatnonzero(a != b)
    dt = time[rows, a][diff] - time[rows, b][diff]
    dl = loss[rows, b][diff] - loss[rows, a][diff]
    ratio = -dt / np.maximum(dl, 1e-18)
    dv = vram[rows, b][diff] - vram[rows, a][diff]
    outs = []
    # three orders: best ratio first; VRAM-freeing moves first (so GPU moves that need room come
    # after the ones that make it), each by ratio within; and the two interleaved, so that e.g.
    # turning one 16-bit GPU expert to 4 bits is followed by the CPU experts its room brings over
    # (without it the frontier jumps from "GPU full of 16-bit" straight to "all 4-bit on the GPU")
    for order in (diff[np.argsort(ratio, kind="stable")], diff[np.lexsort((ratio, dv))],
                  _interleaved(diff, ratio, dv, room_v)):
        out = np.repeat(a[None], max(len(order) - 1, 0), axis=0)
        for k in range(len(order) - 1):
            out[k:, order[k]] = b[order[k]]
        outs.append(out)
    return np.vstack(outs)


def frontier(inp: PlanInputs, budgets: Budgets) -> list[Plan]:
    """Non-dominated feasible plans, sorted from best quality (least loss) to fastest.
    When nothing fits, one plan: the least-memory candidate, marked fits=False."""
    if inp.layers * inp.experts > MAX_UNITS and inp.unit == 1:
        small, unit_of = reduced(inp)
        return [replace(p, shape=(inp.layers, inp.experts), unit_of=unit_of) for p in frontier(small, budgets)]
    tiers, choice, t, l, v, r = candidates(inp, budgets)
    ok = (v <= budgets.vram) & (r <= budgets.ram)
    if not ok.any():
        i = int(np.argmin(v + r))
        return [_to_plan(inp, tiers, choice[i], t[i], l[i], v[i], r[i], fits=False)]
    keep = _pareto(t, l, ok)
    # fill the segments between vertices, so the slider moves in small steps
    _, time, loss, vram, ram = _tables(inp)
    mids = [_between(inp, (time, loss, vram, ram), choice[i], choice[j], float(budgets.vram - v[i]))
            for i, j in zip(keep, keep[1:])]
    mids = [m for m in mids if len(m)]
    if mids:
        extra = np.vstack(mids)
        rows = np.arange(extra.shape[1])[None, :]
        fv, fr = _fixed_memory(inp)
        choice = np.vstack([choice[keep], extra])
        t = np.concatenate([t[keep], time[rows, extra].sum(-1) + inp.dense_token_s])
        l = np.concatenate([l[keep], loss[rows, extra].sum(-1)])
        v = np.concatenate([v[keep], vram[rows, extra].sum(-1) + fv])
        r = np.concatenate([r[keep], ram[rows, extra].sum(-1) + fr])
        keep = _pareto(t, l, (v <= budgets.vram) & (r <= budgets.ram))
    near = [i for i in keep if t[i] * (1 - FAST_END_TOLERANCE) <= t[keep].min()]  # (keep: least loss first)
    keep = [i for i in keep if i not in near[1:]]
    return [_to_plan(inp, tiers, choice[i], t[i], l[i], v[i], r[i]) for i in keep]


# The fast end: of the plans within 3% of the fastest's predicted speed, only the least lossy is kept.
# A gain below the predictions' own error (up to 12%) is not one a user can count on; the loss is:
# on the demo (Zen 1) every expert at cpu-2 was 62.0 tok/s at 1.13 nats, 1.5% above a plan of 0.3.
FAST_END_TOLERANCE = 0.03


UNLIMITED = Budgets(vram=2**62, ram=2**62)


@dataclass(frozen=True)
class SliderScale:
    """What each slider position asks for, independent of the budgets: knots (s, loss target),
    s ascending. Traced along the frontier with unlimited memory, evenly by arc length in
    normalised (speed, loss) coordinates, so that equal slider steps are comparable changes -- a
    scale linear in loss put half of Mixtral's speed range into the first tenth of the slider, and
    on the demo (whose cpu-4 form costs almost nothing) spent most of it on equal speeds."""
    s: tuple[float, ...]
    loss: tuple[float, ...]

    def target(self, slider: float) -> float:
        s = min(max(float(slider), 0.0), 1.0)
        if s <= 0.0:
            return float("inf")  # fastest, whatever it costs
        return float(np.interp(s, self.s, self.loss))

    def position(self, loss: float) -> float:
        """Where on the slider a plan with this loss sits (for drawing the frontier under it)."""
        return float(np.interp(loss, self.loss[::-1], self.s[::-1]))


def slider_scale(inp: PlanInputs) -> SliderScale:
    return _scale_of(frontier(inp, UNLIMITED))  # best quality first


def _scale_of(pts: list[Plan]) -> SliderScale:
    loss = np.array([p.loss for p in pts])
    speed = np.array([p.tok_s for p in pts])
    if len(pts) < 2:
        return SliderScale((0.0, 1.0), (float(loss[0]),) * 2)
    x = (speed - speed.min()) / max(float(np.ptp(speed)), 1e-18)
    y = (loss - loss.min()) / max(float(np.ptp(loss)), 1e-18)
    arc = np.concatenate([[0.0], np.cumsum(np.hypot(np.diff(x), np.diff(y)))])
    s = 1.0 - arc / max(float(arc[-1]), 1e-18)  # best quality at 1, fastest at 0
    return SliderScale(tuple(s[::-1].tolist()), tuple(loss[::-1].tolist()))


def choose(points: list[Plan], slider: float, inp: PlanInputs, scale: SliderScale | None = None) -> Plan:
    """The fastest plan whose loss meets the slider's target (the least-loss plan when none does).
    `scale` is slider_scale(inp), passed in by callers that re-plan often with the same inputs.
    Provisional inputs (no calibration yet): the least-loss plan the budgets allow (a guessed
    sensitivity picked the demo's 4-bit experts blindly and turned "Paris" into a French loop)."""
    if inp.provisional:
        return points[0]
    scale = scale or slider_scale(inp)
    if max(scale.loss) - min(scale.loss) <= 1e-15 and len(points) > 1:
        # with unlimited memory nothing trades quality for speed (small experts, as Qwen3-MoE's: 4 bits
        # are no faster on the GPU), so the slider spans what these budgets offer instead
        scale = _scale_of(points)
    target = scale.target(slider)
    meeting = [p for p in points if p.loss <= target + 1e-15]
    if not meeting:
        return points[0]  # the least loss the budget allows
    return max(meeting, key=lambda p: p.tok_s)


def prefill_s(inp: PlanInputs, placement: Placement, tokens: int) -> float:
    """Predicted time to prefill `tokens` prompt tokens under a placement: the dense part per token,
    plus each expert's expected batch (tokens x top_k x its share) at its tier's batch scaling.
    (CPU experts copied to the GPU for a large batch are not modelled: an upper bound there.)"""
    total = inp.dense_prefill_s * tokens
    by_tier: dict = {}  # tier -> the expected tokens of each of its experts (one pass a tier: a frontier
    for l, e, t in placement.items():  # of hundreds of points over thousands of experts took a minute)
        by_tier.setdefault(t.value, []).append(tokens * inp.top_k * inp.share[l][e])
    for t, n in by_tier.items():
        fixed, per_byte = inp.tier_costs[t]
        one = fixed + per_byte * inp.expert_bytes[t]
        total += one * float(batch_ratios(inp.batch_scale.get(t), n, inp.expert_bytes[t]).sum())
    return total


def decode_tok_s(inp: PlanInputs, placement: Placement) -> float:
    """Predicted decode tok/s under a placement at inp.streams streams: all streams' tokens
    together (one stream: its own rate), from the same tables the frontier uses."""
    tiers, time, _, _, _ = _tables(inp)  # a full problem (unit 1): one row per expert
    col = {t: j for j, t in enumerate(tiers)}
    choice = np.array([col[t] for _, _, t in placement.items()])
    return 1.0 / (float(time[np.arange(choice.size), choice].sum()) + inp.dense_token_s)


def plan(inp: PlanInputs, budgets: Budgets, slider: float) -> Plan:
    return choose(frontier(inp, budgets), slider, inp)
