"""The Checkpoint duck type's mappings over a GGUF file (engine/files/gguf/checkpoint.py): `expected` (HF name
-> shape, the experts' computed when asked), `where` (HF name -> the file holding it) and `Info`."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import expert_shapes

EXPERT_NAME = re.compile(r"^model\.layers\.(\d+)\.(?:\w+\.)?experts\.(\d+)\.(\w+)\.weight$")


@dataclass(frozen=True)
class Info:
    """What Checkpoint.info gives: the HF tensor's shape, the dtype read() returns, and the bytes it
    takes in the file."""
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


class Where:
    def __init__(self, path: Path):
        self.path = path


class Expected(Mapping):
    """HF name -> shape of every tensor the engine reads: the dense ones listed, the experts' (18,432
    names for Qwen3-30B-A3B) computed when asked, so opening stays fast."""

    def __init__(self, dense: dict, d, mxfp4: bool):
        self.dense, self.d, self.mxfp4 = dense, d, mxfp4
        self._experts: dict | None = None

    def _all_experts(self) -> dict:
        if self._experts is None:
            self._experts = expert_shapes(self.d, self.mxfp4)
        return self._experts

    def __getitem__(self, name: str):
        if name in self.dense:
            return self.dense[name]
        if not self.d.adapter.fused_experts and ".experts." in name:
            m = EXPERT_NAME.match(name)  # (mlp.experts. or Gemma 4's experts.)
            if m and self.d.dense_first <= int(m[1]) < self.d.decoder_layers and int(m[2]) < self.d.experts:
                w = next((k for k, v in self.d.adapter.weights.items() if v == m[3]), None)
                if w is not None and name == self.d.adapter.expert_key(int(m[1]), int(m[2]), w):
                    return (self.d.hidden, self.d.ffn) if w == "w2" else (self.d.ffn, self.d.hidden)
            raise KeyError(name)
        return self._all_experts()[name]

    def __iter__(self):
        yield from self.dense
        yield from self._all_experts()

    def __len__(self) -> int:
        return len(self.dense) + len(self._all_experts())


class WhereMap(Mapping):
    """HF name -> an object whose .path is the file holding the tensor (for messages), when asked."""

    def __init__(self, ckpt):  # a GGUFCheckpoint (engine/files/gguf/checkpoint.py imports this module)
        self.ckpt = ckpt
        self._by_path = {p: Where(p) for p in ckpt.file.parts}

    def __getitem__(self, name: str) -> Where:
        self.ckpt.expected[name]  # KeyError for a name the model does not have
        return self._by_path[self.ckpt._info_of(name).path]

    def __iter__(self):
        return iter(self.ckpt.expected)

    def __len__(self) -> int:
        return len(self.ckpt.expected)
