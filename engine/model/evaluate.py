"""Perplexity of the loaded model (any placement) on a text, for quality checks and the planner."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .forward import MoEModel


@torch.inference_mode()
def perplexity(model: MoEModel, ids: list[int], chunk: int = 256) -> float:
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


def corpus_ids(tokenizer, path: str | None = None, max_tokens: int = 1024) -> list[int]:
    """Token ids of an offline text: a file, or by default the text of Python's own pydoc topics
    (present on every machine with Python)."""
    if path:
        from pathlib import Path

        text = Path(path).read_text(encoding="utf-8", errors="replace")
    else:
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
    return tokenizer.encode(text[: max_tokens * 12], add_special_tokens=False)[:max_tokens]


@torch.inference_mode()
def logprobs(model: MoEModel, ids: list[int]) -> torch.Tensor:
    """log-softmax of the model's predictions for ids[1:], [T-1, V] fp32 on the CPU."""
    logits = model.forward(torch.tensor(ids[:-1]), model.new_cache(len(ids)), 0, all_logits=True)
    return F.log_softmax(logits.cpu(), dim=-1)


def compare(ref: torch.Tensor, got: torch.Tensor, ids: list[int]) -> dict:
    """Perplexity of `got`, and the mean KL(ref || got) per token, from two logprob tables."""
    targets = torch.tensor(ids[1:])
    nll = -got.gather(1, targets[:, None]).mean()
    kl = (ref.exp() * (ref - got)).sum(-1).mean()
    ref_nll = -ref.gather(1, targets[:, None]).mean()
    return {"ppl": math.exp(float(nll)), "ref_ppl": math.exp(float(ref_nll)), "kl": float(kl)}
