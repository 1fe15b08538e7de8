"""Named queries: what a client may ask the engine thread about what it holds. A client sends
Query(name=..., args={...}) (engine/protocol/commands.py); the engine thread answers it between requests
with the handler of that name, registered here and nowhere else, and sends the answer back as a
QueryDone: a plain value (a number, a string, a dict of values). A failure is an ErrorEvent. No
client hands the engine code to run: these handlers are all a client can ask for.

  name               args                                   answer
  calibrating        -                                      bool: the background calibration still runs
  vocab              -                                      int: the loaded model's vocabulary size
  peak_vram          -                                      int | None: the most accelerator memory
                                                            allocated so far (None: no accelerator)
  plan_inputs        -                                      dict: inputs (planner.PlanInputs), name,
                                                            where (the devices), free (planner.Budgets),
                                                            measured (bool: profiles measured here)
  evaluate           slider, text, tokens, new_tokens,      dict: plan (the slider's plan), quality
                     vram, ram (bytes; None: free memory)   (ppl, ref_ppl, kl), tokens, done (a Done)
  evaluate_pinned    text, tokens, new_tokens               dict: perplexity, tokens, counts (experts per
                                                            tier), done (a Done)
  set_context        tokens ("auto" or a length)            dict: ctx, bytes, line (the context the model
                                                            runs at now: a SetContext, engine/runtime/session.py)
  check_model        spec (a folder, a file, a hub id,      str: the model's folder, once found (built,
                     "demo")                                downloaded), opened and its tokenizer and
                                                            chat template read; the model in use stays
"""
from __future__ import annotations

from typing import Callable

from ..protocol.errors import InputError, MixdeskError

HANDLERS: dict[str, Callable] = {}  # name -> handler(session, **args) (tests may add their own)


def handler(name: str):
    def register(fn: Callable) -> Callable:
        HANDLERS[name] = fn
        return fn
    return register


def answer(session, query) -> object:
    """On the engine thread: the answer to query (engine/protocol/commands.Query)."""
    fn = HANDLERS.get(query.name)
    if fn is None:
        raise InputError("query", f"the engine answers no query named {query.name!r} "
                         f"(it answers {', '.join(sorted(HANDLERS))})")
    return fn(session, **query.args)


def _loaded(session):
    if session.loaded is None:
        raise MixdeskError("no model is loaded")
    return session.loaded


@handler("set_context")
def set_context(session, tokens="auto") -> dict:
    from .model_in_use import set_context

    return set_context(session, tokens)


@handler("calibrating")
def calibrating(session) -> bool:
    return bool(session.controller.calibrating)


@handler("vocab")
def vocab(session) -> int:
    return int(_loaded(session).ckpt.dims.vocab)


@handler("peak_vram")
def peak_vram(session) -> int | None:
    import torch

    accel = _loaded(session).accel
    return int(torch.cuda.max_memory_allocated(accel.device)) if accel.is_cuda else None


@handler("plan_inputs")
def plan_inputs(session) -> dict:
    from ..measures.inputs import default_budgets
    from ..measures.profile import cached_profile

    ld = _loaded(session)
    held, acc = ld.model.expert_bytes(), ld.accel
    return {"inputs": session.controller.inputs, "name": ld.ckpt.folder.name, "where": acc.describe(),
            "free": default_budgets(acc.cpu_only, acc.device, held_ram=held["host"], held_vram=held["accelerator"]),
            "measured": cached_profile(ld.ckpt, session.controller.profiling.measured_tiers(acc, ld.ckpt)) is not None}


def _decode(loaded, ids: list[int], new_tokens: int):
    """A reply to the corpus's first tokens, alone in a fresh cache: its Done (decode speed)."""
    from ..protocol.sampling import SamplingParams

    return list(loaded.generator.stream(ids[:16], SamplingParams(max_new_tokens=new_tokens)))[-1]


@handler("evaluate")
def evaluate(session, slider: float, text: str | None = None, tokens: int = 1024, new_tokens: int = 64,
             vram: int | None = None, ram: int | None = None, lowest_bits: int | None = None) -> dict:
    """Perplexity all 16-bit, then at the slider's plan under the budgets (and the lowest precision for
    experts, where given), and decode speed (`mixdesk eval`)."""
    from dataclasses import replace

    from ..model.evaluate import compare, corpus_ids, logprobs
    from ..placement import Placement, Tier
    from ..measures.inputs import default_budgets
    from ..planning.planner import Budgets, plan

    ld = _loaded(session)
    m, d = ld.model, ld.ckpt.dims
    ids = corpus_ids(ld.tokenizer, text, tokens)
    m.apply(Placement.uniform(d.layers, d.experts, Tier.CPU16 if ld.accel.cpu_only else Tier.GPU16))
    ref = logprobs(m, ids)
    held = m.expert_bytes()
    free = default_budgets(ld.accel.cpu_only, ld.accel.device, held["host"], held["accelerator"])
    inp = session.controller.inputs
    if lowest_bits is not None:
        inp = replace(inp, lowest_bits=lowest_bits)
    p = plan(inp, Budgets(vram=free.vram if vram is None else vram,
                                                ram=free.ram if ram is None else ram), slider)
    m.apply(p.placement)
    session.controller.migrator.recount()
    q = compare(ref, logprobs(m, ids), ids)
    return {"plan": p, "quality": q, "tokens": len(ids), "done": _decode(ld, ids, new_tokens)}


@handler("evaluate_pinned")
def evaluate_pinned(session, text: str | None = None, tokens: int = 1024, new_tokens: int = 64) -> dict:
    """The perplexity of the model at the placement it was loaded with (`mixdesk eval --placement P`)."""
    from ..model.evaluate import corpus_ids, perplexity

    ld = _loaded(session)
    ids = corpus_ids(ld.tokenizer, text, tokens)
    return {"perplexity": perplexity(ld.model, ids), "tokens": len(ids), "counts": ld.model.placement.counts(),
            "done": _decode(ld, ids, new_tokens)}


@handler("check_model")
def check_model(session, spec: str) -> str:
    """While the model in use stays loaded: the new model's folder found (the demo built, a hub id
    downloaded, with progress; a Stop cancels it), opened, and its tokenizer and chat template read,
    as load does before it builds anything. Returns the folder; what is wrong with it is a
    MixdeskError, one line (the window's File > Open model checks before it loads: app/model_switch.py)."""
    from . import errorlog
    from ..prompts.chat_template import ChatTemplate
    from ..protocol.events import Progress
    from .load import find, open_checkpoint

    def progress(stage):
        return lambda d, t, w="": session.publish(Progress(stage=stage, done=d, total=t, what=w))
    try:
        folder = find(spec, progress, session.current_stop)
        ckpt = open_checkpoint(folder)
        try:
            ChatTemplate.of(ckpt.load_tokenizer(), ckpt.folder)
        finally:
            ckpt.close()
        return str(folder)
    except MixdeskError:
        raise
    except Exception as e:  # noqa: BLE001 - said in one line, the traceback in the log
        log = errorlog.record(e, f"opening {spec}")
        raise MixdeskError(f"{spec} could not be opened: {errorlog.one_line(e)}"
                           + (f" (details in {log})" if log else "")) from None
