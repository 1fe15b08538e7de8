"""The dense (non-expert) matrices of a model whose file is quantised (GGUF), kept in the file's own
blocks on the CPU rather than widened to 16 bits: a Q4_K_M file's attention and output matrices read
4.5-6.6 bits a weight per token where bf16 reads 16 (on the demo that halves the bytes of a step).

Each matrix is a torch tensor (16-bit, as before) or a BlockQuant (engine/files/gguf/blockquant.py). q, k and v
are one matrix [q; k; v] when they share a format (one matmul), else `Stacked` (three).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..files.gguf.blockquant import BlockQuant


class Stacked:
    """Matrices of one input stacked along the output rows ([q; k; v] in different formats)."""

    def __init__(self, parts: list):
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, sum of rows]
        from ..native.dense_linear import linear
        from ..native import choice

        if choice.stacked(self.parts, x):  # a decode step: every part in one native call
            from ..native import matmul_parts, matrix

            descs = [p.desc if not isinstance(p, torch.Tensor) else matrix(p) for p in self.parts]
            return matmul_parts(descs, x.to(self._dtype(x))).to(x.dtype)
        return torch.cat([linear(x, p) for p in self.parts], dim=-1)

    def _dtype(self, x: torch.Tensor) -> torch.dtype:
        """The input's dtype for the native call: a 16-bit part's own dtype (its rows read x as it is)."""
        t = next((p for p in self.parts if isinstance(p, torch.Tensor)), None)
        return t.dtype if t is not None else x.dtype

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def stack(parts: list):
    """[q; k; v] as one matrix where they can be one (all tensors, or one block format), else Stacked."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    if all(isinstance(p, BlockQuant) and not p.mapped for p in parts) and len({p.qtype for p in parts}) == 1:
        # (the file's own mapped rows stay three matrices: one would be a copy)
        raw = torch.cat([p.raw() for p in parts])
        return BlockQuant.from_raw(parts[0].qtype, raw, (sum(p.shape[0] for p in parts), parts[0].shape[1]))
    return Stacked(parts)


def embed_rows(embed, ids: torch.Tensor) -> torch.Tensor:
    """The embedding rows of ids [T] -> [T, D]: a lookup, or each row dequantised from its blocks
    (exactly the values the file holds, fp32)."""
    if isinstance(embed, torch.Tensor):
        return F.embedding(ids, embed)
    return torch.cat([embed.dequantize(i, i + 1) for i in ids.tolist()])


def nbytes(t) -> int:
    return t.nbytes


def mapped_nbytes(t) -> int:
    """Bytes of a weight (a tensor, a BlockQuant, Stacked parts, an expert's w13 and w2) that are a
    mapped model file's pages (file-backed, the page cache's: engine/files/gguf/reader.py `view`), not
    memory the process owns."""
    if isinstance(t, Stacked):
        return sum(mapped_nbytes(p) for p in t.parts)
    if getattr(t, "mapped", False):  # a BlockQuant on the file's rows, an expert on the file's tensors
        return t.nbytes
    if hasattr(t, "w13") and hasattr(t, "w2"):
        return mapped_nbytes(t.w13) + mapped_nbytes(t.w2)
    return t.nbytes if getattr(t, "mapped", False) else 0
