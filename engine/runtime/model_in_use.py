"""The model the engine thread holds, and changing it: a Load (the model in use stays until the new one
is found and its folder validated), an unload, a context change between requests, the announcement
(Loaded). Functions of the session (s: engine/runtime/session.py), run on its thread."""
from __future__ import annotations

from ..protocol import Load, Progress
from . import errorlog
from .scheduler import Request


def unload(s) -> None:
    s.controller.detach()
    s.scheduler.detach()
    if s.loaded is not None:
        s.loaded.ckpt.close()
        s.loaded = None
    s.last_loaded = None
    s.collect()  # the old model's cycles freed before the next one is read


def change(s, req: Request) -> None:
    """A Load: the model in use changed for the one it names."""
    from .load import find, load, open_checkpoint

    # The model in use stays until the new one is found and its folder validated (a download
    # that fails, a folder that is not a model): only then is it released for the new one.
    cmd, ctl = req.cmd, s.controller
    path = find(cmd.path, ctl.profiling.progress, req.stop)  # the window's Cancel (a Stop) stops a download
    s.scheduler.forget(req)
    probe = open_checkpoint(path)  # no weights read
    try:
        unload(s)
        s.telemetry.reset()  # the speeds Stats report are the new model's, from its first reply
        context = context_for(s, probe, cmd)  # auto or asked, beside the weights at their smallest
        ctl.reserve = context.reserve  # kept out of the experts' budgets from the first plan on
        placement = ctl.plan_before_load(probe, cmd)
    finally:
        probe.close()
    from ..measures.hardware import cached

    if placement == "auto" and cached() is None:  # a first start measures this machine before it plans (load_or_measure)
        s.publish(Progress(stage="machine", done=0, total=0, what="Measuring this machine once (about 20 s)"))
    s.loaded = ld = load(path, placement, cmd.device, cmd.dtype, context, progress=ctl.profiling.progress("load"),
                         budgets=ctl.first_budgets(cmd.device), slider=ctl.slider, kv_bits=cmd.kv_bits)
    ld.generator.on_oom = ctl.on_oom
    attach_caches(s, ld)
    prepare_waiting(s)
    ctl.attach(ld)
    announce(s)
    ctl.follow_memory(s.commands.put)


def attach_caches(s, ld) -> None:
    """Requests start on the model's generator, with KV caches of its context (made anew after a
    SetContext)."""
    from ..kv.files import KVFiles

    files = KVFiles.for_model(ld) if s.keep_caches else None  # conversations' caches kept on disk too
    s.scheduler.attach(ld.generator, files, prefill_rate=lambda: s.telemetry.prefill_tok_s)


def context_for(s, ckpt, cmd: Load):
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
    return choose(ckpt, accel, dtype, s.controller.free_budgets(accel), cmd.ctx, pinned, cmd.kv_bits)


def set_context(s, tokens) -> dict:
    """SetContext, between requests: the model runs at another context, its weights untouched. The
    KV caches are made anew at the new length (what they held is read again), the experts re-planned
    beside the new reservation, and the model announced again with it."""
    from ..control.context_fit import choose
    from ..protocol.errors import MixdeskError

    ld, ctl = s.loaded, s.controller
    if ld is None:
        raise MixdeskError("no model is loaded")
    pinned = ld.model.placement if ctl.pinned else None
    context = choose(ld.ckpt, ld.accel, ld.model.dtype, ctl.free_budgets(ld.accel), tokens, pinned,
                     ld.model.kv_bits)
    ld.set_context(context)
    attach_caches(s, ld)  # the old caches go with the old KVCaches
    ctl.reserve_context(context.reserve)
    announce(s)
    return {"ctx": context.ctx, "bytes": context.nbytes, "line": context.line()}


def kv_resident(s) -> int:
    """Bytes the loaded model's KV caches have touched so far (the monitor's thread)."""
    ld = s.loaded
    return ld.model.caches_resident_bytes() if ld is not None else 0


def announce(s) -> None:
    """The model is ready (sent again after a re-profile: the popularity it carries may change)."""
    share = s.controller.inputs.share if s.controller.inputs is not None else ()
    s.last_loaded = s.loaded.announcement(share)
    s.publish(s.last_loaded)


def prepare_waiting(s) -> None:
    """Another model is ready: the requests waiting for it are prepared with its template and
    tokenizer (one that no longer fits ends with its error)."""
    for r in list(s.scheduler.waiting):
        try:
            s.prepare(r)
        except Exception as e:  # noqa: BLE001 - the error boundary: this request ends
            s.scheduler.waiting.remove(r)
            s.scheduler.forget(r)
            r.reply(errorlog.error_event(e, errorlog.DOING["Generate"], r.id))

