"""A model at a released model's widths and a few layers, random weights, written tensor by tensor
from the engine's own list of what the config implies (engine/files/checkpoint.py dense_shapes and
expert_shapes), so it fits any family the engine runs: for benchmarks at real widths.

    write(path, config_dict, seed=0)

Norm weights are the identity for the family (ones, or zeros where norms are zero-centred), matrices
N(0, 1/fan_in), DeltaNet's A_log and dt_bias in their released ranges; bf16, sharded by layer.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

# A Qwen3.5-35B-A3B-width text model (shared/configs/qwen3.5-35b-a3b-config.json's text_config) of 4
# layers, 3 Gated DeltaNet + 1 attention, with a small vocabulary so the lm_head does not swamp the layers.
QWEN35_WIDTH = {
    "model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"], "hidden_size": 2048,
    "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "vocab_size": 2048, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                              "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}


def write(path: Path, config: dict, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    from engine.files.checkpoint import dense_shapes, expert_shapes
    from engine.files.model_config import dims_from_config, hf_config

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    d = dims_from_config(hf_config(config, path / "config.json"), path / "config.json")
    g = torch.Generator().manual_seed(seed)

    def tensor(name: str, shape: tuple) -> torch.Tensor:
        if name.endswith("A_log"):
            return torch.empty(shape).uniform_(0.0, 2.7, generator=g).to(torch.bfloat16)  # A in (1, 16)
        if name.endswith("dt_bias"):
            return torch.empty(shape).uniform_(-4.0, 0.0, generator=g).to(torch.bfloat16)
        if len(shape) == 1:  # norms: the identity (zero-centred ones store w - 1)
            return (torch.zeros if d.norm_offset and "linear_attn.norm" not in name else torch.ones)(
                shape, dtype=torch.bfloat16)
        return (torch.randn(shape, generator=g) * shape[-1] ** -0.5).to(torch.bfloat16)

    shapes = {**dense_shapes(d), **expert_shapes(d)}
    by_shard: dict[int, dict] = {}
    for name, shape in shapes.items():
        layer = int(name.split(".")[2]) + 1 if name.startswith("model.layers.") else 0
        by_shard.setdefault(layer, {})[name] = tensor(name, shape)
    weight_map, n = {}, len(by_shard)
    for i, (_, ts) in enumerate(sorted(by_shard.items())):
        file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(ts, str(path / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in ts})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path
