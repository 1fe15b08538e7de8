"""GGUF's block formats dequantised with torch ops, on whatever device the blocks are: the GPU prefill's
copy of a CPU-resident expert (engine/experts/expert.py QuantExpert.to) sends the file's own rows over PCIe,
4.5 bits a weight for Q4_K instead of 16, and expands them on the GPU.

A port of gguf-py's numpy `dequantize_blocks` (gguf/quants.py), block for block, so it equals
`gguf.quants.dequantize` bit for bit in fp32 (tests/test_torch_dequant.py checks every format on the
CPU). The native kernels' own dequantiser (engine/native/kraw.c) stays the CPU's: this one exists for
devices the C code does not reach.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES

QK_K = 256


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 -> [n, 1] fp32 (a block's fp16 scale)."""
    return b.contiguous().view(torch.float16).float()


def _shifts(values, device, dtype=torch.uint8) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _nibbles(qs: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """Low then high nibbles of groups of `width` bytes: [n, groups * width] uint8 -> [n, groups * 2 * width]."""
    q = qs.reshape(n, -1, 1, width) >> _shifts([0, 4], qs.device).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's twelve bytes of 6-bit scales and mins -> [n, 8] each (gguf's get_scale_min)."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_0(b):
    n = b.shape[0]
    q = _nibbles(b[:, 2:], n, 16).to(torch.int8) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b):
    n = b.shape[0]
    return _f16(b[:, :2]) * _nibbles(b[:, 4:], n, 16).float() + _f16(b[:, 2:4])


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0 / Q5_1's 32 fifth bits, one a value: [n, 4] uint8 (a little-endian uint32) -> [n, 32] uint8."""
    h = qh.to(torch.int64)
    word = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)
    return ((word[:, None] >> torch.arange(32, device=qh.device)) & 1).to(torch.uint8)


def _q5_0(b):
    n = b.shape[0]
    q = (_nibbles(b[:, 6:], n, 16) | (_high_bits(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return _f16(b[:, :2]) * q.float()


def _q5_1(b):
    n = b.shape[0]
    q = _nibbles(b[:, 8:], n, 16) | (_high_bits(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])


def _q8_0(b):
    return _f16(b[:, :2]) * b[:, 2:].contiguous().view(torch.int8).float()


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _scale_min(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, -1, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, -1, 1)
    q = _nibbles(b[:, 16:], n, 32).reshape(n, -1, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _scale_min(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, -1, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, -1, 1)
    qh, qs = b[:, 16:16 + QK_K // 8], b[:, 16 + QK_K // 8:]
    ql = _nibbles(qs, n, 32).reshape(n, -1, 32)
    h = qh.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), b.device).reshape(1, 1, 8, 1)
    h = (h & 0x01).reshape(n, -1, 32)
    return (d * (ql | (h << 4)).float() - dm).reshape(n, QK_K)


def _q6_k(b):
    n = b.shape[0]
    ql, qh = b[:, :QK_K // 2], b[:, QK_K // 2:QK_K // 2 + QK_K // 4]
    scales = b[:, QK_K // 2 + QK_K // 4:QK_K // 2 + QK_K // 4 + QK_K // 16].contiguous().view(torch.int8).float()
    d = (_f16(b[:, -2:]) * scales).reshape(n, QK_K // 16, 1)
    lo = (ql.reshape(n, -1, 1, 64) >> _shifts([0, 4], b.device).reshape(1, 1, 2, 1)) & 0x0F
    lo = lo.reshape(n, -1, 32)
    hi = (qh.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], b.device).reshape(1, 1, 4, 1)) & 0x03
    hi = hi.reshape(n, -1, 32)
    q = ((lo | (hi << 4)).to(torch.int8) - 32).reshape(n, QK_K // 16, -1).float()
    return (d * q).reshape(n, QK_K)


def _q2_k(b):
    n = b.shape[0]
    scales, qs = b[:, :QK_K // 16], b[:, QK_K // 16:QK_K // 16 + QK_K // 4]
    d, dmin = _f16(b[:, -4:-2]), _f16(b[:, -2:])
    dl = (d * (scales & 0x0F).float()).reshape(n, QK_K // 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, QK_K // 16, 1)
    q = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], b.device).reshape(1, 1, 4, 1)) & 3
    return (dl * q.reshape(n, QK_K // 16, 16).float() - ml).reshape(n, QK_K)


def _q3_k(b):
    n = b.shape[0]
    hmask, qs = b[:, :QK_K // 8], b[:, QK_K // 8:QK_K // 8 + QK_K // 4]
    scales, d = b[:, QK_K // 8 + QK_K // 4:-2], _f16(b[:, -2:])
    lo = (scales[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], b.device).reshape(1, 2, 1)).reshape(n, 16)
    hi = (scales[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], b.device).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & 0x0F) | ((hi & 0x03) << 4)).to(torch.int8) - 32
    dl = (d * sc.float()).reshape(n, 16, 1)
    ql = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], b.device).reshape(1, 1, 4, 1)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), b.device).reshape(1, 1, 8, 1)).reshape(n, 16, 16) & 1
    q = ql.to(torch.int8) - ((qh ^ 1) << 2).to(torch.int8)  # the offset is zero where the mask bit is 1
    return (dl * q.float()).reshape(n, QK_K)


IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # IQ4_NL's grid


def _iq4_nl(b):
    n = b.shape[0]
    grid = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=b.device)
    return _f16(b[:, :2]) * grid[_nibbles(b[:, 2:], n, 16).long()]


def _iq4_xs(b):
    n = b.shape[0]
    d = _f16(b[:, :2])
    sh = b[:, 2:4].to(torch.int32)
    sh = sh[:, 0] | (sh[:, 1] << 8)  # 16 bits: two high bits of each of 8 scales
    sl = (b[:, 4:8].reshape(n, -1, 1) >> _shifts([0, 4], b.device).reshape(1, 1, 2)).reshape(n, 8) & 0x0F
    hi = (sh[:, None] >> (2 * torch.arange(8, device=b.device))) & 3
    sc = (sl.to(torch.int32) | (hi << 4)) - 32
    dl = (d * sc.float()).reshape(n, 8, 1)
    grid = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=b.device)
    q = grid[_nibbles(b[:, 8:], n, 16).long()].reshape(n, 8, 32)
    return (dl * q).reshape(n, QK_K)


BLOCKS = {GT.Q4_0: _q4_0, GT.Q4_1: _q4_1, GT.Q5_0: _q5_0, GT.Q5_1: _q5_1, GT.Q8_0: _q8_0,
          GT.Q4_K: _q4_k, GT.Q5_K: _q5_k, GT.Q6_K: _q6_k, GT.Q2_K: _q2_k, GT.Q3_K: _q3_k,
          GT.IQ4_NL: _iq4_nl, GT.IQ4_XS: _iq4_xs}


def supported(qtype) -> bool:
    return GT(qtype) in BLOCKS


def dequantize(rows: torch.Tensor, qtype, k: int) -> torch.Tensor:
    """The file's rows of one matrix, uint8 [N * row_bytes] or [N, row_bytes] on any device ->
    fp32 [N, k] on that device."""
    qtype = GT(qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rows.reshape(-1, size)
    return BLOCKS[qtype](blocks).reshape(-1, k)
