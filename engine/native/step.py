"""The whole decode step of a CPU-resident model in one native call (engine/native/decode.c).

Built from a MoEModel whose dense weights are on the CPU. It points at the model's own tensors
(nothing is copied; each dense matrix a 16-bit or fp32 tensor or a GGUF block weight, BlockQuant,
and [q; k; v] one matrix or stacked parts of different formats, engine/dense_forms.py) and at each MoE block's expert table, which the blocks keep current as experts
migrate; `ready()` says whether every layer can run natively right now (a GPU expert, a calibration
hook or an unsupported shape sends the step back to the torch forward).
"""
from __future__ import annotations

import ctypes

import torch

from . import ERRORS, FMT, Layer, Matrix, Model, lib, matrix, threads


def dense_matrix(w) -> Matrix:
    """One dense matrix as the step reads it: a CPU tensor (contiguous), or a BlockQuant's tiles."""
    return matrix(w) if isinstance(w, torch.Tensor) else w.desc


def parts(w) -> list:
    """The matrices stacked along the output rows of w (dense_forms.Stacked), or [w]."""
    return list(getattr(w, "parts", None) or [w])


def _embed_rows(embed, ids: torch.Tensor) -> torch.Tensor:
    if isinstance(embed, torch.Tensor):
        return embed[ids]
    from ..dense_forms import embed_rows  # a block-format embedding: its rows dequantised

    return embed_rows(embed, ids)


class DecodeStep:
    def __init__(self, model):
        d = model.dims
        self.model = model
        self.layers = (Layer * d.layers)()
        for l, (layer, block) in enumerate(zip(model.layers, model.moe)):
            L = self.layers[l]
            L.ln1, L.ln2 = layer.ln1.data_ptr(), layer.ln2.data_ptr()
            qkv = parts(layer.wqkv)
            for i, w in enumerate(qkv):
                L.qkv[i] = dense_matrix(w)
            L.nqkv, L.wo = len(qkv), dense_matrix(layer.wo)
            L.experts = ctypes.cast(block.table, ctypes.c_void_p)
            L.router = block.router if block.router is not None else Matrix()
            if layer.q_norm is not None:  # fp32: attention's dtype on the CPU (supported() checks it)
                L.q_norm, L.k_norm = layer.q_norm.data_ptr(), layer.k_norm.data_ptr()
        resid = FMT[model.residual_dtype]
        self.desc = Model(d.layers, d.hidden, d.heads, d.kv_heads, d.head_dim, 0, d.experts, d.top_k,
                          d.sliding_window or 0, d.rms_eps, FMT[model.dtype], resid, FMT[model.dtype],
                          ctypes.addressof(self.layers), model.norm.data_ptr(), dense_matrix(model.lm_head),
                          {None: 0, "head": 1, "full": 2}[d.qk_norm], d.clip_qkv or 0.0, FMT[model.kv_dtype])
        self._cache = None

    @staticmethod
    def supported(model) -> bool:
        d = model.dims
        # q/k norms and clip_qkv run natively (Qwen3-MoE, OLMoE); the native router always renormalises
        plain = (d.norm_topk and not d.qkv_bias and not d.shared_ffn
                 and d.router_kind == "softmax_topk" and not d.router_bias and d.act == "silu" and not d.attn_sinks
                 and not d.o_bias and d.layer_windows is None)
        return (plain and model.accel.type == "cpu" and model.dtype in FMT and model.attn_dtype == torch.float32
                and model.kv_dtype in FMT and all(DecodeStep._dense_ok(model, l) for l in model.layers)
                and DecodeStep._readable(model.lm_head, d.hidden)
                and d.head_dim <= 1024 and 0 < d.top_k <= min(64, d.experts) and d.experts <= 1024
                and d.heads % d.kv_heads == 0)

    @staticmethod
    def _readable(w, k: int) -> bool:
        """A matrix the step can read: a contiguous CPU tensor of a native format, or a BlockQuant, of k columns."""
        if isinstance(w, torch.Tensor):
            return w.device.type == "cpu" and w.dtype in FMT and w.is_contiguous() and w.dim() == 2 and w.shape[1] == k
        return getattr(w, "desc", None) is not None and w.shape[1] == k

    @staticmethod
    def _dense_ok(model, layer) -> bool:
        d = model.dims
        qkv = parts(layer.wqkv)
        return (len(qkv) <= 3 and all(DecodeStep._readable(w, d.hidden) for w in qkv)
                and sum(w.shape[0] for w in qkv) == (d.heads + 2 * d.kv_heads) * d.head_dim
                and DecodeStep._readable(layer.wo, d.heads * d.head_dim))

    def ready(self) -> bool:
        m = self.model
        return m.layer_inputs is None and all(b.all_native and b.router is not None and b.record is None
                                              for b in m.moe)

    def __call__(self, ids: torch.Tensor, cache, pos: int) -> torch.Tensor:
        """Logits [1, V] fp32 for one token at pos (the values torch's lm_head gives in the model dtype)."""
        m = self.model
        if cache is not self._cache:  # point every layer at this cache's keys and values
            stride = cache.k.stride(0) * cache.k.element_size()
            for l in range(len(self.layers)):
                self.layers[l].k = cache.k.data_ptr() + l * stride
                self.layers[l].v = cache.v.data_ptr() + l * stride
            self.desc.ctx = cache.ctx
            self._cache = cache
        x = _embed_rows(m.embed, ids).to(m.residual_dtype).contiguous()  # [1, D]
        cos_t, sin_t = m.rope_tables(pos + 1)
        logits = torch.empty(1, m.lm_head.shape[0], dtype=torch.float32)
        rc = lib().mdk_decode(ctypes.byref(self.desc), x.data_ptr(), pos, cos_t[pos].data_ptr(),
                              sin_t[pos].data_ptr(), logits.data_ptr(), threads())
        if rc:
            raise RuntimeError(f"native decode step failed: {ERRORS.get(rc, rc)}")
        return logits

    def batch(self, ids: torch.Tensor, caches: list, positions: list[int]) -> torch.Tensor | None:
        """Logits [B, V] fp32 for B sequences' next tokens, each in its own cache (one native call);
        None where it cannot run them (caches of different lengths, or more than 64)."""
        m = self.model
        B = len(caches)
        if not 1 <= B <= 64 or any(c.ctx != caches[0].ctx for c in caches):
            return None
        self._cache = None  # the layers' own cache pointers are not used here; re-point them next call
        self.desc.ctx = caches[0].ctx
        x = _embed_rows(m.embed, ids).to(m.residual_dtype).contiguous()  # [B, D]
        cos_t, sin_t = m.rope_tables(max(positions) + 1)
        at = torch.tensor(positions)
        cos, sin = cos_t[at, 0].contiguous(), sin_t[at, 0].contiguous()  # [B, Hd]
        pos = (ctypes.c_int * B)(*positions)
        kb = (ctypes.c_void_p * B)(*[c.k.data_ptr() for c in caches])
        vb = (ctypes.c_void_p * B)(*[c.v.data_ptr() for c in caches])
        logits = torch.empty(B, m.lm_head.shape[0], dtype=torch.float32)
        rc = lib().mdk_decode_batch(ctypes.byref(self.desc), B, x.data_ptr(), pos, kb, vb, cos.data_ptr(),
                                    sin.data_ptr(), logits.data_ptr(), threads())
        if rc:
            raise RuntimeError(f"native decode step failed: {ERRORS.get(rc, rc)}")
        return logits
