"""The placement controller without a model: budget re-planning from a scripted memory monitor,
eviction before the next step when a budget shrinks below what is held, the slider, a pinned
placement, and the concurrency the plan follows (with its hysteresis). The experts are stand-ins
with a size per tier, moved by the real Migrator; the planner is the real one, on synthetic
profiles."""
import random
from types import SimpleNamespace

import torch

from engine.machine.monitor import MemorySample, ScriptedSource
from engine.placement import Placement, Tier
from engine.control.controller import PlacementController
from engine.planning.planner import PlanInputs
from engine.protocol import Load, MigrationProgress, PlacementChanged, SetBudgets

L, E, MB = 4, 8, 2**20
SIZES = {"cpu-16": 32 * MB, "gpu-16": 32 * MB, "cpu-4": 10 * MB, "gpu-4": 9 * MB}
DENSE = 64 * MB


class Form:
    def __init__(self, tier):
        self.tier, self.nbytes = Tier(tier), SIZES[Tier(tier).value]


class StandInModel:
    """What the Migrator asks of a model: forms built per tier, swapped in, counted."""

    def __init__(self):
        self.placement = Placement.uniform(L, E, Tier.CPU16)
        self.forms = [[Form(Tier.CPU16) for _ in range(E)] for _ in range(L)]

    def expert_bytes(self):
        out = {"accelerator": 0, "host": 0}
        for row in self.forms:
            for f in row:
                out["accelerator" if f.tier.on_accelerator else "host"] += f.nbytes
        return out

    def dense_bytes(self):
        return DENSE

    def dense_mapped_bytes(self):  # none of it served from a mapped file
        return 0

    def build(self, layer, expert, tier, threads=None):
        return Form(tier)

    def build_steps(self, layer, expert, tier):
        yield
        return Form(tier)

    def install(self, layer, expert, form):
        old, self.forms[layer][expert] = self.forms[layer][expert], form
        self.placement = self.placement.with_tier(layer, expert, form.tier)
        return old


def inputs() -> PlanInputs:
    rng = random.Random(5)
    share = []
    for _ in range(L):
        w = [rng.random() ** 3 for _ in range(E)]
        share.append(tuple(x / sum(w) for x in w))
    sens = {t: [[rng.uniform(0.02, 0.3) for _ in range(E)] for _ in range(L)] for t in ("cpu-4", "gpu-4")}
    costs = {"cpu-16": (5e-5, 1 / 30e9), "cpu-4": (3e-5, 1 / 18e9), "gpu-16": (2e-5, 1 / 800e9),
             "gpu-4": (3e-5, 1 / 500e9)}
    return PlanInputs(L, E, 2, tuple(share), sens, SIZES, costs, dense_bytes=DENSE, dense_s=2e-3, cpu_only=False)


class Machine:
    """A scripted GPU of `vram` bytes of which other programs use `others` (whatever the test
    sets); free is what neither they nor the model hold."""

    def __init__(self, vram, others=0, ram_free=64 * 2**30):
        self.vram, self.others, self.ram_free = vram, others, ram_free
        self.ctl = None
        self.source = ScriptedSource(lambda n: MemorySample(
            vram_total=self.vram, vram_free=max(0, self.vram - self.others - self.held()),
            vram_used_by_others=self.others, ram_total=128 * 2**30, ram_available=self.ram_free))

    def held(self):
        return self.ctl.held[0] if self.ctl is not None else 0


def controller(machine, **kw):
    events = []
    ctl = machine.ctl = PlacementController(events.append, lambda: None, source=machine.source, poll_s=3600,
                                            background_moves=False, **kw)
    loaded = SimpleNamespace(model=StandInModel(), accel=SimpleNamespace(cpu_only=False, is_cuda=False,
                                                                           device=torch.device("cpu")))
    ctl.attach(loaded, inputs=inputs())
    ctl.follow_memory(lambda reading: None)  # readings are taken by the test, as the engine thread does
    return ctl, loaded.model, events


def plans(events, reason=None):
    return [e for e in events if isinstance(e, PlacementChanged) and reason in (None, e.reason)]


def settle(ctl, limit=1000):
    for _ in range(limit):
        if not ctl.migrating:
            return
        ctl.safe_point(busy=False, step_s=0.0)
    raise AssertionError("the migration did not finish")


def reading(ctl, machine):
    ctl.take_reading(ctl.monitor.reading())


def test_the_plan_follows_the_budget_and_evicts_before_the_next_step():
    m = Machine(vram=500 * MB)
    ctl, model, events = controller(m)
    try:
        assert [p.reason for p in plans(events)] == ["budget"]
        settle(ctl)
        assert model.placement == ctl.target
        assert ctl.held[0] <= ctl.budgets.vram and ctl.held[0] > DENSE  # some experts on the GPU
        reading(ctl, m)  # what the model holds now is not counted as taken by others
        assert len(plans(events)) == 1
        before = ctl.held[0]
        m.others = 30 * MB  # a game takes most of what is free: the budget drops below what is held
        reading(ctl, m)
        assert len(plans(events, "budget")) == 2
        assert ctl.held[0] <= ctl.budgets.vram < before  # freed at once, before any safe point
        settle(ctl)
        m.others -= 4 * MB  # a little more room, within the hysteresis: no new plan
        reading(ctl, m)
        assert len(plans(events, "budget")) == 2
        m.others = 0  # the game ends: experts come back
        reading(ctl, m)
        settle(ctl)
        assert len(plans(events, "budget")) == 3 and ctl.held[0] == before
        assert any(isinstance(e, MigrationProgress) for e in events)
    finally:
        ctl.detach()


def test_a_user_cap_and_the_slider_replan_and_the_frontier_is_reused():
    m = Machine(vram=2 * 2**30)
    ctl, model, events = controller(m)
    try:
        settle(ctl)
        ctl.set_cap(SetBudgets(vram=DENSE + 3 * SIZES["gpu-16"]))
        assert ctl.held[0] <= DENSE + 3 * SIZES["gpu-16"]
        pts = ctl.points()
        losses = []
        for v in (0.0, 0.5, 1.0):
            ctl.set_slider(v)
            losses.append(plans(events)[-1].predicted_loss)
        assert ctl.points() is pts  # slider moves reuse the frontier
        assert losses == sorted(losses, reverse=True)  # towards 1 (quality), never a worse loss
        n = len(plans(events))
        ctl.set_slider(1.0)  # no move, no plan
        assert len(plans(events)) == n
    finally:
        ctl.detach()


def test_a_pinned_placement_is_never_replanned():
    m = Machine(vram=500 * MB)
    events = []
    ctl = PlacementController(events.append, lambda: None, source=m.source, poll_s=3600, background_moves=False)
    assert ctl.plan_before_load(None, Load(path="x", placement="cpu")) == "cpu"
    loaded = SimpleNamespace(model=StandInModel(), accel=SimpleNamespace(cpu_only=False, is_cuda=False,
                                                                           device=torch.device("cpu")))
    ctl.attach(loaded)
    try:
        ctl.follow_memory(lambda r: None)
        m.others = 500 * MB
        reading(ctl, m)
        ctl.set_slider(0.9)
        assert not plans(events) and not ctl.migrating
    finally:
        ctl.detach()


def test_the_plan_follows_the_concurrency_once_it_settles_and_does_not_flap():
    ctl, _, events = controller(Machine(vram=500 * MB), max_streams=4)
    try:
        for _ in range(5):
            ctl.follow_streams(4)
        assert ctl.plan_streams == 1 and not plans(events, "streams")  # a few wide steps are not a trend
        for _ in range(200):
            ctl.follow_streams(4)
        assert ctl.plan_streams == 4 and ctl.inputs.streams == 4
        assert [p.streams for p in plans(events, "streams")] == [2, 3, 4]
        n = len(plans(events, "streams"))
        for i in range(400):  # between 3 and 4 streams: no re-plan back and forth
            ctl.follow_streams(3 + i % 2)
        assert len(plans(events, "streams")) == n
        ctl.follow_streams(0)  # a round that decoded nothing does not count
        assert ctl.plan_streams == 4
    finally:
        ctl.detach()
