"""The Migrator on its own, without the engine thread: plans, swaps, held bytes, enforcement, the
worker, and builds spread over short steps. And a cached-profile start that builds each expert
exactly once (issue 14, must show 5)."""
import threading
import time

import pytest

from engine.runtime.load import load
from engine.control.migrator import Migrator
from engine.placement import Placement, Tier


@pytest.fixture
def loaded(tiny):
    ld = load(tiny, "cpu", "cpu", "fp32")
    yield ld
    ld.ckpt.close()


def held_as_counted(model):
    eb = model.expert_bytes()
    return eb["accelerator"], eb["host"] + model.dense_bytes()


def drive(m: Migrator, build_s=None, limit=1000):
    for _ in range(limit):
        if not m.pending:
            return
        if not m.install_ready(0.005, build_s):
            m.wait_ready(0.05)
    raise AssertionError("the migration did not finish")


@pytest.mark.parametrize("background", [False, True])
def test_a_plan_is_reached_and_held_bytes_follow(loaded, background):
    model = loaded.model
    moved = []
    m = Migrator(model, lambda mv, nbytes, s: moved.append(mv), background=background)
    try:
        d = loaded.ckpt.dims
        target = Placement.random(d.layers, d.experts, [Tier.CPU4, Tier.CPU16], seed=3)
        moves = model.placement.diff(target)
        assert moves
        m.retarget(moves)
        drive(m, build_s=0.002)  # short slices: builds cross several calls
        assert model.placement == target
        assert len(moved) == len(moves) == m.counters.done
        assert m.held == held_as_counted(model)
    finally:
        m.stop()


def test_retarget_drops_what_is_no_longer_wanted(loaded):
    model = loaded.model
    d = loaded.ckpt.dims
    m = Migrator(model, background=False)
    first = Placement.uniform(d.layers, d.experts, Tier.CPU4)
    m.retarget(model.placement.diff(first))
    m.install_ready(0.0, build_s=1e-9)  # one step of one build (a positive budget buys one), nothing installed yet
    back = model.placement  # the slider went back: nothing should move
    m.retarget(model.placement.diff(back))
    assert not m.pending
    assert model.placement == back and m.held == held_as_counted(model)


def test_enforce_frees_memory_at_once(loaded):
    model = loaded.model
    d = loaded.ckpt.dims
    m = Migrator(model, background=False)
    m.retarget(model.placement.diff(Placement.uniform(d.layers, d.experts, Tier.CPU4)))
    budget = m.held[1] - 1  # one byte below what is held: every 4-bit move frees RAM
    m.enforce(lambda: (False, m.held[1] > budget))
    assert m.held[1] <= budget and m.held == held_as_counted(model)


def test_a_failed_build_on_the_worker_is_reported_on_the_engine_thread(loaded):
    model = loaded.model
    d = loaded.ckpt.dims
    m = Migrator(model, background=True)
    real = model.build

    def broken(layer, expert, tier, threads=None):
        raise OSError("disk went away")

    model.build = broken
    try:
        m.retarget(model.placement.diff(Placement.uniform(d.layers, d.experts, Tier.CPU4))[:1])
        deadline = time.time() + 10
        with pytest.raises(OSError, match="disk went away"):
            while time.time() < deadline:
                m.wait_ready(0.05)
                m.install_ready(0.005)  # the worker's failure is raised here, on the engine thread
    finally:
        model.build = real
        m.stop()


def test_monitor_reads_held_bytes_and_the_sample_under_the_migrators_lock(loaded):
    from engine.machine.monitor import MemorySample, Monitor, ScriptedSource

    m = Migrator(loaded.model, background=False)
    inside = []
    src = ScriptedSource(lambda i: (inside.append(m.lock.locked()),
                                    MemorySample(0, 0, 0, 8 * 10**9, 16 * 10**9, 10**9))[1])
    Monitor(src, lambda r: None, lambda: m.held, lock=m.lock).reading()
    assert inside == [True]


# ---- place once --------------------------------------------------------------------------------
def test_a_cached_profile_start_builds_each_expert_once(tiny, monkeypatch, window_cache):
    """The second start of a model plans from its cached profile before building anything: each
    expert is built exactly once and no move follows. (window_cache: the cache a first start left.)"""
    import engine.experts.expert as experts
    from engine.protocol import ErrorEvent, Load, Loaded, PlacementChanged
    from engine.runtime.session import Session

    def start(events):
        done = threading.Event()
        s = Session(lambda e: (events.append(e), isinstance(e, (Loaded, ErrorEvent)) and done.set()),
                    poll_s=0.05).start()
        s.submit(Load(path=str(tiny), device="cpu", dtype="fp32"))
        assert done.wait(300)
        time.sleep(0.3)  # the first budget readings and re-plans
        return s

    builds = []
    real = experts.read_expert
    monkeypatch.setattr(experts, "read_expert", lambda ck, l, e: (builds.append((l, e)), real(ck, l, e))[1])
    second = []
    s = start(second)
    try:
        d = s.loaded.ckpt.dims
        assert sorted(builds) == [(l, e) for l in range(d.layers) for e in range(d.experts)]
        assert all(e.moves == 0 for e in second if isinstance(e, PlacementChanged))
        assert not s.controller.migrating
    finally:
        s.shutdown()
