"""One small adapter per Mixture-of-Experts family: where its checkpoint keeps each tensor, which
config fields size it, how its router weighs the chosen experts, and what its attention adds
(q/k norms, q/k/v biases, value clipping) or its MoE block adds (a gated shared expert).

Everything else (placement, tiers, planner, migration, the window) is family-independent and reads
only `Dims` and these adapters. transformers stays the reference for config, tokenizer, chat
template and correctness (tests/test_families.py compares logits with its own classes)."""
from __future__ import annotations

from .family import Family
from .gemma4 import GEMMA4, GEMMA4_TEXT
from .glm4_moe import GLM4_MOE
from .glm4_moe_lite import GLM4_MOE_LITE
from .gpt_oss import GPT_OSS
from .mixtral import MIXTRAL
from .olmoe import OLMOE
from .qwen2_moe import QWEN2_MOE
from .qwen3_5_moe import QWEN3_5_MOE, QWEN3_5_MOE_TEXT
from .qwen3_moe import QWEN3_MOE
from .qwen3_next import QWEN3_NEXT

FAMILIES: dict[str, Family] = {f.model_type: f for f in (MIXTRAL, QWEN3_MOE, OLMOE, QWEN2_MOE, GPT_OSS,
                                                                   QWEN3_5_MOE, QWEN3_5_MOE_TEXT, QWEN3_NEXT, GLM4_MOE,
                                                                   GLM4_MOE_LITE, GEMMA4, GEMMA4_TEXT)}
SUPPORTED_MODEL_TYPES = tuple(t for t, f in FAMILIES.items() if f.runs)  # the ones whose weights run


def family_of(model_type) -> Family | None:
    return FAMILIES.get(model_type)
