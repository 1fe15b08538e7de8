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

    def expert_key(self, layer: int, expert: int, w: str) -> str:
        """w is the engine's name: w1 gate, w2 down, w3 up (SwiGLU: w2 @ (silu(w1 x) * w3 x))."""
        return f"model.layers.{layer}.{self.moe}.experts.{expert}.{self.weights[w]}.weight"

    def router_key(self, layer: int) -> str:
        return f"model.layers.{layer}.{self.moe}.gate.weight"

    def shared_key(self, layer: int, w: str) -> str:
        """The shared expert's w1/w2/w3, or 'gate' (its sigmoid gate, [1, D])."""
        p = f"model.layers.{layer}.{self.moe}."
        return p + "shared_expert_gate.weight" if w == "gate" else p + f"shared_expert.{self.weights[w]}.weight"
