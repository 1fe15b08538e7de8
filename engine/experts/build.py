"""An expert built in a tier from its file, whatever the file: a safetensors checkpoint's experts are
read at 16 bits and quantised (expert.py), a GGUF file's keep its own blocks where a tier can
(gguf_tiers.py). The one entry point for the model, the migrator and the calibration."""
from __future__ import annotations

import torch

from ..placement import Tier
from . import expert, gguf_tiers
from .quant import run_to_end


def build_steps(ckpt, layer: int, expert_index: int, tier: Tier, accel: torch.device, dtype: torch.dtype,
                threads: int | None = None):
    """Expert (layer, expert_index) built in tier as a generator: it yields between short steps (a read,
    a check, a slice of quantisation) and returns the form, so a build can be spread between decode
    steps."""
    own = gguf_tiers if ckpt.is_gguf else expert
    return (yield from own.build_steps(ckpt, layer, expert_index, tier, accel, dtype, threads))


def materialise(ckpt, layer: int, expert_index: int, tier: Tier, accel: torch.device, dtype: torch.dtype,
                threads: int | None = None):
    """Build expert (layer, expert_index) in `tier` from the checkpoint, the 16-bit source of truth.
    gpu-* tiers live on `accel` (the CPU device when there is no CUDA: a test seam that keeps the
    two-tier logic exercised), cpu-* on the host. Only this one expert is ever held at 16 bits."""
    return run_to_end(build_steps(ckpt, layer, expert_index, tier, accel, dtype, threads))
