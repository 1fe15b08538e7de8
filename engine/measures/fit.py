"""Will a model fit on this machine, and how fast will it run? Predicted before any download, from
the model's config.json (or a GGUF file's header) alone, by the planner, with this machine's
measured hardware profile and its memory now. What the model browser says of each candidate.

    predict(config, hw)        the planner's frontier under this machine's budgets -> Fit
    Fit.line()                 e.g. "fits: 16 GB of 24 GB VRAM + 41 GB RAM · about 12 tok/s at best quality"
    by_size(nbytes, budgets)   for a file known only by its size (a GGUF on the hub): a size line

Popularity is uniform and 4-bit sensitivity assumed (as `mixdesk plan --config-only`), so the
speeds are what the planner predicts before calibration; this machine's GPU tiers are its measured
ones (a CPU-only machine plans CPU-only). No Qt, no weights read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..protocol.errors import ModelError
from .hardware import HardwareProfile
from ..planning.kv_reservation import size_text  # noqa: F401 - the words for bytes, imported from here too
from ..planning.planner import Budgets, PlanInputs, frontier

GB = 10**9


def machine_budgets(hw: HardwareProfile, ram_available: int | None = None, vram_free: int | None = None) -> Budgets:
    """What the planner may use on this machine now: the available RAM and the GPU's memory, less
    the margins the engine leaves (engine/measures/inputs.py)."""
    from .inputs import RAM_MARGIN, VRAM_MARGIN

    ram = psutil.virtual_memory().available if ram_available is None else ram_available
    vram = 0 if hw.cpu_only else (hw.gpu_total if vram_free is None else vram_free)
    return Budgets(vram=int(vram * (1 - VRAM_MARGIN)), ram=int(ram * (1 - RAM_MARGIN)))


_gb = size_text


def _rate(tok_s: float) -> str:
    return f"{tok_s:.1f}" if tok_s < 9.95 else f"{tok_s:.0f}"


@dataclass(frozen=True)
class Fit:
    fits: bool
    cpu_only: bool  # planned for the CPU alone (no GPU here)
    vram: int  # what the best-quality plan that fits uses
    ram: int
    budgets: Budgets
    best_tok_s: float  # predicted decode tok/s at the best quality that fits
    fastest_tok_s: float
    four_bit: float  # share of experts at 4 bits at that best quality
    need: int  # the least memory any placement needs (dense part + every expert at its smallest)
    note: str  # what the prediction assumes (for a tooltip)
    mapped: int = 0  # of the best plan, bytes served from the mapped file (page cache, not counted in `ram`)
    paging_tok_s: float = 0.0  # > 0: the file does not fit in free memory beside the rest; the predicted
    #                            speed while it pages (reads from disk as it runs)

    def line(self) -> str:
        """One line in plain words."""
        b = self.budgets
        if not self.fits:
            has = f"{_gb(b.ram)} RAM" + ("" if self.cpu_only else f" + {_gb(b.vram)} VRAM")
            return f"does not fit: needs {_gb(self.need)}, this machine has {has}"
        if self.four_bit > 0.005:
            quality = f"at the best quality that fits ({self.four_bit:.0%} of experts compressed)"
        else:
            quality = "at best quality"
        speed = f"about {_rate(self.best_tok_s)} tok/s {quality}"
        if self.fastest_tok_s > self.best_tok_s * 1.05:
            speed += f", up to {_rate(self.fastest_tok_s)} tok/s at fastest"
        mapped = f" in memory + {_gb(self.mapped)} mapped from the file" if self.mapped else ""
        if self.cpu_only or self.vram == 0:
            where = f"CPU only: {_gb(self.ram)} of {_gb(b.ram)} RAM{mapped}"
        else:
            where = f"fits: {_gb(self.vram)} of {_gb(b.vram)} VRAM + {_gb(self.ram)} RAM{mapped}"
        if self.paging_tok_s:
            return (f"{where} · larger than free memory: it will read from disk as it runs, about "
                    f"{_rate(self.paging_tok_s)} tok/s (close programs for {_rate(self.best_tok_s)})")
        return f"{where} · {speed}"

    def details(self) -> str:
        """The technical terms, for a tooltip."""
        mapped = f" + {self.mapped / GB:.2f} GB mapped from the file" if self.mapped else ""
        return (f"planner's prediction for this machine: VRAM {self.vram / GB:.2f} GB, RAM {self.ram / GB:.2f} GB{mapped} "
                f"(budgets: VRAM {self.budgets.vram / GB:.2f} GB, RAM {self.budgets.ram / GB:.2f} GB); "
                f"decode {self.best_tok_s:.2f} tok/s at slider 1, {self.fastest_tok_s:.2f} at slider 0; "
                f"least memory any placement needs {self.need / GB:.2f} GB. {self.note}")


def fit_of(inp: PlanInputs, budgets: Budgets, note: str = "") -> Fit:
    """The planner's answer for these inputs under these budgets."""
    points = frontier(inp, budgets)
    best = points[0]  # best quality first (the slider at 1); the least-memory plan when nothing fits
    fastest = max(points, key=lambda p: p.tok_s)
    counts = best.counts()
    n = max(sum(counts.values()), 1)
    four = sum(c for t, c in counts.items() if t.endswith("-4")) / n
    smallest = min(inp.expert_bytes[t.value] - inp.mapped_bytes.get(t.value, 0) for t in inp.tiers)
    need = inp.dense_bytes - (inp.dense_mapped if inp.cpu_only else 0) + smallest * inp.layers * inp.experts
    mapped = mapped_total(inp, best)
    return Fit(best.fits, inp.cpu_only, best.vram, best.ram, budgets, best.tok_s, fastest.tok_s, four, need, note,
               mapped, paging_speed(inp, best, mapped, budgets))


# ASSUMED: what a consumer NVMe drive reads in the scattered 1-4 MB pieces experts are (not measured
# here); the paging prediction says so
DISK_READ = 1.5e9


def mapped_total(inp: PlanInputs, p) -> int:
    """Bytes of plan p served from the mapped model file."""
    counts = p.counts()
    return sum(n * inp.mapped_bytes.get(t, 0) for t, n in counts.items()) + (inp.dense_mapped if inp.cpu_only else 0)


def paging_speed(inp: PlanInputs, p, mapped: int, budgets: Budgets) -> float:
    """0 when the mapped file fits in the memory left beside the plan's own; else the predicted tok/s
    while it pages: the share of a token's expert reads that misses RAM comes from disk (DISK_READ)."""
    from .inputs import RAM_MARGIN

    room = budgets.ram / (1 - RAM_MARGIN) - p.ram  # available memory left for the file's pages
    if not mapped or mapped <= room:
        return 0.0
    miss = 1 - max(room, 0) / mapped
    per_token = sum(inp.top_k * inp.layers * inp.mapped_bytes.get(t, 0) * n / max(inp.layers * inp.experts, 1)
                    for t, n in p.counts().items())
    return 1 / (1 / max(p.tok_s, 1e-9) + miss * per_token / DISK_READ)


def _raw_config(config: dict | str | Path) -> tuple[dict, Path]:
    if isinstance(config, dict):
        return config, Path("config.json")
    path = Path(config)
    path = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(path, f"cannot be read: {e}") from None
    if not isinstance(raw, dict):
        raise ModelError(path, "is not a JSON object")
    return raw, path


def inputs_of(config: dict | str | Path, hw: HardwareProfile) -> tuple[PlanInputs, str]:
    """Planner inputs from a config (a dict, a config.json, or a folder holding one) for this
    machine: its measured CPU tiers, and its measured GPU tiers if it has a GPU."""
    from ..files.checkpoint import check_config, dims_from_config, hf_config
    from ..families import FAMILIES
    from .inputs import from_dims
    from .profile import ASSUMED_SENSITIVITY

    raw, path = _raw_config(config)
    if raw.get("model_type") not in FAMILIES:
        names = [f.name for f in FAMILIES.values()]
        raise ModelError(path, f"is a {raw.get('model_type')!r} model; Mixdesk runs {', '.join(names[:-1])} "
                               f"and {names[-1]} models")
    check_config(raw, path)
    d = dims_from_config(hf_config(raw, path), path)
    inp = from_dims(d, hw, 2, ASSUMED_SENSITIVITY)
    return inp, (f"From the config alone: uniform expert popularity and an ASSUMED 4-bit sensitivity "
                 f"({ASSUMED_SENSITIVITY} KL nats/token per layer); tier costs measured on this machine "
                 f"({'CPU only' if inp.cpu_only else 'with its GPU'}); {d.layers} layers x {d.experts} experts, "
                 f"top-{d.top_k}.")


def predict(config: dict | str | Path, hw: HardwareProfile, budgets: Budgets | None = None) -> Fit:
    """What the planner predicts for this model on this machine (budgets: machine_budgets(hw))."""
    inp, note = inputs_of(config, hw)
    return fit_of(inp, budgets or machine_budgets(hw), note)


def predict_gguf(path: str | Path, hw: HardwareProfile, budgets: Budgets | None = None) -> Fit:
    """The same for a GGUF file on disk, from its header (its tensors' real sizes; none read)."""
    from ..files.gguf import open_gguf
    from ..experts.gguf_tiers import requantised_share
    from ..experts.tier_bytes import tier_bytes
    from .inputs import from_dims, with_mapping

    ck = open_gguf(path)
    try:
        inp = from_dims(ck.dims, hw, 2, sizes=tier_bytes(ck, 2), cpu4_share=requantised_share(ck),
                        low_shares={f"cpu-{b}": requantised_share(ck, b) for b in (3, 2)})
        inp = with_mapping(inp, ck)
        label = ck.format_label()
    finally:
        ck.close()
    note = (f"From the GGUF header ({label}): uniform expert popularity, ASSUMED 4-bit sensitivity; "
            f"tier costs measured on this machine.")
    return fit_of(inp, budgets or machine_budgets(hw), note)


def by_size(nbytes: int, budgets: Budgets) -> str:
    """A file known only by its size (the planner needs its header): whether it fits in memory."""
    room = budgets.ram + budgets.vram
    where = f"{_gb(budgets.ram)} RAM" + (f" + {_gb(budgets.vram)} VRAM" if budgets.vram else "")
    if nbytes <= room:
        return f"fits in memory by its size: {_gb(nbytes)} of this machine's {where}"
    return f"does not fit: needs {_gb(nbytes)}, this machine has {where}"
