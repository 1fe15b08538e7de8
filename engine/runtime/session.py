"""The engine thread: owns the model, takes commands from a queue, publishes events.

The window, the terminal, the local server and the tests all drive the engine through this one
interface (the messages are in `protocol`). Each pass of the loop: drain the commands -> the
placement controller's safe point (engine/control/controller.py) -> one round of the scheduler
(engine/runtime/scheduler.py) -> publish. Events go out on this thread; a GUI forwards them to its own.

Error boundary: any exception in a command, a decode step or a migration becomes an ErrorEvent
(one line for the user; the traceback of an unexpected one goes to the log file, see errorlog) and
the thread keeps serving. A request that failed ends with its own error.
"""
from __future__ import annotations

import gc
import queue
import threading
from typing import Callable

import torch

from . import errorlog, model_in_use, queries
from ..files import mapped
from ..control.controller import PlacementController
from ..protocol import (EngineStopped, ErrorEvent, Generate, Load, Loaded, Query, QueryDone, Reading, Reprofile,
                       SetBudgets, SetContext, SetSlider, Shutdown, Stop)
from .scheduler import Request, Scheduler
from .telemetry import Telemetry


class Session:
    def __init__(self, emit: Callable[[object], None], max_streams: int = 4,
                 collect: Callable[[], object] = gc.collect, **placement):
        """emit: where events go (and, unless a request names its own, that request's events).
        collect: a full garbage collection, run as a model is unloaded (a window runs it on its GUI
        thread: Qt objects in cyclic garbage must not be destroyed on the engine thread; app/gui_gc.py).
        placement: the placement controller's options and test seams (PlacementController)."""
        self.emit = emit
        self.collect = collect
        self.listeners: list[Callable[[object], None]] = []  # more consumers of every broadcast event
        self.telemetry = Telemetry()
        self.scheduler = Scheduler(max_streams, on_decode=self.telemetry.decode_step, on_done=self.telemetry.request_done)
        self.controller = PlacementController(self.publish, lambda: model_in_use.announce(self), max_streams=max_streams,
                                              **placement)
        self.controller.kv_resident = lambda: model_in_use.kv_resident(self)
        self.loaded = None
        self.keep_caches = True  # conversations' KV caches written to the user cache folder (engine/kv/files.py)
        self.last_loaded: Loaded | None = None  # the model ready now, as last announced (for late listeners)
        self.current_stop: threading.Event | None = None  # the running query's own stop (a Stop sets it)
        self.commands: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="mixdesk-engine", daemon=True)
        self._quit = False

    def start(self) -> "Session":  # the API: any thread
        self.thread.start()
        return self

    def submit(self, cmd, reply_to: Callable[[object], None] | None = None) -> int | None:
        """Queue a command; a Load, Generate or Query gets a request id (returned), and its own
        events go to reply_to (None: emit). A Stop acts at once, even on a request still queued. A
        SetContext runs as the query set_context (between requests: engine/runtime/queries.py)."""
        if isinstance(cmd, SetContext):
            cmd = Query(name="set_context", args={"tokens": cmd.tokens})
        if isinstance(cmd, (Load, Generate, Query)):
            req = self.scheduler.new(cmd, reply_to or self.emit)
            self.commands.put(req)
            return req.id
        if isinstance(cmd, Stop):
            self.scheduler.stop(cmd.request_id)
            if cmd.request_id is None:
                self.controller.stop_calibration()
        self.commands.put(cmd)  # a Stop too: it wakes the engine thread

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop generating and migrating, free the model, join the thread. True if it ended."""
        self.scheduler.stop()
        self.commands.put(Shutdown())
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def publish(self, ev) -> None:  # an event for every client
        self.emit(ev)
        for listener in list(self.listeners):
            listener(ev)

    def _run(self) -> None:  # the engine thread
        try:
            while not self._quit:
                self._guard("engine", self._iteration)
        except BaseException as e:  # noqa: BLE001 - not even this may pass silently
            log = errorlog.record(e, "engine thread")
            self.publish(EngineStopped(message=f"the engine stopped: {errorlog.one_line(e)}", log=log))
        finally:
            self.scheduler.end_waiting("the engine stopped before this request ran")
            model_in_use.unload(self)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _iteration(self) -> None:
        sched, ctl = self.scheduler, self.controller
        self._drain(block=not (sched.busy or sched.waiting or ctl.migrating or ctl.calibrating))
        if self._quit:
            return
        if sched.busy or ctl.migrating:
            n, ended = ctl.safe_point(sched.busy, self.telemetry.step_median()), 0
            if sched.busy:
                ended = sched.step()
                ctl.follow_streams(sched.last_width)
            elif not n:
                ctl.wait_ready(0.02)  # the worker is building what is left
            self._stats(force=ended > 0 or (n > 0 and not ctl.migrating))  # a reply or the migration ended
        elif ctl.calibrating and not sched.waiting:  # between requests: a slice of the calibration
            self._guard("calibrating", ctl.calibrate_slice)
            self._stats()  # the panel and the model bar stay live through a first start's measuring
        while (query := sched.admit()) is not None:
            self._guard(f"the query {query.cmd.name!r}", lambda: self._query(query), query)
        if self.loaded is not None:
            self._check_files()

    def _check_files(self) -> None:
        """A model file truncated or overwritten while mapped (engine/files/mapped.py): the model is closed,
        with one error naming the file; the replies it was writing ended with the same words."""
        parts = getattr(getattr(self.loaded.ckpt, "file", None), "parts", None) or []
        path = mapped.faulted(parts)
        if path is None:
            return
        model_in_use.unload(self)
        mapped.forget_faults(parts)
        self.publish(ErrorEvent(message=f"{path}: {mapped.CHANGED}", kind="ModelClosed"))

    def _guard(self, what: str, fn, req: Request | None = None) -> None:
        """Run fn; an exception becomes an ErrorEvent (req's own, if given); the engine carries on."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the error boundary: report, log, keep serving
            if req is None:
                self.publish(errorlog.error_event(e, what))
            else:
                self.scheduler.forget(req)
                req.reply(errorlog.error_event(e, what, req.id))

    def _drain(self, block: bool) -> None:
        try:
            cmd = self.commands.get(timeout=0.1) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while not self._quit:
            if isinstance(cmd, Request):  # a load now; a reply (prepared now) or query started by admit, in order
                act = (lambda r: model_in_use.change(self, r)) if isinstance(cmd.cmd, Load) else self._enqueue
                self._guard(errorlog.DOING.get(type(cmd.cmd).__name__, "the query"), lambda c=cmd: act(c), cmd)
            else:
                self._guard(errorlog.DOING.get(type(cmd).__name__, type(cmd).__name__), lambda c=cmd: self._handle(c))
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def _enqueue(self, req: Request) -> None:
        self.prepare(req)
        self.scheduler.enqueue(req)

    def prepare(self, req: Request) -> None:
        """A Generate's prompt as ids for the model loaded now (engine/prompts/prompt.py: the one place a chat
        or a text prompt is rendered and its length checked); the scheduler takes ids only."""
        if isinstance(req.cmd, Generate) and self.loaded is not None:
            req.prompt = self.loaded.prompts.prepare(req.cmd)

    def _handle(self, cmd) -> None:
        ctl = self.controller
        self._quit = isinstance(cmd, Shutdown)
        if isinstance(cmd, SetSlider):
            ctl.set_slider(cmd.value, cmd.lowest_bits)
        elif isinstance(cmd, SetBudgets):
            ctl.set_cap(cmd)
        elif isinstance(cmd, Reading):
            ctl.take_reading(cmd.reading)
        elif isinstance(cmd, Reprofile):
            ctl.reprofile(busy=self.scheduler.busy)
        if not ctl.migrating and not self._quit:
            self._stats(force=True)

    def _query(self, req: Request) -> None:
        """Answer a Query (engine/runtime/queries.py) once nothing runs."""
        self.current_stop = req.stop
        try:
            value = queries.answer(self, req.cmd)
        finally:
            self.current_stop = None
        self.scheduler.forget(req)
        req.reply(QueryDone(request_id=req.id, value=value))

    def _stats(self, force: bool = False) -> None:
        if (ev := self.telemetry.stats(self.loaded, self.controller, self.scheduler.chat_tokens, force,
                                             busy=self.scheduler.busy)) is not None:
            self.publish(ev)


