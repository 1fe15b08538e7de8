"""Perplexity of the loaded model (any placement) on a text, for quality checks and the planner."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .model import MixtralModel


@torch.inference_mode()
def perplexity(model: MixtralModel, ids: list[int], chunk: int = 256) -> float:
    """exp(mean NLL of ids[1:]), computed in chunks through the KV cache (exact, not windowed)."""
    if len(ids) < 2:
        raise ValueError("need at least two tokens")
    cache = model.new_cache(len(ids))
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start:start + chunk]
        logits = model.forward(torch.tensor(piece), cache, start, all_logits=True)  # [T, V] fp32
        targets = torch.tensor(ids[start + 1:start + 1 + len(piece)])
        logits = logits[: len(targets)]
        nll += float(F.cross_entropy(logits.cpu(), targets, reduction="sum"))
        count += len(targets)
    return math.exp(nll / count)
