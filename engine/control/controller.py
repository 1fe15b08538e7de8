"""Where every expert should be, and getting it there while the model generates.

The placement controller owns what placement depends on: the budgets (the memory monitor's
readings under the user's caps), the planner's inputs (engine/control/profiling.py) and its
frontier, the slider, the number of requests decoding together (which the plan follows), and the
migration: a new placement becomes a list of moves that the Migrator builds on a worker thread
and that are swapped in at safe points between decode steps, so generation goes on while experts
move. When a budget shrinks below what is held, the moves that free that memory run before the
next decode step. It runs on the engine thread, which calls it between steps.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable

import torch

from ..placement import LOWEST_BITS, Move, Placement, Tier
from .. import native
from .migrator import Migrator
from ..machine.monitor import MemorySource, Monitor, SystemSource
from ..planning.planner import Budgets, PlanInputs, SliderScale, choose, frontier, slider_scale
from ..protocol import ErrorEvent, Load, MigrationProgress, PlacementChanged, Reading, SetBudgets
from .profiling import Profiling

# Between two decode steps the engine thread builds expert forms for this share of the median of
# the last steps, so that the longest gap between two tokens stays under 2 steps. Measured on the
# demo (benchmarks/migration.py): shares of 0.7 / 0.5 / 0.35 gave longest gaps of 2.3x / 2.0-2.1x /
# 1.6-1.9x the median step; what is left of the gap is the decode steps' own tail (p90 1.2x the
# median on this shared machine), not the builds.
BUILD_SHARE = 0.25
STREAMS_EMA = 0.05  # weight of one decode step in the average concurrency (about 20 steps)
IDLE_BUILD_S = 0.05  # while nothing generates: build in slices this long, then look at the queue


class PlacementController:
    def __init__(self, emit: Callable[[object], None], announce: Callable[[], None],
                 source: MemorySource | None = None, poll_s: float = 0.5, tiers: tuple[Tier, ...] | None = None,
                 seam: bool = False, hysteresis: float = 0.05, slice_s: float = 0.002, slider: float = 0.5,
                 tier_costs: dict | None = None, background_moves: bool | None = None, max_streams: int = 4):
        """emit: events for every client; announce(): the model is ready again (its popularity
        changed). source: the memory monitor's (None: the machine's). background_moves: build on a
        worker thread (None: where the decode threads leave two cores free; on a machine they keep
        busy, a worker only slows the steps: see migrator.py). slice_s: the longest time spent
        swapping built experts in between two steps."""
        self.emit, self.announce = emit, announce
        self.profiling = Profiling(emit, tiers, tier_costs, seam)
        self._source, self.poll_s, self.hysteresis, self.slice_s = source, poll_s, hysteresis, slice_s
        self.background_moves, self.max_streams = background_moves, max_streams
        self.slider = slider
        self.cap = SetBudgets()
        self.loaded = None
        self.pinned = False  # a placement given by the user: no planning, no re-placement
        self.inputs: PlanInputs | None = None
        self.scale: SliderScale | None = None  # slider_scale(self.inputs), computed once per inputs
        self.reading = None
        self.budgets: Budgets | None = None
        self.migrator: Migrator | None = None
        self.monitor: Monitor | None = None
        self.target: Placement | None = None
        self._frontier: tuple | None = None  # (inputs, budgets, points): slider moves reuse it
        # the planner's streams (its cost model of batched decode) follow the concurrency decode
        # steps run at: an average over ~20 steps, re-planned when it settles near another count
        self._width = 1.0
        self.plan_streams = 1
        # one context's keys and values, (VRAM, RAM) bytes, kept out of the budgets the experts are
        # planned under (engine/control/context_fit.py), and the bytes the KV caches have touched so far (the
        # session's), which the monitor adds back as the model's own up to that reservation
        self.reserve = (0, 0)
        self.kv_resident: Callable[[], int] = lambda: 0

    @property
    def held(self) -> tuple[int, int]:
        """(vram, ram) bytes the model holds, as the planner counts them."""
        return self.migrator.held if self.migrator is not None else (0, 0)

    @property
    def mapped(self) -> int:
        """Bytes of the model served from its mapped file."""
        return self.migrator.mapped if self.migrator is not None else 0

    @property
    def calibrating(self) -> bool:
        return self.profiling.calibrating

    @property
    def migrating(self) -> bool:
        return self.migrator is not None and self.migrator.pending

    # ---- a model comes and goes ----
    def first_budgets(self, device: str | None) -> Budgets | None:
        """The budgets the first placement is planned under: free memory within the user's caps
        (None: free memory, which load measures itself)."""
        if self.cap.vram is None and self.cap.ram is None:
            return None
        from ..machine.devices import detect

        acc = detect(device)
        return self._capped(acc.cpu_only, acc)

    def _capped(self, cpu_only: bool, accel) -> Budgets:
        """Free memory (as the planner counts it for cpu_only) within the user's caps."""
        from ..measures.inputs import default_budgets

        free = default_budgets(cpu_only, accel.device)
        return Budgets(vram=free.vram if self.cap.vram is None else min(free.vram, self.cap.vram),
                       ram=free.ram if self.cap.ram is None else min(free.ram, self.cap.ram))

    def free_budgets(self, accel) -> Budgets:
        """The memory the model may use now, within the user's caps, with nothing kept for a context:
        the monitor's reading where it runs (the model's held bytes added back), a reading of the
        memory source given (a test's scripted machine) before it does, else the machine's free memory."""
        if self.monitor is not None:
            return self._gross(self.monitor.reading())
        if self._source is not None:
            return self._gross(Monitor(self._source, lambda r: None).reading())
        return self._capped(accel.cpu_only, accel)

    def reserve_context(self, reserve: tuple[int, int]) -> None:
        """The context's keys and values now take `reserve` (VRAM, RAM): re-plan the experts beside it."""
        self.reserve = reserve
        self._set_budgets(force=True)

    def plan_before_load(self, probe, cmd: Load) -> Placement | str:
        """What to load: the user's placement, or one planned from a cached profile (beside the
        context's reservation), or "auto"."""
        from .context_fit import net

        self.pinned = cmd.placement != "auto"
        if self.pinned:
            return cmd.placement
        return self.profiling.plan_from_cache(probe, cmd, lambda c, a: net(self._capped(c, a), self.reserve),
                                              self.slider, self.plan_streams) or "auto"

    def attach(self, loaded, inputs: PlanInputs | None = None) -> None:
        """The model is built: its migrator, and (unless pinned) its profile, or the planner inputs
        given (a profile measured elsewhere; the tests' scripted machines)."""
        self.loaded = loaded
        background = self.background_moves
        if background is None:
            background = (os.cpu_count() or 1) >= native.threads() + 2
        self.migrator = Migrator(loaded.model, self._moved, background=background,
                                 dense_on_accelerator=not loaded.accel.cpu_only)
        if inputs is not None:
            self._use_inputs(replace(inputs, streams=self.plan_streams))
        elif not self.pinned:
            self._use_profile(self.profiling.profile(loaded, remeasure=False, have_inputs=False))

    def follow_memory(self, on_reading: Callable[[Reading], None]) -> None:
        """Start following free memory (after the model was announced): each reading comes back
        through on_reading, on the monitor's thread."""
        ld = self.loaded
        source = self._source or SystemSource(ld.accel.device.index if ld.accel.is_cuda else None)
        self.monitor = Monitor(source, lambda r: on_reading(Reading(reading=r)), self._held_with_cache,
                               period=self.poll_s, lock=self.migrator.lock)
        self.reading = self.monitor.reading()
        self._set_budgets(force=True)
        self.monitor.start()

    def detach(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        if self.migrator is not None:
            self.migrator.stop()
            self.migrator = None
        self.loaded = self.inputs = self.scale = self.budgets = self.target = self._frontier = None
        self.profiling.background = self.profiling.timings = None

    # ---- what moves the plan ----
    def set_slider(self, value: float, lowest_bits: int | None = None) -> None:
        if lowest_bits is not None and lowest_bits != self.profiling.lowest_bits:
            if lowest_bits not in LOWEST_BITS:
                self.emit(ErrorEvent(message=f"the lowest precision for experts is 4, 3 or 2 bits, not {lowest_bits!r}"))
                return
            self.profiling.lowest_bits = lowest_bits
            self.slider = min(max(value, 0.0), 1.0)
            if self.inputs is not None:
                self._use_inputs(replace(self.inputs, lowest_bits=lowest_bits))
            self._replan("lowest precision")
        elif abs(value - self.slider) > 1e-9:
            self.slider = min(max(value, 0.0), 1.0)
            self._replan("slider")

    def set_cap(self, cap: SetBudgets) -> None:
        self.cap = cap
        self._set_budgets(force=True)

    def take_reading(self, reading) -> None:
        self.reading = reading
        self._set_budgets(force=False)

    def reprofile(self, busy: bool) -> None:
        """Measure this machine and calibrate anew, then re-plan (not while a reply runs)."""
        if self.loaded is None:
            return
        if busy:
            self.emit(ErrorEvent(message="re-measuring waits for the reply to finish: try again then"))
            return
        try:
            mp = self.profiling.profile(self.loaded, remeasure=True, have_inputs=self.inputs is not None)
            if mp is not None:
                self._use_profile(mp)
        finally:
            self.announce()  # ready again, with whichever profile holds now
        self._replan("profile")

    def stop_calibration(self) -> None:
        """Any thread: a calibration in progress stops at its next step."""
        self.profiling.cancel.set()

    def calibrate_slice(self) -> None:
        """A slice of the background measurements (between requests); when they end, plan from the
        measured profile, moving only what changes."""
        try:
            mp = self.profiling.step(self.loaded)
        finally:
            if not self.calibrating and self.inputs is not None and self.inputs.provisional:
                # cancelled or failed: the assumed figures stand, and the slider now trades on them
                self._use_inputs(replace(self.inputs, provisional=False))
                self._replan("profile")
        if mp is not None:
            try:
                self._use_profile(mp)
                self.announce()
                self._replan("profile")
            finally:
                self.profiling.background = None  # only now: a client waiting for it sees the re-plan done

    def follow_streams(self, width: int) -> None:
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

    def _use_profile(self, mp) -> None:
        ld = self.loaded
        from ..experts.tier_bytes import mapped_bytes

        experts_mapped, _ = mapped_bytes(ld.ckpt, ld.model.dtype, ld.accel.cpu_only)
        self._use_inputs(self.profiling.inputs(mp, ld.accel, ld.ckpt.dims, ld.model.dense_bytes(),
                                               self.profiling.timings, self.plan_streams,
                                               (experts_mapped, ld.model.dense_mapped_bytes()), ld.ckpt, ld.model.dtype))

    def _use_inputs(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.scale = slider_scale(self.inputs)
        self._frontier = None
        self.migrator.dense_on_accelerator = not self.inputs.cpu_only

    def _held_with_cache(self) -> tuple[int, int]:
        """What the monitor adds back to free memory: the weights' bytes, and the KV caches' touched
        bytes up to the context's reservation (memory already the model's: else a filling cache would
        count twice, once in the reservation and once as memory gone, and push experts out)."""
        v, r = self.held
        kv = min(self.kv_resident(), sum(self.reserve))
        return (v + kv, r) if self.reserve[0] else (v, r + kv)

    # ---- planning ----
    def _gross(self, reading) -> Budgets:
        """A reading within the user's caps."""
        vram, ram = reading.vram, reading.ram
        if self.cap.vram is not None:
            vram = min(vram, self.cap.vram) if reading.sample.vram_total else self.cap.vram
        if self.cap.ram is not None:
            ram = min(ram, self.cap.ram)
        return Budgets(vram=vram, ram=ram)

    def _set_budgets(self, force: bool) -> None:
        """The budgets the experts are planned under: the reading within the caps, less the context's
        reservation."""
        from .context_fit import net

        if self.reading is None or self.inputs is None:
            return
        new = net(self._gross(self.reading), self.reserve)
        old = self.budgets
        held = self.held
        shrunk_below_held = new.vram < held[0] or new.ram < held[1]
        changed = old is None or any(abs(a - b) > self.hysteresis * max(b, 1)
                                     for a, b in ((new.vram, old.vram), (new.ram, old.ram)))
        if force or changed or shrunk_below_held:
            self.budgets = new
            self._replan("budget")

    def points(self) -> list:
        """The frontier under the current budgets; a slider move reuses it (the planner's costliest
        part: tens of ms that would otherwise stall a decode step)."""
        f = self._frontier
        if f is None or f[0] is not self.inputs or f[1] != self.budgets:
            f = self._frontier = (self.inputs, self.budgets, frontier(self.inputs, self.budgets))
        return f[2]

    def _replan(self, reason: str) -> None:
        if self.inputs is None or self.budgets is None or self.pinned or self.loaded is None:
            return
        pts = self.points()
        scale = self.scale or slider_scale(self.inputs)
        p = choose(pts, self.slider, self.inputs, scale)
        limited = p.loss > scale.target(self.slider) + 1e-12 or not p.fits
        current = self.loaded.model.placement
        moves = current.diff(p.placement)
        self.migrator.retarget(moves)
        self.target = p.placement
        self.emit(PlacementChanged(placement=p.placement, moves=len(moves), reason=reason, predicted_tok_s=p.tok_s,
                                   predicted_loss=p.loss, frontier=tuple((q.loss, q.tok_s) for q in pts),
                                   slider_scale=scale, limited_by_budget=limited, streams=self.inputs.streams,
                                   current=current, moved=self.migrator.counters.done,
                                   provisional=self.inputs.provisional))
        self.enforce()

    def enforce(self) -> None:
        """Before the next decode step, run the planned moves that free memory in a pool that is
        over its budget."""
        if self.migrator is not None and self.budgets is not None:
            self.migrator.enforce(lambda: (self.held[0] > self.budgets.vram, self.held[1] > self.budgets.ram))

    def _moved(self, m: Move, nbytes: int, seconds: float) -> None:
        c = self.migrator.counters
        self.emit(MigrationProgress(done=c.done, total=c.total, bytes_moved=c.bytes_moved, seconds=c.seconds,
                                    last_tier=m.new.value, last_bytes=nbytes, last_seconds=seconds,
                                    layer=m.layer, expert=m.expert))

    # ---- safe points ----
    def safe_point(self, busy: bool, step_s: float) -> int:
        """Between two decode steps: swap built experts in, and build more here within a budget
        that keeps the gap between two tokens under twice a decode step (step_s: the median step;
        while nothing generates, in slices of IDLE_BUILD_S). Returns the experts swapped in."""
        if self.migrator is None:
            return 0
        return self.migrator.install_ready(self.slice_s, BUILD_SHARE * step_s if busy else IDLE_BUILD_S)

    def wait_ready(self, timeout: float) -> None:
        self.migrator.wait_ready(timeout)

    def on_oom(self) -> None:
        """CUDA ran out of memory mid-step: shrink the VRAM budget below what is held, evict, retry."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.cap = SetBudgets(vram=int(self.held[0] * 0.8), ram=self.cap.ram)
        self._set_budgets(force=True)
        self.enforce()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
