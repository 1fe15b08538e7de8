"""The Mixtral forward: dense weights on the accelerator, MoE blocks from `moe`, a static KV cache.

Shapes: T new tokens, P cached positions, D hidden, H query heads, G kv heads, Hd head dim, V vocab.
Compact on purpose: on a 2-core CPU, Python work per layer is a visible share of a decode step, so
q/k/v are one fused matmul and rope is applied to q and k together.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from . import native, offload
from .blockquant import NATIVE as BLOCK_TYPES, BlockQuant
from .checkpoint import Checkpoint, dense_shapes
from .dense_forms import embed_rows, stack
from .errors import ModelError
from .experts import Expert16, build_steps, materialise
from .kernels import linear, weight_problem
from .moe import MoEBlock
from .native import step as native_step
from .placement import Placement, Tier

ProgressFn = Callable[[int, int, str], None]


class KVCache:
    """Preallocated keys and values for every layer: k, v [L, G, ctx, Hd]. torch.empty leaves the
    pages untouched, so memory grows with the context actually used."""

    def __init__(self, layers: int, kv_heads: int, ctx: int, head_dim: int, dtype, device):
        self.k = torch.empty(layers, kv_heads, ctx, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.ctx = ctx
        self.tokens: list[int] = []  # the token ids whose keys/values are in the cache, in order

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class DenseLayer:
    def __init__(self, ln1, wqkv, wo, ln2, bqkv=None, q_norm=None, k_norm=None, bo=None, sinks=None,
                 window: int | None = None):
        self.ln1, self.wqkv, self.wo, self.ln2 = ln1, wqkv, wo, ln2
        # families that have them (engine/families): q/k/v and output biases, q/k norms, attention
        # sinks [H] (GPT-OSS, in attention's dtype)
        self.bqkv, self.q_norm, self.k_norm, self.bo, self.sinks = bqkv, q_norm, k_norm, bo, sinks
        self.window = window  # this layer's sliding window (None: full attention)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.ln1, self.wqkv, self.wo, self.ln2, self.bqkv, self.q_norm, self.k_norm, self.bo,
                            self.sinks) if t is not None]


class MoEModel:
    """The forward of every supported family (engine/families: Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE):
    what differs between them is data in `Dims` and the family adapter, read here."""

    def __init__(self, ckpt: Checkpoint, placement: Placement, accel: torch.device,
                 dtype: torch.dtype = torch.bfloat16, progress: ProgressFn | None = None,
                 offload_costs: offload.OffloadCosts | None = None, measure_offload: bool = True,
                 dense_blocks=None):
        """dense_blocks: a GGUF block type (e.g. Q8_0) the dense matrices of a 16-bit checkpoint are
        quantised to on the CPU (benchmarks only: the app keeps them 16-bit, as it keeps attention)."""
        d = self.dims = ckpt.dims
        if (placement.layers, placement.experts) != (d.layers, d.experts):
            raise ValueError(f"placement is {placement.layers}x{placement.experts}, model {d.layers}x{d.experts}")
        self.ckpt, self.accel, self.dtype = ckpt, accel, dtype
        # fp16 has the range of neither bf16 nor fp32: keep the residual stream (where outlier
        # activations live) in fp32 and use fp16 only for matmul inputs, which are normalised.
        self.residual_dtype = torch.float32 if dtype == torch.float16 else dtype
        # On the CPU, attention runs in fp32 (measured: torch's fp32 SDPA beats its fp16/bf16 kernels
        # several times over at decode); the KV cache is stored to match.
        self.attn_dtype = torch.float32 if accel.type == "cpu" else dtype
        # The KV cache holds keys and values in the model's dtype (as transformers does) and attention
        # widens them as it reads: a bf16 model's cache takes half the RAM of an fp32 one (Mixtral at
        # 32K tokens: 4.3 GB, not 8.6). Decode speed measured the same within noise after 896-token
        # prompts (benchmarks/concurrent_streams.py --prompt 896): attention is bound by its
        # arithmetic there, not by the cache's bytes.
        self.kv_dtype = dtype
        self.placement = placement
        total = d.layers * (d.experts + 1) + 1
        step = 0

        def tick(what: str):
            nonlocal step
            step += 1
            if progress:
                progress(step, total, what)

        def dense(name: str) -> torch.Tensor:
            t = ckpt.read(name)
            why = weight_problem(t, dtype)
            if why:
                raise ModelError(ckpt.where[name].path, f"tensor '{name}' {why}")
            return t.to(device=accel, dtype=dtype)

        # A GGUF file's matrices stay in its own blocks where the native kernels run them (the CPU,
        # below fp32: fp32 is the reference precision); elsewhere they are its exact dequantisation.
        self.file_dense = (getattr(ckpt, "is_gguf", False) and accel.type == "cpu" and native.available()
                           and dtype != torch.float32)
        shapes = dense_shapes(d)

        def matrix(name: str):
            """A matrix the forward multiplies: a tensor, or the file's blocks (engine/dense_forms.py)."""
            if self.file_dense and ckpt.tensor_type(name) in BLOCK_TYPES:
                return BlockQuant.from_raw(ckpt.tensor_type(name), ckpt.read_raw(name), shapes[name])
            if dense_blocks is not None and accel.type == "cpu" and not self.file_dense:
                return BlockQuant.quantize(dense(name), dense_blocks)
            return dense(name)

        self.embed = matrix("model.embed_tokens.weight")  # [V, D]
        self.norm = dense("model.norm.weight")
        self.lm_head = self.embed if d.tie_embeddings else matrix("lm_head.weight")
        tick("dense weights")
        self.layers: list[DenseLayer] = []
        self.moe: list[MoEBlock] = []
        fam = d.adapter
        for l in range(d.layers):
            p = f"model.layers.{l}."
            wqkv = stack([matrix(p + f"self_attn.{n}_proj.weight") for n in "qkv"])  # [(H+2G)Hd, D]
            bqkv = torch.cat([dense(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if d.qkv_bias else None
            qn, kn = ((dense(p + "self_attn.q_norm.weight").to(self.attn_dtype),  # applied in attention's dtype
                       dense(p + "self_attn.k_norm.weight").to(self.attn_dtype)) if d.qk_norm else (None, None))
            self.layers.append(DenseLayer(
                dense(p + "input_layernorm.weight"), wqkv, matrix(p + "self_attn.o_proj.weight"),
                dense(p + "post_attention_layernorm.weight"), bqkv, qn, kn,
                dense(p + "self_attn.o_proj.bias") if d.o_bias else None,
                dense(p + "self_attn.sinks").to(self.attn_dtype) if d.attn_sinks else None, d.window(l)))
            tick(f"layer {l} attention")
            experts = []
            for e in range(d.experts):
                experts.append(materialise(ckpt, l, e, placement[l, e], accel, dtype))
                tick(f"layer {l} expert {e}")
            shared = None
            if d.shared_ffn:  # always active: it stays with the dense weights, on the accelerator
                w13 = torch.cat([dense(fam.shared_key(l, "w1")), dense(fam.shared_key(l, "w3"))])  # [2I', D]
                shared = (Expert16(Tier.GPU16, w13.contiguous(), dense(fam.shared_key(l, "w2")).contiguous()),
                          dense(fam.shared_key(l, "gate")))
            self.moe.append(MoEBlock(dense(fam.router_key(l)), experts, d.top_k, accel, norm_topk=d.norm_topk,
                                     shared=shared, router_kind=d.router_kind,
                                     gate_bias=dense(fam.router_key(l, bias=True)) if d.router_bias else None))
        if offload_costs is None and measure_offload and accel.type == "cuda":
            probe = self._any_cpu_expert() or materialise(ckpt, 0, 0, Tier.CPU16, accel, dtype)
            offload_costs = offload.measure(probe, accel)
        self.set_offload(offload_costs)
        self.inv_freq, self.rope_scale = _rope(ckpt.config, d.head_dim)
        self._rope_cache: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.layer_inputs: list | None = None  # calibration: each layer's input appended when set
        # the whole decode step in one native call, where the model is on the CPU (engine/native)
        self.native_step = native_step.DecodeStep(self) if (
            native.available() and native_step.DecodeStep.supported(self)) else None

    # ---- re-placement ----
    def build(self, layer: int, expert: int, tier: Tier, threads: int | None = None):
        """Expert (layer, expert)'s form in `tier`, derived from the checkpoint. Touches nothing the
        forward reads, so any thread may call it (threads=1: without the native library's lock)."""
        return materialise(self.ckpt, layer, expert, tier, self.accel, self.dtype, threads)

    def build_steps(self, layer: int, expert: int, tier: Tier):
        """build as a generator of short steps (experts.build_steps), for the engine thread."""
        return build_steps(self.ckpt, layer, expert, tier, self.accel, self.dtype)

    def install(self, layer: int, expert: int, form) -> object:
        """Swap a built form in; returns the old one (freed once nothing refers to it). Call between
        forward passes (a safe point), on the thread that runs them."""
        old = self.moe[layer].experts[expert]
        self.moe[layer].set_expert(expert, form)
        self.placement = self.placement.with_tier(layer, expert, form.tier)
        return old

    def move(self, layer: int, expert: int, tier: Tier) -> int:
        """Build expert (layer, expert) in `tier` and swap it in; returns the bytes of the new form."""
        new = self.build(layer, expert, tier)
        self.install(layer, expert, new)
        return new.nbytes

    def apply(self, placement: Placement) -> int:
        """Move every expert whose tier differs (accelerator evictions first); returns bytes built."""
        return sum(self.move(m.layer, m.expert, m.new) for m in self.placement.diff(placement))

    def _any_cpu_expert(self) -> Expert16 | None:
        for block in self.moe:
            for ex in block.experts:
                if not ex.tier.on_accelerator and ex.copyable:
                    return ex
        return None

    def set_offload(self, costs: offload.OffloadCosts | None) -> None:
        self.offload = costs
        for block in self.moe:
            block.offload = costs

    # ---- memory ----
    def expert_bytes(self) -> dict[str, int]:
        """Resident bytes of experts, by device kind ('accelerator' / 'host')."""
        out = {"accelerator": 0, "host": 0}
        for block in self.moe:
            for ex in block.experts:
                out["accelerator" if ex.tier.on_accelerator else "host"] += ex.nbytes
        return out

    def dense_bytes(self) -> int:
        ts = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            ts += layer.tensors()
        ts += [b.gate for b in self.moe]
        ts += [t for b in self.moe if b.shared for t in (b.shared[0].w13, b.shared[0].w2, b.shared[1])]
        return sum(t.nbytes for t in ts)

    def dense_params(self) -> int:
        """Weights outside the experts (a count, whatever format each matrix is in)."""
        return sum(math.prod(s) for s in dense_shapes(self.dims).values())

    @contextmanager
    def recording(self) -> Iterator[list]:
        """While open, every MoE block appends (inputs, routes, route weights, residual stream) to
        the yielded list on each call (calibration and cost measurement)."""
        records: list = []
        for block in self.moe:
            block.record = records
        try:
            yield records
        finally:
            for block in self.moe:
                block.record = block.residual = None

    def new_cache(self, ctx: int) -> KVCache:
        d = self.dims
        return KVCache(d.layers, d.kv_heads, ctx, d.head_dim, self.kv_dtype, self.accel)

    # ---- forward ----
    def rope_tables(self, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope_cache is None or self._rope_cache[0] < upto:
            n = max(upto, 256, 2 * (self._rope_cache[0] if self._rope_cache else 0))
            pos = torch.arange(n, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None, :]  # [n, Hd/2]
            emb = torch.cat([freqs, freqs], dim=-1)  # [n, Hd]
            cos = (emb.cos() * self.rope_scale).to(self.attn_dtype)
            sin = (emb.sin() * self.rope_scale).to(self.attn_dtype)
            half = emb.shape[-1] // 2
            # rotate_half(x) * sin == roll(x, half) * [-sin_lo, sin_hi]: one op instead of three
            sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
            self._rope_cache = (n, cos.to(self.accel)[:, None, :], sin_signed.to(self.accel)[:, None, :])
        return self._rope_cache[1], self._rope_cache[2]

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.dims.rms_eps)
        return w * h.to(w.dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, pos: int, all_logits: bool = False,
                start: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
        """ids [T] long at positions pos..pos+T-1; fills the cache; returns logits [T or 1, V] fp32.
        start=(l, x): begin at layer l with residual stream x (recorded in `layer_inputs` by an
        earlier pass over the same ids)."""
        d = self.dims
        T = ids.shape[0]
        H, G, Hd = d.heads, d.kv_heads, d.head_dim
        end = pos + T
        if end > cache.ctx:
            raise ValueError(f"position {end} exceeds the cache ({cache.ctx})")
        if T == 1 and native.available():
            native.quiet_torch.enter()  # a decode step's torch ops are small: torch stays at one thread
            if start is None and self.native_step is not None and self.native_step.ready():
                return self.native_step(ids.to(self.accel), cache, pos)  # [1, V]: every layer in one call
        else:
            native.quiet_torch.leave()  # a prefill's GEMMs get torch's threads back
        cos_t, sin_t = self.rope_tables(end)
        cos, sin = cos_t[pos:end], sin_t[pos:end]  # [T, 1, Hd]
        masks = {w: self._mask(T, pos, w) for w in {layer.window for layer in self.layers}}
        if start is None:
            first, x = 0, embed_rows(self.embed, ids.to(self.accel)).to(self.residual_dtype)  # [T, D]
        else:  # calibration: resume at a layer from its recorded input (earlier layers unchanged)
            first, x = start
        for l in range(first, len(self.layers)):
            layer = self.layers[l]
            if self.layer_inputs is not None:
                self.layer_inputs.append(x)
            qk, v = self._qkv(x, layer, cos, sin)  # [T, H+G, Hd], [T, G, Hd]
            cache.k[l, :, pos:end] = qk[:, H:].transpose(0, 1)
            cache.v[l, :, pos:end] = v.transpose(0, 1)
            q = qk[:, :H].transpose(0, 1)  # [H, T, Hd]
            mask, causal = masks[layer.window]
            k, vv = (t.to(self.attn_dtype) for t in (cache.k[l, :, :end], cache.v[l, :, :end]))
            if layer.sinks is not None:
                att = self._attend_with_sinks(q, k, vv, mask, layer.sinks)
            else:
                att = F.scaled_dot_product_attention(
                    q[None], k[None], vv[None], attn_mask=mask, is_causal=causal, enable_gqa=G != H)[0]  # [H, T, Hd]
            o = linear(att.transpose(0, 1).reshape(T, H * Hd).to(self.dtype), layer.wo)
            x = x + (o if layer.bo is None else o + layer.bo)
            block = self.moe[l]
            if block.record is not None:
                block.residual = x  # calibration measures perturbations relative to the stream
            x = x + block(self._rms(x, layer.ln2))
        if not all_logits:
            x = x[-1:]
        return linear(self._rms(x, self.norm), self.lm_head).float()  # [T or 1, V]

    @torch.inference_mode()
    def forward_batch(self, ids: torch.Tensor, caches: list[KVCache], positions: list[int]) -> torch.Tensor:
        """One decode step for B sequences at once: token ids[b] at positions[b] of caches[b].
        Returns logits [B, V] fp32. The dense matmuls and the MoE block take the B tokens together
        (each layer's weights, and each expert any token chose, are read once); attention runs per
        sequence over its own cache. The same values as B separate forward() calls, up to the
        summation order of batched matmuls."""
        d = self.dims
        B, H, G, Hd = ids.shape[0], d.heads, d.kv_heads, d.head_dim
        for c, p in zip(caches, positions):
            if p + 1 > c.ctx:
                raise ValueError(f"position {p + 1} exceeds the cache ({c.ctx})")
        if native.available():
            native.quiet_torch.enter()  # small ops: torch stays at one thread, as in forward's decode
            if self.native_step is not None and self.native_step.ready():
                out = self.native_step.batch(ids, caches, positions)  # every layer, all B, in one call
                if out is not None:
                    return out
        cos_t, sin_t = self.rope_tables(max(positions) + 1)
        at = torch.tensor(positions, device=self.accel)
        cos, sin = cos_t[at], sin_t[at]  # [B, 1, Hd]
        x = embed_rows(self.embed, ids.to(self.accel)).to(self.residual_dtype)  # [B, D]
        for l, layer in enumerate(self.layers):
            qk, v = self._qkv(x, layer, cos, sin)  # [B, H+G, Hd], [B, G, Hd]
            att = []
            for b, (c, p) in enumerate(zip(caches, positions)):
                c.k[l, :, p] = qk[b, H:]
                c.v[l, :, p] = v[b]
                first = max(0, p + 1 - layer.window) if layer.window else 0
                k, vv = (t.to(self.attn_dtype) for t in (c.k[l, :, first:p + 1], c.v[l, :, first:p + 1]))
                q = qk[b, :H, None]  # [H, 1, Hd]
                if layer.sinks is not None:
                    att.append(self._attend_with_sinks(q, k, vv, None, layer.sinks)[:, 0])
                else:
                    att.append(F.scaled_dot_product_attention(q[None], k[None], vv[None], enable_gqa=G != H)[0, :, 0])
            o = linear(torch.stack(att).reshape(B, H * Hd).to(self.dtype), layer.wo)  # [B, D]
            x = x + (o if layer.bo is None else o + layer.bo)
            x = x + self.moe[l](self._rms(x, layer.ln2))
        return linear(self._rms(x, self.norm), self.lm_head).float()  # [B, V]

    def _qkv(self, x: torch.Tensor, layer: DenseLayer, cos: torch.Tensor, sin: torch.Tensor):
        """x [T, D] -> q and k with rope [T, H+G, Hd], and v [T, G, Hd], in attention's dtype (the
        family's biases, q/k norms and clip applied)."""
        d = self.dims
        T, H, G, Hd = x.shape[0], d.heads, d.kv_heads, d.head_dim
        qkv = linear(self._rms(x, layer.ln1), layer.wqkv)  # [T, (H+2G)Hd]
        if layer.bqkv is not None:
            qkv = qkv + layer.bqkv
        qkv = qkv.to(self.attn_dtype)
        if layer.q_norm is not None:
            qkv = self._qk_norm(qkv, layer)
        if d.clip_qkv is not None:
            qkv = qkv.clamp(-d.clip_qkv, d.clip_qkv)
        qk = qkv[:, : (H + G) * Hd].view(T, H + G, Hd)
        qk = qk * cos + qk.roll(Hd // 2, dims=-1) * sin  # rope on q and k at once
        return qk, qkv[:, (H + G) * Hd:].view(T, G, Hd)

    def _qk_norm(self, qkv: torch.Tensor, layer: DenseLayer) -> torch.Tensor:
        """RMSNorm of q and of k, per head (Qwen3-MoE) or over all heads at once (OLMoE); v unchanged."""
        d = self.dims
        T, H, G, Hd = qkv.shape[0], d.heads, d.kv_heads, d.head_dim
        q, k, v = qkv.split([H * Hd, G * Hd, G * Hd], dim=-1)
        if d.qk_norm == "head":
            q = self._rms(q.reshape(T, H, Hd), layer.q_norm).reshape(T, H * Hd)
            k = self._rms(k.reshape(T, G, Hd), layer.k_norm).reshape(T, G * Hd)
        else:
            q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
        return torch.cat([q, k, v], dim=-1)

    def _attend_with_sinks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
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

    def _mask(self, T: int, pos: int, win: int | None) -> tuple[torch.Tensor | None, bool]:
        """Attention mask for T queries at pos.. over keys 0..pos+T-1 with a sliding window `win`
        (None + is_causal when we can)."""
        end = pos + T
        if (win is None or end <= win) and (T == 1 or pos == 0):
            return None, T > 1
        q = torch.arange(pos, end, device=self.accel)[:, None]
        k = torch.arange(end, device=self.accel)[None, :]
        m = k <= q
        if win is not None:
            m &= (q - k) < win
        return m, False


def _rope(config, head_dim: int) -> tuple[torch.Tensor, float]:
    rp = getattr(config, "rope_parameters", None) or {}
    kind = rp.get("rope_type", "default")
    if kind == "default":
        theta = float(rp.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)), 1.0
    # scaled variants (llama3, yarn, ...) come from transformers' own tables
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.float(), float(scale)
