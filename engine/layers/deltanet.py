"""The Gated DeltaNet mixer (Qwen3.5-MoE, Qwen3-Next): linear attention whose state per head is a
Dk x Dv matrix, updated by a gated delta rule, read by the query.

For each token (Hk key heads of Dk, Hv value heads of Dv, value head h using key head h / (Hv/Hk)):
  [q; k; v] = silu(causal depthwise conv over the last K inputs of in_proj_qkv(x))
  q, k L2-normalised per head, q scaled by 1/sqrt(Dk)
  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias),  beta = sigmoid(in_proj_b(x))      [Hv]
  S = S * exp(g);  S += k (beta (v - S^T k))^T;  o = S^T q                                [Dk, Dv] per head
  out = out_proj(RMSNorm(o) * norm_w * silu(in_proj_z(x)))        (the norm per head, over Dv)
The state (the conv's last K-1 inputs and S) lives beside the KV cache (engine/layers/state.py). A
decode step is one native call where the library has it (engine/native/deltanet.py); a prompt runs
the delta rule in chunks (engine/layers/delta_rule.py). As transformers computes them, the conv, the
rule and the gated norm run in fp32 whatever the model's dtype.
Shapes: T tokens, D hidden, C = 2 Hk Dk + Hv Dv conv channels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..native.dense_linear import linear
from ..native import choice, deltanet as native_deltanet
from .norms import rms
from .delta_rule import run as run_delta_rule

NAMES = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")  # stacked into one input matrix, in this order


def shapes(d, p: str, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """The DeltaNet mixer's tensors in layer prefix p ("model.layers.0.")."""
    hk, dk, hv, dv, k = d.linear
    c, p = 2 * hk * dk + hv * dv, p + "linear_attn."
    if d.deltanet_inputs == "grouped":
        ins = {p + "in_proj_qkvz.weight": (c + hv * dv, d.hidden), p + "in_proj_ba.weight": (2 * hv, d.hidden)}
    else:
        ins = {p + "in_proj_qkv.weight": (c, d.hidden), p + "in_proj_z.weight": (hv * dv, d.hidden),
               p + "in_proj_b.weight": (hv, d.hidden), p + "in_proj_a.weight": (hv, d.hidden)}
    return {**ins, p + "conv1d.weight": (c, 1, k), p + "A_log": (hv,), p + "dt_bias": (hv,), p + "norm.weight": (dv,),
            p + "out_proj.weight": (d.hidden, hv * dv)}


def input_names(d) -> tuple[str, ...]:
    """The input projections as stored, in the order they stack (engine/model/forward.py)."""
    return ("in_proj_qkvz", "in_proj_ba") if d.deltanet_inputs == "grouped" else NAMES


def grouped_rows(d) -> torch.Tensor:
    """The row order that takes Qwen3-Next's stacked [in_proj_qkvz; in_proj_ba] (rows grouped per key
    head: q, k, then v and z of the hv/hk value heads it serves; then b and a alike) to [qkv; z; b; a]."""
    hk, dk, hv, dv, _ = d.linear
    r = hv // hk
    per = 2 * dk + 2 * r * dv  # rows of one key head's group in in_proj_qkvz
    group = torch.arange(hk)[:, None]

    def take(start, width, stride):
        return (group * stride + start + torch.arange(width)[None, :]).reshape(-1)
    ba = hk * per
    return torch.cat([take(0, dk, per), take(dk, dk, per), take(2 * dk, r * dv, per), take(2 * dk + r * dv, r * dv, per),
                      ba + take(0, r, 2 * r), ba + take(r, r, 2 * r)])


def check_config(raw: dict, field, error, pre: str) -> None:
    """The linear-attention fields: whole numbers in range, and value heads a multiple of key heads."""
    hk, hv = field("linear_num_key_heads"), field("linear_num_value_heads")
    field("linear_key_head_dim"), field("linear_value_head_dim")
    k = field("linear_conv_kernel_dim")
    if hv % hk:
        raise error(f"'{pre}linear_num_value_heads' ({hv}) must be a multiple of '{pre}linear_num_key_heads' ({hk})")
    if not 2 <= k <= 16:
        raise error(f"'{pre}linear_conv_kernel_dim' is {k}; Mixdesk accepts 2 to 16")


def build(w, p: str, layer: int, slot: int) -> "GatedDeltaNet":
    """Decoder layer `layer`'s DeltaNet from its tensors (w: the model's readers, engine/model/forward.py)."""
    d, q = w.dims, p + "linear_attn."
    if d.deltanet_inputs == "grouped":  # Qwen3-Next: its rows regrouped into Qwen3.5's order (a copy)
        w_in = torch.cat([w.dense(q + n + ".weight") for n in input_names(d)])[grouped_rows(d)]
    else:
        w_in = w.stack([w.matrix(q + n + ".weight") for n in NAMES])
    return GatedDeltaNet(slot, w_in, w.read(q + "conv1d.weight"), w.read(q + "A_log"), w.read(q + "dt_bias"),
                         w.read(q + "norm.weight"), w.matrix(q + "out_proj.weight"), d.linear, d.rms_eps,
                         d.tiled_heads)


class GatedDeltaNet:
    kind = "deltanet"

    def __init__(self, slot: int, w_in, conv_w: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                 norm_w: torch.Tensor, wo, linear_dims: tuple, eps: float, tiled: bool = False):
        self.slot = slot  # this layer's index in the cache's LinearState
        self.w_in, self.wo = w_in, wo  # [qkv; z; b; a] [C + 2 Hv Dv... see NAMES, D], and out_proj [D, Hv Dv]
        self.conv_w = conv_w.float().reshape(conv_w.shape[0], -1).contiguous()  # [C, K]
        self.a_log = a_log.float().contiguous()
        self.neg_a = -self.a_log.exp()  # -exp(A_log) [Hv]
        self.dt_bias, self.norm_w = dt_bias.float().contiguous(), norm_w.float().contiguous()
        self.hk, self.dk, self.hv, self.dv, self.k = linear_dims
        self.eps, self.tiled = eps, tiled

    def tensors(self) -> list[torch.Tensor]:
        return [self.w_in, self.wo, self.conv_w, self.neg_a, self.dt_bias, self.norm_w]

    def __call__(self, m, h: torch.Tensor, run) -> torch.Tensor:
        """h [T, D] (the normalised stream) -> [T, D], each sequence of the forward `run` from its own state."""
        proj = linear(h, self.w_in).float()  # [T, C + Hv Dv + 2 Hv]
        outs, row = [], 0
        for cache, pos, n in zip(run.caches, run.positions, run.counts):
            outs.append(self.sequence(proj[row:row + n], cache.state, pos))
            row += n
        o = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, Hv Dv]
        return linear(o.to(m.dtype), self.wo)

    def sequence(self, proj: torch.Tensor, state, pos: int) -> torch.Tensor:
        """One sequence's n tokens (proj [n, C + Hv Dv + 2 Hv], fp32) read from `state` at position pos
        (0: from nothing) -> o [n, Hv Dv] fp32; the state then stands after them."""
        hk, dk, hv, dv = self.hk, self.dk, self.hv, self.dv
        c = 2 * hk * dk + hv * dv
        conv, rec = state.conv[self.slot], state.rec[self.slot]  # [C, K-1], [Hv, Dk, Dv]
        if pos == 0:
            conv.zero_()
            rec.zero_()
        qkv, z, b, a = proj.split([c, hv * dv, hv, hv], dim=-1)
        n = proj.shape[0]
        if n == 1 and choice.deltanet_step(conv, rec):  # a decode step: one native call (engine/native/deltanet.py)
            return native_deltanet.step(hk, qkv[0], conv, self.conv_w, a[0], b[0], self.a_log, self.dt_bias, z[0],
                                        self.norm_w, self.eps, rec, tiled=self.tiled)[None]
        x = torch.cat([conv.t(), qkv])  # [K-1+n, C]: the conv's inputs, the state's first
        conv.copy_(x[n:].t())
        y = F.silu(F.conv1d(x.t()[None], self.conv_w[:, None, :], groups=c)[0].t())  # [n, C]
        q, k, v = y.split([hk * dk, hk * dk, hv * dv], dim=-1)
        q = _l2norm(q.reshape(n, hk, dk)) * dk ** -0.5
        k = _l2norm(k.reshape(n, hk, dk))
        if hv != hk and self.tiled:  # value head h uses key head h % hk (the order a GGUF stores them in)
            q, k = q.repeat(1, hv // hk, 1), k.repeat(1, hv // hk, 1)
        elif hv != hk:  # each key head serves hv/hk consecutive value heads
            q, k = q.repeat_interleave(hv // hk, dim=1), k.repeat_interleave(hv // hk, dim=1)
        g = self.neg_a * F.softplus(a + self.dt_bias)  # [n, Hv] (log of the decay)
        o = run_delta_rule(q, k, v.reshape(n, hv, dv), g, torch.sigmoid(b), rec)  # [n, Hv, Dv]
        o = rms(o, self.eps) * self.norm_w
        return (o * F.silu(z.reshape(n, hv, dv))).reshape(n, hv * dv)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # as transformers' (and FLA's) l2norm
