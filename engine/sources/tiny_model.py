"""A tiny random Mixtral with a real byte-level tokenizer and a chat template, written with
transformers' own save_pretrained (so it has the real checkpoint key layout).

Used by the tests, the benchmarks and `mixdesk --self-test`. Its replies are noise: it exists to
exercise the engine exactly, not to chat.
"""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "The capital of France is Paris. Mixture of experts models route each token to two experts.",
    "Café, naïve, über, 東京, Привет, 🙂 — multi-byte characters must stream correctly.",
    "hello world, this is a tiny model for tests. 0123456789 !?.,;:",
]


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def write_tiny_mixtral(folder: str | Path, *, layers: int = 2, hidden: int = 64, ffn: int = 128,
                       experts: int = 4, top_k: int = 2, heads: int = 4, kv_heads: int = 2,
                       vocab: int = 320, dtype: str = "float32", seed: int = 0,
                       shard_size: str | None = None, tokenizer: bool = True, **extra) -> Path:
    """Write the model to `folder` (created). `shard_size` (e.g. '200KB') writes shards plus an index."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = MixtralConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_local_experts=experts,
        num_experts_per_tok=top_k, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        **extra,
    )
    torch.manual_seed(seed)
    model = MixtralForCausalLM(cfg).to(getattr(torch, dtype))
    # default init is tiny (std 0.02): widen it so routing and logits are not all ties
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5)
    kw = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(str(folder), **kw)
    if tokenizer:
        write_tokenizer(folder, vocab)
    return folder


# transformers' own classes for each family's tiny model, and the config fields that differ from Mixtral's
TINY_FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  lambda ffn, experts, layers: dict(moe_intermediate_size=ffn, num_experts=experts, head_dim=24,
                                            norm_topk_prob=True)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", lambda ffn, experts, layers: dict(intermediate_size=ffn, num_experts=experts,
                                                                           clip_qkv=4.0)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  lambda ffn, experts, layers: dict(moe_intermediate_size=ffn, num_experts=experts,
                                            shared_expert_intermediate_size=96, qkv_bias=True)),
    # a 4-token window on every other layer, so a 16-token prompt exercises it; yarn rope as released
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                lambda ffn, experts, layers: dict(intermediate_size=ffn, num_local_experts=experts, head_dim=16,
                                          sliding_window=4, attention_bias=True,
                                          rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                                           "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                           "original_max_position_embeddings": 64})),
    # Gated DeltaNet layers with a gated full-attention layer every fourth (the last one, in fewer layers)
    "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration",
                    lambda ffn, experts, layers: dict(
                        moe_intermediate_size=ffn, num_experts=experts, shared_expert_intermediate_size=48,
                        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                        linear_value_head_dim=24, linear_conv_kernel_dim=4,
                        layer_types=["full_attention" if (i + 1) % 4 == 0 or i == layers - 1 else "linear_attention"
                                     for i in range(layers)])),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   lambda ffn, experts, layers: dict(
                       moe_intermediate_size=ffn, num_experts=experts, shared_expert_intermediate_size=48,
                       head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=24, linear_conv_kernel_dim=4, norm_topk_prob=True,
                       layer_types=["full_attention" if (i + 1) % 4 == 0 or i == layers - 1 else "linear_attention"
                                    for i in range(layers)])),
    # two expert groups with one chosen, a dense first layer, q/k norms on, rope on half of each head
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 lambda ffn, experts, layers: dict(
                     moe_intermediate_size=ffn, n_routed_experts=experts, intermediate_size=96, head_dim=32,
                     n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=1.5,
                     norm_topk_prob=True, use_qk_norm=True, attention_bias=True)),
    # MLA with a q rank, interleaved rope, a dense first layer, two expert groups
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
                      lambda ffn, experts, layers: dict(
                          moe_intermediate_size=ffn, n_routed_experts=experts, intermediate_size=96, n_shared_experts=1,
                          n_group=2, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True, q_lora_rank=24,
                          kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=20,
                          mlp_layer_types=["dense"] + ["sparse"] * (layers - 1))),
    # sliding and global layers of their own widths (the global keys are their values), a 4-token window,
    # a dense GeGLU MLP beside the experts, soft-capped logits; released as a VLM (a tiny vision tower)
    "gemma4": ("Gemma4Config", "Gemma4ForConditionalGeneration",
               lambda ffn, experts, layers: dict(
                   intermediate_size=96, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                   attention_k_eq_v=True, sliding_window=4, enable_moe_block=True, num_experts=experts, top_k_experts=2,
                   moe_intermediate_size=ffn, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                   final_logit_softcapping=30.0,
                   layer_types=["full_attention" if i % 2 else "sliding_attention" for i in range(layers)])),
}


def write_tiny_model(folder: str | Path, family: str = "mixtral", *, layers: int = 2, hidden: int = 64, ffn: int = 128,
                     experts: int = 4, top_k: int = 2, heads: int = 4, kv_heads: int = 2, vocab: int = 320,
                     seed: int = 0, shard_size: str | None = None, tokenizer: bool = True, mxfp4: bool = False,
                     **extra) -> Path:
    """A tiny random model of one family (engine/families), written by transformers' own classes.
    mxfp4 (GPT-OSS): its experts then stored as the release stores them (to_mxfp4)."""
    if family == "mixtral":
        return write_tiny_mixtral(folder, layers=layers, hidden=hidden, ffn=ffn, experts=experts, top_k=top_k,
                                  heads=heads, kv_heads=kv_heads, vocab=vocab, seed=seed, shard_size=shard_size,
                                  tokenizer=tokenizer, **extra)
    import torch
    import transformers

    config_name, model_name, fields = TINY_FAMILIES[family]
    if family == "glm4_moe_lite":  # MLA: transformers expands keys and values to every head
        kv_heads = heads
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, num_experts_per_tok=top_k, max_position_embeddings=512, bos_token_id=1,
                eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **{**fields(ffn, experts, layers), **extra})
    if family == "qwen3_5_moe":  # released as a VLM: the language model in text_config, a (tiny) vision tower
        cfg = getattr(transformers, config_name)(text_config=text, tie_word_embeddings=False, vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden))
    elif family == "gemma4":  # a VLM too: a tiny vision tower, no audio; tied embeddings, as released
        text.pop("tie_word_embeddings")
        cfg = getattr(transformers, config_name)(text_config=text, audio_config=None, vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16))
    else:
        cfg = getattr(transformers, config_name)(**text)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).float()
    with torch.no_grad():  # widen the default init (std 0.02) so routing and logits are not all ties
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5)
            elif p.dim() == 1 and not torch.all(p == 1):  # biases (norm weights stay at 1)
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():  # GLM's router correction bias (zeros at init)
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    kw = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(str(folder), **kw)
    if mxfp4:
        to_mxfp4(folder)
    if tokenizer:
        write_tokenizer(folder, vocab)
    return folder


def to_mxfp4(folder: Path) -> None:
    """Rewrite a GPT-OSS folder's expert weights as MXFP4 blocks and scales, the layout and config
    entry gpt-oss is released with (engine/files/fused_experts.py), in place."""
    import json

    from safetensors.torch import load_file, save_file

    from ..files.fused_experts import float_to_mxfp4

    files = sorted(folder.glob("*.safetensors"))
    renamed = {}
    for f in files:
        tensors = load_file(str(f))
        for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            w = tensors.pop(name).transpose(1, 2)  # [E, out, in]
            E, R, K = w.shape
            blocks, scales = float_to_mxfp4(w.reshape(E * R, K))
            tensors[name + "_blocks"] = blocks.reshape(E, R, K // 32, 16)
            tensors[name + "_scales"] = scales.reshape(E, R, K // 32)
            renamed[name] = f.name
        save_file(tensors, str(f), metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        for name, file in renamed.items():
            del data["weight_map"][name]
            data["weight_map"][name + "_blocks"] = data["weight_map"][name + "_scales"] = file
        index.write_text(json.dumps(data, indent=2))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
