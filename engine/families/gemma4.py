"""Gemma 4's Mixture-of-Experts models (Gemma 4 26B-A4B; `gemma4`, text-only `gemma4_text`): every layer
has a dense GELU-tanh MLP (`mlp.`) beside 128 routed experts (`experts.gate_up_proj` [E, 2I, D] and
`experts.down_proj` [E, D, I], read per expert: engine/files/fused_experts.py), and Gemma's sandwich of
norms (engine/layers/sandwich.py): the attention's output normed before it joins the stream; the
MLP's and the experts' outputs each normed, summed and normed again; each layer's output scaled by a
learned scalar. The router reads the stream itself (RMS-normalised without a weight, times a learned
scale and 1/sqrt(D)), softmax over the experts, top-k renormalised, times a per-expert scale; the
experts read it normed. Attention: 5 sliding layers to 1 global, each kind with its own head width,
kv heads and rope table (the global layers' keys are their values, with proportional rope on a
quarter of each head), q/k RMSNorms, values RMS-normalised, no 1/sqrt(d) logit scale. The embedding
is scaled by sqrt(D); the final logits soft-capped.

Released as a vision-language (and audio) model: the language model under `model.language_model.`,
its fields in config.text_config; the vision and audio towers are skipped and said once."""
from .family import Family

_COMMON = dict(moe="", router="router.proj", weights={"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"},
               experts_field="num_experts", expert_ffn_field="moe_intermediate_size", top_k_field="top_k_experts",
               qk_norm="head", dense_mlp="mlp", sandwich=True, act="gelu_tanh", router_kind="gemma",
               skipped=("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."))

GEMMA4 = Family(name="Gemma 4", model_type="gemma4", config_class="Gemma4Config", text_config=True,
                text_prefix="model.language_model.", **_COMMON)
GEMMA4_TEXT = Family(name="Gemma 4", model_type="gemma4_text", config_class="Gemma4TextConfig", **_COMMON)
