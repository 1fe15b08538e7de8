"""Native kernels or torch: the one place that decides which of them runs a piece of work, and the
one set of limits it decides by.

Work runs natively where the library loaded, its weights are ones the kernels read in place (on
the CPU, fp32/fp16/bf16 and contiguous, or a native 4-bit/GGUF form that carries its own
descriptor), what the family computes is what the C code computes, and the sizes fit the C side's
fixed arrays below. Past a limit the C code would refuse the call with an error code (or overrun an
array), so such work stays in torch: slower, never wrong.
"""
from __future__ import annotations

import torch

from . import FMT, KV_FMT, available

# decode.c, mdk_decode_batch: sequences in one call (its per-sequence arrays: cache pointers, window
# starts, routes; it returns -1 past this)
MAX_BATCH = 64
# decode.c: route slots per sequence in those arrays (idx, wts [MAX_BATCH * 64]; -1 past this)
MAX_TOP_K = 64
# moe.c, mdk_moe: experts of a layer (its counting sort's per-expert arrays; -3 past this)
MAX_EXPERTS = 1024
# moe.c: (token, expert) pairs of one routed call (its static slot arrays); longer prefills route in torch
MAX_SLOTS = 65536
# decode.c: rope's per-head temporary; attention.c: the portable path's widened key row
MAX_HEAD_DIM = 1024
# decode.c, mdk_layer.qkv[3]: [q; k; v] as at most three stacked parts of different formats
MAX_QKV_PARTS = 3
# Not a C limit but a measured crossover: up to this many rows a dense CPU matmul is the native GEMV
# (it streams the weight once at the memory bandwidth; torch's bf16 GEMV reached ~16 GB/s here);
# larger batches are torch's GEMM.
DENSE_ROWS = 8


def reads(w: torch.Tensor) -> bool:
    """A weight tensor the kernels read in place (native.matrix): CPU, a native format, contiguous."""
    return w.device.type == "cpu" and w.dtype in FMT and w.is_contiguous() and available()


def dense(w, rows: int) -> bool:
    """x [rows, K] @ w.T in the native GEMV (kernels.linear); w a tensor (block weights multiply themselves)."""
    return rows <= DENSE_ROWS and reads(w)


def stacked(parts: list, x: torch.Tensor) -> bool:
    """Stacked matrices of one input (dense_forms.Stacked) as one native call (moe.c mdk_matmul_parts): a
    few rows, at most 8 parts, each a tensor the kernels read or a block weight with its descriptor, all
    of one dtype among the tensors."""
    if not (available() and len(parts) <= 8 and x.shape[0] <= DENSE_ROWS and x.device.type == "cpu"):
        return False
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    return (all(reads(p) for p in tensors) and len({p.dtype for p in tensors}) <= 1
            and all(getattr(p, "desc", None) is not None for p in parts if not isinstance(p, torch.Tensor)))


def expert(w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """A 16-bit or fp32 host expert runs in the native expert kernels (4-bit forms are native by
    their format: quant.Q4Native, BlockQuant)."""
    return reads(w13) and reads(w2)


def router(gate: torch.Tensor) -> bool:
    """The router matrix [E, D] can be read by mdk_moe (and by the native decode step)."""
    return reads(gate)


def moe_layer(block, x: torch.Tensor) -> bool:
    """A whole MoE layer (route, experts, weighted sum) as one mdk_moe call: every expert native and
    x on the CPU, the router the one moe.c has (softmax over E, top-k, renormalised, no bias), no
    calibration hook (it needs the routes in Python), within moe.c's arrays. A prefill with offload
    costs stays in torch, whose path may copy experts to the accelerator."""
    T, K = x.shape[0], block.top_k
    return (block.record is None and block.all_native and block.router_matrix is not None and x.device.type == "cpu"
            and (T == 1 or block.offload is None) and T * K <= MAX_SLOTS and 0 < K <= len(block.experts) <= MAX_EXPERTS)


def deltanet_step(conv: torch.Tensor, state: torch.Tensor) -> bool:
    """A Gated DeltaNet decode step runs as one native call (deltanet.c): the library is there and the
    layer's state lives on the CPU in fp32 (as engine/layers/state.py keeps it), contiguous."""
    return (available() and conv.device.type == "cpu" and state.dtype == torch.float32 and conv.dtype == torch.float32
            and conv.is_contiguous() and state.is_contiguous() and max(state.shape[1:]) <= MAX_HEAD_DIM)


def file_blocks(ckpt, accel: torch.device, dtype: torch.dtype) -> bool:
    """A GGUF file's dense matrices stay in the file's blocks, which the native kernels multiply on
    the CPU; below fp32 only (fp32 is the reference precision: there they are dequantised)."""
    return ckpt.is_gguf and accel.type == "cpu" and available() and dtype != torch.float32


def whole_step(model) -> bool:
    """The model's whole decode step can be one native call (engine/model/native_step.py, decode.c): its
    family computes what decode.c computes (q/k norms and clip_qkv included; no biases, shared
    experts, sinks, per-layer windows, output gates, partial rope or mixers other than attention), it lives on the CPU in native formats with fp32 attention,
    and its shapes fit decode.c's arrays."""
    d = model.dims
    plain = (d.norm_topk and not d.qkv_bias and not d.shared_ffn and d.router_kind == "softmax_topk"
             and not d.router_bias and d.act == "silu" and not d.attn_sinks and not d.o_bias
             and d.layer_windows is None and d.mixers is None and not d.attn_gate and not d.rot_dim
             and not d.dense_first)
    return (available() and plain and model.accel.type == "cpu" and model.dtype in FMT
            and model.attn_dtype == torch.float32 and model.kv_dtype in KV_FMT
            and all(_dense_ok(model, layer) for layer in model.layers) and _readable(model.lm_head, d.hidden)
            and d.head_dim <= MAX_HEAD_DIM and 0 < d.top_k <= min(MAX_TOP_K, d.experts)
            and d.experts <= MAX_EXPERTS and d.heads % d.kv_heads == 0)


def step_ready(model) -> bool:
    """The native step exists (whole_step) and every layer can run in it now: all its experts are
    native CPU experts (migration may have put one on the GPU) and no calibration hook listens."""
    return (model.native_step is not None and model.layer_inputs is None
            and all(b.all_native and b.router_matrix is not None and b.record is None for b in model.moe))


def decode_step(model, ids: torch.Tensor, caches: list, start=None) -> bool:
    """This forward is a decode step (one new token per sequence) that runs as one native call: the
    step is ready, the forward starts at the first layer, and the caches fit mdk_decode_batch (at
    most MAX_BATCH, all of one length: its model descriptor holds one ctx)."""
    return (ids.shape[0] == len(caches) <= MAX_BATCH and start is None and step_ready(model)
            and all(c.ctx == caches[0].ctx for c in caches))


def _readable(w, k: int) -> bool:
    """A dense matrix the step reads: a tensor the kernels read in place, or a BlockQuant, of k columns."""
    if isinstance(w, torch.Tensor):
        return reads(w) and w.dim() == 2 and w.shape[1] == k
    return getattr(w, "desc", None) is not None and w.shape[1] == k


def _dense_ok(model, layer) -> bool:
    d = model.dims
    qkv = list(getattr(layer.wqkv, "parts", None) or [layer.wqkv])  # dense_forms.Stacked's parts, or one
    return (len(qkv) <= MAX_QKV_PARTS and all(_readable(w, d.hidden) for w in qkv)
            and sum(w.shape[0] for w in qkv) == (d.heads + 2 * d.kv_heads) * d.head_dim
            and _readable(layer.wo, d.heads * d.head_dim))
