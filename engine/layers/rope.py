"""Rotary position tables: cos and signed sin per position, grown as positions are reached.

A model has one table (`Rope` of its rotary dims), or one per layer kind where kinds differ (Gemma 4:
its sliding layers' default rope and its global layers' proportional rope, each over its own head
width; `keyed`). Shapes: n positions, R rotary dims.
"""
from __future__ import annotations

import torch


class Rope:
    def __init__(self, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype, device: torch.device):
        self.inv_freq, self.scale, self.dtype, self.device = inv_freq, scale, dtype, device
        self._cache: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def tables(self, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [n, 1, R] for positions 0..n-1, n >= upto."""
        if self._cache is None or self._cache[0] < upto:
            n = max(upto, 256, 2 * (self._cache[0] if self._cache else 0))
            pos = torch.arange(n, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None, :]  # [n, R/2]
            emb = torch.cat([freqs, freqs], dim=-1)  # [n, R]
            cos = (emb.cos() * self.scale).to(self.dtype)
            sin = (emb.sin() * self.scale).to(self.dtype)
            half = emb.shape[-1] // 2
            # rotate_half(x) * sin == roll(x, half) * [-sin_lo, sin_hi]: one op instead of three
            sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
            self._cache = (n, cos.to(self.device)[:, None, :], sin_signed.to(self.device)[:, None, :])
        return self._cache[1], self._cache[2]

    def rows(self, positions: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [T, 1, R] (contiguous) of a forward's T tokens: one sequence's run from
        positions[0] (a slice of the tables), or one token at each of the positions (T == B)."""
        cos_t, sin_t = self.tables(max(positions) + (T if len(positions) == 1 else 1))
        if len(positions) == 1:
            return cos_t[positions[0]:positions[0] + T], sin_t[positions[0]:positions[0] + T]
        at = torch.tensor(positions, device=self.device)
        return cos_t[at], sin_t[at]


def frequencies(config, rotary: int) -> tuple[torch.Tensor, float]:
    """A config's inverse frequencies over `rotary` dims, and the attention scale its rope type brings."""
    rp = getattr(config, "rope_parameters", None) or {}
    kind = rp.get("rope_type", "default")
    if kind == "default":
        theta = float(rp.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        return 1.0 / (theta ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary)), 1.0
    # scaled variants (llama3, yarn, ...) come from transformers' own tables
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.float(), float(scale)


def keyed(config, dtype: torch.dtype, device: torch.device) -> dict[str, Rope]:
    """One table per layer kind (Gemma 4), from transformers' own rotary module for the config: its
    per-kind inverse frequencies and scales (proportional rope spans the whole head, zeros beyond the
    rotated quarter)."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    ref = Gemma4TextRotaryEmbedding(config)
    return {k: Rope(getattr(ref, f"{k}_inv_freq").float(), float(getattr(ref, f"{k}_attention_scaling")), dtype, device)
            for k in ref.rope_type}
