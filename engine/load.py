"""Open a model folder and build everything needed to chat with it under one placement."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import Checkpoint, dense_shapes
from .devices import Accelerator, detect
from .errors import ModelError
from .generate import Generator
from .kernels import auto_dtype
from .model import MixtralModel, Progress
from .placement import Placement, Tier

DTYPES = {"auto": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Loaded:
    ckpt: Checkpoint
    accel: Accelerator
    model: MixtralModel
    tokenizer: object
    generator: Generator

    def describe(self) -> str:
        d = self.ckpt.dims
        eb = self.model.expert_bytes()
        return (f"{self.ckpt.folder.name}: {d.layers} layers x {d.experts} experts (top-{d.top_k}), "
                f"{self.model.dtype} | {self.accel.describe()} | placement: {self.model.placement.summary()} | "
                f"experts on accelerator {eb['accelerator'] / 2**20:,.0f} MiB, host {eb['host'] / 2**20:,.0f} MiB")


def parse_placement(spec: str, ckpt: Checkpoint, accel: Accelerator, dtype: torch.dtype,
                    vram_budget: int | None = None) -> Placement:
    """'auto' | 'gpu' | 'cpu' | 'random:SEED' | path to a JSON placement."""
    d = ckpt.dims
    if spec == "gpu":
        return Placement.uniform(d.layers, d.experts, Tier.GPU16)
    if spec == "cpu":
        return Placement.uniform(d.layers, d.experts, Tier.CPU16)
    if spec.startswith("random:"):
        return Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], int(spec.split(":", 1)[1]))
    if spec == "auto":
        return auto_placement(ckpt, accel, dtype, vram_budget)
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


def auto_placement(ckpt: Checkpoint, accel: Accelerator, dtype: torch.dtype,
                   vram_budget: int | None = None) -> Placement:
    """Until the planner lands: fill the VRAM budget with 16-bit experts, evenly across layers.
    CPU-only: every expert is cpu-16."""
    d = ckpt.dims
    pl = Placement.uniform(d.layers, d.experts, Tier.CPU16)
    if accel.cpu_only:
        return pl
    if vram_budget is None:
        free, _total = torch.cuda.mem_get_info(accel.device)
        from .plan_inputs import VRAM_MARGIN  # one margin for the planner and the first placement

        vram_budget = int(free * (1 - VRAM_MARGIN))
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_expert = d.expert_params() * itemsize
    dense = sum(math.prod(s) for s in dense_shapes(d).values()) * itemsize
    room = max(0, vram_budget - dense)
    n = min(room // per_expert, d.layers * d.experts)
    for i in range(n):  # round-robin over layers so every layer gets the same share
        pl = pl.with_tier(i % d.layers, i // d.layers, Tier.GPU16)
    return pl


def load(folder: str | Path, placement: str | Placement = "auto", device: str | None = None,
         dtype: str = "auto", ctx: int = 4096, progress: Progress | None = None) -> Loaded:
    ckpt = Checkpoint(folder)
    try:
        tokenizer = ckpt.load_tokenizer()
        accel = detect(device)
        torch_dtype = DTYPES[dtype] or auto_dtype(accel.device)
        pl = placement if isinstance(placement, Placement) else parse_placement(placement, ckpt, accel, torch_dtype)
        model = MixtralModel(ckpt, pl, accel.device, torch_dtype, progress=progress)
    except BaseException:
        ckpt.close()
        raise
    gen = Generator(model, tokenizer, ckpt.eos_token_ids(tokenizer), ctx=ctx)
    return Loaded(ckpt, accel, model, tokenizer, gen)
