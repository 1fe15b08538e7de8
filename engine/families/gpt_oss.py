"""GPT-OSS (gpt-oss-20b, gpt-oss-120b). Departures from the other families, each data read by the
one forward (engine/model/forward.py), MoE block (engine/model/moe.py) and expert (engine/experts/expert.py):
- experts fused per layer (`mlp.experts.gate_up_proj` [E, D, 2I] with gate and up interleaved,
  `down_proj` [E, I, D]) with biases, shipped as MXFP4 blocks and scales: engine/files/fused_experts.py
  reads one expert at a time, exactly (MXFP4 values are exact in bf16);
- a router (`mlp.router`) with a bias: top-k of the logits first, then a softmax over the k chosen;
- a clamped SwiGLU: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7) (experts.Glu);
- q/k/v and output projections with biases, attention sinks (a learned logit per head in the
  softmax's denominator), and a sliding window (128 tokens) on the layers `layer_types` names.
For planning, an expert is 3 x D x I weights like the others: 16-bit means its bf16 form, 4-bit the
engine's own 4-bit tiers (MXFP4 is 4.25 bits a weight: the sizes are within 6%)."""
from .family import Family

GPT_OSS = Family(name="GPT-OSS", model_type="gpt_oss", config_class="GptOssConfig", moe="mlp",
                 weights={"w1": "gate_up_proj", "w2": "down_proj", "w3": "gate_up_proj"},
                 experts_field="num_local_experts", expert_ffn_field="intermediate_size", qkv_bias="attention_bias",
                 fused_experts=True, router="router", router_kind="topk_softmax", router_bias=True,
                 act="swiglu_oai", expert_bias=True, attn_sinks=True, o_bias="attention_bias", layer_types=True)
