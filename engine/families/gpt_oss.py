"""GPT-OSS (gpt-oss-20b, gpt-oss-120b): planned from its config (`mixdesk plan --config-only`), not
run yet. What running it needs, each a departure from the other families here:
- experts fused per layer (`mlp.experts.gate_up_proj` [E, D, 2I] with gate and up interleaved,
  `down_proj` [E, I, D]) with biases, shipped as MXFP4 blocks and scales;
- a router with a bias, top-k first and softmax over the k chosen;
- a clamped SwiGLU: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = clamp(gate, max=7);
- attention sinks (a learned logit per head in the softmax's denominator), and sliding-window
  attention (128 tokens) on every other layer.
For planning, an expert is 3 x D x I weights like the others: 16-bit means its bf16 form, 4-bit the
engine's own 4-bit tiers (MXFP4 is 4.25 bits a weight: the sizes are within 6%)."""
from .family import Family

GPT_OSS = Family(name="GPT-OSS", model_type="gpt_oss", config_class="GptOssConfig", moe="mlp",
                 weights={"w1": "gate_up_proj", "w2": "down_proj", "w3": "gate_up_proj"},
                 experts_field="num_local_experts", expert_ffn_field="intermediate_size", runs=False)
