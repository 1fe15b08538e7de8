"""The whole decode step of a CPU-resident model in one native call (engine/native/decode.c).

Built from a MoEModel whose dense weights are on the CPU (engine/native/choice.py `whole_step`
says which models). It points at the model's own tensors (nothing is copied; each dense matrix a
16-bit or fp32 tensor or a GGUF block weight, BlockQuant, and [q; k; v] one matrix or stacked parts
of different formats, engine/experts/dense_forms.py) and at each MoE block's expert table, which the blocks
keep current as experts migrate. Whether a given forward runs here is choice.decode_step's call (a
GPU expert, a calibration hook or a batch past the C side's arrays sends it to the torch forward).
"""
from __future__ import annotations

import ctypes

import torch

from ..native import ERRORS, FMT, KV_FMT, Layer, Matrix, Model, lib, matrix, threads


def dense_matrix(w) -> Matrix:
    """One dense matrix as the step reads it: a CPU tensor (contiguous), or a BlockQuant's tiles."""
    return matrix(w) if isinstance(w, torch.Tensor) else w.desc


def parts(w) -> list:
    """The matrices stacked along the output rows of w (dense_forms.Stacked), or [w]."""
    return list(getattr(w, "parts", None) or [w])


def _embed_rows(embed, ids: torch.Tensor) -> torch.Tensor:
    if isinstance(embed, torch.Tensor):
        return embed[ids]
    from ..experts.dense_forms import embed_rows  # a block-format embedding: its rows dequantised

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
            L.router = block.router_matrix if block.router_matrix is not None else Matrix()
            att = layer.mixer  # every mixer an attention mixer (choice.whole_step checks it)
            if att.q_norm is not None:  # fp32: attention's dtype on the CPU (choice.whole_step checks it)
                L.q_norm, L.k_norm = att.q_norm.data_ptr(), att.k_norm.data_ptr()
            # L.k / L.v stay null: only mdk_decode reads them, and every call here passes its caches
        resid = FMT[model.residual_dtype]
        self.desc = Model(d.layers, d.hidden, d.heads, d.kv_heads, d.head_dim, 0, d.experts, d.top_k,
                          d.sliding_window or 0, d.rms_eps, FMT[model.dtype], resid, FMT[model.dtype],
                          ctypes.addressof(self.layers), model.norm.data_ptr(), dense_matrix(model.lm_head),
                          {None: 0, "head": 1, "full": 2}[d.qk_norm], d.clip_qkv or 0.0, KV_FMT[model.kv_dtype])

    def __call__(self, ids: torch.Tensor, caches: list, positions: list[int]) -> torch.Tensor:
        """Logits [B, V] fp32 (the values torch's lm_head gives in the model dtype) for B sequences'
        next tokens ids [B], token b at positions[b] of caches[b], in one mdk_decode_batch call. B=1
        (a single sequence's decode) is the same call: the C side's mdk_decode is only that case."""
        m = self.model
        B = len(caches)
        self.desc.ctx = caches[0].ctx  # every cache of one length (choice.decode_step checks)
        x = _embed_rows(m.embed, ids).to(m.residual_dtype).contiguous()  # [B, D]
        cos, sin = m.rope_rows(positions, B)  # [B, 1, Hd], contiguous
        pos = (ctypes.c_int * B)(*positions)
        kb = (ctypes.c_void_p * B)(*[c.k.data_ptr() for c in caches])
        vb = (ctypes.c_void_p * B)(*[c.v.data_ptr() for c in caches])
        logits = torch.empty(B, m.lm_head.shape[0], dtype=torch.float32)
        rc = lib().mdk_decode_batch(ctypes.byref(self.desc), B, x.data_ptr(), pos, kb, vb, cos.data_ptr(),
                                    sin.data_ptr(), logits.data_ptr(), threads())
        if rc:
            raise RuntimeError(f"native decode step failed: {ERRORS.get(rc, rc)}")
        return logits
