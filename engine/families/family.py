"""Family: what one Mixture-of-Experts family's checkpoint and config mean (engine/families)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    name: str                   # shown to people: "Mixtral", "Qwen3-MoE", ...
    model_type: str             # config.json's model_type
    config_class: str           # transformers' config class: it parses and normalises config.json
    moe: str                    # the MoE block's name inside a layer: "block_sparse_moe" or "mlp"
    weights: dict = field(default_factory=lambda: {"w1": "w1", "w2": "w2", "w3": "w3"})  # gate, down, up
    experts_field: str = "num_local_experts"
    expert_ffn_field: str = "intermediate_size"
    norm_topk_default: bool = True      # renormalise the top-k route weights to sum to 1
    qk_norm: str | None = None          # None, "head" (RMSNorm over each head) or "full" (over all heads)
    qkv_bias: str | None = None         # the config field that turns q/k/v biases on, if the family has them
    shared_expert: bool = False         # a shared SwiGLU expert, always active, scaled by sigmoid(gate(x))
    clip_qkv: bool = False              # q, k, v clamped to +-config.clip_qkv (after the q/k norms)
    runs: bool = True                   # False: planned from its config, its weights not run yet
    # GPT-OSS and what only it has so far:
    fused_experts: bool = False         # one tensor per layer and weight holds every expert (engine/files/fused_experts.py)
    router: str = "gate"                # the router's module name inside the MoE block
    router_kind: str = "softmax_topk"   # or "topk_softmax": top-k of the logits, softmax over those k
    router_bias: bool = False
    act: str = "silu"                   # SwiGLU's activation: "silu", or "swiglu_oai" (clamped, with alpha)
    expert_bias: bool = False           # experts' gate/up and down carry biases
    attn_sinks: bool = False            # a learned logit per head in attention's softmax denominator
    o_bias: str | None = None           # the config field that turns the output projection's bias on
    layer_types: bool = False           # config.layer_types says which layers use the sliding window
    # Qwen3.5-MoE and what it brings (engine/layers: a layer is a mixer and a feed-forward):
    mixers: dict | None = None          # config.layer_types' values -> the mixer part ("attention", "deltanet")
    text_config: bool = False           # the language model's fields sit in config.text_config (a VLM release)
    text_prefix: str | None = None      # its tensors' prefix in that layout ("model.language_model."), read as "model."
    skipped: tuple = ()                 # tensor prefixes of parts Mixdesk does not run (vision tower, MTP head)
    attn_gate: bool = False             # q_proj yields [q; gate] per head; attention's output * sigmoid(gate)
    norm_offset: bool = False           # RMSNorms scale by 1 + w (weights stored zero-centred)
    # GLM-4.5 and what it brings:
    dense_first: str | None = None      # the config field counting leading layers whose feed-forward is dense
    qk_norm_field: str | None = None    # the config field that turns the q/k norms on (else qk_norm stands)
    shared_name: str = "shared_expert"  # the shared expert's module ("shared_experts": GLM, ungated)
    shared_gated: bool = True           # its output scaled by sigmoid(shared_expert_gate(x)) (Qwen)
    # Gemma 4 and what it brings:
    dense_mlp: str = ""                 # a dense MLP's module beside the experts in every layer ("mlp")
    top_k_field: str = "num_experts_per_tok"
    sandwich: bool = False              # norms after the mixer and after the feed-forward too (Gemma)
    mixer: str = "attention"            # every layer's mixer where the config has no layer_types ("mla": GLM-4.7-Flash)
    deltanet_inputs: str = "split"      # DeltaNet's input projections: "split" (in_proj_qkv/z/b/a) or
                                        # "grouped" (in_proj_qkvz, in_proj_ba: rows grouped per key head)

    def block(self, layer: int) -> str:
        """The prefix of a layer's MoE block tensors ("model.layers.3.mlp."; Gemma 4 keeps them in the layer)."""
        return f"model.layers.{layer}." + (f"{self.moe}." if self.moe else "")

    def internal_name(self, name: str) -> str | None:
        """A file's tensor name as the engine names it (the VLM wrapper's prefix read as "model."), or
        None for the parts Mixdesk skips (the vision tower, a multi-token-prediction head)."""
        if any(name.startswith(p) for p in self.skipped):
            return None
        if self.text_prefix and name.startswith(self.text_prefix):
            return "model." + name[len(self.text_prefix):]
        return name

    def expert_key(self, layer: int, expert: int, w: str) -> str:
        """w is the engine's name: w1 gate, w2 down, w3 up (SwiGLU: w2 @ (silu(w1 x) * w3 x)).
        A fused family's key is the layer's tensor that holds this expert (gate and up together)."""
        if self.fused_experts:
            return f"{self.block(layer)}experts.{self.weights[w]}"
        return f"{self.block(layer)}experts.{expert}.{self.weights[w]}.weight"

    def router_key(self, layer: int, bias: bool = False) -> str:
        return f"{self.block(layer)}{self.router}." + ("bias" if bias else "weight")

    def shared_key(self, layer: int, w: str) -> str:
        """The shared expert's w1/w2/w3, or 'gate' (its sigmoid gate, [1, D])."""
        p = self.block(layer)
        return p + "shared_expert_gate.weight" if w == "gate" else p + f"{self.shared_name}.{self.weights[w]}.weight"

    def dense_ffn_key(self, layer: int, w: str) -> str:
        """A dense layer's MLP (GLM's first layers), or the dense MLP beside the experts (Gemma 4): its w1/w2/w3."""
        return f"model.layers.{layer}.{self.dense_mlp or self.moe}.{self.weights[w]}.weight"

    def correction_key(self, layer: int) -> str:
        """The router's correction bias (sigmoid routing: added to the scores that choose, not to the weights)."""
        return f"{self.block(layer)}{self.router}.e_score_correction_bias"
