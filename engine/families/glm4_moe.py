"""GLM-4.5 and GLM-4.5-Air (`glm4_moe`; llama.cpp's `glm4moe`): Mixtral-like experts (`mlp.experts.E.
gate_proj|up_proj|down_proj`) chosen by a sigmoid router: scores = sigmoid(gate(x)), the top-k chosen by
scores + a learned correction bias (`mlp.gate.e_score_correction_bias`) within the best `topk_group` of
`n_group` expert groups, weighted by their scores (renormalised when norm_topk_prob is set) times
`routed_scaling_factor`; a shared expert (`mlp.shared_experts`, moe_intermediate_size x n_shared_experts
wide) that every token runs, ungated. The first `first_k_dense_replace` layers have a dense MLP
(`mlp.gate_proj|up_proj|down_proj`, intermediate_size wide) instead of experts: the placement's rows
are the layers with experts. q/k/v biases, q/k norms only where use_qk_norm is set, rope on half of
each head (partial_rotary_factor 0.5). The release's multi-token-prediction layer (the layer past
num_hidden_layers) is skipped and said once."""
from .family import Family

GLM4_MOE = Family(name="GLM-4.5", model_type="glm4_moe", config_class="Glm4MoeConfig", moe="mlp",
                  weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}, experts_field="n_routed_experts",
                  expert_ffn_field="moe_intermediate_size", norm_topk_default=True, qk_norm="head",
                  qk_norm_field="use_qk_norm", qkv_bias="attention_bias", shared_expert=True,
                  shared_name="shared_experts", shared_gated=False, router_kind="sigmoid_groups",
                  dense_first="first_k_dense_replace")
