"""Qwen3.5-MoE in GGUF (llama.cpp's `qwen35moe`), both ways: its metadata as the HF config the engine
sizes from, the Fixes that undo what the converter did to its tensors (engine/files/gguf/layout.py), and
the converter's own steps for engine/files/gguf/writer.py.

What llama.cpp's converter does (conversion/qwen.py: Qwen3_5MoeTextModel over _LinearAttentionVReorderBase,
Qwen3NextModel, _QwenMtpMixin, Qwen2MoeModel; vendored in llama-cpp-python 0.3.36, ggml-org/llama.cpp@0c1e57098):
- drops the vision tower (TextModel.filter_tensors), reads `model.language_model.` as `model.`, writes
  the MTP head as extra blocks unless --no-mtp (nextn_predict_layers; Mixdesk's writer: --no-mtp);
- where key heads are fewer than value heads, moves the DeltaNet's value heads from grouped order
  (value head h uses key head h // r, r = Hv / Hk) to tiled (file head v * Hk + k is HF head k * r + v),
  so ggml's broadcast pairs them: in_proj_qkv's v rows, in_proj_z's rows, in_proj_b/in_proj_a's rows,
  A_log, dt_bias, conv1d's v channels, out_proj's columns;
- A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [C, 1, K] squeezed to [C, K];
- every RMSNorm weight but linear_attn.norm stored as 1 + w (the zero-centred norms made plain);
- in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate, in_proj_b -> ssm_beta, in_proj_a -> ssm_alpha,
  out_proj -> ssm_out, linear_attn.norm -> ssm_norm, post_attention_layernorm -> post_attention_norm;
  attention's q_proj ([Hd query; Hd gate] rows a head) as attn_q unchanged; experts fused as Qwen3-MoE's;
- metadata: ssm.conv_kernel (K), ssm.state_size (Dk), ssm.group_count (Hk), ssm.time_step_rank (Hv),
  ssm.inner_size (Hv Dv), attention.recurrent_layers (one bool a block), full_attention_interval,
  rope.dimension_count (head_dim x partial_rotary_factor), rope.dimension_sections (mrope_section,
  [11, 11, 10, 0] when absent), expert_shared_feed_forward_length.
llama.cpp itself reads the value head width as ssm.state_size (it assumes Dv = Dk, as in every
release); Mixdesk reads it as ssm.inner_size / Hv.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from ...protocol.errors import ModelError
from .layout import Fix, head_rows

ARCH = "qwen35moe"
DEFAULT_SECTIONS = [11, 11, 10, 0]  # _Qwen35MRopeMixin's, when the config has no mrope_section


# --- reading: the metadata as Qwen3_5MoeTextConfig's fields ------------------------------------------

def config_fields(f, key, raw: dict) -> None:
    """Add the hybrid layers' fields to raw (engine/files/gguf/config.py's HF config dict). `key(name, kind,
    required, default)` reads {arch}.name. Inconsistent metadata is one ModelError naming the key."""
    path, a = f.path, ARCH
    hk, dk, hv = key("ssm.group_count"), key("ssm.state_size"), key("ssm.time_step_rank")
    inner, conv = key("ssm.inner_size"), key("ssm.conv_kernel")
    for name, v in (("ssm.state_size", dk), ("ssm.time_step_rank", hv), ("ssm.inner_size", inner),
                    ("ssm.conv_kernel", conv)):
        if v < 1:
            raise ModelError(path, f"metadata '{a}.{name}' is {v}; it must be at least 1")
    if hk < 1 or hv % hk:
        raise ModelError(path, f"metadata '{a}.ssm.group_count' is {hk}; it must divide '{a}.ssm.time_step_rank' "
                         f"({hv}): each key head serves a whole number of value heads")
    if inner % hv:
        raise ModelError(path, f"metadata '{a}.ssm.inner_size' ({inner}) is not a whole number of value heads "
                         f"('{a}.ssm.time_step_rank': {hv})")
    blocks, mtp = raw["num_hidden_layers"], key("nextn_predict_layers", required=False) or 0
    if not 0 <= mtp < blocks:
        raise ModelError(path, f"metadata '{a}.nextn_predict_layers' is {mtp}; it must be below '{a}.block_count' "
                         f"({blocks})")
    layers = blocks - mtp  # the MTP blocks come last; Mixdesk does not run them
    recurrent = f.get(f"{a}.attention.recurrent_layers")
    if recurrent is not None:
        if not isinstance(recurrent, list) or len(recurrent) != blocks or \
                any(not isinstance(x, (bool, int)) for x in recurrent):
            raise ModelError(path, f"metadata '{a}.attention.recurrent_layers' must list one true/false for each of "
                             f"the {blocks} blocks ('{a}.block_count')")
        linear = [bool(x) for x in recurrent[:layers]]
    else:  # llama.cpp's rule without the array: every interval-th layer is attention
        every = key("full_attention_interval", required=False, default=4)
        if every < 1:
            raise ModelError(path, f"metadata '{a}.full_attention_interval' is {every}; it must be at least 1")
        linear = [(i + 1) % every != 0 for i in range(layers)]
    head_dim = raw["head_dim"]
    rot = key("rope.dimension_count", required=False) or head_dim
    if not 0 < rot <= head_dim or rot % 2:
        raise ModelError(path, f"metadata '{a}.rope.dimension_count' is {rot}; it must be an even number from 2 to "
                         f"the head's {head_dim} dimensions")
    partial = rot / head_dim
    if int(head_dim * partial) != rot:  # (never for power-of-two heads) so that int(head_dim * factor) == rot
        partial = (rot + 0.5) / head_dim
    rope = raw["rope_parameters"]
    rope["partial_rotary_factor"] = partial
    sections = f.get(f"{a}.rope.dimension_sections")
    if isinstance(sections, list) and len(sections) >= 3:
        rope.update(mrope_section=[int(x) for x in sections[:3]], mrope_interleaved=True)
    t = f.tensors
    shared = key("expert_shared_feed_forward_length", required=False)
    if shared is None and "blk.0.ffn_up_shexp.weight" in t:
        shared = t["blk.0.ffn_up_shexp.weight"].ne[1]
    raw.update(num_hidden_layers=layers, shared_expert_intermediate_size=shared or 0, attention_bias=False,
               layer_types=["linear_attention" if x else "full_attention" for x in linear],
               linear_num_key_heads=hk, linear_key_head_dim=dk, linear_num_value_heads=hv,
               linear_value_head_dim=inner // hv, linear_conv_kernel_dim=conv)


# --- reading: the tensors' fixes ------------------------------------------------------------------------

def tiled_heads(hk: int, hv: int) -> torch.Tensor:
    """For each HF value head h (grouped: key head h // r), the file's head (tiled: (h % r) Hk + h // r)."""
    r = hv // hk
    h = torch.arange(hv)
    return (h % r) * hk + h // r


def _minus_one(x: torch.Tensor) -> torch.Tensor:
    return x - 1.0  # the converter's 1 + w undone (in fp32: exact wherever the stored 1 + w is at least 0.5)


def _a_log(heads: torch.Tensor | None):
    def undo(x):
        x = x if heads is None else x[heads]
        bad = x[~(torch.isfinite(x) & (x < 0))]
        if bad.numel():
            raise ValueError(f"holds {float(bad[0])!r}; the converter stores -exp(A_log) there, a negative number")
        return torch.log(-x)
    return undo


def _take(index: torch.Tensor | None, dim: int = 0):
    return (lambda x: x) if index is None else (lambda x: x.index_select(dim, index))


def fixes(d, tiled: bool = True) -> dict[str, Fix]:
    """HF name -> Fix for a qwen35moe file of Dims d (engine/files/gguf/layout.py). tiled: the DeltaNet's value
    heads stay in the file's tiled order (every matrix its own blocks, mapped; the engine's mixer reads
    them so: Dims.tiled_heads); False: back in Hugging Face's grouped order (rows and columns moved)."""
    hk, dk, hv, dv, _ = d.linear or (1, 0, 1, 0, 0)  # (None: attention layers only)
    heads = tiled_heads(hk, hv) if hv != hk else None  # the converter reorders only when they differ
    plain = Fix(value=_minus_one)
    out = {"model.norm.weight": plain}
    for l in range(d.layers):
        p = f"model.layers.{l}."
        out[p + "input_layernorm.weight"] = out[p + "post_attention_layernorm.weight"] = plain
        if d.mixer(l) == "attention":
            out[p + "self_attn.q_norm.weight"] = out[p + "self_attn.k_norm.weight"] = plain
            continue
        q = p + "linear_attn."
        if tiled and heads is not None:  # read in the file's (tiled) order: the mixer knows it (Dims.tiled_heads)
            out[q + "A_log"] = Fix(value=_a_log(None))
            out[q + "dt_bias"] = out[q + "conv1d.weight"] = Fix(value=_same)  # F32, the HF shape
            continue
        out[q + "A_log"] = Fix(value=_a_log(heads))
        if heads is None:
            continue
        qkv = torch.cat([torch.arange(2 * hk * dk), head_rows(heads, dv, 2 * hk * dk)])
        out[q + "in_proj_qkv.weight"] = Fix(rows=qkv)
        out[q + "in_proj_z.weight"] = Fix(rows=head_rows(heads, dv))
        out[q + "in_proj_b.weight"] = out[q + "in_proj_a.weight"] = Fix(rows=heads)
        out[q + "out_proj.weight"] = Fix(cols=heads, width=dv)
        out[q + "dt_bias"] = Fix(value=_take(heads))
        out[q + "conv1d.weight"] = Fix(value=_take(qkv))
    return out


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


# --- writing: the converter's steps ------------------------------------------------------------------------

def reorder_v_heads(t: torch.Tensor, dim: int, hk: int, r: int, width: int) -> torch.Tensor:
    """_LinearAttentionVReorderBase._reorder_v_heads: dim's [Hk, r, width] grouped heads to [r, Hk, width]."""
    shape = list(t.shape)
    dim %= len(shape)
    t = t.reshape(*shape[:dim], hk, r, width, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).contiguous().reshape(shape)


def skipped(name: str) -> bool:
    """The tensors the converter leaves out of the text model (the vision tower; MTP under --no-mtp)."""
    return "visual." in name or name.startswith(("mtp.", "model.mtp."))


def convert(name: str, shape: tuple, load, hp: dict) -> tuple[str, tuple, Callable]:
    """_LinearAttentionVReorderBase then Qwen3NextModel.modify_tensors for one tensor (its name already
    without `language_model.`): (HF name to map, shape, load). The arithmetic runs in the dtype the
    converter has (f16 and f32 as stored, anything else as f32)."""
    hk, hv = hp.get("linear_num_key_heads", 0), hp.get("linear_num_value_heads", 0)
    steps = []
    if hk > 0 and hv > 0 and hk != hv and "linear_attn." in name:
        dk, dv, r = hp["linear_key_head_dim"], hp["linear_value_head_dim"], hv // hk
        c = 2 * hk * dk
        if ".in_proj_qkv." in name:
            steps.append(lambda t: torch.cat([t[:c], reorder_v_heads(t[c:], 0, hk, r, dv)]))
        elif ".in_proj_z." in name:
            steps.append(lambda t: reorder_v_heads(t, 0, hk, r, dv))
        elif ".in_proj_b." in name or ".in_proj_a." in name:
            steps.append(lambda t: reorder_v_heads(t, 0, hk, r, 1))
        elif ".A_log" in name or ".dt_bias" in name:
            steps.append(lambda t: reorder_v_heads(t[:, None], 0, hk, r, 1)[:, 0])
        elif ".conv1d" in name:
            steps.append(lambda t: (lambda s: torch.cat([s[:c], reorder_v_heads(s[c:], 0, hk, r, dv)]))(t.squeeze()))
        elif ".out_proj." in name:
            steps.append(lambda t: reorder_v_heads(t, 1, hk, r, dv))
    if name.endswith(".A_log"):
        steps.append(lambda t: -torch.exp(t))
    elif name.endswith(".dt_bias"):
        name = name[:-len(".dt_bias")] + ".dt_proj.bias"
    elif "conv1d" in name:
        steps.append(lambda t: t.squeeze())
        shape = tuple(s for s in shape if s != 1)
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        steps.append(lambda t: t + 1)
    if not steps:
        return name, shape, load
    return name, shape, functools.partial(_apply, load, steps)


def _apply(load, steps) -> torch.Tensor:
    t = load()
    if t.dtype not in (torch.float16, torch.float32):
        t = t.to(torch.float32)
    for s in steps:
        t = s(t)
    return t


def metadata(w, hp: dict) -> None:
    """Qwen3NextModel's and _Qwen35MRopeMixin's keys after Qwen2MoeModel's (--no-mtp: no nextn key)."""
    w.add_ssm_conv_kernel(hp["linear_conv_kernel_dim"])
    w.add_ssm_state_size(hp["linear_key_head_dim"])
    w.add_ssm_group_count(hp["linear_num_key_heads"])
    w.add_ssm_time_step_rank(hp["linear_num_value_heads"])
    w.add_ssm_inner_size(hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
    if (types := hp.get("layer_types")) is not None:
        w.add_array(f"{w.arch}.attention.recurrent_layers", [t == "linear_attention" for t in types])
    w.add_full_attention_interval(hp.get("full_attention_interval", 4))
    rope = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    if "mrope_section" not in rope:
        w.add_rope_dimension_sections(DEFAULT_SECTIONS)
