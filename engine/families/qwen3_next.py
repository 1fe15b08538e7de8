"""Qwen3-Next (Qwen3-Next-80B-A3B; llama.cpp's `qwen3next`): Qwen3.5-MoE's layers (engine/families/
qwen3_5_moe.py: three Gated DeltaNet layers to one gated attention layer, zero-centred norms, routed
experts plus a gated shared expert), text-only, 512 experts top-10, route weights renormalised when
norm_topk_prob is set. What differs is how its DeltaNet input projections are stored: two matrices,
`in_proj_qkvz` and `in_proj_ba`, whose rows are grouped per key head (each group: its q, its k, then
the v and z of the value heads it serves; b and a alike). engine/layers/deltanet.py reads them as the
Qwen3.5 order by a row permutation at load."""
from .family import Family

QWEN3_NEXT = Family(name="Qwen3-Next", model_type="qwen3_next", config_class="Qwen3NextConfig", moe="mlp",
                    weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}, experts_field="num_experts",
                    expert_ffn_field="moe_intermediate_size", norm_topk_default=True, qk_norm="head",
                    shared_expert=True, mixers={"full_attention": "attention", "linear_attention": "deltanet"},
                    attn_gate=True, norm_offset=True, skipped=("mtp.",), deltanet_inputs="grouped")
