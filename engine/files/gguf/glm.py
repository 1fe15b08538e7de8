"""GLM-4.5 and GLM-4.5-Air in GGUF (llama.cpp's `glm4moe`), both ways: its metadata as the Glm4MoeConfig
the engine sizes from (engine/families/glm4_moe.py), and the converter's steps for engine/files/gguf/writer.py.
The routing metadata GLM-4.7-Flash's `deepseek2` files share is read here too (engine/files/gguf/glm_lite.py).

What llama.cpp's converter does (conversion/glm.py Glm4MoeModel over TextModel; vendored in llama-cpp-python
0.3.36, ggml-org/llama.cpp@0c1e57098):
- no tensor is transformed: q/k rows stay as released (GLM-4.5's rope is already NeoX-style, rotate-half on
  the first rope.dimension_count dims of a head; only the dense GLM-4 permutes, for M-RoPE), norms stay plain;
- e_score_correction_bias (ModelBase.filter_tensors: renamed e_score_correction.bias) -> blk.N.exp_probs_b.bias;
  mlp.shared_experts.* -> ffn_{gate,up,down}_shexp; the leading dense layers' mlp.{gate,up,down}_proj ->
  ffn_{gate,up,down}; experts fused per layer in down, gate, up order; post_attention_layernorm ->
  post_attention_norm; q/k norms attn_q_norm/attn_k_norm where use_qk_norm;
- the MTP layer (model.layers.{num_hidden_layers}.*: a whole decoder layer plus eh_proj, enorm, hnorm,
  shared_head.norm -> blk.N.nextn.*) is written as extra blocks (block_count grows, nextn_predict_layers
  says how many) unless --no-mtp (Mixdesk's writer: --no-mtp; its reader skips such blocks);
- metadata after TextModel's (which adds expert_group_count / expert_group_used_count from n_group /
  topk_group): rope.dimension_count = head_dim x partial_rotary_factor (0.5 when absent), expert_count,
  expert_feed_forward_length, expert_shared_count, leading_dense_block_count (first_k_dense_replace),
  expert_gating_func = 2 (sigmoid), expert_weights_scale (routed_scaling_factor), expert_weights_norm
  (norm_topk_prob), nextn_predict_layers (not under --no-mtp); the tokenizer as _set_vocab_glm (bos
  [gMASK], eot <|user|>, unk <|endoftext|>, eom <|observation|>).
llama.cpp's loader (src/models/glm4-moe.cpp) reads expert_shared_count (required),
leading_dense_block_count, expert_weights_scale (0 or absent: no scaling), expert_weights_norm (absent:
false), expert_gating_func (absent: sigmoid), and groups in build_moe_ffn (top-2 sums, as transformers).
"""
from __future__ import annotations

import math
import re

from ...protocol.errors import ModelError

ARCH = "glm4moe"
SIGMOID, SOFTMAX = 2, 1  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE (gguf.ExpertGatingFuncType)
GATING_NAMES = {0: "none", 1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrtsoftplus"}


# --- reading: the metadata as Glm4MoeConfig's fields (and the routing GLM-4.7-Flash shares) -------------------

def moe_fields(f, key, raw: dict, gating_default: int, why_default: str = "") -> tuple[int, int]:
    """The MoE and routing keys of a GLM file (glm4moe or deepseek2) into raw: n_routed_experts,
    moe_intermediate_size, n_shared_experts, n_group, topk_group, routed_scaling_factor, norm_topk_prob,
    num_hidden_layers (the MTP blocks left out). Returns (layers, leading dense layers). Inconsistent
    metadata is one ModelError naming the key."""
    a, path = f.get("general.architecture"), f.path
    experts, top_k = key("expert_count"), raw["num_experts_per_tok"]
    if experts < 1:
        raise ModelError(path, f"metadata '{a}.expert_count' is {experts}; a Mixture-of-Experts model has experts")
    blocks = raw["num_hidden_layers"]
    mtp = key("nextn_predict_layers", required=False) or 0
    if not 0 <= mtp < blocks:
        raise ModelError(path, f"metadata '{a}.nextn_predict_layers' is {mtp}; it must be below '{a}.block_count' "
                         f"({blocks})")
    layers = blocks - mtp  # the MTP blocks come last; Mixdesk does not run them
    lead = key("leading_dense_block_count", required=False) or 0
    if not 0 <= lead < layers:
        raise ModelError(path, f"metadata '{a}.leading_dense_block_count' is {lead}; it must be below the {layers} "
                         f"layers ('{a}.block_count' less '{a}.nextn_predict_layers'): a model without expert "
                         "layers is not an MoE")
    groups = key("expert_group_count", required=False) or 1  # llama.cpp: 0 or 1, no groups
    if experts % groups:
        raise ModelError(path, f"metadata '{a}.expert_group_count' is {groups}; it must divide the {experts} experts "
                         f"('{a}.expert_count')")
    chosen = key("expert_group_used_count", required=False) or 0
    if groups == 1:
        chosen = 1
    elif not 1 <= chosen <= groups or top_k > experts // groups * chosen:
        raise ModelError(path, f"metadata '{a}.expert_group_used_count' is {chosen}; it must be 1 to "
                         f"'{a}.expert_group_count' ({groups}) groups holding at least '{a}.expert_used_count' "
                         f"({top_k}) experts")
    gating = key("expert_gating_func", required=False)
    if (gating if gating is not None else gating_default) != SIGMOID:
        g = gating if gating is not None else gating_default
        said = f"is {g} ({GATING_NAMES.get(g, 'unknown')})" if gating is not None else \
            f"is absent, which llama.cpp reads as {GATING_NAMES[g]}{why_default}"
        raise ModelError(path, f"metadata '{a}.expert_gating_func' {said}; Mixdesk runs GLM's sigmoid routing "
                         f"(expert_gating_func {SIGMOID}) with its correction bias")
    scale = key("expert_weights_scale", float, required=False)
    if scale is not None and (not math.isfinite(scale) or scale < 0):
        raise ModelError(path, f"metadata '{a}.expert_weights_scale' is {scale!r}; it must be a number of at least 0")
    shared = key("expert_shared_count")
    if shared < 0:
        raise ModelError(path, f"metadata '{a}.expert_shared_count' is {shared}; it must be at least 0")
    norm = f.get(f"{a}.expert_weights_norm")
    rope_type = f.get(f"{a}.rope.scaling.type")
    if rope_type not in (None, "none"):
        raise ModelError(path, f"metadata '{a}.rope.scaling.type' is {rope_type!r}; Mixdesk runs GLM files "
                         "without rope scaling (as GLM-4.5 and GLM-4.7-Flash are released)")
    raw.update(num_hidden_layers=layers, n_routed_experts=experts, n_shared_experts=shared, n_group=groups,
               topk_group=chosen, routed_scaling_factor=scale or 1.0,  # llama.cpp: 0 (or absent) is no scaling
               norm_topk_prob=bool(norm) if norm is not None else False)
    return layers, lead


def config_fields(f, key, raw: dict) -> None:
    """Glm4MoeConfig's fields from a glm4moe file's metadata and tensors (added to config.py's raw)."""
    path, a, t = f.path, ARCH, f.tensors
    layers, lead = moe_fields(f, key, raw, SIGMOID)
    head_dim = raw["head_dim"]
    rot = key("rope.dimension_count", required=False) or head_dim  # llama.cpp: the whole head when absent
    if not 0 < rot <= head_dim or rot % 2:
        raise ModelError(path, f"metadata '{a}.rope.dimension_count' is {rot}; it must be an even number from 2 to "
                         f"the head's {head_dim} dimensions")
    raw["rope_parameters"]["partial_rotary_factor"] = rotary_factor(rot, head_dim)
    expert_ffn = key("expert_feed_forward_length")
    raw.update(moe_intermediate_size=expert_ffn, first_k_dense_replace=lead,
               intermediate_size=key("feed_forward_length", required=lead > 0) or expert_ffn,
               use_qk_norm="blk.0.attn_q_norm.weight" in t, attention_bias="blk.0.attn_q.bias" in t)


def rotary_factor(rot: int, head_dim: int) -> float:
    """partial_rotary_factor with int(head_dim * factor) == rot (as transformers sizes the rotary dims)."""
    partial = rot / head_dim
    return partial if int(head_dim * partial) == rot else (rot + 0.5) / head_dim


# --- writing: the converter's steps --------------------------------------------------------------------------

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def skipped(name: str, hp: dict, deepseek2: bool = False) -> bool:
    """What --no-mtp leaves out: the layers past num_hidden_layers (the MTP head); and for deepseek2,
    where the embeddings are tied, lm_head (DeepseekV2Model.modify_tensors)."""
    m = _LAYER.match(name)
    if m and int(m[1]) >= hp["num_hidden_layers"]:
        return True
    return deepseek2 and bool(hp.get("tie_word_embeddings")) and name in ("lm_head.weight", "model.lm_head.weight")


def renamed(name: str) -> str:
    """ModelBase.filter_tensors: the correction bias as a bias (it maps to exp_probs_b.bias)."""
    return name.replace("e_score_correction_bias", "e_score_correction.bias")


def group_metadata(w, hp: dict) -> None:
    """TextModel.set_gguf_parameters' group and gating keys (after expert_used_count), for every family."""
    if (n := hp.get("n_group")) is not None:
        w.add_expert_group_count(n)
    if (n := hp.get("topk_group")) is not None:
        w.add_expert_group_used_count(n)
    keys = ("score_function", "scoring_func", "score_func", "moe_router_activation", "moe_router_activation_func",
            "expert_selection_fn")
    func = next((hp[k] for k in keys if k in hp), None)
    if func is not None:  # the sdist's ExpertGatingFuncType (the installed gguf may lack SQRTSOFTPLUS)
        kinds = {"sigmoid": SIGMOID, "softmax": SOFTMAX, "sqrtsoftplus": 4}
        if func not in kinds:
            raise ValueError(f"Unsupported expert score gating function value: {func}")
        w.add_uint32(f"{w.arch}.expert_gating_func", kinds[func])


def partial_rotary_factor(hp: dict) -> float:
    """TextModel's rope_parameters mirror: the factor in rope_parameters, or the config's top level."""
    rope = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    if "partial_rotary_factor" in rope:
        return rope["partial_rotary_factor"]
    top = next((hp[k] for k in ("partial_rotary_factor", "rope_pct", "rope_percent") if k in hp), None)
    return 0.5 if top is None else top


def metadata(w, hp: dict) -> None:
    """Glm4MoeModel.set_gguf_parameters after TextModel's (--no-mtp: no nextn key)."""
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(int(head_dim * partial_rotary_factor(hp)))
    if (n := hp.get("n_routed_experts")) is not None:
        w.add_expert_count(n)
    if (n := hp.get("moe_intermediate_size")) is not None:
        w.add_expert_feed_forward_length(n)
    if (n := hp.get("n_shared_experts")) is not None:
        w.add_expert_shared_count(n)
    if (n := hp.get("first_k_dense_replace")) is not None:
        w.add_leading_dense_block_count(n)
    w.add_uint32(f"{w.arch}.expert_gating_func", SIGMOID)
    if (x := hp.get("routed_scaling_factor")) is not None:
        w.add_expert_weights_scale(x)
    if (x := hp.get("norm_topk_prob")) is not None:
        w.add_expert_weights_norm(x)
