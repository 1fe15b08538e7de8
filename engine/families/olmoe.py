"""OLMoE (OLMoE-1B-7B): `mlp.experts.E.gate_proj|up_proj|down_proj`, 64 experts, top-8, route weights
not renormalised (norm_topk_prob false); an RMSNorm over the whole q and the whole k projection
(not per head), then optional clipping of q, k and v (clip_qkv)."""
from .family import Family

OLMOE = Family(name="OLMoE", model_type="olmoe", config_class="OlmoeConfig", moe="mlp",
               weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}, experts_field="num_experts",
               expert_ffn_field="intermediate_size", norm_topk_default=False, qk_norm="full", clip_qkv=True)
