"""A synthetic checkpoint: a model folder that holds only config.json, a tokenizer and a marker, whose
weights are seeded random tensors generated on demand when the engine reads them.

What it is for: measuring speed and memory behaviour at real size (Mixtral-8x7B: 93 GB at 16 bits)
on a machine where such weights can be neither downloaded nor stored. Everything else is the real
engine: the same loading, tiers, planner, session and migrations. Its answers are noise.

Each tensor is a function of (seed, name) only, so re-reading an expert for a re-placement gives the
same weights (16 -> 4 -> 16 stays bit-identical, as with a file). Tensors are generated on the GPU
when there is one (a Mixtral expert matrix in well under a millisecond; on a CPU it takes ~0.3 s).
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from ..files.checkpoint import Checkpoint, dims_from_config, dense_shapes, expert_shapes
from ..protocol.errors import ModelError
from ..files.model_files import check_links

MARKER = "mixdesk-synthetic.json"


def write_synthetic(folder: str | Path, config_path: str | Path, seed: int = 0,
                    dtype: str = "bfloat16") -> Path:
    """Make a synthetic model folder from a Mixtral config.json (a few hundred KB on disk)."""
    from .tiny_model import write_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        raw = json.loads(Path(config_path).read_text())
    except (OSError, ValueError) as e:
        raise ModelError(Path(config_path), f"cannot be read: {e}") from None
    (folder / "config.json").write_text(json.dumps(raw, indent=1))
    write_tokenizer(folder, min(int(raw.get("vocab_size", 32000)), 4096))
    (folder / MARKER).write_text(json.dumps({"seed": seed, "dtype": dtype}))
    return folder


def is_synthetic(folder: str | Path) -> bool:
    return (Path(folder).expanduser() / MARKER).is_file()


class _Where:  # what error messages need from a tensor's location
    def __init__(self, path: Path):
        self.path = path


class SyntheticCheckpoint:
    """Duck-types engine.files.checkpoint.Checkpoint for the engine's reads."""

    def __init__(self, folder: str | Path):
        from ..files.checkpoint import hf_config

        self.folder = Path(folder).expanduser()
        self.config_path = self.folder / "config.json"
        check_links(self.folder)  # as a checkpoint's: nothing is read through a link out of the folder
        meta = json.loads((self.folder / MARKER).read_text())
        self.seed = int(meta.get("seed", 0))
        self.dtype = getattr(torch, meta.get("dtype", "bfloat16"))
        self.raw_config = json.loads(self.config_path.read_text())
        self.config = hf_config(self.raw_config, self.config_path)
        self.dims = dims_from_config(self.config, self.config_path)
        self.expected = {**dense_shapes(self.dims), **expert_shapes(self.dims)}
        self.where = {name: _Where(self.folder / MARKER) for name in self.expected}
        self.gen_device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    mxfp4 = False
    is_gguf = False

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        shape = self.expected[name]
        if len(shape) == 1:  # norms: ones, as a fresh model has
            t = torch.ones(shape, dtype=self.dtype, device=self.gen_device)
        elif len(shape) == 3:  # a layer's fused experts (GPT-OSS): expert by expert, as read_rows makes them
            t = torch.cat([self._random(name, shape[1:], e) for e in range(shape[0])])
        else:
            t = self._random(name, shape)
        if out is not None:
            out.copy_(t)
            return out
        return t.cpu()

    def read_rows(self, name: str, first: int, count: int) -> torch.Tensor:
        shape = self.expected[name]
        if len(shape) == 3:
            return torch.cat([self._random(name, shape[1:], e).cpu() for e in range(first, first + count)])
        return self.read(name)[first:first + count]

    def _random(self, name: str, shape: tuple, part: int | None = None) -> torch.Tensor:
        key = name if part is None else f"{name}#{part}"
        g = torch.Generator(device=self.gen_device).manual_seed(self.seed * 1_000_003 + zlib.crc32(key.encode()))
        t = torch.randn(shape, generator=g, device=self.gen_device, dtype=torch.float32)
        t = t.mul_(0.5 / shape[-1] ** 0.5).to(self.dtype)  # the tiny model's scale: routing not all ties
        return t if part is None else t[None]

    def expert_nbytes(self) -> int:
        if self.dims.adapter.fused_experts:
            return sum(int(torch.tensor(s[1:]).prod()) for n, s in self.expected.items()
                       if ".layers.0." in n and ".experts." in n) * self.dtype.itemsize
        return sum(int(torch.tensor(s).prod()) for n, s in self.expected.items()
                   if ".experts.0." in n and ".layers.0." in n) * self.dtype.itemsize

    def dense_nbytes(self) -> int:
        return sum(int(torch.tensor(s).prod()) for s in dense_shapes(self.dims).values()) * self.dtype.itemsize

    # the tokenizer and end-of-sequence ids come from the folder, as for a real checkpoint
    load_tokenizer = Checkpoint.load_tokenizer
    eos_token_ids = Checkpoint.eos_token_ids

    def close(self) -> None:
        pass
