"""The engine thread: owns the model, takes commands from a queue, publishes events.

The GUI, the CLI and the tests all use this one interface. Commands: Load, Generate, Stop,
SetSlider, SetBudgets, Shutdown. Events: Progress, Loaded, TokenOut, Done, Stats,
PlacementChanged, MigrationProgress, ErrorEvent. `emit` is called on the engine thread; a GUI
forwards events to its own thread (a queued signal), never touching widgets from here.

Re-placement: the memory monitor and the slider feed the planner; a new placement becomes a list
of moves, applied between decode steps (safe points) a time slice at a time, so generation goes
on while experts move. When a budget shrinks below what is held, the moves that free that memory
run before the next decode step; memory is freed before it is allocated (the diff's order).
"""
from __future__ import annotations

import gc
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from . import native
from .errors import MixdeskError
from .generate import Finished, SamplingParams, Token
from .monitor import BudgetReading, MemorySource, Monitor, SystemSource
from .placement import Move, Placement, Tier
from .profile import Cancelled, uniform_profile
from .planner import Budgets, PlanInputs, SliderScale, choose, frontier, slider_scale


# ---- commands ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    path: str
    device: str | None = None
    dtype: str = "auto"
    ctx: int = 4096


@dataclass(frozen=True)
class Generate:
    request_id: int
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = SamplingParams()


@dataclass(frozen=True)
class Stop:
    request_id: int | None = None


@dataclass(frozen=True)
class SetSlider:
    value: float


@dataclass(frozen=True)
class SetBudgets:
    """A user cap on what the model may use (None: follow the monitor)."""

    vram: int | None = None
    ram: int | None = None


@dataclass(frozen=True)
class Reprofile:
    """Measure this machine and calibrate the loaded model anew (profiles go stale: a driver or
    BIOS change, or a profile measured while the machine was busy), then re-plan."""


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class _Reading:  # from the monitor thread
    reading: BudgetReading


# ---- events -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Progress:
    stage: str
    done: int
    total: int
    what: str = ""


@dataclass(frozen=True)
class Loaded:
    name: str
    description: str
    cpu_only: bool
    layers: int
    experts: int
    ctx: int
    share: tuple = ()  # [L][E] routing share per expert (popularity), for the placement map
    count_tokens: Callable[[str], int] | None = None  # thread-safe (a Rust tokenizer underneath)


@dataclass(frozen=True)
class TokenOut:
    request_id: int
    token_id: int
    text: str
    index: int
    seconds: float


@dataclass(frozen=True)
class Done:
    request_id: int
    finished: Finished


@dataclass(frozen=True)
class PlacementChanged:
    placement: Placement
    moves: int
    reason: str
    predicted_tok_s: float
    predicted_loss: float
    frontier: tuple = ()  # ((loss, tok_s), ...) best quality first
    slider_scale: SliderScale | None = None  # what each slider position asks for (planner.SliderScale)
    limited_by_budget: bool = False  # the slider asks for more quality than the budget allows


@dataclass(frozen=True)
class MigrationProgress:
    done: int
    total: int
    bytes_moved: int
    seconds: float
    last_tier: str = ""  # the tier the last moved expert went to
    last_bytes: int = 0
    last_seconds: float = 0.0


@dataclass(frozen=True)
class Stats:
    decode_tok_s: float
    prefill_tok_s: float
    vram_held: int
    vram_free: int
    vram_others: int
    vram_budget: int
    ram_held: int
    rss: int
    ram_budget: int
    tiers: dict = field(default_factory=dict)
    ctx_used: int = 0
    ctx_max: int = 0
    cpu_only: bool = True
    cpu_kernel: str = ""  # the CPU expert kernel in use (engine.native.status())


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    request_id: int | None = None


def _token_counter(tokenizer) -> Callable[[str], int]:
    """Counts tokens without holding a reference to the model (so shutting down frees it)."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


class Session:
    def __init__(self, emit: Callable[[object], None], source: MemorySource | None = None,
                 poll_s: float = 0.5, tiers: tuple[Tier, ...] | None = None, seam: bool = False,
                 hysteresis: float = 0.05, slice_s: float = 0.05, slider: float = 0.5,
                 costs: dict | None = None):
        self.emit = emit
        self._source = source
        self.poll_s = poll_s
        self.tiers = tiers  # restrict the planner to these tiers (None: all the machine has)
        self.seam = seam  # plan gpu-* tiers on the CPU device (tests and experiments only)
        self.costs = costs  # tier -> (fixed_s, s_per_byte), replacing measured ones (tests only)
        self.hysteresis = hysteresis
        self.slice_s = slice_s
        self.commands: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="mixdesk-engine", daemon=True)
        self.cancel = threading.Event()
        # engine-thread state
        self.loaded = None
        self.inputs: PlanInputs | None = None
        self.scale: SliderScale | None = None  # slider_scale(self.inputs), computed once per inputs
        self.slider = slider
        self.cap = SetBudgets()
        self.reading: BudgetReading | None = None
        self.budgets: Budgets | None = None
        self.moves: deque[Move] = deque()
        self.migration = [0, 0, 0, 0.0]  # done, total, bytes, seconds
        self.held = (0, 0)  # (vram, ram) bytes the model holds, read by the monitor thread
        self.monitor: Monitor | None = None
        self._gen = None
        self._request: int | None = None
        self._queued: deque[Generate] = deque()
        self._quit = False
        self._decode_ema = 0.0
        self._prefill = 0.0
        self._last_stats = 0.0

    # ---- API (any thread) ----
    def start(self) -> "Session":
        self.thread.start()
        return self

    def submit(self, cmd) -> None:
        if isinstance(cmd, Stop):
            self.cancel.set()  # effective at the next step, even mid-queue
        self.commands.put(cmd)

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop generating and migrating, free the model, join the thread. True if it ended."""
        self.cancel.set()
        self.commands.put(Shutdown())
        self.thread.join(timeout)
        return not self.thread.is_alive()

    # ---- engine thread ----
    def _run(self) -> None:
        try:
            while not self._quit:
                if self._gen is not None:
                    self._drain(block=False)
                    if self._quit:
                        break
                    self._migrate(self.slice_s)
                    self._step()
                elif self.moves:
                    self._drain(block=False)
                    self._migrate(self.slice_s)
                else:
                    self._drain(block=True)
                    if self._gen is None and self._queued:
                        self._begin(self._queued.popleft())
        except Exception as e:  # last resort: say it, never die silently
            self.emit(ErrorEvent(f"engine stopped: {e}\n{traceback.format_exc()}"))
        finally:
            self._teardown()

    def _teardown(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        self._gen = None
        self.moves.clear()
        if self.loaded is not None:
            self.loaded.ckpt.close()
        self.loaded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _drain(self, block: bool) -> None:
        try:
            cmd = self.commands.get(timeout=0.1) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(cmd)
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, cmd) -> None:
        try:
            if isinstance(cmd, Shutdown):
                self._quit = True
            elif isinstance(cmd, Load):
                self._load(cmd)
            elif isinstance(cmd, Generate):
                if self._gen is None:
                    self._begin(cmd)
                else:
                    self._queued.append(cmd)
            elif isinstance(cmd, Stop):
                if self._gen is None:
                    self.cancel.clear()
            elif isinstance(cmd, SetSlider):
                if abs(cmd.value - self.slider) > 1e-9:
                    self.slider = min(max(cmd.value, 0.0), 1.0)
                    self._replan("slider")
            elif isinstance(cmd, Reprofile):
                if self.loaded is not None and self._gen is None:
                    self.cancel.clear()
                    try:
                        self._profile(remeasure=True)
                    finally:
                        self._emit_loaded()  # ready again, with whichever profile holds now
                    self._replan("profile")
                elif self.loaded is not None:
                    self.emit(ErrorEvent("re-measuring waits for the reply to finish: try again then"))
            elif isinstance(cmd, SetBudgets):
                self.cap = cmd
                self._set_budgets(force=True)
            elif isinstance(cmd, _Reading):
                self.reading = cmd.reading
                self._set_budgets(force=False)
        except MixdeskError as e:
            self.emit(ErrorEvent(str(e), getattr(cmd, "request_id", None)))

    # ---- loading ----
    def _load(self, cmd: Load) -> None:
        from .load import load

        if self.loaded is not None:
            self.loaded.ckpt.close()
            self.loaded = None
            gc.collect()
        prog = lambda stage: (lambda d, t, w="": self.emit(Progress(stage, d, t, w)))  # noqa: E731
        path = cmd.path
        if path == "demo":
            from . import demo

            path = str(demo.ensure(progress=prog("build demo"), log=lambda s: None))
        else:
            from .hub import resolve

            path = str(resolve(path))
        self.cancel.clear()
        self.loaded = loaded = load(path, "auto", cmd.device, cmd.dtype, cmd.ctx, progress=prog("load"),
                                    budgets=self._first_budgets(cmd.device), slider=self.slider)
        loaded.generator.on_oom = self._on_oom
        self._update_held()
        self._profile(remeasure=False)
        self._emit_loaded()
        source = self._source or SystemSource(loaded.accel.device.index if loaded.accel.is_cuda else None)
        self.monitor = Monitor(source, lambda r: self.commands.put(_Reading(r)), lambda: self.held,
                               period=self.poll_s)
        self.reading = self.monitor.reading()
        self._set_budgets(force=True)
        self.monitor.start()

    def _emit_loaded(self) -> None:
        """The model is ready (sent again after a re-profile: the popularity it carries may change)."""
        ld = self.loaded
        self.emit(Loaded(ld.ckpt.folder.name, ld.describe(), ld.accel.cpu_only, ld.ckpt.dims.layers,
                         ld.ckpt.dims.experts, ld.generator.ctx, self.inputs.share, _token_counter(ld.tokenizer)))

    def _profile(self, remeasure: bool) -> None:
        """Both profiles (cached, or measured anew) -> the planner's inputs and the slider's scale."""
        from .hardware import _tier_costs, load_or_measure
        from .plan_inputs import from_profiles, measure_dense_prefill_s, measure_dense_s
        from .profile import load_or_calibrate

        loaded = self.loaded
        prog = lambda stage: (lambda d, t, w="": self.emit(Progress(stage, d, t, w)))  # noqa: E731
        self.emit(Progress("profile", 0, 1, "measuring this machine"))
        hw = load_or_measure(loaded.accel.device, remeasure=remeasure)
        try:
            mp = load_or_calibrate(loaded.model, loaded.tokenizer, progress=prog("calibrate"), cancel=self.cancel,
                                   recalibrate=remeasure)
        except Cancelled:
            self.cancel.clear()
            if remeasure and self.inputs is not None:
                self.emit(ErrorEvent("calibration cancelled: keeping the profile measured before"))
                return
            mp = uniform_profile(loaded.model)
            self.emit(ErrorEvent("calibration cancelled: planning with uniform popularity and an assumed "
                                 "4-bit sensitivity until it runs"))
        dense_s = measure_dense_s(loaded.model, hw)
        inp = from_profiles(mp, hw, loaded.ckpt.dims.top_k, loaded.model.dense_bytes(), dense_s,
                            dense_prefill_s=measure_dense_prefill_s(loaded.model, hw))
        if self.seam and loaded.accel.cpu_only:
            inp = replace(inp, cpu_only=False, tier_costs={
                **inp.tier_costs, **_tier_costs([Tier.GPU16, Tier.GPU4], torch.device("cpu"))})
        if self.costs is not None:
            inp = replace(inp, tier_costs={**inp.tier_costs, **self.costs})
        if self.tiers is not None:
            inp = replace(inp, tier_costs={t: c for t, c in inp.tier_costs.items() if Tier(t) in self.tiers})
        self.inputs = inp
        self.scale = slider_scale(inp)
        self._update_held()

    def _first_budgets(self, device: str | None) -> Budgets | None:
        """The budgets the first placement is planned under: free memory within the user's caps
        (None: free memory, which load measures itself)."""
        if self.cap.vram is None and self.cap.ram is None:
            return None
        from .devices import detect
        from .plan_inputs import default_budgets

        acc = detect(device)
        free = default_budgets(acc.cpu_only, acc.device)
        return Budgets(vram=free.vram if self.cap.vram is None else min(free.vram, self.cap.vram),
                       ram=free.ram if self.cap.ram is None else min(free.ram, self.cap.ram))

    # ---- planning and migration ----
    def _update_held(self) -> None:
        """Bytes held against each budget, counted as the planner counts them: the dense part is
        on the accelerator unless the plan is CPU-only."""
        m = self.loaded.model
        eb = m.expert_bytes()
        cpu_only = self.inputs.cpu_only if self.inputs is not None else self.loaded.accel.cpu_only
        dense = m.dense_bytes()
        self.held = (eb["accelerator"] + (0 if cpu_only else dense), eb["host"] + (dense if cpu_only else 0))

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
        shrunk_below_held = new.vram < self.held[0] or new.ram < self.held[1]
        changed = old is None or any(abs(a - b) > self.hysteresis * max(b, 1)
                                     for a, b in ((new.vram, old.vram), (new.ram, old.ram)))
        if force or changed or shrunk_below_held:
            self.budgets = new
            self._replan("budget")

    def _replan(self, reason: str) -> None:
        if self.inputs is None or self.budgets is None:
            return
        pts = frontier(self.inputs, self.budgets)
        scale = self.scale or slider_scale(self.inputs)
        p = choose(pts, self.slider, self.inputs, scale)
        limited = p.loss > scale.target(self.slider) + 1e-12 or not p.fits
        current = self.loaded.model.placement
        target = p.placement
        moves = current.diff(target)
        self.moves = deque(moves)
        self.migration = [0, len(moves), 0, 0.0]
        self.target = target
        self.emit(PlacementChanged(target, len(moves), reason, p.tok_s, p.loss,
                                   tuple((q.loss, q.tok_s) for q in pts), scale, limited))
        self._enforce()
        if not moves:
            self._stats(force=True)

    def _over(self) -> tuple[bool, bool]:
        return self.held[0] > self.budgets.vram, self.held[1] > self.budgets.ram

    def _enforce(self) -> None:
        """Before the next decode step, run the queued moves that free memory in a pool that is
        over its budget (evictions are first in the queue)."""
        over_v, over_r = self._over()
        while (over_v or over_r) and self.moves:
            frees = [m for m in self.moves if (over_v and m.old.on_accelerator and not m.new.on_accelerator)
                     or (over_r and not m.old.on_accelerator and (m.new.on_accelerator or m.new.bits < m.old.bits))
                     or (over_v and m.old.on_accelerator and m.new.bits < m.old.bits)]
            if not frees:
                break
            self.moves.remove(frees[0])
            self._apply(frees[0])
            over_v, over_r = self._over()

    def _apply(self, m: Move) -> None:
        t0 = time.perf_counter()
        nbytes = self.loaded.model.move(m.layer, m.expert, m.new)
        dt = time.perf_counter() - t0
        self._update_held()
        self.migration[0] += 1
        self.migration[2] += nbytes
        self.migration[3] += dt
        self.emit(MigrationProgress(*self.migration, m.new.value, nbytes, dt))

    def _migrate(self, budget_s: float) -> None:
        if not self.moves:
            return
        t0 = time.perf_counter()
        while self.moves and time.perf_counter() - t0 < budget_s:
            self._apply(self.moves.popleft())
        if not self.moves:
            self._stats(force=True)  # the migration just finished

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
    def _begin(self, cmd: Generate) -> None:
        if self.loaded is None:
            self.emit(ErrorEvent("no model is loaded", cmd.request_id))
            return
        self.cancel.clear()
        gen = self.loaded.generator
        try:
            ids = cmd.prompt_ids if cmd.prompt_ids is not None else gen.chat_prompt(cmd.messages or [])
            self._gen = gen.stream(ids, cmd.params, self.cancel)
            self._request = cmd.request_id
        except MixdeskError as e:
            self.emit(ErrorEvent(str(e), cmd.request_id))

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            ev = next(self._gen)
        except StopIteration:
            self._gen = None
            return
        except MixdeskError as e:
            self._gen = None
            self.emit(ErrorEvent(str(e), self._request))
            return
        if isinstance(ev, Token):
            if ev.index == 0:
                self._prefill = 0.0
            else:
                rate = 1.0 / max(ev.seconds, 1e-9)
                self._decode_ema = rate if self._decode_ema == 0 else 0.8 * self._decode_ema + 0.2 * rate
            self.emit(TokenOut(self._request, ev.id, ev.text, ev.index, ev.seconds))
            self._stats()
        elif isinstance(ev, Finished):
            self._prefill = ev.prefill_tok_s
            if ev.decode_tok_s:
                self._decode_ema = ev.decode_tok_s
            self._gen = None
            self.emit(Done(self._request, ev))
            self._stats(force=True)

    def _stats(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.loaded is None or (not force and now - self._last_stats < 0.25):
            return
        self._last_stats = now
        s = self.reading.sample if self.reading else None
        b = self.budgets or Budgets(0, 0)
        counts = {t.value: n for t, n in self.loaded.model.placement.counts().items() if n}
        self.emit(Stats(self._decode_ema, self._prefill, self.held[0], s.vram_free if s else 0,
                        s.vram_used_by_others if s else 0, b.vram, self.held[1], s.rss if s else 0, b.ram,
                        counts, len(self.loaded.generator.cache.tokens), self.loaded.generator.ctx,
                        self.loaded.accel.cpu_only, native.status()))
