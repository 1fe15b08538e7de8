"""RMS normalisation, the one way every part computes it: x / sqrt(mean(x²) + eps), in fp32 whatever x's
dtype (as transformers' RMSNorm does), then back in x's dtype, or in the weight's dtype times the weight
where there is one. (DeltaNet's L2 norm of its queries and keys is another thing: engine/layers/deltanet.py.)"""
from __future__ import annotations

import torch


def rms(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.to(x.dtype) if weight is None else weight * h.to(weight.dtype)
