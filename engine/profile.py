"""The model profile: what the planner needs to know about one model, measured once and cached in
the user's cache folder (never in the model folder).

- popularity[l][e]: how many (token, slot) pairs the router sent to expert e of layer l on the
  calibration text;
- sensitivity[tier][l][e]: relative output error ||f4(X) - f16(X)|| / ||f16(X)|| of the expert's
  4-bit form against its 16-bit form, on the calibration activations X routed to it;
- bytes per tier of one expert.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from .experts import Expert16, quantise, read_expert
from .model import MixtralModel
from .placement import Tier

CORPUS = Path(__file__).resolve().parents[1] / "resources" / "corpus"
FORMAT = 1
MIN_TOKENS = 8  # an expert that saw fewer calibration tokens is measured on all of its layer's tokens

Progress = Callable[[int, int, str], None]


class Cancelled(Exception):
    pass


@dataclass
class ModelProfile:
    key: str
    layers: int
    experts: int
    calibration_tokens: int
    popularity: list[list[int]]
    sensitivity: dict[str, list[list[float]]]
    expert_bytes: dict[str, int]
    dtype: str
    format: int = FORMAT

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "ModelProfile | None":
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                return None
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def model_key(folder: Path) -> str:
    """Identifies a checkpoint by its path, config and weight files' sizes and times."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for f in sorted(folder.iterdir()):
        if f.suffix in (".json", ".safetensors"):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def profile_path(folder: Path) -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("mixdesk", appauthor=False) / "profiles" / f"{model_key(folder)}.json"


def calibration_text() -> str:
    return (CORPUS / "calibration.txt").read_text(encoding="utf-8")


def capture(model: MixtralModel, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the model over ids and return, per layer, the MoE inputs x [T, D] and routes [T, K]."""
    records: list[tuple[torch.Tensor, torch.Tensor]] = []
    for block in model.moe:
        block.record = records
    try:
        model.forward(torch.tensor(ids), model.new_cache(len(ids)), 0)
    finally:
        for block in model.moe:
            block.record = None
    return records


def calibrate(model: MixtralModel, ids: list[int], tiers: tuple[Tier, ...] = (Tier.CPU4, Tier.GPU4),
              progress: Progress | None = None, cancel: threading.Event | None = None) -> ModelProfile:
    d, ckpt = model.dims, model.ckpt
    records = capture(model, ids)
    popularity = [torch.bincount(idx.reshape(-1).cpu(), minlength=d.experts).tolist() for _, idx in records]
    sens = {t.value: [[0.0] * d.experts for _ in range(d.layers)] for t in tiers}
    sizes: dict[str, int] = {}
    cpu = torch.device("cpu")
    total, done = d.layers * d.experts, 0
    for l, (x, idx) in enumerate(records):
        x = x.to(cpu)
        for e in range(d.experts):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            rows = (idx == e).any(-1).cpu()
            xe = x[rows] if int(rows.sum()) >= MIN_TOKENS else x
            w13, w2 = read_expert(ckpt, l, e)
            ref16 = Expert16(Tier.CPU16, w13.to(model.dtype), w2.to(model.dtype))
            y16 = ref16(xe).float()
            sizes[Tier.CPU16.value] = sizes[Tier.GPU16.value] = ref16.nbytes
            for t in tiers:
                q = quantise(t, w13, w2, model.accel if t.on_accelerator else cpu, model.dtype)
                y4 = q(xe.to(q.device)).float().to(cpu)
                sens[t.value][l][e] = float((y4 - y16).norm() / y16.norm().clamp(min=1e-12))
                sizes[t.value] = q.nbytes
            done += 1
            if progress:
                progress(done, total, f"layer {l} expert {e}")
    return ModelProfile(key=model_key(ckpt.folder), layers=d.layers, experts=d.experts,
                        calibration_tokens=len(ids), popularity=popularity, sensitivity=sens,
                        expert_bytes=sizes, dtype=str(model.dtype).replace("torch.", ""))


def uniform_profile(model: MixtralModel, sensitivity: float = 0.1) -> ModelProfile:
    """A stand-in when calibration is cancelled: every expert equally popular and sensitive."""
    d = model.dims
    n = d.expert_params()  # 4-bit sizes: cpu-4 5 bits a weight, gpu-4 4.5 (see quant.py)
    b16 = n * torch.empty((), dtype=model.dtype).element_size()
    return ModelProfile(key=model_key(model.ckpt.folder), layers=d.layers, experts=d.experts, calibration_tokens=0,
                        popularity=[[1] * d.experts for _ in range(d.layers)],
                        sensitivity={t: [[sensitivity] * d.experts for _ in range(d.layers)] for t in ("cpu-4", "gpu-4")},
                        expert_bytes={"cpu-16": b16, "gpu-16": b16, "cpu-4": n * 5 // 8, "gpu-4": n * 9 // 16},
                        dtype=str(model.dtype).replace("torch.", ""))


def load_or_calibrate(model: MixtralModel, tokenizer, progress: Progress | None = None,
                      cancel: threading.Event | None = None, max_tokens: int = 1024) -> ModelProfile:
    path = profile_path(model.ckpt.folder)
    prof = ModelProfile.load(path)
    if prof is not None and (prof.layers, prof.experts) == (model.dims.layers, model.dims.experts):
        return prof
    ids = tokenizer.encode(calibration_text(), add_special_tokens=False)[:max_tokens]
    prof = calibrate(model, ids, progress=progress, cancel=cancel)
    prof.save(path)
    return prof
