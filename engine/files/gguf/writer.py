"""A GGUF file from a transformers model folder (save_pretrained's layout), written the way llama.cpp
writes one: its converter's architecture names, metadata keys, tensor names, shapes and order, the
q/k row permutation of `llama`, Qwen3.5-MoE's steps (engine/files/gguf/qwen35.py, as with --no-mtp), GLM-4.5's
(engine/files/gguf/glm.py), GLM-4.7-Flash's as deepseek2 (engine/files/gguf/glm_lite.py, --no-mtp too), Gemma 4's text
model (engine/files/gguf/gemma4.py: rope_freqs, per-layer heads, its vocabulary), the
tokenizer's metadata (convert_hf_to_gguf.py and its conversion/ package), and for the K-quant recipes
its quantizer's type per tensor (src/llama-quant.cpp: engine/files/gguf/quant_types.py).

Shapes are torch's order ([out, in]; experts [E, out, in]); GGUF lists them reversed (ne[0] = in).
Tensors are planned first (names, shapes, types) and then made and written one at a time from the
memory-mapped safetensors, so peak memory is one layer's experts, not the model.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import gguf
import numpy as np
import torch
from gguf import MODEL_ARCH, GGMLQuantizationType as GT, LlamaFileType as FT
from gguf.constants import GGML_QUANT_SIZES

from ...protocol.errors import ModelError
import engine.files.gguf.gemma4 as gemma4  # (as modules, not `from . import`: no edge to the package)
import engine.files.gguf.glm as glm
import engine.files.gguf.glm_lite as glm_lite
import engine.files.gguf.qwen35 as qwen35
from .quant_types import llama_quantize_types as _llama_quantize_types
from .tokenizer import write_vocab

RECIPES = {"f32": FT.ALL_F32, "f16": FT.MOSTLY_F16, "bf16": FT.MOSTLY_BF16, "q8_0": FT.MOSTLY_Q8_0,
           "q4_k_m": FT.MOSTLY_Q4_K_M, "q5_k_m": FT.MOSTLY_Q5_K_M}
# the converter's one type for every quantizable tensor; llama-quantize's default type for its K mixes
BASE_TYPE = {FT.ALL_F32: GT.F32, FT.MOSTLY_F16: GT.F16, FT.MOSTLY_BF16: GT.BF16, FT.MOSTLY_Q8_0: GT.Q8_0,
             FT.MOSTLY_Q4_K_M: GT.Q4_K, FT.MOSTLY_Q5_K_M: GT.Q5_K}
K_MIXES = (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M)

QWEN_EXPERT = r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+_proj)\.weight"


@dataclass(frozen=True)
class Family:
    arch: MODEL_ARCH
    expert: str | None = None      # one expert's weight in the folder: groups (layer, expert, projection)
    merge_order: tuple[str, ...] = ()  # the order the converter writes a layer's merged projections in
    merged: str = ""               # the merged tensor's name as the converter hands it to the tensor map
    permute: bool = False          # llama's q/k row order for its rope (LlamaModel.permute)


_QWEN = dict(expert=QWEN_EXPERT, merge_order=("down_proj", "gate_proj", "up_proj"),
             merged="model.layers.{bid}.mlp.experts.{w}.weight")
FAMILIES = {
    "MixtralForCausalLM": Family(MODEL_ARCH.LLAMA, r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight",
                                 ("w1", "w2", "w3"), "layers.{bid}.feed_forward.experts.{w}.weight", permute=True),
    "Qwen2MoeForCausalLM": Family(MODEL_ARCH.QWEN2MOE, **_QWEN),
    "Qwen3MoeForCausalLM": Family(MODEL_ARCH.QWEN3MOE, **_QWEN),
    "OlmoeForCausalLM": Family(MODEL_ARCH.OLMOE, **_QWEN),
    "GptOssForCausalLM": Family(MODEL_ARCH.GPT_OSS),
    # the VLM release and the text-only model: the same text model (engine/files/gguf/qwen35.py)
    "Qwen3_5MoeForConditionalGeneration": Family(MODEL_ARCH.QWEN35MOE, **_QWEN),
    "Qwen3_5MoeForCausalLM": Family(MODEL_ARCH.QWEN35MOE, **_QWEN),
    "Glm4MoeForCausalLM": Family(MODEL_ARCH.GLM4_MOE, **_QWEN),
    "Glm4MoeLiteForCausalLM": Family(MODEL_ARCH.DEEPSEEK2, **_QWEN),  # llama.cpp runs it as deepseek2
    "Gemma4ForConditionalGeneration": Family(MODEL_ARCH.GEMMA4),  # the text model (engine/files/gguf/gemma4.py)
    "Gemma4ForCausalLM": Family(MODEL_ARCH.GEMMA4),
}
GLM = (MODEL_ARCH.GLM4_MOE, MODEL_ARCH.DEEPSEEK2)

Load = Callable[[], torch.Tensor]
Override = Mapping[str, GT] | Callable[[str, tuple], "GT | None"] | None


@dataclass
class Planned:
    """One tensor of the file: its GGUF name, torch-order shape, type, and how to make its data."""
    name: str
    shape: tuple[int, ...]
    load: Load            # float values, or (raw) the file's bytes as they are
    qtype: GT = GT.F32
    raw: bool = False     # MXFP4 experts kept as released (no second rounding)


def write_gguf(model_folder: str | Path, out_path: str | Path, recipe: str = "f16", split: int = 1, *,
               types: Override = None, pre: str | None = None) -> list[Path]:
    """Write the model in `model_folder` as GGUF at `out_path` (or `split` parts named as gguf-split names
    them, name-0000i-of-0000N.gguf). `types` overrides the type of tensors by GGUF name (a mapping, or
    a function of (name, shape) returning a type or None). Returns the files written."""
    folder, out = Path(model_folder), Path(out_path)
    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r}: one of {', '.join(RECIPES)}")
    hp = json.loads((folder / "config.json").read_text())
    hp = {**hp, **hp.get("text_config", {})}
    hf_arch = (hp.get("architectures") or [None])[0]
    if hf_arch not in FAMILIES:
        raise ModelError(folder, f"architecture {hf_arch!r} cannot be written as GGUF here")
    fam, ftype = FAMILIES[hf_arch], RECIPES[recipe]
    if fam.arch == MODEL_ARCH.DEEPSEEK2:
        glm_lite.check_source(folder, hp)
    if fam.arch == MODEL_ARCH.GEMMA4:
        gemma4.check_source(folder, hp)
    mxfp4 = (hp.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    n_layer = hp["num_hidden_layers"]
    plan = list(_plan(folder, hp, fam, gguf.get_tensor_name_map(fam.arch, n_layer)))
    for p in plan:
        if not p.raw:
            p.qtype = _converter_type(p, ftype)
    if ftype in K_MIXES:
        _llama_quantize_types(plan, ftype, _n_experts(hp) or 1, n_layer)
    for p in plan:
        t = types.get(p.name) if isinstance(types, Mapping) else types(p.name, p.shape) if types else None
        if t is not None:
            p.qtype = GT(t)
    if not 1 <= split <= len(plan):
        raise ValueError(f"split: 1 to {len(plan)} parts, not {split}")

    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[fam.arch])
    per_part = [len(plan) // split + (i < len(plan) % split) for i in range(split)]
    for p in plan:  # the writer starts a new part when the current one holds split_max_tensors
        w.split_max_tensors = per_part[len(w.tensors) - 1] if split > 1 else 0
        w.add_tensor_info(p.name, _byte_shape(p), np.dtype(np.uint8), int(np.prod(_byte_shape(p))), raw_dtype=p.qtype)
    if mxfp4 and ftype in (FT.ALL_F32, FT.MOSTLY_F16, FT.MOSTLY_BF16):
        ftype = FT.MOSTLY_MXFP4_MOE  # the converter's prepare_metadata
    _metadata(w, folder, hp, fam, ftype)
    if fam.arch != MODEL_ARCH.GEMMA4 or not gemma4.write_vocab(w, folder):
        write_vocab(w, folder, hp, fam.arch == MODEL_ARCH.LLAMA, pre, glm=fam.arch in GLM)

    paths = w.format_shard_names(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file(path=out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for p in plan:
        w.write_tensor_data(_encode(p))
    w.close()
    return paths


# --- which tensors, named and shaped as the converter does -------------------------------------------

def _sources(folder: Path) -> list[tuple[str, tuple, Load]]:
    """(name, shape, load) of every tensor, in the converter's order: parts sorted, header order within."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        parts = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        parts = sorted(p.name for p in folder.iterdir() if p.name.startswith("model") and p.suffix == ".safetensors")
    if not parts:
        raise ModelError(folder, "has no model*.safetensors")
    out = []
    for part in parts:
        with open(folder / part, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        handle = safe_open(str(folder / part), "pt")  # memory-mapped; each load reads one tensor
        for name, meta in header.items():
            if name != "__metadata__":
                out.append((name, tuple(meta["shape"]), functools.partial(handle.get_tensor, name)))
    return out


def _plan(folder: Path, hp: dict, fam: Family, tmap: gguf.TensorNameMap):
    def mapped(name: str) -> str:
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ModelError(folder, f"tensor {name} has no GGUF name for {gguf.MODEL_ARCH_NAMES[fam.arch]}")
        return new

    n_head, n_kv = hp["num_attention_heads"], hp.get("num_key_value_heads")
    sources = _sources(folder)
    if fam.arch == MODEL_ARCH.GEMMA4:  # named, cut and extended as Gemma4Model does (engine/files/gguf/gemma4.py)
        yield from (Planned(*x) for x in gemma4.sources(folder, sources, hp))
        return
    if fam.arch == MODEL_ARCH.QWEN35MOE:  # filter_tensors, then the family's modify_tensors (engine/files/gguf/qwen35.py)
        sources = [qwen35.convert(n.replace("language_model.", ""), s, f, hp) for n, s, f in sources
                   if not qwen35.skipped(n)]
        sources = [x for n, s, f in sources for x in _split_fused(n, s, f)]
    if fam.arch in GLM:  # filter_tensors (--no-mtp), then DeepseekV2Model's kv_b split (engine/files/gguf/glm*.py)
        sources = [(glm.renamed(n), s, f) for n, s, f in sources
                   if not glm.skipped(n, hp, fam.arch == MODEL_ARCH.DEEPSEEK2)]
        if fam.arch == MODEL_ARCH.DEEPSEEK2:
            sources = [x for n, s, f in sources for x in glm_lite.convert(n, s, f, hp)]
    if fam.arch == MODEL_ARCH.GPT_OSS:  # generate_extra_tensors: the MXFP4 experts come first
        yield from _mxfp4_experts(sources, mapped)
    experts: dict[int, dict[str, tuple]] = {}
    for name, shape, load in sources:
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        if fam.permute and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            heads = n_kv if name.endswith(("k_proj.weight", "k_proj.bias")) and n_kv else n_head
            load = functools.partial(lambda f, h: permute(f(), h), load, heads)
        m = re.fullmatch(fam.expert, name) if fam.expert else None
        if m:  # a layer's experts are merged into one [E, out, in] tensor per projection once all are seen
            bid = int(m.group(1))
            experts.setdefault(bid, {})[name] = (shape, load)
            n_e = _n_experts(hp)
            if len(experts[bid]) == n_e * 3:
                for wname in fam.merge_order:
                    parts = [experts[bid].pop(name.replace(f".{m.group(2)}.{m.group(3)}.", f".{x}.{wname}."))
                             for x in range(n_e)]
                    yield Planned(mapped(fam.merged.format(bid=bid, w=wname)), (n_e, *parts[0][0]),
                                  functools.partial(lambda ls: torch.stack([f() for f in ls]), [f for _, f in parts]))
            continue
        if fam.arch == MODEL_ARCH.GPT_OSS:
            yield from _gpt_oss(name, shape, load, mapped)
            continue
        yield Planned(mapped(name), shape, load)
    left = [n for d in experts.values() for n in d]
    if left:
        raise ModelError(folder, f"incomplete experts: {left[:3]}")


def _n_experts(hp: dict) -> int:
    return int(hp.get("num_local_experts") or hp.get("num_experts") or hp.get("n_routed_experts") or 0)


def _split_fused(name: str, shape: tuple, load: Load):
    """Qwen2MoeModel.modify_tensors on transformers 5's fused experts: gate_up_proj [E, 2I, D] split in
    gate then up halves, down_proj [E, D, I] as it is, each then merged like per-expert tensors."""
    if name.endswith(("mlp.experts.down_proj", "mlp.experts.down_proj.weight")):
        yield name.removesuffix(".weight") + ".weight", shape, load
    elif name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj.weight")):
        base, n = name.removesuffix(".weight").removesuffix(".gate_up_proj"), shape[-2] // 2
        yield f"{base}.gate_proj.weight", (*shape[:-2], n, shape[-1]), lambda: load()[..., :n, :]
        yield f"{base}.up_proj.weight", (*shape[:-2], n, shape[-1]), lambda: load()[..., n:, :]
    else:
        yield name, shape, load


def _gpt_oss(name: str, shape: tuple, load: Load, mapped):
    """GptOssModel.filter_tensors/modify_tensors: sinks get '.weight'; gate_up is interleaved (gate at even
    rows); float experts are stored [E, in, out] and transposed."""
    if "sinks" in name:
        name += ".weight"
    if "_blocks" in name or "_scales" in name:
        return  # written by _mxfp4_experts
    if "down_proj" in name:
        if name.endswith("_bias"):
            yield Planned(mapped(name.replace("down_proj_bias", "down_proj.bias")), shape, load)
        else:
            yield Planned(mapped(name.replace("down_proj", "down_proj.weight")), (shape[0], shape[2], shape[1]),
                          lambda: load().transpose(-1, -2))
        return
    if "gate_up_proj" in name:
        bias = name.endswith("_bias")
        for half, which in ((0, "gate_proj"), (1, "up_proj")):
            if bias:
                yield Planned(mapped(name.replace("gate_up_proj_bias", f"{which}.bias")), (*shape[:-1], shape[-1] // 2),
                              functools.partial(lambda h: load()[..., h::2], half))
            else:
                yield Planned(mapped(name.replace("gate_up_proj", f"{which}.weight")), (shape[0], shape[2] // 2, shape[1]),
                              functools.partial(lambda h: load().transpose(-1, -2)[:, h::2, :], half))
        return
    yield Planned(mapped(name), shape, load)


def _mxfp4_experts(sources, mapped):
    """GptOssModel.generate_extra_tensors/repack_mxfp4: blocks [E, R, K/32, 16] and scales [E, R, K/32]
    -> ggml's block_mxfp4 rows (scale byte, then 16 bytes of nibbles in ggml's order)."""
    loads = {name: (shape, load) for name, shape, load in sources}
    for name, (shape, load) in loads.items():
        if name.endswith("down_proj_scales"):
            blocks = loads[name.replace("_scales", "_blocks")][1]
            pairs = [(name.replace("_scales", ".weight"), blocks, load, slice(None))]
        elif name.endswith("gate_up_proj_scales"):
            blocks = loads[name.replace("_scales", "_blocks")][1]
            pairs = [(name.replace("gate_up_proj_scales", f"{w}.weight"), blocks, load, slice(h, None, 2))
                     for h, w in ((0, "gate_proj"), (1, "up_proj"))]
        else:
            continue
        for new, b, s, rows in pairs:
            E, R, nb = shape
            r = len(range(R)[rows])
            yield Planned(mapped(new), (E, r, nb * 32), functools.partial(_repack_mxfp4, b, s, rows), GT.MXFP4, raw=True)


def _repack_mxfp4(blocks: Load, scales: Load, rows: slice) -> torch.Tensor:
    t = blocks()[:, rows]
    t = (t & 0x0F) << 4 | (t & 0xF0) >> 4  # the converter's transform_nibble_layout, step for step
    a, b = t.chunk(2, dim=-1)
    a = torch.stack(((a & 0xF0).view(-1, 1), (a << 4).view(-1, 1)), dim=2).view(t.shape)
    b = torch.stack(((b >> 4).view(-1, 1), (b & 0x0F).view(-1, 1)), dim=2).view(t.shape)
    t = a | b
    t = (t & 0xF0) >> 4 | (t & 0x0F) << 4
    out = torch.cat((scales()[:, rows].unsqueeze(-1), t), dim=-1)
    return out.reshape(out.shape[0], out.shape[1], -1)


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """LlamaModel.permute: each head's rows from HF's rotate-half order to llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of permute: a file's q/k rows back in HF's order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- types ---------------------------------------------------------------------------------------------

def _converter_type(p: Planned, ftype: FT) -> GT:
    """ModelBase.prepare_tensors: norms, 1-D tensors, biases and routers stay F32, the rest take the
    recipe's type (F16 under a K mix, llama-quantize's usual input); Q8_0 of a row not whole blocks -> F16."""
    n = p.name
    if len(p.shape) <= 1 or n.endswith("_norm.weight") or not n.endswith(".weight") \
            or re.fullmatch(r"blk\.\d+\.(ffn_gate_inp(_shexp)?|ssm_conv1d)\.weight", n):
        return GT.F32
    t = GT.F16 if ftype in K_MIXES else BASE_TYPE[ftype]
    return GT.F16 if p.shape[-1] % GGML_QUANT_SIZES[t][0] else t


def _byte_shape(p: Planned) -> tuple[int, ...]:
    return tuple(gguf.quant_shape_to_byte_shape(p.shape, p.qtype))


@functools.cache
def _native_quantizes(qtype: GT) -> bool:
    """Whether engine/files/gguf/blockquant's C quantiser for qtype works here (checked with one small call)."""
    try:
        from .blockquant import quantize_raw

        quantize_raw(torch.linspace(-1, 1, GGML_QUANT_SIZES[qtype][0] * 8).reshape(1, -1), qtype)
        return True
    except Exception:
        return False


def _encode(p: Planned) -> np.ndarray:
    """The tensor's bytes in its type, shaped as the file's rows ([..., row_bytes] uint8)."""
    data = p.load()
    if p.raw:
        return data.contiguous().numpy().view(np.uint8)
    x = data.float().contiguous()
    if p.qtype == GT.F32:
        return x.numpy().view(np.uint8)
    if p.qtype == GT.F16:
        return x.numpy().astype(np.float16).view(np.uint8)
    if p.qtype in (GT.Q4_K, GT.Q5_K, GT.Q6_K, GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q3_K, GT.Q2_K) and _native_quantizes(p.qtype):
        from .blockquant import quantize_raw

        rows = quantize_raw(x.reshape(-1, x.shape[-1]), p.qtype).numpy()
        return rows.reshape(*x.shape[:-1], rows.shape[-1])
    return gguf.quants.quantize(x.numpy(), p.qtype)  # raises NotImplementedError for K types


# --- metadata, as TextModel.set_gguf_parameters and the family classes write it -------------------------

def _first(hp: dict, *keys):
    return next((hp[k] for k in keys if k in hp), None)


def _metadata(w: gguf.GGUFWriter, folder: Path, hp: dict, fam: Family, ftype: FT) -> None:
    arch_hp = hp
    if fam.arch == MODEL_ARCH.DEEPSEEK2:
        hp = glm_lite.metadata_hparams(hp)
    total, shared, expert, count = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, folder, None, total)
    meta.name = meta.name or folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, count)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)

    w.add_block_count(hp["num_hidden_layers"])
    for key, add in ((("max_position_embeddings", "n_ctx", "n_positions"), w.add_context_length),
                     (("hidden_size", "n_embd", "dim"), w.add_embedding_length),
                     (("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                       "hidden_dim"), w.add_feed_forward_length),
                     (("num_attention_heads", "n_head", "n_heads"), w.add_head_count),
                     (("num_key_value_heads", "n_kv_heads"), w.add_head_count_kv)):
        if (v := _first(hp, *key)) is not None:
            add(v)
    rope = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    rope = dict(rope.get("full_attention", rope))  # (Gemma 4's per kind: the global layers')
    if "rope_theta" not in rope and (theta := _first(hp, "rope_theta", "rotary_emb_base")) is not None:
        rope["rope_theta"] = theta
    rope_type, factor = rope.get("rope_type", rope.get("type")), rope.get("factor")
    if rope_type == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif rope_type == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast), ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(rope[key])
    if "mrope_section" in rope:  # padded to [time, height, width, extra]
        w.add_rope_dimension_sections((list(rope["mrope_section"]) + [0, 0, 0, 0])[:4])
    if rope.get("rope_theta") is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    if fam.arch == MODEL_ARCH.GEMMA4:
        gemma4.swa_theta(w, hp)
    if (eps := _first(hp, "rms_norm_eps", "norm_eps")) is not None:  # OlmoeModel then sets 1e-5 over it
        w.add_layer_norm_rms_eps(1e-5 if fam.arch == MODEL_ARCH.OLMOE else eps)
    if (eps := _first(hp, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        w.add_layer_norm_eps(eps)
    if (n := _first(hp, "num_local_experts", "num_experts", "n_routed_experts")) is not None:
        w.add_expert_count(n)
    if (n := _first(hp, "num_experts_per_tok", "num_experts_per_token", "top_k_experts")) is not None:
        w.add_expert_used_count(n)
    glm.group_metadata(w, hp)  # n_group, topk_group, a scoring function (TextModel's, for every family)
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)

    if fam.arch == MODEL_ARCH.LLAMA:
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])
    elif fam.arch in (MODEL_ARCH.QWEN2MOE, MODEL_ARCH.QWEN3MOE, MODEL_ARCH.QWEN35MOE):
        if hp.get("moe_intermediate_size") is not None:
            w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
        if hp.get("shared_expert_intermediate_size") is not None:
            w.add_expert_shared_feed_forward_length(hp["shared_expert_intermediate_size"])
        if fam.arch == MODEL_ARCH.QWEN35MOE:
            qwen35.metadata(w, hp)
    elif fam.arch == MODEL_ARCH.GPT_OSS:
        w.add_sliding_window(hp["sliding_window"])
        w.add_expert_feed_forward_length(hp["intermediate_size"])
    elif fam.arch == MODEL_ARCH.GLM4_MOE:
        glm.metadata(w, hp)
    elif fam.arch == MODEL_ARCH.DEEPSEEK2:
        glm_lite.metadata(w, arch_hp)
    elif fam.arch == MODEL_ARCH.GEMMA4:
        gemma4.metadata(w, hp)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
