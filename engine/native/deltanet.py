"""One Gated DeltaNet decode step (Qwen3-Next / Qwen3.5-MoE linear-attention layers) for one token of
one sequence, from the input projections' outputs to the gated RMSNorm (out_proj is applied by the
caller): deltanet.c's mdk_deltanet_step, and `reference`, the same math in torch (the engine's fallback
where the library is missing, and the tests' second opinion next to transformers' own functions).

Shapes (fp32, contiguous, CPU): Hk key heads of Dk, Hv value heads of Dv, C = 2*Hk*Dk + Hv*Dv conv
channels, K conv taps. qkv [C] (in_proj_qkv's output, before the conv); conv [C, K-1] each channel's
previous K-1 inputs, oldest first; conv_w [C, K]; a, b, A_log, dt_bias [Hv]; z [Hv*Dv]; norm_w [Dv];
state [Hv, Dk, Dv]. conv and state are updated in place; the result is [Hv*Dv].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import native

ERRORS = {-1: "bad sizes (a head dim over 1024, or more channels than the library indexes)", -2: "out of memory"}


def _sizes(key_heads, qkv, conv, conv_w, a, b, A_log, dt_bias, z, norm_w, state):
    """(Hk, Dk, Hv, Dv, K) from the shapes, or ValueError naming the argument that does not fit."""
    if state.dim() != 3:
        raise ValueError(f"state: expected [Hv, Dk, Dv], got {list(state.shape)}")
    Hv, Dk, Dv = state.shape
    Hk = int(key_heads)
    if Hk < 1 or Hv % Hk:
        raise ValueError(f"key_heads: {Hk} does not divide the {Hv} value heads")
    if conv_w.dim() != 2:
        raise ValueError(f"conv_w: expected [C, K], got {list(conv_w.shape)}")
    C, K = 2 * Hk * Dk + Hv * Dv, conv_w.shape[1]
    want = {"qkv": (qkv, (C,)), "conv": (conv, (C, K - 1)), "conv_w": (conv_w, (C, K)), "a": (a, (Hv,)),
            "b": (b, (Hv,)), "A_log": (A_log, (Hv,)), "dt_bias": (dt_bias, (Hv,)), "z": (z, (Hv * Dv,)),
            "norm_w": (norm_w, (Dv,)), "state": (state, (Hv, Dk, Dv))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous float32 CPU tensor, got {t.dtype} on {t.device}"
                             f"{'' if t.is_contiguous() else ', not contiguous'}")
    return Hk, Dk, Hv, Dv, K


def step(key_heads: int, qkv, conv, conv_w, a, b, A_log, dt_bias, z, norm_w, eps: float, state,
         out: torch.Tensor | None = None, threads: int | None = None, tiled: bool = False) -> torch.Tensor:
    """The native step: updates conv and state in place, returns out [Hv*Dv] (a new tensor if None).
    tiled: value head h uses key head h % Hk (a GGUF's order) instead of h // (Hv/Hk)."""
    Hk, Dk, Hv, Dv, K = _sizes(key_heads, qkv, conv, conv_w, a, b, A_log, dt_bias, z, norm_w, state)
    if out is None:
        out = torch.empty(Hv * Dv, dtype=torch.float32)
    elif tuple(out.shape) != (Hv * Dv,) or out.dtype != torch.float32 or not out.is_contiguous() \
            or out.device.type != "cpu":
        raise ValueError(f"out: expected a contiguous float32 CPU tensor of shape [{Hv * Dv}]")
    L = native.lib()
    if L is None:
        raise RuntimeError(f"deltanet.step: {native.status()}; use deltanet.reference")
    rc = L.mdk_deltanet_step(
        Hk, Dk, Hv, Dv, K, int(tiled), qkv.data_ptr(), conv.data_ptr(), conv_w.data_ptr(), a.data_ptr(), b.data_ptr(),
        A_log.data_ptr(), dt_bias.data_ptr(), z.data_ptr(), norm_w.data_ptr(), float(eps), state.data_ptr(),
        out.data_ptr(), native.threads() if threads is None else int(threads))
    if rc:
        raise RuntimeError(f"mdk_deltanet_step: {ERRORS.get(rc, f'error {rc}')}")
    return out


def reference(key_heads: int, qkv, conv, conv_w, a, b, A_log, dt_bias, z, norm_w, eps: float, state,
              tiled: bool = False) -> torch.Tensor:
    """The same step in plain torch (fp32): updates conv and state in place, returns [Hv*Dv]."""
    Hk, Dk, Hv, Dv, K = _sizes(key_heads, qkv, conv, conv_w, a, b, A_log, dt_bias, z, norm_w, state)
    x = torch.cat([conv, qkv[:, None]], dim=1)  # [C, K]: the history, then this token
    y = F.silu((x * conv_w).sum(-1))
    conv.copy_(x[:, 1:])
    q, k, v = y.split([Hk * Dk, Hk * Dk, Hv * Dv])
    q, k, v = q.view(Hk, Dk), k.view(Hk, Dk), v.view(Hv, Dv)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / Dk ** 0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if tiled:
        q, k = q.repeat(Hv // Hk, 1), k.repeat(Hv // Hk, 1)  # [Hv, Dk]: value head h uses key head h % Hk
    else:
        q, k = q.repeat_interleave(Hv // Hk, 0), k.repeat_interleave(Hv // Hk, 0)  # [Hv, Dk]
    decay = (-A_log.exp() * F.softplus(a + dt_bias)).exp()[:, None, None]
    beta = torch.sigmoid(b)[:, None]
    S = state * decay
    delta = (v - (S * k[:, :, None]).sum(1)) * beta  # [Hv, Dv]
    S = S + k[:, :, None] * delta[:, None, :]
    state.copy_(S)
    o = (S * q[:, :, None]).sum(1)  # [Hv, Dv]
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    return (norm_w * o * F.silu(z.view(Hv, Dv))).reshape(-1)
