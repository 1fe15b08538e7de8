"""GLM-4.7-Flash in GGUF: llama.cpp converts Glm4MoeLiteForCausalLM under the `deepseek2` architecture.
Both ways: a deepseek2 file's metadata as the Glm4MoeLiteConfig the engine sizes from (engine/families/
glm4_moe_lite.py), the Fix that joins the split kv_b_proj back (engine/files/gguf/layout.py), and the
converter's steps for engine/files/gguf/writer.py.

What llama.cpp's converter does (conversion/glm.py Glm4MoeLiteModel over conversion/deepseek.py
DeepseekV2Model; vendored in llama-cpp-python 0.3.36, ggml-org/llama.cpp@0c1e57098):
- kv_b_proj [H (N + V), R] is split per head into k_b = its N rows transposed, [H, R, N] (attn_k_b), and
  v_b = its V rows, [H, V, R] (attn_v_b), for the absorbed MLA it computes; no attn_kv_b is written (files
  of converters before that split hold attn_kv_b as released: read as it is). n_head_kv there is the
  config's num_key_value_heads (the tensors are made before the metadata sets it to 1);
- nothing else is transformed: q_a/q_a_layernorm/q_b/kv_a_proj_with_mqa/kv_a_layernorm/o_proj -> attn_q_a,
  attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, attn_output, rows as released: the rope part is
  not permuted, llama.cpp rotates deepseek2's rope dims as interleaved pairs (LLAMA_ROPE_TYPE_NORM), which
  is transformers' rope_interleave (a file is read with it set; a source without it is refused by the writer);
- the feed-forward as GLM-4.5's (engine/files/gguf/glm.py), post_attention_layernorm as ffn_norm; MTP layers
  (past num_hidden_layers) dropped when --no-mtp or num_nextn_predict_layers is 0, else extra blocks;
  lm_head dropped where tied;
- metadata: TextModel's with head_count_kv 1 and rms_norm_eps 1e-6 when absent, then leading_dense_block_count
  (first_k_dense_replace; 0 when absent: a config with only mlp_layer_types would be written wrong, so the
  writer refuses it), vocab_size, attention.q_lora_rank, kv_lora_rank, key_length = kv_lora_rank + rope,
  value_length = kv_lora_rank, key_length_mla = nope + rope, value_length_mla = v_head_dim,
  expert_feed_forward_length, expert_count, expert_shared_count, expert_weights_scale, expert_weights_norm
  (only when true), rope.dimension_count = qk_rope_head_dim, rope.scaling.yarn_log_multiplier (0.1 x
  mscale_all_dim), nextn_predict_layers (not under --no-mtp). No expert_gating_func unless the config has
  a scoring_func: llama.cpp then takes sigmoid only for 47 or 48 layers and a 154,880-token vocabulary
  (GLM-4.7-Flash), softmax otherwise (DeepSeek-V2).

Which deepseek2 files Mixdesk runs: those that fit GLM-4.7-Flash's Dims exactly: sigmoid routing with the
exp_probs_b correction bias, no rope scaling, no attention temperature. DeepSeek-V3-shaped files without
yarn would fit and run as this family; DeepSeek-V2/V2.5/V2-Lite (softmax routing), DeepSeek-V3, R1 and
Kimi K2 (yarn rope) and Mistral Large 3 (attention temperature) are refused by the key that shows it.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from ...protocol.errors import ModelError
from .glm import SIGMOID, SOFTMAX, moe_fields
from .layout import Fix

ARCH = "deepseek2"
GLM_LITE_LAYERS, GLM_LITE_VOCAB = (47, 48), 154880  # llama.cpp's test for a GLM-4.7-Flash file without gating


# --- reading: the metadata as Glm4MoeLiteConfig's fields -----------------------------------------------------

def config_fields(f, key, raw: dict) -> None:
    """Glm4MoeLiteConfig's fields from a deepseek2 file's metadata and tensors (added to config.py's raw).
    Inconsistent metadata, or a deepseek2 model that is not GLM-4.7-Flash-shaped, is one ModelError naming
    the key."""
    path, a, t = f.path, ARCH, f.tensors
    temp = key("attention.temperature_scale", float, required=False)
    if temp:
        raise ModelError(path, f"metadata '{a}.attention.temperature_scale' is {temp}: a deepseek2 model with "
                         "attention temperature tuning (Mistral Large 3); Mixdesk runs deepseek2 files shaped as "
                         "GLM-4.7-Flash")
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size", required=False) or (len(tokens) if tokens is not None else raw["vocab_size"])
    mtp = key("nextn_predict_layers", required=False) or 0
    glm_lite = raw["num_hidden_layers"] - mtp in GLM_LITE_LAYERS and vocab == GLM_LITE_VOCAB
    layers, lead = moe_fields(f, key, raw, SIGMOID if glm_lite else SOFTMAX,
                              " (as for DeepSeek-V2; llama.cpp assumes sigmoid only for GLM-4.7-Flash's 47 layers "
                              "and 154,880-token vocabulary)")
    R, P = key("attention.kv_lora_rank"), key("rope.dimension_count")
    if R < 1:
        raise ModelError(path, f"metadata '{a}.attention.kv_lora_rank' is {R}; it must be at least 1")
    if P < 2 or P % 2:
        raise ModelError(path, f"metadata '{a}.rope.dimension_count' is {P}; it must be an even number of at least "
                         "2 (rope rotates pairs)")
    k_mla = key("attention.key_length_mla", required=False)
    v_mla = key("attention.value_length_mla", required=False)
    if k_mla and v_mla:  # llama.cpp's is_mla(): the converter's split kv_b and MQA-shaped cache
        for name, want in (("attention.key_length", R + P), ("attention.value_length", R)):
            v = key(name, required=False)
            if v not in (None, want):
                raise ModelError(path, f"metadata '{a}.{name}' is {v}; an MLA file's is {want} (from "
                                 f"'{a}.attention.kv_lora_rank' {R} and '{a}.rope.dimension_count' {P})")
        k_name, v_name, N, V = "attention.key_length_mla", "attention.value_length_mla", k_mla - P, v_mla
    else:  # a file of the converters before the split: key_length and value_length are the heads'
        k_name, v_name = "attention.key_length", "attention.value_length"
        N, V = key(k_name) - P, key(v_name)
    if N < 1:
        raise ModelError(path, f"metadata '{a}.{k_name}' is {N + P}; it must exceed '{a}.rope.dimension_count' "
                         f"({P}): each head's key has dimensions without rope")
    if V < 1:
        raise ModelError(path, f"metadata '{a}.{v_name}' is {V}; it must be at least 1")
    heads, expert_ffn = raw["num_attention_heads"], key("expert_feed_forward_length")
    raw.pop("head_dim", None)  # Glm4MoeLiteConfig maps head_dim to qk_rope_head_dim
    raw.update(num_key_value_heads=heads, q_lora_rank=key("attention.q_lora_rank", required=False) or None,
               kv_lora_rank=R, qk_nope_head_dim=N, qk_rope_head_dim=P, v_head_dim=V, rope_interleave=True,
               mlp_layer_types=["dense"] * lead + ["sparse"] * (layers - lead), moe_intermediate_size=expert_ffn,
               intermediate_size=key("feed_forward_length", required=lead > 0) or expert_ffn,
               attention_bias="blk.0.attn_kv_a_mqa.bias" in t)


# --- reading: kv_b_proj joined back --------------------------------------------------------------------------

def _join_kv_b(parts: list) -> torch.Tensor:
    k_b, v_b = parts  # [H, R, N] (each head's key rows transposed), [H, V, R]
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])  # [H (N + V), R]


def fixes(d, tensors) -> dict[str, Fix]:
    """HF name -> Fix for a deepseek2 file of Dims d: each layer's kv_b_proj from attn_k_b and attn_v_b
    (a file holding attn_kv_b, as converters before the split wrote it, is read as it is)."""
    _, R, N, _, V = d.mla
    H, out = d.heads, {}
    for l in range(d.decoder_layers):
        b = f"blk.{l}."
        if b + "attn_kv_b.weight" not in tensors:
            out[f"model.layers.{l}.self_attn.kv_b_proj.weight"] = Fix(
                parts=((b + "attn_k_b.weight", (H, R, N)), (b + "attn_v_b.weight", (H, V, R))), join=_join_kv_b)
    return out


# --- writing: the converter's steps ----------------------------------------------------------------------------

def check_source(folder, hp: dict) -> None:
    """What the converter would get wrong, refused: the dense layers known only from mlp_layer_types (it
    reads first_k_dense_replace, 0 when absent), a rope that is not interleaved (llama.cpp rotates pairs)."""
    kinds = hp.get("mlp_layer_types")
    if isinstance(kinds, list):
        dense = next((i for i, k in enumerate(kinds) if k != "dense"), len(kinds))
        if dense != (hp.get("first_k_dense_replace") or 0):
            raise ModelError(folder, f"config.json's mlp_layer_types has {dense} leading dense layers but "
                             f"first_k_dense_replace is {hp.get('first_k_dense_replace')!r}; llama.cpp's converter "
                             "writes the latter, so the file would not be the model")
    if hp.get("rope_interleave", True) is False:
        raise ModelError(folder, "config.json's rope_interleave is false; llama.cpp rotates a deepseek2 file's rope "
                         "dimensions as interleaved pairs, so the file would not be the model")


def convert(name: str, shape: tuple, load, hp: dict):
    """DeepseekV2Model.modify_tensors' kv_b split for one tensor: [(HF-style name to map, shape, load)]."""
    if not name.endswith("kv_b_proj.weight"):
        return [(name, shape, load)]
    heads, v, n = hp["num_key_value_heads"], hp["v_head_dim"], hp["qk_nope_head_dim"]
    if shape[0] != heads * (v + n):
        raise ModelError(name, f"has {shape[0]} rows, not num_key_value_heads x (qk_nope_head_dim + v_head_dim) "
                         f"= {heads * (v + n)}")
    r = shape[-1]
    return [(name.replace("kv_b_proj", "k_b_proj"), (heads, r, n), functools.partial(_k_b, load, heads, n)),
            (name.replace("kv_b_proj", "v_b_proj"), (heads, v, r), functools.partial(_v_b, load, heads, n))]


def _k_b(load: Callable, heads: int, n: int) -> torch.Tensor:
    t = load()
    return t.view(heads, -1, t.shape[-1])[:, :n].transpose(1, 2)


def _v_b(load: Callable, heads: int, n: int) -> torch.Tensor:
    t = load()
    return t.view(heads, -1, t.shape[-1])[:, n:]


def metadata_hparams(hp: dict) -> dict:
    """DeepseekV2Model.set_gguf_parameters' changes before TextModel's keys: MQA (one kv head), rms eps 1e-6."""
    return {**hp, "num_key_value_heads": 1, "rms_norm_eps": hp.get("rms_norm_eps", 1e-6)}


def metadata(w, hp: dict) -> None:
    """DeepseekV2Model.set_gguf_parameters after TextModel's (Glm4MoeLiteModel's nextn key not under --no-mtp)."""
    lead = hp.get("first_k_dense_replace")
    if lead is None:
        lead = hp["num_hidden_layers"] if hp.get("n_routed_experts") is None else 0
    w.add_leading_dense_block_count(lead)
    rank = hp.get("kv_lora_rank", 512)
    w.add_vocab_size(hp["vocab_size"])
    if hp.get("q_lora_rank") is not None:
        w.add_q_lora_rank(hp["q_lora_rank"])
    w.add_kv_lora_rank(rank)
    w.add_key_length(rank + hp["qk_rope_head_dim"])
    w.add_value_length(rank)
    w.add_key_length_mla(hp["qk_nope_head_dim"] + hp["qk_rope_head_dim"])
    w.add_value_length_mla(hp["v_head_dim"])
    w.add_expert_feed_forward_length(next(hp[k] for k in ("moe_intermediate_size", "intermediate_size") if k in hp))
    if hp.get("n_routed_experts") is not None:
        w.add_expert_count(hp["n_routed_experts"])
    w.add_expert_shared_count(hp.get("n_shared_experts", 0))
    if hp.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(hp["routed_scaling_factor"])
    if hp.get("norm_topk_prob"):
        w.add_expert_weights_norm(hp["norm_topk_prob"])
    w.add_rope_dimension_count(hp["qk_rope_head_dim"])
    rope = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
