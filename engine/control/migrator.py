"""Live re-placement with a bounded stall: expert forms are built on a worker thread and swapped in
by the engine thread between decode steps.

Building a form (read the 16-bit source, quantise or copy it) is the slow part of a move; on the
demo a 4-bit build takes ~10 ms, as long as a decode step. Built on the engine thread a time slice
at a time, one slice added a whole step to the gap between two tokens. Here a worker builds, one
expert at a time, and the engine thread only swaps pointers (microseconds), so the gap between
tokens stays near one step.

Memory: at most `ready_cap` built forms wait to be swapped in, so the new forms held next to the
old ones are bounded. When a budget shrinks below what is held, `enforce` runs the moves that free
memory on the engine thread at once, before the next step: memory is freed before it is allocated.

Held bytes are kept per move, not recounted, and change under `lock`, which the memory monitor
also holds while it samples free memory: a reading never sees a swap half counted.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..placement import Move
from ..experts.quant import run_to_end


@dataclass
class Counters:
    done: int = 0
    total: int = 0
    bytes_moved: int = 0
    seconds: float = 0.0  # time spent building the forms that were swapped in


class Migrator:
    def __init__(self, model, on_move: Callable[[Move, int, float], None] | None = None,
                 background: bool = True, ready_cap: int = 2, dense_on_accelerator: bool = False):
        """model: builds and installs forms (MoEModel.build / .install / .expert_bytes).
        on_move(move, nbytes, seconds) runs on the engine thread after each swap."""
        self.model = model
        self.on_move = on_move
        self.ready_cap = ready_cap
        self.lock = threading.Lock()  # held bytes and the model's placement change under it
        self._cv = threading.Condition(threading.Lock())  # the queues below
        self._queue: deque[Move] = deque()
        self._ready: deque[tuple[Move, object, float]] = deque()
        self._building: Move | None = None
        self._want: dict[tuple[int, int], object] = {}  # (layer, expert) -> target tier
        self._stop = False
        self.counters = Counters()
        eb = model.expert_bytes()
        self._experts = [eb["accelerator"], eb["host"], eb.get("mapped", 0)]  # [2]: the mapped file's pages
        self._dense_mapped = model.dense_mapped_bytes()
        self._dense = model.dense_bytes() - self._dense_mapped  # what the process owns of it
        self.dense_on_accelerator = dense_on_accelerator
        self._current: list | None = None  # [move, build steps, seconds so far]: the engine thread's build
        self._step_s = 0.0  # how long one build step takes (an average), to stop before the budget ends
        self.worker: threading.Thread | None = None
        if background:
            self.worker = threading.Thread(target=self._work, name="mixdesk-migrate", daemon=True)
            self.worker.start()

    # ---- bookkeeping ----
    @property
    def held(self) -> tuple[int, int]:
        """(vram, ram) bytes the model holds, counted as the planner counts them: the dense part
        is on the accelerator unless the plan is CPU-only; RAM is what the process owns (a mapped
        file's pages are page cache, already in the free memory the budgets add this to)."""
        d = self._dense
        return (self._experts[0] + (d if self.dense_on_accelerator else 0),
                self._experts[1] + (0 if self.dense_on_accelerator else d))

    def _count(self, form, sign: int) -> None:
        from ..experts.dense_forms import mapped_nbytes

        if form.tier.on_accelerator:
            self._experts[0] += sign * form.nbytes
            return
        m = mapped_nbytes(form)
        self._experts[1] += sign * (form.nbytes - m)
        self._experts[2] += sign * m

    @property
    def mapped(self) -> int:
        """Bytes of the model served from its mapped file (page cache, not the process's memory)."""
        return self._experts[2] + (0 if self.dense_on_accelerator else self._dense_mapped)

    def recount(self) -> None:
        """Count held bytes anew (after something outside the migrator replaced experts)."""
        with self.lock:
            eb = self.model.expert_bytes()
            self._experts = [eb["accelerator"], eb["host"], eb.get("mapped", 0)]

    @property
    def pending(self) -> bool:
        with self._cv:
            return bool(self._queue or self._ready or self._building or self._current)

    # ---- planning side (engine thread) ----
    def retarget(self, moves: list[Move]) -> None:
        """Replace the plan with `moves` (from the installed placement to the new target, in the
        diff's order). Forms already built for the same target stay; the others are dropped.
        A re-plan while moves are pending goes on counting the same migration (done stays, the
        total is what is done plus what is left), so its progress never starts again at 0/N."""
        with self._cv:
            c = self.counters
            going = bool(self._queue or self._ready or self._building or self._current)
            self._want = {(m.layer, m.expert): m.new for m in moves}
            self._ready = deque(r for r in self._ready if self._want.get((r[0].layer, r[0].expert)) == r[0].new)
            have = {(r[0].layer, r[0].expert) for r in self._ready}
            for m in (self._building, (self._current or [None])[0]):
                if m is not None and self._want.get((m.layer, m.expert)) == m.new:
                    have.add((m.layer, m.expert))
            if self._current is not None and (self._current[0].layer, self._current[0].expert) not in have:
                self._current = None  # a build for a target given up
            self._queue = deque(m for m in moves if (m.layer, m.expert) not in have)
            self.counters = (Counters(done=c.done, total=c.done + len(moves), bytes_moved=c.bytes_moved,
                                      seconds=c.seconds) if going else Counters(total=len(moves)))
            self._cv.notify_all()

    # ---- engine thread: swaps ----
    def install_ready(self, budget_s: float = 0.005, build_s: float | None = None, most: int | None = None) -> int:
        """Swap in the forms the worker built (in plan order) for up to budget_s; then build here,
        in short steps (a read, a check, a slice of quantisation: experts.build_steps), until
        build_s is spent (None: no limit; any positive budget runs at least one step), installing
        `most` moves at most. Returns how many moves were installed. The engine thread builds with
        every native thread, so on a machine whose cores the decode steps keep busy (no room for a
        worker) moves still go at full speed, in bounded slices between steps."""
        n, t0 = 0, time.perf_counter()
        while True:
            with self._cv:
                if self._ready and (time.perf_counter() - t0 < budget_s or n == 0) and (most is None or n < most):
                    move, form, secs = self._ready.popleft()
                    self._cv.notify_all()
                else:
                    break
            self._install_built(move, form, secs)
            n += 1
        steps = 0
        while True:
            if most is not None and n >= most:
                return n
            if build_s is not None:  # a positive budget always buys one step, whatever the swaps took
                left = build_s - (time.perf_counter() - t0)
                if build_s <= 0 or (steps and (left <= 0 or self._step_s > left)):
                    return n
            with self._cv:
                if self._current is None:
                    if not self._queue:
                        return n
                    move = self._queue.popleft()
                    self._current = [move, self.model.build_steps(move.layer, move.expert, move.new), 0.0]
                cur = self._current
            t1 = time.perf_counter()
            try:
                next(cur[1])
                form = None
            except StopIteration as done:
                form = done.value
            except BaseException:
                self._current = None
                raise
            dt = time.perf_counter() - t1
            cur[2] += dt
            self._step_s = dt if not self._step_s else 0.8 * self._step_s + 0.2 * dt
            steps += 1
            if form is not None:
                self._current = None
                self._install(cur[0], form, cur[2])
                n += 1

    def _install_built(self, move: Move, form, secs: float) -> None:
        if isinstance(form, BaseException):  # the worker's build failed: report it here
            with self._cv:
                self._want.pop((move.layer, move.expert), None)
            raise form
        self._install(move, form, secs)

    def _install(self, move: Move, form, secs: float) -> None:
        with self.lock:
            old = self.model.install(move.layer, move.expert, form)
            self._count(old, -1)
            self._count(form, +1)
        with self._cv:
            self._want.pop((move.layer, move.expert), None)
        c = self.counters
        c.done += 1
        c.bytes_moved += form.nbytes
        c.seconds += secs
        if self.on_move is not None:
            self.on_move(move, form.nbytes, secs)

    def enforce(self, over: Callable[[], tuple[bool, bool]]) -> None:
        """While over(): (vram over budget, ram over budget), run at once the planned moves that
        free memory in the pool that is over (built here if not built yet)."""
        over_v, over_r = over()
        while over_v or over_r:
            def frees(m: Move) -> bool:
                return ((over_v and m.old.on_accelerator and not m.new.on_accelerator)
                        or (over_r and not m.old.on_accelerator and (m.new.on_accelerator or m.new.bits < m.old.bits))
                        or (over_v and m.old.on_accelerator and m.new.bits < m.old.bits))
            with self._cv:
                item = next((r for r in self._ready if frees(r[0])), None)
                if item is not None:
                    self._ready.remove(item)
                elif self._current is not None and frees(self._current[0]):
                    item, self._current = (self._current[0], run_to_end(self._current[1]), 0.0), None
                else:
                    m = next((m for m in self._queue if frees(m)), None)
                    if m is None:
                        if self._building is not None and frees(self._building):
                            self._cv.wait(0.05)  # the worker is building it: wait for it
                            continue
                        return
                    self._queue.remove(m)
                    item = (m, None, 0.0)
                self._cv.notify_all()
            move, form, secs = item
            if form is None:
                t1 = time.perf_counter()
                form = self.model.build(move.layer, move.expert, move.new)
                secs = time.perf_counter() - t1
            self._install_built(move, form, secs)
            over_v, over_r = over()

    def wait_ready(self, timeout: float) -> bool:
        """Block until a built form waits to be swapped in (or timeout); True if one does."""
        with self._cv:
            if not self._ready and (self._queue or self._building):
                self._cv.wait(timeout)
            return bool(self._ready)

    # ---- worker thread ----
    def _work(self) -> None:
        _lower_priority()
        while True:
            with self._cv:
                while not self._stop and (not self._queue or len(self._ready) >= self.ready_cap):
                    self._cv.wait()
                if self._stop:
                    return
                move = self._building = self._queue.popleft()
            try:
                t0 = time.perf_counter()
                form = self.model.build(move.layer, move.expert, move.new, threads=1)
                secs = time.perf_counter() - t0
            except BaseException as e:  # noqa: BLE001 - the engine thread reports it
                form, secs = e, 0.0
            with self._cv:
                self._building = None
                if self._want.get((move.layer, move.expert)) == move.new:
                    self._ready.append((move, form, secs))
                self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._queue.clear()
            self._ready.clear()
            self._cv.notify_all()
        if self.worker is not None:
            self.worker.join(5)


def _lower_priority() -> None:
    """The worker yields the cores to the decode threads (Linux: a thread has its own nice value)."""
    if sys.platform.startswith("linux") and os.environ.get("MIXDESK_MIGRATE_NICE", "1") != "0":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
