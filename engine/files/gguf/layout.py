"""Where a dense tensor's form in a GGUF file differs from its Hugging Face form, and how a read undoes it.

llama.cpp's converter rearranges some tensors for its own kernels (convert_hf_to_gguf.py); a `Fix`
says how, per HF name, in three kinds:
- rows permuted: llama's q/k rows for its rope (LlamaModel.permute); Qwen3.5's DeltaNet value heads
  from grouped to tiled order (in_proj_qkv's v rows, in_proj_z, in_proj_b, in_proj_a). A row's
  blocks move whole: lossless on every type, so the file's blocks stay usable, in the HF order.
- column groups permuted: Qwen3.5's out_proj (its input is the value heads, tiled). Lossless on
  blocks when a group is whole blocks (the float types; 32-element blocks with the value head a
  multiple of 32); otherwise the tensor is presented as its exact dequantisation (F32).
- values changed: Qwen3.5's zero-centred RMSNorm weights stored as 1 + w, A_log as -exp(A_log),
  its 1-D and conv tensors reordered with the heads. Small tensors, presented as F32.
- split: one HF tensor written as several file tensors (deepseek2's kv_b_proj as attn_k_b, transposed
  per head, and attn_v_b: engine/files/gguf/glm_lite.py); joined from their values, presented as F32.
A tensor without a Fix is read as the file holds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES


@dataclass(frozen=True)
class Fix:
    rows: torch.Tensor | None = None   # HF row i is the file's row rows[i]
    cols: torch.Tensor | None = None   # HF column group g is the file's group cols[g]...
    width: int = 1                     # ...of `width` columns each
    value: Callable[[torch.Tensor], torch.Tensor] | None = None  # fp32 values (HF shape, HF order) -> HF's;
                                                                 # may raise ValueError (the file is wrong)
    parts: tuple = ()                  # ((GGUF name, torch shape), ...): the file tensors it was split into
    join: Callable[[list], torch.Tensor] | None = None  # their fp32 values, in those shapes -> the HF tensor

    def blocks_ok(self, qtype: GT) -> bool:
        """Whether the file's rows, in qtype, can be given in the HF order as they are (no value
        changes; a column group is whole blocks)."""
        return self.value is None and not self.parts and \
            (self.cols is None or self.width % GGML_QUANT_SIZES[qtype][0] == 0)

    def raw(self, raw: torch.Tensor, qtype: GT) -> torch.Tensor:
        """The file's rows [R, row_bytes] uint8 in the HF order (only where blocks_ok)."""
        if self.rows is not None:
            raw = raw[self.rows]
        if self.cols is not None:
            block, size = GGML_QUANT_SIZES[qtype]
            r = raw.shape[0]
            raw = raw.reshape(r, len(self.cols), self.width // block * size)[:, self.cols].reshape(r, -1)
        return raw

    def floats(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The file's values x [R, K] (any float dtype) as the HF tensor of `shape`, in fp32."""
        x = x.float()
        if self.rows is not None:
            x = x[self.rows]
        if self.cols is not None:
            r, k = x.shape
            x = x.reshape(r, len(self.cols), self.width)[:, self.cols].reshape(r, k)
        x = x.reshape(shape)
        return self.value(x) if self.value is not None else x


def head_rows(heads: torch.Tensor, width: int, base: int = 0) -> torch.Tensor:
    """A permutation of heads (head i is heads[i]) as one of their rows, `width` rows a head, from `base`."""
    return (base + heads[:, None] * width + torch.arange(width)[None, :]).reshape(-1)
