"""Qwen3.5-MoE and Qwen3.6-MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B; llama.cpp's `qwen35moe`): a hybrid
of two mixers (engine/layers): three of every four layers are Gated DeltaNet linear attention
(engine/layers/deltanet.py: a causal depthwise conv over q/k/v, L2-normalised q/k, a gated delta-rule
state per head, a gated RMSNorm), the fourth gated full attention (q_proj yields a per-head output
gate; q/k RMSNorm per head; rope on a quarter of each head). Every layer's feed-forward is 256 routed
experts (softmax, top-8, renormalised) plus a shared expert behind a sigmoid gate, as Qwen2-MoE's.
RMSNorms are zero-centred (x scaled by 1 + w).

Released as a vision-language model: the language model's fields in config.text_config, its tensors
under `model.language_model.`; the vision tower (`model.visual.`) and the multi-token-prediction head
(`mtp.`) are skipped and said once: Mixdesk chats in text. A text-only checkpoint (`qwen3_5_moe_text`,
transformers' Qwen3_5MoeForCausalLM) has the same layers under `model.`."""
from .family import Family

_COMMON = dict(moe="mlp", weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}, experts_field="num_experts",
               expert_ffn_field="moe_intermediate_size", norm_topk_default=True, qk_norm="head", shared_expert=True,
               mixers={"full_attention": "attention", "linear_attention": "deltanet"}, attn_gate=True,
               norm_offset=True, skipped=("model.visual.", "model.language_model.mtp.", "mtp."))

QWEN3_5_MOE = Family(name="Qwen3.5-MoE", model_type="qwen3_5_moe", config_class="Qwen3_5MoeConfig",
                     text_config=True, text_prefix="model.language_model.", **_COMMON)
QWEN3_5_MOE_TEXT = Family(name="Qwen3.5-MoE", model_type="qwen3_5_moe_text", config_class="Qwen3_5MoeTextConfig",
                          **_COMMON)
