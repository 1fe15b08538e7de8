"""The attention mixer: grouped-query attention over a KV cache, with what each family adds (q/k/v and
output biases, q/k RMSNorms per head or over all heads, value clipping, attention sinks, a sliding
window per layer, a per-head output gate, rope on part of each head).

Shapes: T new tokens, D hidden, H query heads, G kv heads, Hd head dim, R rotary dims (R <= Hd).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..native.dense_linear import linear
from ..native import flash
from .norms import rms


def shapes(d, p: str, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """The attention mixer's tensors in layer prefix p ("model.layers.3.")."""
    g, hd, k_is_v, _ = d.attn_of(layer)
    q, kv = d.heads * hd, g * hd
    s = {p + "self_attn.q_proj.weight": (2 * q if d.attn_gate else q, d.hidden),
         p + "self_attn.k_proj.weight": (kv, d.hidden), p + "self_attn.o_proj.weight": (d.hidden, q)}
    if not k_is_v:
        s[p + "self_attn.v_proj.weight"] = (kv, d.hidden)
    if d.o_bias:
        s[p + "self_attn.o_proj.bias"] = (d.hidden,)
    if d.attn_sinks:
        s[p + "self_attn.sinks"] = (d.heads,)
    if d.qkv_bias:
        s[p + "self_attn.q_proj.bias"], s[p + "self_attn.k_proj.bias"], s[p + "self_attn.v_proj.bias"] = (q,), (kv,), (kv,)
    if d.qk_norm:
        head = d.qk_norm == "head"
        s[p + "self_attn.q_norm.weight"] = (hd,) if head else (q,)
        s[p + "self_attn.k_norm.weight"] = (hd,) if head else (kv,)
    return s


def build(w, p: str, layer: int, slot: int) -> "Attention":
    """Decoder layer `layer`'s attention from its tensors (w: the model's readers, engine/model/forward.py)."""
    d = w.dims
    g, hd, k_is_v, rope = d.attn_of(layer)
    wqkv = w.stack([w.matrix(p + f"self_attn.{n}_proj.weight") for n in ("qk" if k_is_v else "qkv")])  # [(H(2)+2G)Hd, D]
    bqkv = torch.cat([w.dense(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if d.qkv_bias else None
    qn, kn = ((w.norm(p + "self_attn.q_norm.weight", w.attn_dtype),  # applied in attention's dtype
               w.norm(p + "self_attn.k_norm.weight", w.attn_dtype)) if d.qk_norm else (None, None))
    return Attention(slot, wqkv, w.matrix(p + "self_attn.o_proj.weight"), bqkv, qn, kn,
                     w.dense(p + "self_attn.o_proj.bias") if d.o_bias else None,
                     w.dense(p + "self_attn.sinks").to(w.attn_dtype) if d.attn_sinks else None, d.window(layer),
                     g, hd, k_is_v, rope)


class Attention:
    kind = "attention"

    def __init__(self, slot: int, wqkv, wo, bqkv=None, q_norm=None, k_norm=None, bo=None, sinks=None,
                 window: int | None = None, kv_heads: int | None = None, head_dim: int | None = None,
                 k_is_v: bool = False, rope: str | None = None):
        # this layer's own shape where layers differ (Gemma 4: sliding and global layers), else the model's
        self.kv_heads, self.head_dim, self.k_is_v, self.rope = kv_heads, head_dim, k_is_v, rope
        self.slot = slot  # this layer's index in the KV cache (layers of other mixers keep no keys)
        self.wqkv, self.wo = wqkv, wo  # [q (and its gate); k; v] as one matrix [(H(2)+2G)Hd, D], and [D, H Hd]
        # families that have them (engine/families): q/k/v and output biases, q/k norms, attention
        # sinks [H] (GPT-OSS, in attention's dtype)
        self.bqkv, self.q_norm, self.k_norm, self.bo, self.sinks = bqkv, q_norm, k_norm, bo, sinks
        self.window = window  # this layer's sliding window (None: full attention)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.wqkv, self.wo, self.bqkv, self.q_norm, self.k_norm, self.bo, self.sinks)
                if t is not None]

    def __call__(self, m, h: torch.Tensor, run) -> torch.Tensor:
        """h [T, D] (the normalised stream) -> the mixer's output [T, D] for the forward `run`
        (model.Run: its caches, positions, token counts, rope rows and spans)."""
        qkv, gate = self._project(m, h)  # [T, (H+2G)Hd] in attention's dtype, and the gate [T, H Hd] or None
        cos, sin = run.rope[self.rope] if self.rope is not None else (run.cos, run.sin)
        qk, v = self._rope_qk(m, qkv, cos, sin)  # [T, H+G, Hd], [T, G, Hd]
        att, row = [], 0
        for c, p, n, span in zip(run.caches, run.positions, run.counts, run.spans):
            att.append(self._attend(m, qk[row:row + n], v[row:row + n], c, p, span[self.window]))
            row += n
        a = att[0] if len(att) == 1 else torch.cat(att)  # [T, H Hd]
        if gate is not None:
            a = a * torch.sigmoid(gate)
        o = linear(a.to(m.dtype), self.wo)  # [T, D]
        return o if self.bo is None else o + self.bo

    def _project(self, m, h: torch.Tensor):
        d = m.dims
        qkv = linear(h, self.wqkv)
        if self.bqkv is not None:
            qkv = qkv + self.bqkv
        qkv, gate = qkv.to(m.attn_dtype), None
        if d.attn_gate:
            qkv, gate = _split_gate(qkv, d)
        if self.k_is_v:  # no v_proj: the values are the keys as projected (before the k norm and rope)
            qkv = torch.cat([qkv, qkv[:, d.heads * self._hd(d):]], dim=-1)
        if self.q_norm is not None:
            qkv = self._qk_norm(m, qkv)
        if d.clip_qkv is not None:
            qkv = qkv.clamp(-d.clip_qkv, d.clip_qkv)
        if d.v_norm:  # values RMS-normalised per head, without a weight (Gemma 4)
            T, Hd, G = qkv.shape[0], self._hd(d), self._g(d)
            v = qkv[:, -G * Hd:].reshape(T, G, Hd)
            v = rms(v, d.rms_eps)
            qkv = torch.cat([qkv[:, :-G * Hd], v.reshape(T, G * Hd)], dim=-1)
        return qkv, gate

    def _hd(self, d) -> int:
        return self.head_dim or d.head_dim

    def _g(self, d) -> int:
        return self.kv_heads or d.kv_heads

    def _rope_qk(self, m, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """qkv [T, (H+2G)Hd] -> q and k with rope [T, H+G, Hd], and v [T, G, Hd]."""
        d = m.dims
        T, H, G, Hd = qkv.shape[0], d.heads, self._g(d), self._hd(d)
        R = Hd if self.rope is not None else d.rotary  # a keyed rope table spans the whole head
        qk = qkv[:, : (H + G) * Hd].view(T, H + G, Hd)
        if R == Hd:
            qk = qk * cos + qk.roll(Hd // 2, dims=-1) * sin  # rope on q and k at once
        else:  # rope on the first R dims of each head, the rest as they are
            r = qk[..., :R]
            qk = torch.cat([r * cos + r.roll(R // 2, dims=-1) * sin, qk[..., R:]], dim=-1)
        return qk, qkv[:, (H + G) * Hd:].view(T, G, Hd)

    def _qk_norm(self, m, qkv: torch.Tensor) -> torch.Tensor:
        """RMSNorm of q and of k, per head (Qwen3-MoE) or over all heads at once (OLMoE); v unchanged."""
        d = m.dims
        T, H, G, Hd = qkv.shape[0], d.heads, self._g(d), self._hd(d)
        q, k, v = qkv.split([H * Hd, G * Hd, G * Hd], dim=-1)
        if d.qk_norm == "head":
            q = m._rms(q.reshape(T, H, Hd), self.q_norm).reshape(T, H * Hd)
            k = m._rms(k.reshape(T, G, Hd), self.k_norm).reshape(T, G * Hd)
        else:
            q, k = m._rms(q, self.q_norm), m._rms(k, self.k_norm)
        return torch.cat([q, k, v], dim=-1)

    def _attend(self, m, qk: torch.Tensor, v: torch.Tensor, cache, pos: int, span: tuple) -> torch.Tensor:
        """One sequence's n new tokens at pos..: their keys and values (qk [n, H+G, Hd], v [n, G, Hd])
        into this layer's slot of its cache, then their attention over the keys they see (span:
        `span`) -> [n, H*Hd]."""
        H, G, n, l = m.dims.heads, self._g(m.dims), qk.shape[0], self.slot
        end = pos + n
        cache.store(l, pos, qk[:, H:].transpose(0, 1), v.transpose(0, 1))  # (rounded to the cache's format)
        first, mask, causal = span
        if self.sinks is None and n >= flash.MIN_TOKENS and qk.device.type == "cpu":
            # as stored (flash.c reads bf16 and fp32 rows), or an 8-bit cache's rows widened to fp32 once
            # a call: flash packs its keys a call anyway, and a dequantised value is exact in fp32
            k, vv = cache.span(l, first, end)
            att = flash.attend(qk[:, :H], k, vv, pos - first, self.window, m.dims.attn_scale,
                               bf16_values=k.dtype == torch.bfloat16)  # weights as precise as the values
            if att is not None:
                return att
        k, vv = cache.span(l, first, end, m.attn_dtype)
        q = qk[:, :H].transpose(0, 1)  # [H, n, Hd]
        if self.sinks is not None:
            att = _attend_with_sinks(q, k, vv, mask, self.sinks)
        else:
            att = F.scaled_dot_product_attention(q[None], k[None], vv[None], attn_mask=mask, is_causal=causal,
                                                 enable_gqa=G != H, scale=m.dims.attn_scale)[0]  # [H, n, Hd]
        return att.transpose(0, 1).reshape(n, -1)


def _split_gate(qkv: torch.Tensor, d) -> tuple[torch.Tensor, torch.Tensor]:
    """q_proj's rows hold, per head, Hd query rows then Hd gate rows: -> [q; k; v] [T, (H+2G)Hd] and the
    gate [T, H Hd]."""
    T, H, Hd = qkv.shape[0], d.heads, d.head_dim
    qg = qkv[:, : 2 * H * Hd].view(T, H, 2 * Hd)
    q, gate = qg[..., :Hd].reshape(T, H * Hd), qg[..., Hd:].reshape(T, H * Hd)
    return torch.cat([q, qkv[:, 2 * H * Hd:]], dim=-1), gate


def span(n: int, pos: int, win: int | None, device) -> tuple[int, torch.Tensor | None, bool]:
    """The keys first..pos+n-1 that n queries at pos.. see under a sliding window `win` (a query at q
    sees keys q-win+1..q), and the mask over them: (first, mask [n, keys] bool, is_causal), the
    mask None where SDPA needs none (one query sees every key from first on; a prompt from 0)."""
    end = pos + n
    first = max(0, pos - win + 1) if win is not None else 0
    if n == 1 or (pos == 0 and (win is None or end <= win)):
        return first, None, n > 1
    q = torch.arange(pos, end, device=device)[:, None]
    k = torch.arange(first, end, device=device)[None, :]
    mask = k <= q
    if win is not None:
        mask &= (q - k) < win
    return first, mask, False


def _attend_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       sinks: torch.Tensor) -> torch.Tensor:
    """Attention whose softmax has one more logit per head, the sink, that weighs no value
    (GPT-OSS). q [H, T, Hd], k/v [G, S, Hd], mask [T, S] bool or None (plain causal) -> [H, T, Hd]."""
    H, T, Hd = q.shape
    G, S = k.shape[0], k.shape[1]
    qg = q.reshape(G, (H // G) * T, Hd)  # query head h uses kv head h // (H/G), as repeat_kv does
    logits = torch.bmm(qg, k.transpose(1, 2)).view(H, T, S) * Hd ** -0.5
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    logits = logits.masked_fill(~mask, float("-inf"))
    full = torch.cat([logits, sinks.view(H, 1, 1).expand(H, T, 1)], dim=-1)
    probs = torch.softmax(full.float(), dim=-1)[..., :S].to(v.dtype)  # the sink's share is dropped
    return torch.bmm(probs.view(G, (H // G) * T, S), v).view(H, T, Hd)
