"""Open a model folder and build everything needed to chat with it under one placement."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..prompts.chat_template import ChatTemplate
from ..files.checkpoint import Checkpoint
from ..machine.devices import Accelerator, detect
from ..protocol.errors import ModelError
from ..prompts.formats import reply_end_ids
from .generate import Generator
from .. import native
from ..native.dense_linear import compute_dtype
from ..kv.tensors import check_kv_bits
from ..model.forward import MoEModel, ProgressFn
from ..placement import Placement, Tier
from ..planning.kv_reservation import ContextChoice
from ..prompts.prompt import Prompts
from ..prompts.prompt_limit import longest_token_chars

@dataclass
class LoadedModel:
    ckpt: Checkpoint
    accel: Accelerator
    model: MoEModel
    tokenizer: object
    generator: Generator
    prompts: Prompts  # its chat template and tokenizer: prompts to ids (engine/prompts/prompt.py)
    context: ContextChoice | None = None  # the context it runs at and what it costs (engine/control/context_fit.py)

    def set_context(self, context: ContextChoice) -> None:
        """Run at another context (SetContext): the generator's and the prompts' length; the caller
        makes the caches anew (engine/runtime/session.py)."""
        self.context = context
        self.generator.ctx = min(context.ctx, self.ckpt.dims.max_positions)
        self.prompts.ctx = self.generator.ctx

    def describe(self) -> str:
        d = self.ckpt.dims
        eb = self.model.expert_bytes()
        return (f"{self.ckpt.folder.name}: {d.layers} layers x {d.experts} experts (top-{d.top_k}), "
                f"{self.model.dtype}{' (keys and values 8-bit)' if self.model.kv_bits == 8 else ''} | {self.accel.describe()} | CPU kernel: {native.status()} | placement: {self.model.placement.summary()} | "
                f"experts on accelerator {eb['accelerator'] / 2**20:,.0f} MiB, host {eb['host'] / 2**20:,.0f} MiB")

    def announcement(self, share: tuple):
        """The Loaded event for this model. Its callables hold the tokenizer and the chat template,
        not the model (listeners keep events; shutting down must free the model)."""
        from ..experts.gguf_tiers import bar_fields
        from ..protocol.events import Loaded

        d, tok, gen, p = self.ckpt.dims, self.tokenizer, self.generator, self.prompts
        t = p.template
        return Loaded(name=self.ckpt.folder.name, description=self.describe(), cpu_only=self.accel.cpu_only,
                      layers=d.layers, experts=d.experts, ctx=gen.ctx, share=share,
                      params=d.layers * d.experts * d.expert_params() + self.model.dense_params(),
                      count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)),
                      prompt_ids=p.chat, max_token_chars=p.max_token_chars, reply_format=t.format,
                      takes_tools=t.takes_tools, thinking_switch=t.thinking_switch, memory=self.memory_note(),
                      context=self.context,
                      **(bar_fields(self.ckpt) if self.ckpt.is_gguf else {}))

    def memory_note(self) -> str:
        """Where the weights are, in words, for a model that reads some from its mapped file: how much
        is mapped and how much is the process's own memory, and a plain warning when the mapped part
        is larger than the memory free for it (it then pages: runs, slower)."""
        import psutil

        eb, m = self.model.expert_bytes(), self.model
        mapped = eb["mapped"] + m.dense_mapped_bytes()
        if not mapped:
            return ""
        own = eb["host"] + m.dense_bytes() - m.dense_mapped_bytes()
        gb = 1e9
        note = (f"{mapped / gb:.1f} GB of weights are read from the file as they are used (mapped: file cache the "
                f"system shares and can free), {own / gb:.1f} GB are in Mixdesk's own memory")
        mi = psutil.Process().memory_info()
        room = psutil.virtual_memory().available + min(getattr(mi, "shared", 0), mapped)  # ours already in RAM too
        if mapped > room:
            note += (f". The file is larger than the {room / gb:.1f} GB of memory free for it: it will read from "
                     "disk as it runs, slower; closing other programs speeds it up")
        return note


def parse_placement(spec: str, ckpt: Checkpoint, accel: Accelerator, dtype: torch.dtype,
                    budgets=None, slider: float = 1.0) -> Placement:
    """'auto' | 'gpu' | 'cpu' | 'random:SEED' | path to a JSON placement."""
    d = ckpt.dims
    if spec == "gpu":
        return Placement.uniform(d.layers, d.experts, Tier.GPU16)
    if spec == "cpu":
        return Placement.uniform(d.layers, d.experts, Tier.CPU16)
    if spec.startswith("random:"):
        return Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], int(spec.split(":", 1)[1]))
    if spec == "auto":
        return auto_placement(ckpt, accel, dtype, budgets, slider)
    path = Path(spec)
    try:
        pl = Placement.from_json(path.read_text())
    except FileNotFoundError:
        raise ModelError(path, "placement file does not exist") from None
    except (ValueError, json.JSONDecodeError) as e:
        raise ModelError(path, f"is not a placement (a JSON list of lists of tiers): {e}") from None
    if (pl.layers, pl.experts) != (d.layers, d.experts):
        raise ModelError(path, f"is {pl.layers}x{pl.experts}; the model has {d.layers}x{d.experts} experts")
    return pl


def auto_placement(ckpt: Checkpoint, accel: Accelerator, dtype: torch.dtype, budgets=None,
                   slider: float = 1.0) -> Placement:
    """The first placement, before this model has a profile: the planner on the model's shape
    (uniform popularity, an assumed 4-bit sensitivity) with this machine's measured tier costs and
    its free memory. Provisional: the least loss that memory allows, whatever the slider (planner.choose),
    until the calibration has measured which experts 4 bits would hurt. A model bigger than RAM + VRAM at 16 bits therefore loads
    straight into 4-bit where it must, instead of materialising every expert at 16 bits first; one
    that cannot fit even at 4 bits is refused with the figures, before anything is read."""
    from ..measures.hardware import load_or_measure
    from ..measures.inputs import default_budgets, from_dims
    from ..planning.planner import plan

    from ..experts.tier_bytes import tier_bytes

    hw = load_or_measure(accel.device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    # a GGUF file's dense matrices stay in its blocks on a CPU-only machine (engine/model/forward.py)
    dense = ckpt.dense_nbytes() if ckpt.is_gguf and accel.cpu_only else None
    inp = from_dims(ckpt.dims, hw, itemsize, sizes=tier_bytes(ckpt, itemsize), dense_bytes=dense,
                    cpu4_share=cpu4_share(ckpt))
    from dataclasses import replace

    from ..experts.tier_bytes import mapped_bytes

    mapped, dense_mapped = mapped_bytes(ckpt, dtype, accel.cpu_only)
    inp = replace(inp, cpu_only=inp.cpu_only or accel.cpu_only, provisional=True, mapped_bytes=mapped,
                  dense_mapped=dense_mapped)
    budgets = budgets or default_budgets(inp.cpu_only, accel.device)
    p = plan(inp, budgets, slider)
    if not p.fits:
        gb = 1e9
        raise ModelError(ckpt.folder, f"does not fit in this machine's free memory even with every expert at 4 bits: "
                         f"it needs {p.ram / gb:.1f} GB of RAM and {p.vram / gb:.1f} GB of GPU memory; "
                         f"{budgets.ram / gb:.1f} GB and {budgets.vram / gb:.1f} GB are free. "
                         "Close other programs, or use a smaller model.")
    return p.placement


def load(folder: str | Path, placement: str | Placement = "auto", device: str | None = None,
         dtype: str = "auto", ctx: int | str | ContextChoice = "auto", progress: ProgressFn | None = None,
         budgets=None, slider: float = 1.0, kv_bits: int | None = None) -> LoadedModel:
    """ctx: "auto" (the model's own context length as memory allows: engine/control/context_fit.py), a length
    (refused with the figures when its keys and values do not fit), or a ContextChoice made already
    (the session's, whose reservation `budgets` do not hold yet either). budgets and slider apply to
    placement "auto" (budgets: planner.Budgets, the memory the model may use; None: free memory); it
    is planned under them less the context's keys and values. kv_bits: 16 or 8 (engine/kv/int8.py); None:
    the ContextChoice's, else 16."""
    from ..control import context_fit
    from ..measures.inputs import default_budgets

    ckpt = open_checkpoint(folder)
    try:
        tokenizer = ckpt.load_tokenizer()
        template = ChatTemplate.of(tokenizer, ckpt.folder)  # it must parse and render, before anything is built
        accel = detect(device)
        torch_dtype = compute_dtype(dtype, accel.device)
        pl = placement if isinstance(placement, Placement) or placement == "auto" else \
            parse_placement(placement, ckpt, accel, torch_dtype)
        free = budgets or default_budgets(accel.cpu_only, accel.device)
        if kv_bits is None:
            kv_bits = ctx.cost.kv_bits if isinstance(ctx, ContextChoice) else 16
        check_kv_bits(ckpt.dims, kv_bits)  # before a context is sized with it
        context = ctx if isinstance(ctx, ContextChoice) else context_fit.choose(
            ckpt, accel, torch_dtype, free, ctx, None if pl == "auto" else pl, kv_bits)
        if pl == "auto":
            pl = auto_placement(ckpt, accel, torch_dtype, context_fit.net(free, context.reserve), slider)
        model = MoEModel(ckpt, pl, accel.device, torch_dtype, progress=progress, kv_bits=kv_bits)
    except BaseException:
        ckpt.close()
        raise
    ends = ckpt.eos_token_ids(tokenizer) | reply_end_ids(template.format, tokenizer)
    gen = Generator(model, tokenizer, ends, ctx=context.ctx)
    prompts = Prompts(template, tokenizer, gen.ctx, longest_token_chars(tokenizer))
    return LoadedModel(ckpt, accel, model, tokenizer, gen, prompts, context)


def cpu4_share(ckpt) -> float:
    """The share of an expert's weights cpu-4 re-quantises: all of a 16-bit checkpoint's; of a GGUF
    file's, those it holds at more than 4 bits (engine/experts/gguf_tiers.py)."""
    if not ckpt.is_gguf:
        return 1.0
    from ..experts.gguf_tiers import requantised_share

    return requantised_share(ckpt)


def find(spec: str, progress, cancel) -> str:
    """The folder or file a Load names: "demo" (built once), a path, or a hub id (downloaded, which
    `cancel` stops). progress(stage) -> a progress callable."""
    if spec == "demo":
        from ..sources import demo

        return str(demo.ensure(progress=progress("build demo"), log=lambda s: None))
    from ..sources.hub import resolve

    return str(resolve(spec, progress=progress("download"), cancel=cancel))


def open_checkpoint(folder: str | Path) -> Checkpoint:
    """A model opened and validated (no weights read): a safetensors folder, a GGUF file (or a
    folder or split set of one: engine/files/gguf), or a synthetic model."""
    from ..sources.synthetic import SyntheticCheckpoint, is_synthetic

    from ..files.gguf import is_gguf, open_gguf

    if is_gguf(folder):
        return open_gguf(folder)
    return SyntheticCheckpoint(folder) if is_synthetic(folder) else Checkpoint(folder)
