"""A dense feed-forward: the SwiGLU MLP of the layers that have no experts (GLM-4.5's first layers),
kept with the dense weights on the accelerator. (The routed feed-forward is engine/model/moe.py's MoEBlock.)
"""
from __future__ import annotations

import torch

from ..experts.expert import Expert16, Glu
from ..placement import Tier


class DenseFFN:
    def __init__(self, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, act: str = "silu"):
        glu = Glu(act=act) if act != "silu" else None  # GELU-tanh (Gemma)
        self.mlp = Expert16(Tier.GPU16, torch.cat([w1, w3]).contiguous(), w2.contiguous(), glu)  # [2I, D], [D, I]

    def tensors(self) -> list[torch.Tensor]:
        return [self.mlp.w13, self.mlp.w2]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [T, D] -> [T, D]
        return self.mlp(x).to(x.dtype)
