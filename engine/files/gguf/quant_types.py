"""The types llama-quantize gives a file's tensors under its K-quant mixes (src/llama-quant.cpp:
tensor_allows_quantization, tensor_get_category, llama_tensor_get_type_impl for Q4_K_M / Q5_K_M, the
fallback of rows that are not whole blocks), for engine/files/gguf/writer.py's plan (Planned tensors: name,
torch-order shape, qtype, raw)."""
from __future__ import annotations

from gguf import GGMLQuantizationType as GT, LlamaFileType as FT
from gguf.constants import GGML_QUANT_SIZES

# llama-quantize's default type for its K mixes
BASE_TYPE = {FT.MOSTLY_Q4_K_M: GT.Q4_K, FT.MOSTLY_Q5_K_M: GT.Q5_K}
# llama-quant.cpp tensor_type_fallback: a row that is not whole blocks of the type takes a 32-block type
FALLBACK = {GT.Q2_K: GT.Q4_0, GT.Q3_K: GT.Q4_0, GT.Q4_K: GT.Q5_0, GT.Q5_K: GT.Q5_1, GT.Q6_K: GT.Q8_0}


def _quantizable(p) -> bool:
    """llama-quant.cpp tensor_allows_quantization, for the tensors these families have."""
    n = p.name
    return (_n_dims(p.shape) >= 2 and n.endswith("weight") and "_norm.weight" not in n
            and "ffn_gate_inp.weight" not in n and "ssm_conv1d.weight" not in n and not p.raw)


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: outer dimensions of 1 do not count (a [1, D] gate, such as ffn_gate_inp_shexp, is 1-D)."""
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return len(dims)


def _category(name: str) -> str:
    """llama-quant.cpp tensor_get_category (the first match wins, as there)."""
    if name in ("output.weight", "token_embd.weight"):
        return name.split(".")[0]
    for part in ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight", "attn_k.weight", "attn_q.weight",
                 "attn_output.weight", "ffn_up", "ffn_gate", "ffn_down"):
        if part in name:
            return part.removesuffix(".weight")
    return "other"


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def llama_quantize_types(plan: list, ftype: FT, n_expert: int, n_layer: int) -> None:
    """llama_tensor_get_type_impl for LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M (non-Falcon), then the fallback."""
    cats = [_category(p.name) for p in plan]
    n_attn_v = sum(c in ("attn_v", "attn_qkv", "attn_kv_b") for c in cats)
    tied = "output" not in cats
    i_attn_v = i_ffn_down = 0
    for p, cat in zip(plan, cats):
        if not _quantizable(p):
            continue
        t = BASE_TYPE[ftype]
        if cat == "output" or (tied and cat == "token_embd"):
            t = GT.Q8_0 if p.shape[-1] % GGML_QUANT_SIZES[t][0] else GT.Q6_K
        elif cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            if _use_more_bits(i_attn_v, n_attn_v):
                t = GT.Q6_K
            if n_expert == 8:  # "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
                t = GT.Q8_0
            i_attn_v += 1
        elif cat == "attn_k" and n_expert == 8:
            t = GT.Q8_0
        elif cat == "ffn_down":
            # MoE: the layer from the name (llama.cpp: Mixtral's experts are not stored in layer order)
            i_layer = int(p.name.split(".")[1]) if n_expert > 1 else i_ffn_down
            if _use_more_bits(i_layer, n_layer):
                t = GT.Q6_K
            i_ffn_down += 1
        elif cat == "attn_output" and n_expert == 8 and ftype == FT.MOSTLY_Q4_K_M:
            t = GT.Q5_K
        p.qtype = _fallback(t, p.shape[-1])


def _fallback(t: GT, ncols: int) -> GT:
    if ncols % GGML_QUANT_SIZES[t][0] == 0:
        return t
    t = FALLBACK.get(t, t)
    return GT.F16 if ncols % GGML_QUANT_SIZES[t][0] else t
