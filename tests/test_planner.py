"""The planner is a pure function of (profiles, budgets, slider): its promises, on random profiles."""
import random
import time

import pytest
import numpy as np

from engine.placement import Tier
from engine.planning import planner
from engine.planning.planner import Budgets, PlanInputs, choose, frontier, plan, slider_scale

SLIDERS = [i / 10 for i in range(11)]


def random_inputs(seed: int, layers=4, experts=8, cpu_only=False) -> PlanInputs:
    rng = random.Random(seed)
    share = []
    for _ in range(layers):
        w = [rng.random() ** 3 for _ in range(experts)]
        share.append(tuple(x / sum(w) for x in w))
    sens = {t: [[rng.uniform(0.02, 0.3) for _ in range(experts)] for _ in range(layers)] for t in ("cpu-4", "gpu-4")}
    b16 = 100_000_000
    costs = {"cpu-16": (5e-5, 1 / 30e9), "cpu-4": (3e-5, 1 / 18e9)}
    if not cpu_only:
        costs.update({"gpu-16": (2e-5, 1 / 800e9), "gpu-4": (3e-5, 1 / 500e9)})
    return PlanInputs(layers, experts, 2, tuple(share), sens,
                      {"cpu-16": b16, "gpu-16": b16, "cpu-4": b16 * 5 // 16, "gpu-4": b16 * 9 // 32},
                      costs, dense_bytes=50_000_000, dense_s=2e-3, cpu_only=cpu_only)


def budgets_for(inp, frac_v, frac_r):
    total = inp.layers * inp.experts * inp.expert_bytes["cpu-16"]
    return Budgets(vram=int(frac_v * total) + inp.dense_bytes, ram=int(frac_r * total) + inp.dense_bytes)


CASES = [(seed, fv, fr, cpu) for seed in range(4) for fv, fr in [(0.2, 0.5), (0.5, 1.0), (0.1, 0.35), (1.0, 1.0)]
         for cpu in (False, True)]


@pytest.mark.parametrize("seed,fv,fr,cpu_only", CASES)
def test_budgets_never_exceeded_and_frontier_not_dominated(seed, fv, fr, cpu_only):
    inp = random_inputs(seed, cpu_only=cpu_only)
    b = budgets_for(inp, fv if not cpu_only else 0, fr)
    pts = frontier(inp, b)
    assert pts and all(p.fits for p in pts)
    for p in pts:
        assert p.vram <= b.vram and p.ram <= b.ram
        if cpu_only:
            assert not any(t.on_accelerator for _, _, t in p.placement.items())
    for p in pts:
        for q in pts:
            if q is not p:
                assert not (q.loss <= p.loss and q.tok_s >= p.tok_s), "dominated point on the frontier"


@pytest.mark.parametrize("seed,fv,fr,cpu_only", CASES)
def test_slider_monotone(seed, fv, fr, cpu_only):
    inp = random_inputs(seed, cpu_only=cpu_only)
    b = budgets_for(inp, fv if not cpu_only else 0, fr)
    pts, scale = frontier(inp, b), slider_scale(inp)  # made once, as the controller does when it re-plans
    plans = [choose(pts, s, inp, scale) for s in SLIDERS]
    assert plan(inp, b, SLIDERS[3]) == plans[3]
    for lo, hi in zip(plans, plans[1:]):
        assert hi.loss <= lo.loss + 1e-12  # quality never gets worse as the slider rises
        assert hi.tok_s <= lo.tok_s + 1e-9  # and speed never rises
    assert plans[0].tok_s >= plans[-1].tok_s


@pytest.mark.parametrize("seed", range(4))
def test_bigger_budget_never_slower_at_same_slider(seed):
    inp = random_inputs(seed)
    small, big = budgets_for(inp, 0.2, 0.6), budgets_for(inp, 0.5, 1.0)
    f_small, f_big, scale = frontier(inp, small), frontier(inp, big), slider_scale(inp)
    for s in SLIDERS:
        a, c = choose(f_small, s, inp, scale), choose(f_big, s, inp, scale)
        if a.loss <= scale.target(s) + 1e-15:  # the small budget met the slider's quality target
            assert c.tok_s >= a.tok_s - 1e-9
        else:  # it could not: the bigger budget gives at least its quality
            assert c.loss <= a.loss + 1e-12


def test_nothing_fits_is_reported():
    inp = random_inputs(0)
    pts = frontier(inp, Budgets(vram=0, ram=1000))
    assert len(pts) == 1 and not pts[0].fits


def test_mixtral_size_frontier_is_fast():
    inp = random_inputs(1, layers=32, experts=8)
    b = budgets_for(inp, 0.25, 0.7)
    frontier(inp, b)
    t0 = time.perf_counter()
    pts = frontier(inp, b)
    assert time.perf_counter() - t0 < 0.5  # well under 100 ms on a quiet machine; CI is shared
    assert len(pts) > 5


def test_all_16bit_when_everything_fits():
    inp = random_inputs(2)
    b = budgets_for(inp, 1.2, 1.2)
    best = plan(inp, b, 1.0)
    assert best.loss == 0 and set(best.counts()) == {"gpu-16"}
    assert Tier.GPU16 in best.placement.counts()


@pytest.mark.parametrize("seed", range(4))
def test_memory_forced_4bit_experts_are_the_least_loss_ones(seed):
    """The seed paper's setting: memory holds only k experts at 16 bits. At best quality the planner
    must 4-bit exactly the experts whose popularity x sensitivity is least (sizes are equal)."""
    from dataclasses import replace

    inp = random_inputs(seed, layers=6, experts=8, cpu_only=True)
    inp = replace(inp, tier_costs={"cpu-16": inp.tier_costs["cpu-16"], "cpu-4": inp.tier_costs["cpu-4"]})
    n = inp.layers * inp.experts
    b16, b4 = inp.expert_bytes["cpu-16"], inp.expert_bytes["cpu-4"]
    cost = sorted(s * v for row_s, row_v in zip(inp.share, inp.sensitivity["cpu-4"]) for s, v in zip(row_s, row_v))
    for k in (n // 4, n // 2, 3 * n // 4):
        best = plan(inp, Budgets(vram=0, ram=inp.dense_bytes + k * b16 + (n - k) * b4), 1.0)
        assert best.counts().get("cpu-16", 0) == k
        assert best.loss == pytest.approx(sum(cost[: n - k]), rel=1e-9)


def test_frontier_has_no_plateau_between_gpu16_and_all_4bit_on_gpu():
    """Identical experts (a plan from a config alone), a GPU that holds a quarter of them at 16 bits:
    the frontier must step through the mixes of 16- and 4-bit on the GPU, not jump from "GPU full of
    16-bit" to "every expert 4-bit on the GPU"."""
    from dataclasses import replace

    inp = random_inputs(0, layers=32, experts=8)
    uniform = tuple(tuple([1 / 8] * 8) for _ in range(32))
    inp = replace(inp, share=uniform, sensitivity={t: [[0.1] * 8 for _ in range(32)] for t in ("cpu-4", "gpu-4")})
    pts = frontier(inp, budgets_for(inp, 0.25, 1.0))
    speeds = [p.tok_s for p in pts]
    assert max(b / a for a, b in zip(speeds, speeds[1:])) < 1.1


@pytest.mark.parametrize("seed", range(3))
def test_slider_steps_are_even(seed):
    """With memory to spare, eleven evenly spaced slider settings walk the frontier in comparable
    steps (normalised speed and loss together), not all at one end."""
    import numpy as np

    from dataclasses import replace

    # most experts nearly free to quantise, a few costly (like the demo, or a model with a few
    # sensitive layers): a scale linear in loss would spend the slider's whole speed range in
    # its first few percent
    rng = random.Random(seed)
    inp = random_inputs(seed, layers=16, experts=8, cpu_only=True)
    sens = [[rng.uniform(1e-4, 1e-3) if rng.random() < 0.9 else rng.uniform(0.5, 1.0) for _ in range(8)]
            for _ in range(16)]
    inp = replace(inp, sensitivity={"cpu-4": sens, "gpu-4": sens})
    unlimited = Budgets(vram=2**62, ram=2**62)
    pts = frontier(inp, unlimited)
    speed = np.array([p.tok_s for p in pts])
    loss = np.array([p.loss for p in pts])
    scale = slider_scale(inp)  # plan(inp, unlimited, s) for each s, the frontier and scale made once
    plans = [choose(pts, s, inp, scale) for s in SLIDERS]
    x = np.array([(p.tok_s - speed.min()) / np.ptp(speed) for p in plans])
    y = np.array([(p.loss - loss.min()) / np.ptp(loss) for p in plans])
    steps = np.hypot(np.diff(x), np.diff(y))
    total = float(np.hypot(np.diff(speed) / np.ptp(speed), np.diff(loss) / np.ptp(loss)).sum())
    assert steps.max() <= 0.2 * total


def test_prefill_prediction_follows_each_tiers_batch_scaling():
    from dataclasses import replace

    from engine.placement import Placement
    from engine.planning.planner import prefill_s

    inp = random_inputs(0, cpu_only=True)
    inp = replace(inp, dense_prefill_s=1e-4, batch_scale={
        "cpu-16": [[1, 1.0], [4, 2.0], [16, 4.0], [64, 8.0], [256, 16.0]],  # batching pays
        "cpu-4": [[1, 1.0], [256, 256.0]]})  # no gain from batching
    pl16 = Placement.uniform(inp.layers, inp.experts, Tier.CPU16)
    pl4 = Placement.uniform(inp.layers, inp.experts, Tier.CPU4)
    a16, b16 = prefill_s(inp, pl16, 64), prefill_s(inp, pl16, 1024)
    a4, b4 = prefill_s(inp, pl4, 64), prefill_s(inp, pl4, 1024)
    assert 0 < a16 < b16 < 16 * a16  # 16x the tokens, less than 16x the time
    assert b4 == pytest.approx(16 * a4, rel=1e-9)  # linear where batching gains nothing
    assert prefill_s(inp, pl16, 1024) == prefill_s(inp, pl16, 1024)  # a pure function


SCALING = {"cpu-16": [[1, 1.0], [2, 1.2], [4, 1.6], [16, 4.0], [64, 8.0], [256, 16.0]],
           "cpu-4": [[1, 1.0], [2, 1.3], [4, 1.9], [16, 5.0], [64, 10.0], [256, 20.0]]}


def test_expected_runs_of_a_batched_decode_step():
    from engine.planning.planner import expected_runs

    p = np.array([0.0, 0.05, 0.25, 0.6, 1.0])
    assert np.allclose(expected_runs(p, 1, SCALING["cpu-4"], 1e6), p)
    # no gain from batching: n tokens cost n runs, so S streams cost S times one stream's share
    assert np.allclose(expected_runs(p, 4, [[1, 1.0], [256, 256.0]], 1e6), 4 * p)
    # perfect batching: the expert runs once whenever any of the S tokens picks it
    assert np.allclose(expected_runs(p, 4, [[1, 1.0], [256, 1.0]], 1e6), 1 - (1 - p) ** 4)
    # the measured table: against a simulation of S independent tokens
    rng = np.random.default_rng(0)
    n = rng.binomial(4, p[None, :], size=(200_000, 5))
    from engine.planning.planner import batch_ratio
    per_k = np.array([batch_ratio(SCALING["cpu-4"], k, 1e6) if k else 0.0 for k in range(5)])
    sim = per_k[n].mean(0)  # n is 0..4: each count's ratio once, looked up for the 1M draws
    assert np.allclose(expected_runs(p, 4, SCALING["cpu-4"], 1e6), sim, atol=3e-3)


def test_batched_decode_prediction_and_frontier():
    from dataclasses import replace

    from engine.placement import Placement
    from engine.planning.planner import UNLIMITED, decode_tok_s

    one = replace(random_inputs(2, cpu_only=True), batch_scale=SCALING)
    four = replace(one, streams=4)
    for tier in (Tier.CPU16, Tier.CPU4):
        pl = Placement.uniform(one.layers, one.experts, tier)
        a, b = decode_tok_s(one, pl), decode_tok_s(four, pl)
        assert a < b < 4 * a  # four streams together: more tokens a second, less than four times
    assert one.dense_token_s == one.dense_s and four.dense_token_s == pytest.approx(one.dense_s * 1.6 / 4)
    # the frontier's speeds are the aggregate rate at that many streams, for the same placements
    for inp in (one, four):
        for p in frontier(inp, UNLIMITED):
            assert p.tok_s == pytest.approx(decode_tok_s(inp, p.placement), rel=1e-9)
    # batching favours rare experts: an expert's cost grows less than its share does
    _, t1, *_ = planner._tables(one)
    _, t4, *_ = planner._tables(four)
    share = np.asarray(one.share).reshape(-1)
    hi, lo = int(share.argmax()), int(share.argmin())
    assert t4[hi, 0] / t4[lo, 0] < t1[hi, 0] / t1[lo, 0]
