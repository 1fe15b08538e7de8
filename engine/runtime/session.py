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

from . import errorlog, queries
from ..files import mapped
from ..control.controller import PlacementController
from ..protocol import (EngineStopped, ErrorEvent, Generate, Load, Loaded, Progress, Query, QueryDone, Reading, Reprofile,
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
        self.controller = PlacementController(self.publish, self._announce, max_streams=max_streams, **placement)
        self.controller.kv_resident = self._kv_resident
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
            self._unload()
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
        self._unload()
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
                act = self._load if isinstance(cmd.cmd, Load) else self._enqueue
                self._guard(DOING.get(type(cmd.cmd).__name__, "the query"), lambda c=cmd: act(c), cmd)
            else:
                self._guard(DOING.get(type(cmd).__name__, type(cmd).__name__), lambda c=cmd: self._handle(c))
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def _enqueue(self, req: Request) -> None:
        self._prepare(req)
        self.scheduler.enqueue(req)

    def _prepare(self, req: Request) -> None:
        """A Generate's prompt as ids for the model loaded now (engine/prompts/prompt.py: the one place a chat
        or a text prompt is rendered and its length checked); the scheduler takes ids only."""
        if isinstance(req.cmd, Generate) and self.loaded is not None:
            req.prompt = self.loaded.prompts.prepare(req.cmd)

    def _prepare_waiting(self) -> None:
        """Another model is ready: the requests waiting for it are prepared with its template and
        tokenizer (one that no longer fits ends with its error)."""
        for r in list(self.scheduler.waiting):
            try:
                self._prepare(r)
            except Exception as e:  # noqa: BLE001 - the error boundary: this request ends
                self.scheduler.waiting.remove(r)
                self.scheduler.forget(r)
                r.reply(errorlog.error_event(e, DOING["Generate"], r.id))

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

    def _unload(self) -> None:
        self.controller.detach()
        self.scheduler.detach()
        if self.loaded is not None:
            self.loaded.ckpt.close()
            self.loaded = None
        self.last_loaded = None
        self.collect()  # the old model's cycles freed before the next one is read

    def _load(self, req: Request) -> None:
        from .load import find, load, open_checkpoint

        # The model in use stays until the new one is found and its folder validated (a download
        # that fails, a folder that is not a model): only then is it released for the new one.
        cmd, ctl = req.cmd, self.controller
        path = find(cmd.path, ctl.profiling.progress, req.stop)  # the window's Cancel (a Stop) stops a download
        self.scheduler.forget(req)
        probe = open_checkpoint(path)  # no weights read
        try:
            self._unload()
            self.telemetry.reset()  # the speeds Stats report are the new model's, from its first reply
            context = self._context(probe, cmd)  # auto or asked, beside the weights at their smallest
            ctl.reserve = context.reserve  # kept out of the experts' budgets from the first plan on
            placement = ctl.plan_before_load(probe, cmd)
        finally:
            probe.close()
        from ..measures.hardware import cached

        if placement == "auto" and cached() is None:  # a first start measures this machine before it plans (load_or_measure)
            self.publish(Progress(stage="machine", done=0, total=0, what="Measuring this machine once (about 20 s)"))
        self.loaded = ld = load(path, placement, cmd.device, cmd.dtype, context, progress=ctl.profiling.progress("load"),
                                budgets=ctl.first_budgets(cmd.device), slider=ctl.slider, kv_bits=cmd.kv_bits)
        ld.generator.on_oom = ctl.on_oom
        self._attach_caches(ld)
        self._prepare_waiting()
        ctl.attach(ld)
        self._announce()
        ctl.follow_memory(self.commands.put)

    def _attach_caches(self, ld) -> None:
        """Requests start on the model's generator, with KV caches of its context (made anew after a
        SetContext)."""
        from ..kv.files import KVFiles

        files = KVFiles.for_model(ld) if self.keep_caches else None  # conversations' caches kept on disk too
        self.scheduler.attach(ld.generator, files, prefill_rate=lambda: self.telemetry.prefill_tok_s)

    def _context(self, ckpt, cmd: Load):
        """The context a Load opens at (engine/control/context_fit.py) under the memory the model may use now."""
        from ..control.context_fit import choose
        from ..machine.devices import detect
        from ..native.dense_linear import compute_dtype
        from .load import parse_placement
        from ..kv.tensors import check_kv_bits

        accel = detect(cmd.device)
        dtype = compute_dtype(cmd.dtype, accel.device)
        pinned = None if cmd.placement == "auto" else parse_placement(cmd.placement, ckpt, accel, dtype)
        check_kv_bits(ckpt.dims, cmd.kv_bits)  # a format this model's rows cannot take: one line, nothing sized
        return choose(ckpt, accel, dtype, self.controller.free_budgets(accel), cmd.ctx, pinned, cmd.kv_bits)

    def set_context(self, tokens) -> dict:
        """SetContext, between requests: the model runs at another context, its weights untouched. The
        KV caches are made anew at the new length (what they held is read again), the experts re-planned
        beside the new reservation, and the model announced again with it."""
        from ..control.context_fit import choose
        from ..protocol.errors import MixdeskError

        ld, ctl = self.loaded, self.controller
        if ld is None:
            raise MixdeskError("no model is loaded")
        pinned = ld.model.placement if ctl.pinned else None
        context = choose(ld.ckpt, ld.accel, ld.model.dtype, ctl.free_budgets(ld.accel), tokens, pinned,
                         ld.model.kv_bits)
        ld.set_context(context)
        self._attach_caches(ld)  # the old caches go with the old KVCaches
        ctl.reserve_context(context.reserve)
        self._announce()
        return {"ctx": context.ctx, "bytes": context.nbytes, "line": context.line()}

    def _kv_resident(self) -> int:
        """Bytes the loaded model's KV caches have touched so far (the monitor's thread)."""
        ld = self.loaded
        return ld.model.caches_resident_bytes() if ld is not None else 0

    def _announce(self) -> None:
        """The model is ready (sent again after a re-profile: the popularity it carries may change)."""
        share = self.controller.inputs.share if self.controller.inputs is not None else ()
        self.last_loaded = self.loaded.announcement(share)
        self.publish(self.last_loaded)


DOING = {  # what a command was doing, for an error message
    "Load": "loading the model", "Generate": "starting the reply", "Query": "the query", "SetSlider": "re-planning",
    "SetBudgets": "re-planning", "Reading": "re-planning", "Reprofile": "re-measuring"}
