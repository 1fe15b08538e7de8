"""What every checkpoint offers the engine, whichever format holds it: a Hugging Face folder of
safetensors (checkpoint.py), a GGUF file (gguf/checkpoint.py) or a synthetic checkpoint whose weights are
made on demand (engine/sources/synthetic.py). A tier, the mapping, the planner and the loader ask only
this of a file; where the formats differ (a GGUF file's experts keep their own blocks), they branch on
`is_gguf`, a field every checkpoint declares, never on a probe of its attributes."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from .model_config import Dims


@runtime_checkable
class ModelCheckpoint(Protocol):
    folder: Path  # the folder, or a GGUF checkpoint's file
    config_path: Path
    raw_config: dict  # config.json as read (a GGUF file's metadata mapped to its names)
    dims: Dims
    dtype: torch.dtype  # the experts' 16-bit source
    mxfp4: bool  # experts shipped as MXFP4 blocks (gpt-oss)
    is_gguf: bool  # a GGUF file: its CPU tiers hold its own blocks (engine/experts/gguf_tiers.py)
    expected: dict  # tensor name -> shape, every tensor the model reads
    where: dict  # tensor name -> its location (.path names the file in an error)

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor: ...

    def read_rows(self, name: str, first: int, count: int) -> torch.Tensor: ...

    def expert_nbytes(self) -> int: ...

    def dense_nbytes(self) -> int: ...

    def close(self) -> None: ...
