"""A GGUF file's metadata as the Hugging Face config.json the same model ships with.

The engine sizes and runs a model from a transformers config (engine/files/checkpoint.py: check_config,
hf_config, dims_from_config), so a GGUF's metadata is turned into that dict and goes through the
same three checks: Dims come out as for the model's safetensors. The keys are those
convert_hf_to_gguf.py writes ({arch}.block_count, {arch}.attention.head_count, ...); where the
converter writes nothing, the value is what llama.cpp assumes for that architecture (noted below),
or the tensors' own shapes. Qwen3.5-MoE's hybrid layers (ssm.*, recurrent layers, partial rope) are
read by engine/files/gguf/qwen35.py; GLM-4.5's (glm4moe) and GLM-4.7-Flash's (deepseek2) dense leading layers,
routing and MLA by engine/files/gguf/glm.py and glm_lite.py; Gemma 4's (gemma4) by engine/files/gguf/gemma4.py.
"""
from __future__ import annotations

from ...protocol.errors import ModelError
from .names import ARCH_NAMES, ARCHS


def _supported() -> str:
    return ", ".join(f"{a} ({n})" for a, n in ARCH_NAMES.items())


def hf_config_dict(f) -> dict:
    """f: an open reader.GGUFFile. Returns the raw config dict (as config.json would hold it)."""
    arch = f.get("general.architecture")
    path = f.path
    if not isinstance(arch, str):
        raise ModelError(path, "has no general.architecture; it is not a model file (a vocabulary-only or "
                         "adapter GGUF?)")
    if arch not in ARCHS:
        raise ModelError(path, f"is a '{arch}' model; Mixdesk runs these GGUF Mixture-of-Experts "
                         f"architectures: {_supported()}")

    def key(name: str, kind=int, required: bool = True, default=None):
        full = f"{arch}.{name}"
        v = f.get(full)
        if v is None:
            if required and default is None:
                raise ModelError(path, f"lacks the metadata '{full}'")
            return default
        if isinstance(v, list):  # a per-layer array: Mixdesk runs models whose layers are all alike
            if not v or any(x != v[0] for x in v):
                raise ModelError(path, f"metadata '{full}' differs between layers ({v[:8]}...); Mixdesk runs "
                                 "models whose layers are all alike")
            v = v[0]
        if kind is int and (not isinstance(v, int) or isinstance(v, bool)):
            raise ModelError(path, f"metadata '{full}' is {v!r}; it must be a whole number")
        if kind is float and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ModelError(path, f"metadata '{full}' is {v!r}; it must be a number")
        return kind(v)

    if arch == "gemma4":  # per-layer heads, sliding pattern, proportional rope: engine/files/gguf/gemma4.py
        import engine.files.gguf.gemma4 as gemma4  # (as a module: no edge to the package)

        if "token_embd.weight" not in f.tensors:
            raise ModelError(path, "is missing tensor 'token_embd.weight'")
        return _special_tokens(f, gemma4.config_dict(f, key, f.tensors["token_embd.weight"]))
    experts = key("expert_count", default=0)
    if arch == "llama" and not experts:
        raise ModelError(path, "is a dense llama model (llama.expert_count is 0); Mixdesk runs Mixture-of-Experts "
                         f"models: {_supported()}")
    t = f.tensors
    embd = t.get("token_embd.weight")
    if embd is None:
        raise ModelError(path, "is missing tensor 'token_embd.weight'")
    hidden = key("embedding_length")
    heads = key("attention.head_count")
    head_dim = key("attention.key_length", required=False) or (hidden // heads if heads else 0)
    if arch != "deepseek2":  # MLA's widths: engine/files/gguf/glm_lite.py
        vdim = key("attention.value_length", required=False)
        if vdim not in (None, head_dim):
            raise ModelError(path, f"has keys of {head_dim} and values of {vdim} per head; Mixdesk runs models "
                             "whose keys and values are the same width")
    rope_dim = key("rope.dimension_count", required=False)
    if rope_dim not in (None, head_dim) and arch not in ("qwen35moe", "glm4moe", "deepseek2"):
        # partial rope: Qwen3.5 rotates a quarter (engine/files/gguf/qwen35.py), GLM-4.5 half (engine/files/gguf/glm.py)
        raise ModelError(path, f"applies rope to {rope_dim} of each head's {head_dim} dimensions; Mixdesk runs "
                         "models with rope over the whole head")
    model_type = ARCHS[arch]
    raw = {
        "model_type": model_type,
        "architectures": [{"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                           "qwen2_moe": "Qwen2MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
                           "gpt_oss": "GptOssForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                           "glm4_moe": "Glm4MoeForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM"}[model_type]],
        "num_hidden_layers": key("block_count"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", required=False) or heads,
        "head_dim": head_dim,
        # HF's vocab_size is the embedding's rows (the converter pads the token list to it)
        "vocab_size": embd.shape[0] if len(embd.ne) == 2 else -1,
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", float),
        "num_experts_per_tok": key("expert_used_count"),
        "tie_word_embeddings": "output.weight" not in t,
        "rope_parameters": {"rope_type": "default", "rope_theta": key("rope.freq_base", float, default=10000.0)},
    }
    if model_type in ("glm4_moe", "glm4_moe_lite"):  # leading dense layers, sigmoid routing (engine/files/gguf/glm*.py)
        import engine.files.gguf.glm as glm  # (as modules: no edge to the package)
        import engine.files.gguf.glm_lite as glm_lite

        (glm if arch == glm.ARCH else glm_lite).config_fields(f, key, raw)
        return _special_tokens(f, raw)
    window = key("attention.sliding_window", required=False)
    gate = t.get("blk.0.ffn_gate_exps.weight")
    expert_ffn = key("expert_feed_forward_length", required=False) or \
        (gate.ne[1] if gate is not None else None) or key("feed_forward_length", required=False)
    if expert_ffn is None:
        raise ModelError(path, f"lacks the metadata '{arch}.expert_feed_forward_length'")
    norm = f.get(f"{arch}.expert_weights_norm")
    if model_type == "mixtral":
        raw.update(num_local_experts=experts, intermediate_size=key("feed_forward_length", required=False)
                   or expert_ffn, sliding_window=window)
    elif model_type == "qwen3_moe":
        # llama.cpp renormalises Qwen3-MoE's top-k weights (every release sets norm_topk_prob)
        raw.update(num_experts=experts, moe_intermediate_size=expert_ffn, norm_topk_prob=bool(norm)
                   if norm is not None else True, attention_bias="blk.0.attn_q.bias" in t,
                   use_sliding_window=False, sliding_window=None, mlp_only_layers=[], decoder_sparse_step=1)
    elif model_type == "qwen2_moe":
        shared = key("expert_shared_feed_forward_length", required=False)
        if shared is None and "blk.0.ffn_up_shexp.weight" in t:
            shared = t["blk.0.ffn_up_shexp.weight"].ne[1]
        raw.update(num_experts=experts, moe_intermediate_size=expert_ffn, norm_topk_prob=bool(norm) if norm
                   is not None else False, shared_expert_intermediate_size=shared or 0,
                   qkv_bias="blk.0.attn_q.bias" in t, use_sliding_window=False, sliding_window=None,
                   mlp_only_layers=[], decoder_sparse_step=1)
    elif model_type == "qwen3_5_moe_text":  # softmax top-k, always renormalised (as transformers' router)
        from .qwen35 import config_fields

        raw.update(num_experts=experts, moe_intermediate_size=expert_ffn)
        config_fields(f, key, raw)
    elif model_type == "olmoe":
        clip = f.get(f"{arch}.attention.clamp_kqv")
        raw.update(num_experts=experts, intermediate_size=expert_ffn, norm_topk_prob=bool(norm) if norm
                   is not None else False, clip_qkv=float(clip) if clip else None)
    else:  # gpt_oss: what llama.cpp's openai-moe assumes (swa on every other layer from layer 0,
        # the clamped SwiGLU at 7.0), and the yarn rope the release uses
        layers = raw["num_hidden_layers"]
        rope = raw["rope_parameters"]
        if f.get(f"{arch}.rope.scaling.type") == "yarn":
            rope.update(rope_type="yarn", factor=key("rope.scaling.factor", float),
                        original_max_position_embeddings=key("rope.scaling.original_context_length"),
                        beta_fast=key("rope.scaling.yarn_beta_fast", float, default=32.0),
                        beta_slow=key("rope.scaling.yarn_beta_slow", float, default=1.0), truncate=False)
        raw.update(num_local_experts=experts, intermediate_size=expert_ffn, sliding_window=window or 128,
                   attention_bias=True, swiglu_limit=7.0,
                   layer_types=["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(layers)])
    return _special_tokens(f, raw)


def _special_tokens(f, raw: dict) -> dict:
    for name, tid in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        v = f.get(f"tokenizer.ggml.{tid}_token_id")
        if isinstance(v, int) and not isinstance(v, bool):
            raw[name] = v
    return raw
