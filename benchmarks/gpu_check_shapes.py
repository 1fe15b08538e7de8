"""The models the GPU check runs and the memory each runs under.

Every model is a synthetic checkpoint (engine/sources/synthetic.py): a folder holding config.json,
a tokenizer and a marker, whose weights are made on demand by name (on the GPU when there is one).
So Mixtral-8x7B's 93 GB at 16 bits are never written or downloaded: loading one costs what building
its experts costs (generate, copy to the host, quantise where the tier is 4-bit).

On the device the shapes are the published configs (resources/). The rehearsal (--small) keeps
each family's structure at toy widths: Mixtral's 8 wide experts top-2, Qwen3-30B-A3B's many small
experts top-8.

Memory: on the device a stage group emulates a card of 24 or 12 GB (gpu_check_memory.emulate_card)
and the planner gets that card's free memory less the monitor's margin, as the app would see it.
The rehearsal has RAM only; its cap is the device cap's share of the device model, laid between the
tiny model's all-4-bit and all-16-bit sizes, so that it binds about as hard.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GB = 10**9
CONFIGS = {"mixtral": ROOT / "resources" / "mixtral-8x7b-config.json",
           "qwen3": ROOT / "resources" / "qwen3-30b-a3b-config.json"}
LABELS = {"mixtral": "Mixtral-8x7B", "qwen3": "Qwen3-30B-A3B"}
# the rehearsal's widths: a few layers, small matrices, each family's expert count and top-k kept
SMALL = {
    "mixtral": {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
                "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096},
    "qwen3": {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
              "num_hidden_layers": 4, "num_experts": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2},
}
GGUF_LAYERS = 2  # the GGUF stage's Qwen3-30B-A3B shape, cut to 2 of its 48 layers (about 1 GB at Q4_K_M)


def config(model: str, small: bool, layers: int | None = None) -> dict:
    cfg = json.loads(CONFIGS[model].read_text())
    if small:
        cfg.update(SMALL[model])
    if layers is not None:
        cfg["num_hidden_layers"] = layers
        cfg.pop("max_window_layers", None)
    return cfg


def label(model: str, small: bool, layers: int | None = None) -> str:
    cfg = config(model, small, layers)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    what = f"{LABELS[model]}-shaped" if not small else f"{LABELS[model]}-like (rehearsal widths)"
    return (f"{what}: {cfg['num_hidden_layers']} layers x {experts} experts top-{cfg['num_experts_per_tok']}, "
            f"hidden {cfg['hidden_size']}, expert width {cfg.get('moe_intermediate_size') or cfg['intermediate_size']}")


def synthetic(work: Path, model: str, small: bool, layers: int | None = None) -> Path:
    """The model's synthetic folder under work/, written once per run (its profile, which the sweep
    saves, is then found by the stages after it)."""
    from engine.sources.synthetic import write_synthetic

    folder = work / f"{model}-{'small' if small else 'full'}-{layers or 'all'}"
    if not (folder / "config.json").exists():
        work.mkdir(parents=True, exist_ok=True)
        cfg_path = work / f"{folder.name}.config.json"
        cfg_path.write_text(json.dumps(config(model, small, layers)))
        write_synthetic(folder, cfg_path)
    return folder


@functools.cache  # transformers' config class parses it: 0.2 s a time
def dims(model: str, small: bool):
    from engine.files.checkpoint import dims_from_config, hf_config

    return dims_from_config(hf_config(config(model, small), CONFIGS[model]), CONFIGS[model])


def sizes(d) -> tuple[int, int, int]:
    """(dense bytes, all experts at 16 bits, all experts at cpu-4) of a model's shape, bf16."""
    from engine.measures.inputs import dense_bytes_of
    from engine.experts.tier_bytes import tier_bytes_of_dims

    n = d.layers * d.experts
    t = tier_bytes_of_dims(d, 2)
    return dense_bytes_of(d, torch.bfloat16), n * t["cpu-16"], n * t["cpu-4"]


def rehearsal_cap(model: str, card_gb: float, small: bool = True) -> int:
    """The RAM cap standing for a card of card_gb when there is no GPU (see the docstring)."""
    dense_d, e16_d, _ = sizes(dims(model, small=False))
    share = min(max((card_gb * GB - dense_d) / e16_d, 0.0), 1.0)
    dense, e16, e4 = sizes(dims(model, small))
    return int(dense + e4 + share * (e16 - e4))


def budgets(model: str, card_gb: float, small: bool) -> tuple[object, str]:
    """The planner's budgets for `model` on a card of card_gb, and how they were made."""
    from engine.measures.inputs import VRAM_MARGIN, default_budgets
    from engine.planning.planner import Budgets

    if torch.cuda.is_available():
        free = default_budgets(False, torch.device("cuda"))
        vram = min(free.vram, int(card_gb * GB * (1 - VRAM_MARGIN)))
        return Budgets(vram=vram, ram=free.ram), (f"a {card_gb:g} GB card: the planner's VRAM budget is its "
                                                  f"size less the monitor's {VRAM_MARGIN:.0%} margin")
    cap = rehearsal_cap(model, card_gb, small)
    return Budgets(vram=0, ram=cap), (f"rehearsal: RAM cap {cap / 2**20:.1f} MiB, the {card_gb:g} GB card's share "
                                      "of the device model laid between this model's all-4-bit and all-16-bit sizes")


def drop_budgets(model: str, small: bool, before_gb: float, after_gb: float) -> tuple[str, int, int]:
    """(pool, budget before, budget after) of the live budget drop: VRAM on the device (each card's
    size less the monitor's margin), RAM in the rehearsal (the caps above)."""
    from engine.measures.inputs import VRAM_MARGIN

    if torch.cuda.is_available():
        return "vram", int(before_gb * GB * (1 - VRAM_MARGIN)), int(after_gb * GB * (1 - VRAM_MARGIN))
    return "ram", rehearsal_cap(model, before_gb, small), rehearsal_cap(model, after_gb, small)
