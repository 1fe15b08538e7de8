"""What the engine says about its own speed and memory: decode and prefill speed, and the Stats
event, from one place with one averaging rule.

Decode speed: each decode step's rate (the tokens it made, one per request in it, over its
seconds) into an exponential average of weight WEIGHT (about the last 5-10 steps), whether the
step decoded one request or several. Prefill speed: the last request's (its prompt tokens read,
over their time). The last steps' seconds also give the migration's build budget between two
steps (engine/control/controller.py).
"""
from __future__ import annotations

import statistics
import time
from collections import deque

from .. import native
from ..planning.planner import Budgets
from ..protocol import Stats

WEIGHT = 0.2
STATS_EVERY_S = 0.25  # Stats go out at most this often, unless something just changed


class Telemetry:
    def __init__(self):
        self.decode_tok_s = 0.0
        self.prefill_tok_s = 0.0
        self.steps: deque = deque(maxlen=32)  # the last decode steps' seconds
        self._last = 0.0

    def reset(self) -> None:
        """Another model: the last one's speeds are not its own."""
        self.decode_tok_s = self.prefill_tok_s = 0.0
        self.steps.clear()

    def decode_step(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self.steps.append(seconds)
        rate = tokens / seconds
        self.decode_tok_s = rate if not self.decode_tok_s else (1 - WEIGHT) * self.decode_tok_s + WEIGHT * rate

    def request_done(self, done) -> None:
        self.prefill_tok_s = done.prefill_tok_s or self.prefill_tok_s

    def step_median(self) -> float:
        """The median of the last decode steps' seconds (0: none yet)."""
        return statistics.median(self.steps) if self.steps else 0.0

    def stats(self, loaded, controller, ctx_used: int, force: bool = False, busy: bool = False) -> Stats | None:
        """The Stats event now (None: one went out less than STATS_EVERY_S ago and force is off)."""
        now = time.perf_counter()
        if loaded is None or (not force and now - self._last < STATS_EVERY_S):
            return None
        self._last = now
        s = controller.reading.sample if controller.reading else None
        b = controller.budgets or Budgets(0, 0)
        held = controller.held
        counts = {t.value: n for t, n in loaded.model.placement.counts().items() if n}
        return Stats(decode_tok_s=self.decode_tok_s, prefill_tok_s=self.prefill_tok_s, vram_held=held[0],
                     vram_free=s.vram_free if s else 0, vram_others=s.vram_used_by_others if s else 0,
                     vram_budget=b.vram, ram_held=held[1], rss=s.rss if s else 0, ram_budget=b.ram,
                     ram_mapped=controller.mapped, rss_file=s.rss_file if s else 0,
                     tiers=counts, ctx_used=ctx_used, ctx_max=loaded.generator.ctx,
                     cpu_only=loaded.accel.cpu_only, cpu_kernel=native.status(), generating=busy)
