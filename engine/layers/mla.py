"""Multi-head latent attention (MLA: DeepSeek-V2/V3, GLM-4.7-Flash): keys and values come from one
latent per token, so the cache holds that latent (kv_lora_rank wide, RMS-normalised) and one shared
rope key (qk_rope_head_dim wide) instead of every head's keys and values.

Per token (H heads; N, P, V the no-rope, rope and value dims of a head; R the latent's width):
  q = q_b(RMSNorm(q_a(x)))  (or q_proj(x) without a q rank)  -> [H, N + P]: q_nope, q_rot
  [latent; k_rot] = kv_a(x)  -> latent = RMSNorm(latent) [R], k_rot [P] (one for all heads)
  k_h = [W_k[h] latent; k_rot],  v_h = W_v[h] latent        (kv_b = [W_k; W_v] per head: [H (N + V), R])
Computed absorbed, as llama.cpp and vLLM decode MLA: q_nope W_k[h] is a query in the latent space, so
attention runs over the cached [latent; k_rot] rows directly (one SDPA call whose heads share one
"key head" of R + P dims and whose values are the latents), and W_v[h] applies to each head's
weighted latent afterwards. Nothing per head is ever expanded over the context: a decode step reads
R + P numbers a cached token. Rope is DeepSeek's interleaved pairs when rope_interleave is set.
Shapes: T tokens, D hidden, S cached positions.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..native.dense_linear import linear


def shapes(d, p: str, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """The MLA mixer's tensors in layer prefix p."""
    qr, R, N, P, V = d.mla
    H, p = d.heads, p + "self_attn."
    s = {p + "kv_a_proj_with_mqa.weight": (R + P, d.hidden), p + "kv_a_layernorm.weight": (R,),
         p + "kv_b_proj.weight": (H * (N + V), R), p + "o_proj.weight": (d.hidden, H * V)}
    if qr:
        s.update({p + "q_a_proj.weight": (qr, d.hidden), p + "q_a_layernorm.weight": (qr,),
                  p + "q_b_proj.weight": (H * (N + P), qr)})
    else:
        s[p + "q_proj.weight"] = (H * (N + P), d.hidden)
    if d.qkv_bias:
        s[p + "kv_a_proj_with_mqa.bias"] = (R + P,)
        if qr:
            s[p + "q_a_proj.bias"] = (qr,)
    return s


def check_config(raw: dict, field, error, pre: str, hidden: int) -> None:
    """MLA's ranks and head dims: whole numbers, ranks below the hidden size, an even rope width."""
    kv = field("kv_lora_rank")
    q = field("q_lora_rank", required=False, lo=1)
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        field(name)
    for name, rank in (("kv_lora_rank", kv), ("q_lora_rank", q)):
        if rank is not None and rank >= hidden:
            raise error(f"'{pre}{name}' ({rank}) must be smaller than 'hidden_size' ({hidden}): a latent "
                        "wider than the stream it compresses")
    if raw["qk_rope_head_dim"] % 2:
        raise error(f"'{pre}qk_rope_head_dim' ({raw['qk_rope_head_dim']}) must be even (rope rotates pairs)")


def softmax_scale(cfg, d) -> float:
    """1/sqrt(N + P), times yarn's mscale^2 where the rope is scaled with mscale_all_dim (as DeepSeek)."""
    _, _, N, P, _ = d.mla
    scale = (N + P) ** -0.5
    rp = getattr(cfg, "rope_parameters", None) or {}
    if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim") and rp.get("factor", 1) > 1:
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0
        scale *= m * m
    return scale


def build(w, p: str, layer: int, slot: int) -> "LatentAttention":
    d, q = w.dims, p + "self_attn."
    qr, R, N, P, V = d.mla
    bias = (lambda n: w.dense(q + n + ".bias")) if d.qkv_bias else (lambda n: None)
    if qr:
        wq = (w.matrix(q + "q_a_proj.weight"), bias("q_a_proj"), w.norm(q + "q_a_layernorm.weight"),
              w.matrix(q + "q_b_proj.weight"))
    else:
        wq = (w.matrix(q + "q_proj.weight"), None, None, None)
    kv_b = w.dense(q + "kv_b_proj.weight").view(d.heads, N + V, R)
    return LatentAttention(slot, wq, w.matrix(q + "kv_a_proj_with_mqa.weight"), bias("kv_a_proj_with_mqa"),
                           w.norm(q + "kv_a_layernorm.weight"), kv_b[:, :N].to(w.attn_dtype).contiguous(),
                           kv_b[:, N:].to(w.attn_dtype).contiguous(), w.matrix(q + "o_proj.weight"),
                           softmax_scale(w.config, d))


class LatentAttention:
    kind = "mla"
    window = None

    def __init__(self, slot: int, wq: tuple, w_kva, b_kva, kv_norm, w_k: torch.Tensor, w_v: torch.Tensor, wo,
                 scale: float):
        self.slot = slot  # this layer's index in the KV cache (which holds [latent; k_rot] rows here)
        self.wq, self.w_kva, self.b_kva, self.kv_norm = wq, w_kva, b_kva, kv_norm
        self.w_k, self.w_v, self.wo = w_k, w_v, wo  # [H, N, R], [H, V, R] (attention's dtype), [D, H V]
        self.scale = scale

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (*self.wq, self.w_kva, self.b_kva, self.kv_norm, self.w_k, self.w_v, self.wo)
                if t is not None]

    def __call__(self, m, h: torch.Tensor, run) -> torch.Tensor:
        d = m.dims
        _, R, N, P, V = d.mla
        T, H = h.shape[0], d.heads
        w_a, b_a, q_norm, w_b = self.wq
        q = linear(h, w_a)
        if w_b is not None:
            q = linear(m._rms(q if b_a is None else q + b_a, q_norm), w_b)
        q = q.to(m.attn_dtype).view(T, H, N + P)
        kv = linear(h, self.w_kva)
        kv = (kv if self.b_kva is None else kv + self.b_kva).to(m.attn_dtype)  # [T, R + P]
        latent = m._rms(kv[:, :R], self.kv_norm).to(m.attn_dtype)
        q_rot, k_rot = _rope_pairs(q[..., N:], kv[:, None, R:], run.cos, run.sin, m.dims.rope_interleave)
        q_lat = torch.einsum("thn,hnr->thr", q[..., :N], self.w_k)  # the query in the latent space [T, H, R]
        qq = torch.cat([q_lat, q_rot], dim=-1)  # [T, H, R + P]
        rows = torch.cat([latent, k_rot[:, 0]], dim=-1)  # [T, R + P]: what the cache keeps
        out, at = [], 0
        for c, pos, n in zip(run.caches, run.positions, run.counts):
            c.store(self.slot, pos, rows[None, at:at + n])
            keys = c.span(self.slot, 0, pos + n, m.attn_dtype)[0]  # [1, S, R + P]
            o = F.scaled_dot_product_attention(qq[at:at + n].transpose(0, 1)[None], keys[None], keys[None, :, :, :R],
                                               is_causal=n > 1 and pos == 0, scale=self.scale,
                                               attn_mask=_mask(n, pos, h.device), enable_gqa=True)[0]  # [H, n, R]
            out.append(torch.einsum("hnr,hvr->nhv", o, self.w_v).reshape(n, H * V))
            at += n
        o = out[0] if len(out) == 1 else torch.cat(out)
        return linear(o.to(m.dtype), self.wo)


def _mask(n: int, pos: int, device) -> torch.Tensor | None:
    """Queries at pos.. see keys 0..their own position (None where SDPA's is_causal or no mask does)."""
    if n == 1 or pos == 0:
        return None
    q = torch.arange(pos, pos + n, device=device)[:, None]
    return torch.arange(pos + n, device=device)[None, :] <= q


def _rope_pairs(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool):
    """Rope on q [T, H, P] and k [T, 1, P]; cos/sin [T, 1, P] are the model's tables (angles repeated in
    two halves, sin signed for rotate-half). Interleaved: dims (2i, 2i+1) form pair i, and the result
    lists the pairs' first members, then their second (as transformers' apply_rotary_pos_emb_interleave)."""
    if not interleave:
        P = q.shape[-1]
        return q * cos + q.roll(P // 2, dims=-1) * sin, k * cos + k.roll(P // 2, dims=-1) * sin
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], -sin[..., :half]  # the model's first half of sin is -sin (rotate_half's sign)

    def turn(x):
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    return turn(q), turn(k)
