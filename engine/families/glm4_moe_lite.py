"""GLM-4.7-Flash (`glm4_moe_lite`; llama.cpp reads it as `deepseek2`): GLM-4.5's feed-forward (sigmoid
routing with a correction bias, routed scaling, an ungated shared expert, a dense first layer: engine/
families/glm4_moe.py) under multi-head latent attention (engine/layers/mla.py: a q rank, a 512-wide kv
latent plus a 64-wide shared rope key per token in the cache, interleaved rope). Which layers are dense
is config.mlp_layer_types (transformers derives it; the dense ones come first)."""
from .family import Family

GLM4_MOE_LITE = Family(name="GLM-4.7-Flash", model_type="glm4_moe_lite", config_class="Glm4MoeLiteConfig", moe="mlp",
                       weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"},
                       experts_field="n_routed_experts", expert_ffn_field="moe_intermediate_size",
                       norm_topk_default=True, qkv_bias="attention_bias", shared_expert=True,
                       shared_name="shared_experts", shared_gated=False, router_kind="sigmoid_groups",
                       dense_first="mlp_layer_types", mixer="mla")
