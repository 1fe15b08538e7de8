"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): like Qwen3-MoE's experts, plus q/k/v biases and a
shared expert that every token runs, scaled by sigmoid(shared_expert_gate(x)). The shared expert is
always active, so it lives with the dense weights on the accelerator (placed before any routed
expert); the planner's routed experts are the `mlp.experts.E` ones."""
from .family import Family

QWEN2_MOE = Family(name="Qwen2-MoE", model_type="qwen2_moe", config_class="Qwen2MoeConfig", moe="mlp",
                   weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}, experts_field="num_experts",
                   expert_ffn_field="moe_intermediate_size", norm_topk_default=False, qkv_bias="qkv_bias",
                   shared_expert=True)
