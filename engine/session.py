"""The engine thread: owns the model, takes commands from a queue, publishes events.

The window, the terminal chat, bench, eval, plan and the tests all drive the engine through this
one interface (the messages are in `protocol`). `emit` is called on the engine thread; a GUI
forwards events to its own thread (a queued signal), never touching widgets from here.

Error boundary: any exception in a command, a decode step or a migration becomes an ErrorEvent
(one line for the user; the traceback of an unexpected one goes to the log file, see errorlog) and
the thread keeps serving. A request that failed ends with its own error.

Concurrency: requests run together in one Batch (engine/batch.py): each decode step is one
batched forward for every running request, and a new request's prompt is read a chunk at a time
between steps. The chat's request uses the generator's own KV cache (its prefix carries over
between turns), so a second chat request waits for the first; requests with slot "pool" (the
local server's) take pool caches, up to `max_streams` requests at once. Stop(request_id) ends one
request; Stop() ends all of them (and a calibration).

Re-placement: the memory monitor and the slider feed the planner; a new placement becomes a list
of moves that the Migrator builds on a worker thread and that are swapped in between decode steps
(safe points), so generation goes on while experts move. When a budget shrinks below what is
held, the moves that free that memory run before the next decode step.
"""
from __future__ import annotations

import gc
import os
import queue
import statistics
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Callable

import torch

from . import errorlog, native
from .errors import MixdeskError
from .batch import Batch, Either
from .generate import Finished, Token
from .migrator import Migrator
from .monitor import MemorySource, Monitor, SystemSource
from .placement import Move, Placement, Tier
from .planning.planner import Budgets, PlanInputs, SliderScale, choose, frontier, slider_scale
from .prompt_limit import check_chars, longest_token_chars, message_chars
from .protocol import (Done, EngineStopped, ErrorEvent, Generate, Load, Loaded, MigrationProgress,
                       PlacementChanged, Reading, Reprofile, SetBudgets, SetSlider, Shutdown, Stats,
                       Stop, Task, TaskDone, TokenOut)
from .session_profile import Profiling


def _token_counter(tokenizer) -> Callable[[str], int]:
    """Counts tokens without holding a reference to the model (so shutting down frees it)."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _prompt_ids(generator) -> Callable[[list], list]:
    """The chat template's ids(), without a reference to the model (listeners keep events)."""
    if generator.template is None:
        generator.chat_prompt([{"role": "user", "content": "Hello"}])  # builds the template
    return generator.template.ids


class Session(Profiling):
    def __init__(self, emit: Callable[[object], None], source: MemorySource | None = None,
                 poll_s: float = 0.5, tiers: tuple[Tier, ...] | None = None, seam: bool = False,
                 hysteresis: float = 0.05, slice_s: float = 0.002, slider: float = 0.5,
                 tier_costs: dict | None = None, background_moves: bool | None = None, max_streams: int = 4):
        self._primary = emit
        self.emit = self._fanout
        # more consumers of every event (the local server beside the window); called on this thread
        self.listeners: list[Callable[[object], None]] = []
        self.max_streams = max_streams
        self.batch: Batch | None = None
        self.last_loaded: Loaded | None = None  # the model ready now, as last announced (for late listeners)
        self._stops: dict[int, threading.Event] = {}  # each running or queued request's own Stop
        self._source = source
        self.poll_s = poll_s
        self.tiers = tiers  # restrict the planner to these tiers (None: all the machine has)
        self.seam = seam  # plan gpu-* tiers on the CPU device (tests and experiments only)
        self.tier_costs = tier_costs  # tier -> (fixed_s, s_per_byte), replacing measured ones (tests only)
        self.hysteresis = hysteresis
        self.slice_s = slice_s  # longest time spent swapping built experts in between two steps
        # build new expert forms on a worker thread too (None: where the decode threads leave two
        # cores free; on a machine they keep busy, a worker only slows the steps: see migrator.py)
        self.background_moves = background_moves
        self.commands: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="mixdesk-engine", daemon=True)
        self.cancel = threading.Event()  # stops the reply in progress
        self.calib_cancel = threading.Event()  # stops a calibration (Stop with no request id)
        self._calib = None  # the background calibration's steps (profile.calibrate_steps), if one runs
        self._timings: tuple[float, float] | None = None  # the model's dense decode and prefill timings
        # engine-thread state
        self.loaded = None
        self.pinned = False  # a placement given by the user: no planning, no re-placement
        self.inputs: PlanInputs | None = None
        self.scale: SliderScale | None = None  # slider_scale(self.inputs), computed once per inputs
        self.slider = slider
        self.cap = SetBudgets()
        self.reading = None
        self.budgets: Budgets | None = None
        self.migrator: Migrator | None = None
        self.monitor: Monitor | None = None
        self.target: Placement | None = None
        self._frontier: tuple | None = None  # (inputs, budgets, points): slider moves reuse it
        self._queued: deque = deque()
        self._quit = False
        self._decode_ema = 0.0
        self._steps: deque = deque(maxlen=32)  # the last decode steps' seconds (the build budget)
        # the planner's streams (its cost model of batched decode) follow the concurrency decode
        # steps run at: an average over ~20 steps, re-planned when it settles near another count
        self._width = 1.0
        self.plan_streams = 1
        self._prefill = 0.0
        self._last_stats = 0.0
        self._max_token_chars = 0  # the loaded tokenizer's longest token (engine/prompt_limit.py)

    def _fanout(self, ev) -> None:
        self._primary(ev)
        for listener in list(self.listeners):
            listener(ev)

    @property
    def _busy(self) -> bool:
        """Some request is generating."""
        return self.batch is not None and self.batch.active

    # ---- API (any thread) ----
    def start(self) -> "Session":
        self.thread.start()
        return self

    def submit(self, cmd) -> None:
        if isinstance(cmd, Generate):
            self._stops.setdefault(cmd.request_id, threading.Event())
        if isinstance(cmd, Stop):  # effective at the next step, even mid-queue
            if cmd.request_id is None:
                self.cancel.set()
                self.calib_cancel.set()
            else:
                self._stops.setdefault(cmd.request_id, threading.Event()).set()
        self.commands.put(cmd)

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop generating and migrating, free the model, join the thread. True if it ended."""
        self.cancel.set()
        self.commands.put(Shutdown())
        self.thread.join(timeout)
        return not self.thread.is_alive()

    @property
    def held(self) -> tuple[int, int]:
        """(vram, ram) bytes the model holds, as the planner counts them."""
        return self.migrator.held if self.migrator is not None else (0, 0)

    # ---- engine thread ----
    def _run(self) -> None:
        why = ""
        try:
            while not self._quit:
                self._guard("engine", self._iteration)
        except BaseException as e:  # noqa: BLE001 - not even this may pass silently
            why = f"{errorlog.one_line(e)}"
            log = errorlog.record(e, "engine thread")
            self.emit(EngineStopped(message=f"the engine stopped: {why}", log=log))
        finally:
            self._teardown()

    def _iteration(self) -> None:
        if self._busy:
            self._drain(block=False)
            if self._quit:
                return
            self._swap()
            if self._busy:
                self._step()
        elif self.migrator is not None and self.migrator.pending:
            self._drain(block=False)
            if not self._quit and not self._swap():
                self.migrator.wait_ready(0.02)  # the worker is building what is left
        elif self._calib is not None:  # between requests: a slice of the background calibration
            self._drain(block=False)
            if not self._quit and not self._busy and self._calib is not None and not self._queued:
                self._guard("calibrating", self._calibrate_slice)
        else:
            self._drain(block=True)
        while self._queued and not self._quit and self._may_start(self._queued[0]):
            cmd = self._queued.popleft()
            self._guard(_describe(cmd), lambda: self._begin(cmd), cmd.request_id)

    def _may_start(self, cmd) -> bool:
        """Whether a command can start now: a task or a load waits for every request to end; a
        request joins the running ones while the batch has room for its slot."""
        if not self._busy:
            return True
        return isinstance(cmd, Generate) and self.batch.can_take(cmd.slot)

    def _guard(self, what: str, fn, request_id: int | None = None) -> bool:
        """Run fn; any exception becomes an ErrorEvent and the engine carries on. True if it ran."""
        try:
            fn()
            return True
        except Exception as e:  # noqa: BLE001 - the error boundary: report, log, keep serving
            self._failed(request_id)
            self._report(e, what, request_id)
        return False

    def _report(self, e: Exception, what: str, request_id: int | None, log: str | None = None) -> None:
        """One ErrorEvent for e: an expected error's own line; an unexpected one logged (once: pass
        `log` when one error ends several requests) and said as "<what> failed: ..."."""
        if isinstance(e, MixdeskError):
            self.emit(ErrorEvent(message=str(e), request_id=request_id, kind=type(e).__name__))
            return
        log = errorlog.record(e, what) if log is None else log
        where = f" (details in {log})" if log else ""
        self.emit(ErrorEvent(message=f"{what} failed: {errorlog.one_line(e)}{where}", request_id=request_id,
                             log=log, kind=type(e).__name__))

    def _failed(self, request_id: int | None) -> None:
        """After an error: a request that failed before it joined the batch is over."""
        if request_id is not None:
            self._stops.pop(request_id, None)

    def _teardown(self) -> None:
        for cmd in self._queued:  # requests that never started
            if isinstance(cmd, Generate):
                self.emit(ErrorEvent(message="the engine stopped before this request ran", request_id=cmd.request_id,
                                     kind="Unloaded"))
        self._queued.clear()
        self._unload()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _drain(self, block: bool) -> None:
        try:
            cmd = self.commands.get(timeout=0.1) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._guard(_describe(cmd), lambda c=cmd: self._handle(c), getattr(cmd, "request_id", None))
            if self._quit:
                return
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, cmd) -> None:
        if isinstance(cmd, Shutdown):
            self._quit = True
        elif isinstance(cmd, Load):
            self._load(cmd)
        elif isinstance(cmd, (Generate, Task)):
            if not self._queued and self._may_start(cmd):
                self._begin(cmd)
            else:
                self._queued.append(cmd)
        elif isinstance(cmd, Stop):
            if cmd.request_id is not None:  # a request still queued ends here, without a token
                for q in [q for q in self._queued if isinstance(q, Generate) and q.request_id == cmd.request_id]:
                    self._queued.remove(q)
                    self._stops.pop(q.request_id, None)
                    self.emit(Done(request_id=q.request_id, finished=Finished("cancelled", "")))
            if not self._busy:
                self.cancel.clear()
        elif isinstance(cmd, SetSlider):
            if abs(cmd.value - self.slider) > 1e-9:
                self.slider = min(max(cmd.value, 0.0), 1.0)
                self._replan("slider")
        elif isinstance(cmd, Reprofile):
            if self.loaded is not None and not self._busy:
                self.cancel.clear()
                try:
                    self._profile(remeasure=True)
                finally:
                    self._emit_loaded()  # ready again, with whichever profile holds now
                self._replan("profile")
            elif self.loaded is not None:
                self.emit(ErrorEvent(message="re-measuring waits for the reply to finish: try again then"))
        elif isinstance(cmd, SetBudgets):
            self.cap = cmd
            self._set_budgets(force=True)
        elif isinstance(cmd, Reading):
            self.reading = cmd.reading
            self._set_budgets(force=False)

    # ---- loading ----
    def _unload(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        if self.migrator is not None:
            self.migrator.stop()
            self.migrator = None
        if self.batch is not None:
            for rid in self.batch.end_all():  # requests still running end with a word, not silence
                self._stops.pop(rid, None)
                self.emit(ErrorEvent(message="the model was closed while this request ran", request_id=rid,
                                     kind="Unloaded"))
            self.batch = None
        if self.loaded is not None:
            self.loaded.ckpt.close()
            self.loaded = None
        self.last_loaded = None
        self.inputs = self.scale = self.budgets = self.target = self._frontier = None
        self._calib = self._timings = None
        gc.collect()

    def _load(self, cmd: Load) -> None:
        from .load import load, open_checkpoint

        # The model in use stays until the new one is found and its folder validated (a download
        # that fails, a folder that is not a model): only then is it released for the new one.
        path = cmd.path
        if path == "demo":
            from .sources import demo

            path = str(demo.ensure(progress=self._progress("build demo"), log=lambda s: None))
        else:
            from .sources.hub import resolve

            self.calib_cancel.clear()  # the window's Cancel (Stop with no request id) stops a download
            path = str(resolve(path, progress=self._progress("download"), cancel=self.calib_cancel))
        probe = open_checkpoint(path)  # no weights read
        try:
            self._unload()
            self.cancel.clear()
            self.pinned = cmd.placement != "auto"
            placement = cmd.placement
            if not self.pinned:  # a cached profile: plan from it before any expert is built
                placement = self._plan_from_cache(probe, cmd) or "auto"
        finally:
            probe.close()
        self.loaded = loaded = load(path, placement, cmd.device, cmd.dtype, cmd.ctx, progress=self._progress("load"),
                                    budgets=self._first_budgets(cmd.device), slider=self.slider)
        loaded.generator.on_oom = self._on_oom
        self._max_token_chars = longest_token_chars(loaded.tokenizer)
        self.batch = Batch(loaded.generator, self.max_streams)
        background = self.background_moves
        if background is None:
            background = (os.cpu_count() or 1) >= native.threads() + 2
        self.migrator = Migrator(loaded.model, self._moved, background=background,
                                 dense_on_accelerator=not loaded.accel.cpu_only)
        if not self.pinned:
            self._profile(remeasure=False)
        self._emit_loaded()
        source = self._source or SystemSource(loaded.accel.device.index if loaded.accel.is_cuda else None)
        self.monitor = Monitor(source, lambda r: self.commands.put(Reading(reading=r)), lambda: self.held,
                               period=self.poll_s, lock=self.migrator.lock)
        self.reading = self.monitor.reading()
        self._set_budgets(force=True)
        self.monitor.start()

    def _emit_loaded(self) -> None:
        """The model is ready (sent again after a re-profile: the popularity it carries may change)."""
        ld = self.loaded
        d = ld.ckpt.dims
        share = self.inputs.share if self.inputs is not None else ()
        self.last_loaded = Loaded(name=ld.ckpt.folder.name, description=ld.describe(), cpu_only=ld.accel.cpu_only,
                         layers=d.layers, experts=d.experts, ctx=ld.generator.ctx, share=share,
                         params=d.layers * d.experts * d.expert_params()
                         + ld.model.dense_params(),
                         count_tokens=_token_counter(ld.tokenizer), prompt_ids=_prompt_ids(ld.generator),
                         max_token_chars=self._max_token_chars, **getattr(ld.ckpt, "bar_fields", dict)())
        self.emit(self.last_loaded)

    def _first_budgets(self, device: str | None) -> Budgets | None:
        """The budgets the first placement is planned under: free memory within the user's caps
        (None: free memory, which load measures itself)."""
        if self.cap.vram is None and self.cap.ram is None:
            return None
        from .devices import detect
        from .planning.inputs import default_budgets

        acc = detect(device)
        free = default_budgets(acc.cpu_only, acc.device)
        return Budgets(vram=free.vram if self.cap.vram is None else min(free.vram, self.cap.vram),
                       ram=free.ram if self.cap.ram is None else min(free.ram, self.cap.ram))

    # ---- planning and migration ----
    def _set_budgets(self, force: bool) -> None:
        if self.reading is None or self.inputs is None:
            return
        vram, ram = self.reading.vram, self.reading.ram
        if self.cap.vram is not None:
            vram = min(vram, self.cap.vram) if self.reading.sample.vram_total else self.cap.vram
        if self.cap.ram is not None:
            ram = min(ram, self.cap.ram)
        new = Budgets(vram=vram, ram=ram)
        old = self.budgets
        held = self.held
        shrunk_below_held = new.vram < held[0] or new.ram < held[1]
        changed = old is None or any(abs(a - b) > self.hysteresis * max(b, 1)
                                     for a, b in ((new.vram, old.vram), (new.ram, old.ram)))
        if force or changed or shrunk_below_held:
            self.budgets = new
            self._replan("budget")

    def _points(self) -> list:
        """The frontier under the current budgets; a slider move reuses it (the planner's costliest
        part: tens of ms that would otherwise stall a decode step)."""
        f = self._frontier
        if f is None or f[0] is not self.inputs or f[1] != self.budgets:
            f = self._frontier = (self.inputs, self.budgets, frontier(self.inputs, self.budgets))
        return f[2]

    def _replan(self, reason: str) -> None:
        if self.inputs is None or self.budgets is None or self.pinned or self.loaded is None:
            return
        pts = self._points()
        scale = self.scale or slider_scale(self.inputs)
        p = choose(pts, self.slider, self.inputs, scale)
        limited = p.loss > scale.target(self.slider) + 1e-12 or not p.fits
        target = p.placement
        moves = self.loaded.model.placement.diff(target)
        self.migrator.retarget(moves)
        self.target = target
        self.emit(PlacementChanged(placement=target, moves=len(moves), reason=reason, predicted_tok_s=p.tok_s,
                                   predicted_loss=p.loss, frontier=tuple((q.loss, q.tok_s) for q in pts),
                                   slider_scale=scale, limited_by_budget=limited, streams=self.inputs.streams))
        self._enforce()
        if not moves:
            self._stats(force=True)

    def _over(self) -> tuple[bool, bool]:
        held = self.held
        return held[0] > self.budgets.vram, held[1] > self.budgets.ram

    def _enforce(self) -> None:
        """Before the next decode step, run the planned moves that free memory in a pool that is
        over its budget."""
        if self.migrator is not None and self.budgets is not None:
            self.migrator.enforce(self._over)

    def _moved(self, m: Move, nbytes: int, seconds: float) -> None:
        c = self.migrator.counters
        self.emit(MigrationProgress(done=c.done, total=c.total, bytes_moved=c.bytes_moved, seconds=c.seconds,
                                    last_tier=m.new.value, last_bytes=nbytes, last_seconds=seconds))

    def _swap(self) -> int:
        """A safe point between two decode steps: swap built experts in, and build more here within
        a budget that keeps the gap between two tokens under twice a decode step (while nothing
        generates, without a limit)."""
        m = self.migrator
        if m is None:
            return
        build_s = IDLE_BUILD_S
        if self._busy:
            build_s = BUILD_SHARE * statistics.median(self._steps) if self._steps else 0.0
        n = m.install_ready(self.slice_s, build_s)
        if n and not m.pending:
            self._stats(force=True)  # the migration just finished
        return n

    def _on_oom(self) -> None:
        """CUDA ran out of memory mid-step: shrink the VRAM budget below what is held, evict, retry."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.cap = SetBudgets(vram=int(self.held[0] * 0.8), ram=self.cap.ram)
        self._set_budgets(force=True)
        self._enforce()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ---- generation ----
    def _begin(self, cmd) -> None:
        if isinstance(cmd, Task):
            self.emit(TaskDone(request_id=cmd.request_id, value=cmd.fn(self)))
            return
        if self.loaded is None:
            self._stops.pop(cmd.request_id, None)
            self.emit(ErrorEvent(message="no model is loaded", request_id=cmd.request_id, kind="NoModel"))
            return
        if not self._busy:
            self.cancel.clear()
        gen = self.loaded.generator
        cmd.params.check()
        if cmd.prompt_ids is not None:
            ids = list(cmd.prompt_ids)
        elif cmd.prompt_text is not None:
            check_chars(len(cmd.prompt_text), gen.ctx, self._max_token_chars)
            ids = gen.tok.encode(cmd.prompt_text, add_special_tokens=True)
        else:
            check_chars(message_chars(cmd.messages), gen.ctx, self._max_token_chars)
            ids = gen.chat_prompt(cmd.messages or [])
        if cmd.fresh and cmd.slot == "chat":
            gen.cache.tokens = []
        own = self._stops.setdefault(cmd.request_id, threading.Event())
        self.batch.add(cmd.request_id, ids, cmd.params, Either(own, self.cancel), cmd.slot)

    def _step(self) -> None:
        """One round of the batch; each request's tokens, end or error goes out as its event."""
        try:
            results = self.batch.step()
        except Exception as e:  # noqa: BLE001 - outside any one request: every running one ends
            log = errorlog.record(e, "generating")
            for rid in self.batch.end_all():
                self._stops.pop(rid, None)
                self._report(e, "generating", rid, log)
            native.quiet_torch.leave()
            return
        self._follow_streams(self.batch.last_width)
        n, seconds = self.batch.last_decode
        if n > 1 and seconds > 0:  # a batched step: the aggregate rate
            self._steps.append(seconds)
            self._decode_ema = 0.8 * self._decode_ema + 0.2 * n / seconds if self._decode_ema else n / seconds
            self.batch.last_decode = (0, 0.0)
        for rid, ev in results:
            if isinstance(ev, Token):
                if ev.index == 0:
                    self._prefill = 0.0
                elif len(self.batch.streams) <= 1:
                    self._steps.append(ev.seconds)
                    rate = 1.0 / max(ev.seconds, 1e-9)
                    self._decode_ema = rate if self._decode_ema == 0 else 0.8 * self._decode_ema + 0.2 * rate
                self.emit(TokenOut(request_id=rid, token_id=ev.id, text=ev.text, index=ev.index, seconds=ev.seconds))
            elif isinstance(ev, Finished):
                self._prefill = ev.prefill_tok_s or self._prefill
                if ev.decode_tok_s and not self.batch.streams:
                    self._decode_ema = ev.decode_tok_s
                self._stops.pop(rid, None)
                self.emit(Done(request_id=rid, finished=ev))
            elif isinstance(ev, BaseException):
                self._stops.pop(rid, None)
                self._report(ev, "generating", rid)
        if not self._busy:
            native.quiet_torch.leave()
            self.cancel.clear()
        self._stats(force=any(isinstance(ev, Finished) for _, ev in results))

    def _follow_streams(self, width: int) -> None:
        """After a decode step of `width` sequences: when the average width settles near another
        whole number of streams, plan for that many (PlanInputs.streams)."""
        if width <= 0:
            return
        self._width += STREAMS_EMA * (width - self._width)
        want = max(1, min(self.max_streams, round(self._width)))
        if want != self.plan_streams and abs(self._width - want) < 0.3:
            self.plan_streams = want
            if self.inputs is not None:
                self.inputs = replace(self.inputs, streams=want)
                self._frontier = None
                self._replan("streams")

    def _stats(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.loaded is None or (not force and now - self._last_stats < 0.25):
            return
        self._last_stats = now
        s = self.reading.sample if self.reading else None
        b = self.budgets or Budgets(0, 0)
        held = self.held
        counts = {t.value: n for t, n in self.loaded.model.placement.counts().items() if n}
        self.emit(Stats(decode_tok_s=self._decode_ema, prefill_tok_s=self._prefill, vram_held=held[0],
                        vram_free=s.vram_free if s else 0, vram_others=s.vram_used_by_others if s else 0,
                        vram_budget=b.vram, ram_held=held[1], rss=s.rss if s else 0, ram_budget=b.ram,
                        tiers=counts, ctx_used=len(self.loaded.generator.cache.tokens),
                        ctx_max=self.loaded.generator.ctx, cpu_only=self.loaded.accel.cpu_only,
                        cpu_kernel=native.status()))


# Between two decode steps the engine thread builds expert forms for this share of the median of
# the last steps, so that the longest gap between two tokens stays under 2 steps. Measured on the
# demo (benchmarks/migration.py): shares of 0.7 / 0.5 / 0.35 gave longest gaps of 2.3x / 2.0-2.1x /
# 1.6-1.9x the median step; what is left of the gap is the decode steps' own tail (p90 1.2x the
# median on this shared machine), not the builds.
BUILD_SHARE = 0.25
STREAMS_EMA = 0.05  # weight of one decode step in the average concurrency (about 20 steps)
IDLE_BUILD_S = 0.05  # while nothing generates: build in slices this long, then look at the queue


def _describe(cmd) -> str:
    """What a command was doing, for an error message: 'loading the model', ..."""
    return {"Load": "loading the model", "Generate": "starting the reply", "Task": "the task",
            "SetSlider": "re-planning", "SetBudgets": "re-planning", "Reading": "re-planning",
            "Reprofile": "re-measuring"}.get(type(cmd).__name__, type(cmd).__name__)
