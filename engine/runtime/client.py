"""A blocking client of the engine thread, for the command line: it submits commands and waits
for their events, exactly as the window does through its bridge. The terminal chat, bench, plan and
eval all run through it, so the engine thread is the one place that loads, calibrates, plans,
re-places and generates."""
from __future__ import annotations

import queue
import sys
import time
from typing import Any, Callable

from ..protocol.errors import MixdeskError
from ..protocol.sampling import SamplingParams
from ..protocol import (Done, EngineStopped, ErrorEvent, Generate, Load, Loaded, Progress, PromptProgress, Query,
                       QueryDone, Reprofile, Stop, Token)
from .session import Session


class EngineError(MixdeskError):
    """An error the engine reported (its message is already one line for the user)."""

    def __init__(self, message: str, kind: str = ""):
        self.kind = kind
        super().__init__(message)


class Client:
    def __init__(self, on_event: Callable[[object], None] | None = None,
                 on_progress: Callable[[Progress], None] | None = None, **session_kwargs):
        """on_event sees every event (the terminal chat's --verbose, tests); on_progress the
        Progress ones."""
        self.events: queue.Queue = queue.Queue()
        self.on_event = on_event
        self.on_progress = on_progress
        self.loaded: Loaded | None = None
        self.session = Session(self.events.put, **session_kwargs).start()

    def _next(self, timeout: float | None = None):
        ev = self.events.get(timeout=timeout)
        if self.on_event is not None:
            self.on_event(ev)
        if isinstance(ev, Progress) and self.on_progress is not None:
            self.on_progress(ev)
        if isinstance(ev, EngineStopped):
            raise EngineError(ev.message)
        if isinstance(ev, Loaded):
            self.loaded = ev
        return ev

    def _error(self, ev: ErrorEvent, rid: int) -> None:
        if ev.request_id == rid:
            raise EngineError(ev.message, ev.kind)

    def load(self, path: str, placement: str = "auto", device: str | None = None, dtype: str = "auto",
             ctx: int | str = "auto", kv_bits: int = 16) -> Loaded:
        rid = self.session.submit(Load(path=path, placement=placement, device=device, dtype=dtype, ctx=ctx,
                                       kv_bits=kv_bits))
        while True:
            ev = self._next()
            if isinstance(ev, ErrorEvent):
                self._error(ev, rid)
            elif isinstance(ev, Loaded):
                return ev

    def reprofile(self) -> Loaded:
        self.session.submit(Reprofile())
        while True:
            ev = self._next()
            if isinstance(ev, Loaded):
                return ev

    def generate(self, messages: list[dict] | None = None, prompt_ids: list[int] | None = None,
                 params: SamplingParams = SamplingParams(), on_text: Callable[[str], None] | None = None,
                 fresh: bool = False, on_reasoning: Callable[[str], None] | None = None,
                 on_reading: Callable[[PromptProgress], None] | None = None) -> Done:
        """One reply, its content passed to on_text as it streams and its reasoning to on_reasoning
        (the model's format read: engine/prompts/formats), a long prompt's progress to on_reading as it is
        read. Messages are rendered here, before the request goes in (Loaded.prompt_ids:
        engine/prompts/prompt.py). Ctrl-C stops the reply (the partial reply comes back, reason 'cancelled'),
        or the prompt's reading, within a chunk (what was read stays cached for the next send)."""
        if messages is not None and prompt_ids is None and self.loaded is not None:
            try:
                prompt_ids, messages = self.loaded.prompt_ids(messages), None
            except MixdeskError as e:  # it cannot fit, or the template refuses it: as the engine says it
                raise EngineError(str(e), type(e).__name__) from None
        rid = self.session.submit(Generate(messages=messages, prompt_ids=prompt_ids, params=params, fresh=fresh))
        while True:
            try:  # a Ctrl-C while waiting, or while a callback draws what came, stops the request
                ev = self._next()
                if isinstance(ev, ErrorEvent):
                    self._error(ev, rid)
                elif isinstance(ev, Token) and ev.request_id == rid:
                    for d in ev.deltas:
                        if d.part == "content" and on_text is not None:
                            on_text(d.text)
                        elif d.part == "reasoning" and on_reasoning is not None:
                            on_reasoning(d.text)
                elif isinstance(ev, PromptProgress) and ev.request_id == rid and on_reading is not None:
                    on_reading(ev)
                elif isinstance(ev, Done) and ev.request_id == rid:
                    return ev
            except KeyboardInterrupt:
                self.session.submit(Stop(request_id=rid))

    def query(self, name: str, **args) -> Any:
        """The engine thread's answer to the named query (engine/runtime/queries.py lists them)."""
        rid = self.session.submit(Query(name=name, args=args))
        while True:
            ev = self._next()
            if isinstance(ev, ErrorEvent):
                self._error(ev, rid)
            elif isinstance(ev, QueryDone) and ev.request_id == rid:
                return ev.value

    def wait_calibrated(self, poll_s: float = 0.25) -> None:
        """Until the first start's background calibration has ended (measured, failed or
        cancelled): the planner's inputs are then the measured profiles. Its progress goes to
        on_progress meanwhile."""
        while self.query("calibrating"):
            time.sleep(poll_s)

    def close(self) -> None:
        end_session(self.session)


def end_session(session: Session) -> None:
    """Stop an engine thread and wait until it, and the helper threads it started (the memory
    monitor, the migrator's worker), have ended; the terminal commands and the window end with it.
    A thread still inside torch when the interpreter exits is killed as it takes the GIL back
    (pthread_exit), which torch's C++ frames turn into std::terminate: "terminate called without an
    active exception", exit 134. A calibration step or a decode step cannot be interrupted, so this
    waits for it to end (on a busy machine the first calibration step took longer than the 10 s
    that shutdown used to wait)."""
    s = session
    helpers = [t for t in (getattr(s.controller.monitor, "_thread", None), getattr(s.controller.migrator, "worker", None))
               if t is not None]
    if s.thread.is_alive():
        s.submit(Stop())  # the reply in progress ends; a calibration stops at its next step
    s.shutdown(timeout=0)
    s.thread.join()
    for t in helpers:  # told to stop by the engine thread's teardown; joined there with a timeout
        t.join()


def progress_bar(quiet: bool) -> Callable[[int, int, str], None]:
    """A progress bar on stderr (nothing when quiet)."""
    def show(done: int, total: int, what: str) -> None:
        if quiet:
            return
        if total <= 0:  # a stage of unknown length (measuring this machine): said on a line of its own
            sys.stderr.write(f"\r{what}…\n")
            sys.stderr.flush()
            return
        width = 30
        fill = int(width * min(done, total) / total)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {what[:36]:<36}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def for_terminal(quiet: bool, **kw) -> Client:
    """An engine thread for a command-line command, its progress drawn on stderr unless quiet."""
    bar = progress_bar(quiet)
    return Client(on_progress=lambda p: bar(p.done, p.total, p.what if p.stage == "machine" else
                                            f"{p.stage} {p.what}".strip()), **kw)
