"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): `mlp.experts.E.gate_proj|up_proj|
down_proj` with their own width (moe_intermediate_size), 128 experts and top-8; the router
renormalises the top-k weights when norm_topk_prob is set; an RMSNorm on each head of q and k before
rope. Layers listed in mlp_only_layers (or skipped by decoder_sparse_step) are dense MLPs, which
the engine refuses for now: every released Qwen3-MoE has MoE in every layer."""
from .family import Family

QWEN3_MOE = Family(name="Qwen3-MoE", model_type="qwen3_moe", config_class="Qwen3MoeConfig", moe="mlp",
                   weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}, experts_field="num_experts",
                   expert_ffn_field="moe_intermediate_size", norm_topk_default=False, qk_norm="head")
