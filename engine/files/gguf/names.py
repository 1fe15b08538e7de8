"""GGUF's tensor names and architectures, and the Hugging Face names the engine reads them by.

llama.cpp's converter (convert_hf_to_gguf.py, gguf-py's tensor_mapping.py) renames every tensor
and fuses each layer's experts into one [E, rows, K] tensor per weight; tests/test_gguf_read.py
checks this table against gguf's own TensorNameMap. Two layouts older or newer than that one are
read too: one tensor per expert (blk.N.ffn_gate.E.weight, the first Mixtral GGUFs of December 2023)
and gate and up fused into one (blk.N.ffn_gate_up_exps.weight, gate rows first).

llama's converter permutes the rows of attn_q and attn_k for its rope kernel (LlamaModel.permute:
the two halves of each head interleaved); `unpermute_rows` undoes it as a row index, which is
lossless on quantised rows too (a row's blocks move whole). Qwen3.5-MoE's (`qwen35moe`) Gated
DeltaNet tensors are named here too; what its converter does to them is undone by
engine/files/gguf/qwen35.py (engine/files/gguf/layout.py: how each read undoes it). So are GLM's (`glm4moe`,
and GLM-4.7-Flash as `deepseek2`): the leading dense layers' ffn_gate/up/down, the router's correction
bias exp_probs_b, the ungated shared experts (shared_experts -> *_shexp) and MLA's attn_q_a ... attn_kv_b;
deepseek2's kv_b_proj, which the converter now writes split, is joined by engine/files/gguf/glm_lite.py.
Gemma 4's (`gemma4`) sandwich norms, router scales and layer scalar are GEMMA4_LAYER (engine/files/gguf/gemma4.py);
its fused experts are ffn_gate_up_exps (gate rows first) and ffn_down_exps.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# general.architecture -> the engine's model_type ("llama" only with experts: Mixtral)
ARCHS = {"llama": "mixtral", "qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "olmoe": "olmoe",
         "gpt-oss": "gpt_oss", "qwen35moe": "qwen3_5_moe_text", "glm4moe": "glm4_moe", "deepseek2": "glm4_moe_lite",
         "gemma4": "gemma4_text"}
ARCH_NAMES = {"llama": "Mixtral (llama with experts)", "qwen3moe": "Qwen3-MoE", "qwen2moe": "Qwen2-MoE",
              "olmoe": "OLMoE", "gpt-oss": "GPT-OSS", "qwen35moe": "Qwen3.5-MoE", "glm4moe": "GLM-4.5",
              "deepseek2": "GLM-4.7-Flash", "gemma4": "Gemma 4"}  # deepseek2 files of its shape: engine/files/gguf/glm_lite.py
PERMUTED_QK = ("llama",)  # the architectures whose converter permutes q and k rows

_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
         # multi-head latent attention (deepseek2: GLM-4.7-Flash); kv_b_proj as the oldest files hold it
         # (the converter now writes it split: engine/files/gguf/glm_lite.py)
         "q_a_proj": "attn_q_a", "q_a_layernorm": "attn_q_a_norm", "q_b_proj": "attn_q_b",
         "kv_a_proj_with_mqa": "attn_kv_a_mqa", "kv_a_layernorm": "attn_kv_a_norm", "kv_b_proj": "attn_kv_b"}
# Qwen3.5's Gated DeltaNet (linear_attn.*): in_proj_qkv and in_proj_z keep attention's words
_LINEAR = {"in_proj_qkv.weight": "attn_qkv.weight", "in_proj_z.weight": "attn_gate.weight",
           "in_proj_b.weight": "ssm_beta.weight", "in_proj_a.weight": "ssm_alpha.weight",
           "out_proj.weight": "ssm_out.weight", "conv1d.weight": "ssm_conv1d.weight", "A_log": "ssm_a",
           "dt_bias": "ssm_dt.bias", "norm.weight": "ssm_norm.weight"}
_SHARED = {"gate_proj": "ffn_gate_shexp", "up_proj": "ffn_up_shexp", "down_proj": "ffn_down_shexp"}
_DENSE = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}  # GLM's leading dense layers' MLP
# Gemma 4's layer tensors beyond attention's (engine/files/gguf/gemma4.py says what the converter does)
GEMMA4_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "layer_scalar": "layer_output_scale.weight", "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale", "router.per_expert_scale": "ffn_down_exps.scale",
}
# the engine's w1 (gate), w2 (down), w3 (up) -> GGUF's word for it
EXPERT_WORD = {"w1": "gate", "w2": "down", "w3": "up"}


def gguf_name(hf: str, arch: str) -> str | None:
    """The GGUF tensor holding a dense (non-expert) HF tensor; None if there is none."""
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    m = _LAYER.match(hf)
    if not m:
        return None
    b, rest = f"blk.{m[1]}.", m[2]
    if arch == "gemma4" and rest in GEMMA4_LAYER:  # its sandwich norms, router, scalar (engine/files/gguf/gemma4.py)
        return b + GEMMA4_LAYER[rest]
    if rest == "input_layernorm.weight":
        return b + "attn_norm.weight"
    if rest == "post_attention_layernorm.weight":  # GPT-OSS, Qwen3.5 and GLM-4.5 keep the HF word; others ffn_norm
        return b + ("post_attention_norm.weight" if arch in ("gpt-oss", "qwen35moe", "glm4moe") else "ffn_norm.weight")
    if rest.startswith("linear_attn.") and rest[12:] in _LINEAR:
        return b + _LINEAR[rest[12:]]
    if rest == "self_attn.sinks":
        return b + "attn_sinks.weight"
    if rest == "mlp.gate.e_score_correction_bias":  # sigmoid routing's correction bias (GLM)
        return b + "exp_probs_b.bias"
    parts = rest.split(".")
    if parts[0] == "self_attn" and len(parts) == 3 and parts[1] in _ATTN:
        return b + f"{_ATTN[parts[1]]}.{parts[2]}"
    if len(parts) == 3 and parts[1] in ("gate", "router"):  # mlp.gate / block_sparse_moe.gate / mlp.router
        return b + f"ffn_gate_inp.{parts[2]}"
    if rest == "mlp.shared_expert_gate.weight":
        return b + "ffn_gate_inp_shexp.weight"
    if len(parts) == 4 and parts[0] == "mlp" and parts[1] in ("shared_expert", "shared_experts") \
            and parts[2] in _SHARED:
        return b + f"{_SHARED[parts[2]]}.{parts[3]}"
    if len(parts) == 3 and parts[0] == "mlp" and parts[1] in _DENSE:
        return b + f"{_DENSE[parts[1]]}.{parts[2]}"
    return None


@dataclass(frozen=True)
class ExpertRef:
    """Where one expert's w1/w2/w3 lies: `tensor` holds it whole (expert None), or expert `expert`
    of a fused [E, rows, K] tensor, rows row0..row0+rows of that expert's matrix."""
    tensor: str
    expert: int | None
    row0: int
    rows: int


def expert_ref(tensors, layer: int, expert: int, w: str, ffn: int) -> ExpertRef | None:
    """Find expert (layer, expert)'s w in the file's tensors (a name -> info mapping); None if absent."""
    word, b = EXPERT_WORD[w], f"blk.{layer}."
    fused = b + f"ffn_{word}_exps.weight"
    if fused in tensors:
        return ExpertRef(fused, expert, 0, tensors[fused].ne[1])
    if w != "w2" and b + "ffn_gate_up_exps.weight" in tensors:
        return ExpertRef(b + "ffn_gate_up_exps.weight", expert, 0 if w == "w1" else ffn, ffn)
    single = b + f"ffn_{word}.{expert}.weight"
    if single in tensors:
        return ExpertRef(single, None, 0, tensors[single].ne[1])
    return None


def expert_tensor_name(layer: int, w: str) -> str:
    """The tensor the converter writes for a layer's w (the name a missing-tensor message gives)."""
    return f"blk.{layer}.ffn_{EXPERT_WORD[w]}_exps.weight"


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row index p with hf = gguf[p]: LlamaModel.permute reshaped each head's rows (2, half) and
    swapped the axes to (half, 2); this swaps them back."""
    hd = rows // heads
    idx = torch.arange(rows).reshape(heads, hd // 2, 2)  # gguf row of (head, i, j)
    return idx.transpose(1, 2).reshape(rows)               # hf row (head, j, i) reads gguf (head, i, j)
