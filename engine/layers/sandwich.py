"""Gemma 4's layer: the mixer and the feed-forward each between two norms, a dense MLP beside the
experts, and a learned scalar on the layer's output (engine/families/gemma4.py).

  x = x + post_attn(attn(ln1(x)))
  m = post_ffn_1(mlp(pre_ffn(x))) + post_ffn_2(experts(pre_ffn_2(x); routed by x itself))
  x = (x + post_ffn(m)) * layer_scalar
"""
from __future__ import annotations

import torch

NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm", "post_feedforward_layernorm_1",
         "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")


def shapes(d, p: str) -> dict[str, tuple[int, ...]]:
    """The norms and the scalar a sandwich layer adds to ln1/ln2 (ln2 is its post-attention norm)."""
    return {**{p + n + ".weight": (d.hidden,) for n in NORMS}, p + "layer_scalar": (1,)}


class SandwichLayer:
    def __init__(self, ln1, mixer, post_attn, norms: dict, scalar: torch.Tensor, mlp, moe):
        self.ln1, self.mixer, self.ln2 = ln1, mixer, post_attn  # ln2: the mixer's output norm here
        self.norms, self.scalar = norms, scalar  # NORMS' weights by name, the output scalar [1]
        self.mlp, self.ffn = mlp, moe  # the dense MLP (layers/feed_forward.py) and the MoE block

    def tensors(self) -> list:
        return [self.ln1, self.ln2, self.scalar, *self.norms.values(), *self.mixer.tensors(), *self.mlp.tensors()]

    def forward(self, m, x: torch.Tensor, run) -> torch.Tensor:
        n = self.norms
        x = x + m._rms(self.mixer(m, m._rms(x, self.ln1), run), self.ln2)
        dense = m._rms(self.mlp(m._rms(x, n["pre_feedforward_layernorm"])), n["post_feedforward_layernorm_1"])
        block = self.ffn
        if block.record is not None:
            block.residual = x  # calibration measures perturbations relative to the stream
        routed = block(m._rms(x, n["pre_feedforward_layernorm_2"]), route_x=x)
        y = dense + m._rms(routed, n["post_feedforward_layernorm_2"])
        return (x + m._rms(y, n["post_feedforward_layernorm"])) * self.scalar
