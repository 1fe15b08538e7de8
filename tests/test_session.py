"""The engine thread: commands in, events out; re-placement while generating, under a scripted
memory timeline and a moving slider; stop and shutdown."""
import threading
import time
import weakref

import pytest

from engine.runtime.generate import SamplingParams
from engine.machine.monitor import MemorySample, ScriptedSource
from engine.placement import Tier
from engine.planning.planner import plan
from engine.protocol import (Done, ErrorEvent, Generate, Load, Loaded, PlacementChanged, Reprofile, SetSlider,
                             Shutdown, Stats, Stop, Token)
from engine.runtime.session import Session

GB = 10**9


# Each test's own cache, a copy of the run's measured one (tests/conftest.py): the tiny model starts
# calibrated, as on any start after its first (Reprofile measures anew where tested).
pytestmark = pytest.mark.usefixtures("window_cache")


class Recorder:
    def __init__(self):
        self.events = []
        self.cond = threading.Condition()

    def __call__(self, ev):
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()

    def wait(self, pred, timeout=120):
        end = time.time() + timeout
        with self.cond:
            while not any(pred(e) for e in self.events):
                left = end - time.time()
                assert left > 0, f"timed out; last events: {self.events[-5:]}"
                self.cond.wait(left)
        return next(e for e in self.events if pred(e))

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


def start(tiny, rec, source=None, **kw):
    s = Session(rec, source=source, poll_s=0.02, **kw).start()
    s.submit(Load(path=str(tiny), device="cpu", dtype="fp32"))
    rec.wait(lambda e: isinstance(e, Loaded) or isinstance(e, ErrorEvent))
    assert not rec.of(ErrorEvent), rec.of(ErrorEvent)
    calibrated(s)
    return s


def calibrated(s, timeout=120):
    """Wait for the background calibration of a never-profiled model to end."""
    end = time.time() + timeout
    while s.controller.calibrating:
        assert time.time() < end, "calibration did not finish"
        time.sleep(0.02)


def tokens_of(rec, rid):
    return [e for e in rec.events if isinstance(e, Token) and e.request_id == rid]


def greedy_reference(tiny, prompt, n):
    """A greedy run with a fixed all-16-bit placement (the same precision as every 16-bit tier)."""
    from engine.runtime.load import load

    loaded = load(tiny, "cpu", device="cpu", dtype="fp32", ctx=512)
    loaded.generator.eos_ids.clear()
    return list(loaded.generator.stream(prompt, SamplingParams(max_new_tokens=n)))[-1].token_ids


PROMPT = [5, 17, 33, 60, 7, 99, 120, 3]


def test_budget_timeline_halves_then_restores(tiny):
    rec = Recorder()
    holder = {}
    total = {"vram": None}
    emitted = [0]

    def timeline(n):  # by tokens emitted, so the test does not depend on this machine's speed
        s = holder["s"]
        budget = total["vram"]
        if budget is None:
            budget = 10 * GB
        elif 20 <= emitted[0] < 60:
            budget = budget // 2
        free = max(budget - s.controller.held[0], 0)
        return MemorySample(vram_total=budget, vram_free=free, ram_total=64 * GB, ram_available=32 * GB)

    src = ScriptedSource(timeline)
    fast_gpu = {"gpu-16": (1e-6, 1e-12), "cpu-16": (1e-5, 1e-10)}  # so the plan wants the "GPU"
    s = Session(rec, source=src, poll_s=0.01, tiers=(Tier.GPU16, Tier.CPU16), seam=True, slider=1.0,
                tier_costs=fast_gpu)
    holder["s"] = s
    s.start()
    s.submit(Load(path=str(tiny), device="cpu", dtype="fp32"))
    rec.wait(lambda e: isinstance(e, Loaded))
    d = s.controller.inputs
    per = d.expert_bytes["gpu-16"]
    total["vram"] = int((d.dense_bytes + per * d.layers * d.experts * 0.75) / 0.9)  # room for 3/4 of experts
    violations = []

    gpu_counts = []  # (tokens emitted so far, experts on the accelerator) at every placement change

    def check(ev):
        rec(ev)
        if isinstance(ev, PlacementChanged):
            gpu_counts.append((emitted[0], ev.placement.counts()[Tier.GPU16]))
        if isinstance(ev, Token):
            emitted[0] = ev.index + 1
            time.sleep(0.005)  # give the 10 ms monitor a chance to see each phase
            ctl = s.controller
            if ctl.budgets is not None and ctl.held[0] > ctl.budgets.vram:
                violations.append((ev.index, ctl.held[0], ctl.budgets.vram))

    s.emit = check  # the broadcast events (PlacementChanged), and the reply's own (submitted after this)
    src.n = 0
    rid = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=120)))
    done = rec.wait(lambda e: isinstance(e, Done))
    assert s.shutdown()
    before = [c for i, c in gpu_counts if i < 20]
    during = [c for i, c in gpu_counts if 20 <= i < 60]
    after = [c for i, c in gpu_counts if i >= 60]
    assert before and during and after, gpu_counts
    assert min(during) < before[-1]  # the placement followed the budget down
    assert after[-1] == before[-1]  # and back up
    assert not violations, violations[:3]
    toks = tokens_of(rec, rid)
    assert [t.index for t in toks] == list(range(len(toks)))  # none lost or duplicated
    assert done.request_id == rid and done.token_ids == greedy_reference(tiny, PROMPT, 120)


def test_slider_moves_20_times_during_a_generation(tiny, pace):
    rec = Recorder()
    s = start(tiny, rec)
    s.loaded.generator.eos_ids.clear()
    pace(s.loaded.generator)  # 200 tokens over ~1 s: the slider moves land during the reply
    rid = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=200)))
    rec.wait(lambda e: isinstance(e, Token))
    values = [(i * 7 % 20) / 19 for i in range(20)]
    for v in values:
        s.submit(SetSlider(value=v))
        time.sleep(0.01)
    done = rec.wait(lambda e: isinstance(e, Done))
    deadline = time.time() + 30
    while s.controller.migrating and time.time() < deadline:
        time.sleep(0.05)
    final = plan(s.controller.inputs, s.controller.budgets, values[-1]).placement
    assert s.loaded.model.placement == final
    toks = tokens_of(rec, rid)
    assert done.request_id == rid
    assert [t.index for t in toks] == list(range(len(toks))) and len(done.token_ids) == 200
    assert "".join(t.text for t in toks) == done.text
    assert len([e for e in rec.of(PlacementChanged) if e.reason == "slider"]) >= 2
    assert rec.of(Stats) and rec.of(Stats)[-1].tiers
    assert s.shutdown()


def test_stop_cancels_the_reply(tiny, pace):
    rec = Recorder()
    s = start(tiny, rec)
    s.loaded.generator.eos_ids.clear()
    pace(s.loaded.generator)
    rid = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=5000)))
    rec.wait(lambda e: isinstance(e, Token) and e.index >= 3)
    s.submit(Stop(request_id=rid))
    done = rec.wait(lambda e: isinstance(e, Done))
    assert done.request_id == rid and done.reason == "cancelled"
    nxt = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=3)))
    rec.wait(lambda e: isinstance(e, Done) and e.request_id == nxt)  # a stop does not stick
    assert s.shutdown()


@pytest.mark.parametrize("when", ["generating", "migrating"])
def test_shutdown_leaves_no_thread_and_frees_the_model(tiny, when):
    rec = Recorder()
    s = start(tiny, rec, slice_s=0.0)
    model = weakref.ref(s.loaded.model)
    if when == "generating":
        s.loaded.generator.eos_ids.clear()
        s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=100000)))
        rec.wait(lambda e: isinstance(e, Token))
    else:
        for v in (0.0, 1.0, 0.0, 1.0):
            s.submit(SetSlider(value=v))
    assert s.shutdown(timeout=30)
    assert not [t for t in threading.enumerate() if t.name.startswith("mixdesk-")]
    import gc

    gc.collect()
    assert model() is None


@pytest.mark.slow  # 8 s; Tools > Re-measure through the window (test_app.py) takes the same path in the default run
def test_reprofile_measures_both_profiles_anew_and_replans(tiny, tmp_path):
    from engine.measures.hardware import profile_path as hw_path

    rec = Recorder()
    s = start(tiny, rec)
    files = [hw_path(), *(tmp_path / "cache").rglob("profiles/*.json")]
    assert len(files) == 2
    before = {f: f.stat().st_mtime_ns for f in files}
    loaded_before = len(rec.of(Loaded))  # the first start's, and the one after its background calibration
    profile_plans = len([e for e in rec.of(PlacementChanged) if e.reason == "profile"])
    s.submit(Reprofile())
    rec.wait(lambda e: len([p for p in rec.of(PlacementChanged) if p.reason == "profile"]) > profile_plans)
    assert len(rec.of(Loaded)) == loaded_before + 1  # ready again
    assert all(f.stat().st_mtime_ns > before[f] for f in files)  # both measured anew
    assert not rec.of(ErrorEvent)
    s.shutdown()


def test_errors_anywhere_become_events_and_the_thread_serves_on(tiny, monkeypatch):
    """The error boundary: a bad request, a failing query and a failing re-plan each end with an
    ErrorEvent (the unexpected ones with a log file holding the traceback), and the same thread
    answers the next request."""
    from pathlib import Path

    from engine.runtime import queries
    from engine.protocol import Query, QueryDone

    monkeypatch.setitem(queries.HANDLERS, "broken", lambda session: {}["missing"])  # a handler with a bug

    rec = Recorder()
    s = start(tiny, rec)
    thread = s.thread
    rid = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(temperature=float("nan"))))
    err = rec.wait(lambda e: isinstance(e, ErrorEvent) and e.request_id == rid)
    assert err.kind == "InputError" and "temperature" in err.message and not err.log

    rid = s.submit(Query(name="broken"))
    err = rec.wait(lambda e: isinstance(e, ErrorEvent) and e.request_id == rid)
    assert "KeyError" in err.message and err.log and "KeyError" in Path(err.log).read_text()
    rid = s.submit(Query(name="no such question"))
    err = rec.wait(lambda e: isinstance(e, ErrorEvent) and e.request_id == rid)
    assert err.kind == "InputError" and "no such question" in err.message and "vocab" in err.message

    def broken(*a, **k):
        raise ZeroDivisionError("planner bug")

    s.controller.points = broken  # the planner's frontier, on the controller's next re-plan
    s.submit(SetSlider(value=0.123))
    err = rec.wait(lambda e: isinstance(e, ErrorEvent) and "planner bug" in e.message)
    assert err.request_id is None
    del s.controller.points  # the method again

    rid = s.submit(Query(name="vocab"))
    assert rec.wait(lambda e: isinstance(e, QueryDone) and e.request_id == rid).value == s.loaded.ckpt.dims.vocab
    rid = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=3)))
    assert len(rec.wait(lambda e: isinstance(e, Done) and e.request_id == rid).token_ids) == 3
    assert s.thread is thread and thread.is_alive()
    s.shutdown()


def test_a_model_that_fails_to_open_leaves_the_one_in_use_chatting(tiny, tmp_path):
    """Load of a folder that is not a model: an error, and the model in use still answers (it is
    released only once the new one is found and its folder validated)."""
    rec = Recorder()
    s = start(tiny, rec)
    try:
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "readme.txt").write_text("not a model")
        for path in [str(tmp_path / "notes")]:
            rid = s.submit(Load(path=path, device="cpu", dtype="fp32"))
            err = rec.wait(lambda e, rid=rid: isinstance(e, ErrorEvent) and e.request_id == rid)
            assert err.message and not err.log  # an expected error, said in one line
            assert s.loaded is not None and s.last_loaded is not None and s.last_loaded.name == tiny.name
            rid = s.submit(Generate(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=3)))
            assert len(rec.wait(lambda e, rid=rid: isinstance(e, Done) and e.request_id == rid).token_ids) == 3
    finally:
        s.shutdown()


def test_the_check_model_query_opens_a_model_without_releasing_the_one_in_use(tiny, tmp_path):
    """File > Open model's check (app/model_switch.py) is a named query answered on the engine thread:
    a model's folder comes back; a folder that is not one is an error in one line; the model in use
    stays, and a chat sent as messages is rendered by the engine's one prompt pipeline."""
    from engine.protocol import Query, QueryDone

    rec = Recorder()
    s = start(tiny, rec)
    try:
        assert s.last_loaded.prompt_ids == s.loaded.prompts.chat  # engine/prompts/prompt.py, off the engine thread too
        rid = s.submit(Query(name="check_model", args={"spec": str(tiny)}))
        assert rec.wait(lambda e: isinstance(e, QueryDone) and e.request_id == rid).value == str(tiny)
        (tmp_path / "notes").mkdir()
        rid = s.submit(Query(name="check_model", args={"spec": str(tmp_path / "notes")}))
        err = rec.wait(lambda e: isinstance(e, ErrorEvent) and e.request_id == rid)
        assert "notes" in err.message and "\n" not in err.message and not err.log
        assert s.loaded is not None and s.last_loaded.name == tiny.name
        chat = [{"role": "user", "content": "hello"}]
        rid = s.submit(Generate(messages=chat, params=SamplingParams(max_new_tokens=3)))
        done = rec.wait(lambda e: isinstance(e, Done) and e.request_id == rid)
        assert done.prompt_tokens == len(s.last_loaded.prompt_ids(chat))
    finally:
        s.shutdown()
