"""The forward of every supported family: dense weights on the accelerator, MoE blocks from `moe`,
a static KV cache per sequence, one or several sequences per call.

Shapes: T new tokens, P cached positions, D hidden, H query heads, G kv heads, Hd head dim, V vocab.
Compact on purpose: on a 2-core CPU, Python work per layer is a visible share of a decode step, so
q/k/v are one fused matmul and rope is applied to q and k together.
"""
from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Callable, Iterator

import torch
from ..kv import int8 as kv8
from .. import native
from ..experts import offload
from ..kv.tensors import KVCache, check_kv_bits
from ..files.gguf.blockquant import NATIVE as BLOCK_TYPES, BlockQuant
from ..files.checkpoint import Checkpoint, dense_shapes
from ..layers import MIXERS, Layer, attention
from ..layers import norms, rope, router
from .feed_forward import DenseFFN
from ..layers.rope import Rope
from ..layers.sandwich import NORMS as SANDWICH_NORMS, SandwichLayer
from ..layers.state import LinearState
from ..experts.dense_forms import embed_rows, stack
from ..protocol.errors import ForwardStopped, ModelError
from ..experts.build import build_steps, materialise
from ..experts.expert import Expert16
from ..native.dense_linear import linear, weight_problem
from .moe import MoEBlock
from ..native import choice
from .native_step import DecodeStep
from ..placement import Placement, Tier

ProgressFn = Callable[[int, int, str], None]


class Run:
    """What every layer of one forward shares: the sequences' caches, positions and new-token counts,
    the rope rows (cos, sin [T, 1, R]) and each sequence's attention spans by window."""

    def __init__(self, caches, positions, counts, cos, sin, spans):
        self.caches, self.positions, self.counts, self.cos, self.sin, self.spans = (
            caches, positions, counts, cos, sin, spans)


class MoEModel:
    """The model of every supported family (engine/families: Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE,
    GPT-OSS): what differs between them is data in `Dims` and the family adapter, read here."""

    def __init__(self, ckpt: Checkpoint, placement: Placement, accel: torch.device,
                 dtype: torch.dtype = torch.bfloat16, progress: ProgressFn | None = None,
                 offload_costs: offload.OffloadCosts | None = None, measure_offload: bool = True,
                 dense_blocks=None, kv_bits: int = 16):
        """dense_blocks: a GGUF block type (e.g. Q8_0) the dense matrices of a 16-bit checkpoint are
        quantised to on the CPU (benchmarks only: the app keeps them 16-bit, as it keeps attention).
        kv_bits: 16 (keys and values in the model's dtype) or 8 (int8 with a scale per 32: engine/kv/int8.py)."""
        d = self.dims = ckpt.dims
        check_kv_bits(d, kv_bits)
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
        # At 8 bits (Load.kv_bits) the rows are int8 codes and fp16 scales in uint8 (engine/kv/int8.py):
        # 1.0625 bytes a value, and the native decode's attention reads them as they are.
        self.kv_bits = kv_bits
        self.kv_dtype = torch.uint8 if kv_bits == 8 else dtype
        self._caches = weakref.WeakSet()  # the KV caches made and alive: the memory monitor counts their pages
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

        def norm(name: str, to=None) -> torch.Tensor:
            """An RMSNorm's weight as the forward scales by it (zero-centred ones: 1 + w, in fp32 first)."""
            w = dense(name)
            return ((1.0 + w.float()) if d.norm_offset else w).to(to or dtype)

        # A GGUF file's matrices stay in its own blocks where the native kernels run them (the CPU,
        # below fp32: fp32 is the reference precision); elsewhere they are its exact dequantisation.
        self.file_dense = choice.file_blocks(ckpt, accel, dtype)
        shapes = dense_shapes(d)

        # A 16-bit checkpoint's dense matrices at its own precision on the CPU: the file's tensors where
        # it is mapped (no copy; engine/experts/expert.py mapped_form does the same for the experts)
        from ..files import mapped

        map_dense = (accel.type == "cpu" and not ckpt.is_gguf and hasattr(ckpt, "view")
                     and dtype in (torch.float16, torch.bfloat16) and mapped.serving())

        def matrix(name: str):
            """A matrix the forward multiplies: a tensor, or the file's blocks (engine/experts/dense_forms.py)."""
            if map_dense and ckpt.info(name).dtype == {torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]:
                t = ckpt.view(name)
                why = weight_problem(t, dtype)
                if why:
                    raise ModelError(ckpt.where[name].path, f"tensor '{name}' {why}")
                t.mapped = True  # (engine/experts/dense_forms.py mapped_nbytes: the file's pages, not owned)
                return t
            if self.file_dense and ckpt.tensor_type(name) in BLOCK_TYPES:
                view = ckpt.raw_view(name)  # the mapped file's rows; None where they must be reordered
                if view is not None:
                    return BlockQuant.from_file(ckpt.tensor_type(name), [view], shapes[name])
                return BlockQuant.from_raw(ckpt.tensor_type(name), ckpt.read_raw(name), shapes[name])
            if dense_blocks is not None and accel.type == "cpu" and not self.file_dense:
                return BlockQuant.quantize(dense(name), dense_blocks)
            return dense(name)

        self.embed = matrix("model.embed_tokens.weight")  # [V, D]
        self.norm = norm("model.norm.weight")
        self.lm_head = self.embed if d.tie_embeddings else matrix("lm_head.weight")
        tick("dense weights")
        self.layers: list[Layer] = []
        self.moe: list[MoEBlock] = []
        fam = d.adapter
        # what the layer parts read their tensors with (engine/layers: each part builds itself)
        w = SimpleNamespace(dims=d, accel=accel, attn_dtype=self.attn_dtype, matrix=matrix, dense=dense, norm=norm,
                            stack=stack, read=lambda name: ckpt.read(name).to(accel),
                            config=ckpt.config.get_text_config())
        slots = {"attention": 0, "deltanet": 0}  # each mixer kind's layers are numbered in the cache
        for i in range(d.decoder_layers):
            p = f"model.layers.{i}."
            kind = d.mixer(i)
            keeps = "deltanet" if kind == "deltanet" else "attention"  # a state, or rows of the KV cache
            mixer = MIXERS[kind].build(w, p, i, slots[keeps])
            slots[keeps] += 1
            tick(f"layer {i} {kind}")
            if i < d.dense_first:  # a dense MLP (GLM-4.5's first layers), with the dense weights
                ffn = DenseFFN(dense(fam.dense_ffn_key(i, "w1")), dense(fam.dense_ffn_key(i, "w3")),
                               dense(fam.dense_ffn_key(i, "w2")))
            else:
                l = i - d.dense_first  # the MoE layer: the placement's row
                experts = []
                for e in range(d.experts):
                    experts.append(materialise(ckpt, l, e, placement[l, e], accel, dtype))
                    tick(f"layer {i} expert {e}")
                ffn = self._moe_block(w, fam, i, experts)
                self.moe.append(ffn)
            if d.sandwich:  # Gemma 4: a dense MLP beside the experts, and norms around both
                mlp = DenseFFN(*(dense(fam.dense_ffn_key(i, k)) for k in ("w1", "w3", "w2")), act=d.act)
                self.layers.append(SandwichLayer(norm(p + "input_layernorm.weight"), mixer,
                                                 norm(p + "post_attention_layernorm.weight"),
                                                 {n: norm(p + n + ".weight") for n in SANDWICH_NORMS},
                                                 dense(p + "layer_scalar"), mlp, ffn))
                continue
            self.layers.append(Layer(norm(p + "input_layernorm.weight"), mixer,
                                     norm(p + "post_attention_layernorm.weight"), ffn))
        if offload_costs is None and measure_offload and accel.type == "cuda":
            probe = self._any_cpu_expert() or materialise(ckpt, 0, 0, Tier.CPU16, accel, dtype)
            offload_costs = offload.measure(probe, accel, dtype=dtype)
        self.set_offload(offload_costs)
        text = ckpt.config.get_text_config()
        self.rope = Rope(*rope.frequencies(text, d.rotary), self.attn_dtype, accel)
        # layers of several kinds with their own rope tables (Gemma 4): by the layers' rope key
        self.ropes = rope.keyed(text, self.attn_dtype, accel) if d.layer_attn is not None else {}
        self.layer_inputs: list | None = None  # calibration: each layer's input appended when set
        # the whole decode step in one native call, where the model is on the CPU (engine/native)
        self.native_step = DecodeStep(self) if choice.whole_step(self) else None

    def _moe_block(self, w, fam, i: int, experts: list) -> MoEBlock:
        """Decoder layer i's MoE block: its router (and the family's router extras), the experts, and
        the shared expert, which is always active, so it stays with the dense weights on the accelerator."""
        d, dense = self.dims, w.dense
        shared = None
        if d.shared_ffn:
            form = self._shared_from_file(fam, i)
            if form is None:
                w13 = torch.cat([dense(fam.shared_key(i, "w1")), dense(fam.shared_key(i, "w3"))])  # [2I', D]
                form = Expert16(Tier.GPU16, w13.contiguous(), dense(fam.shared_key(i, "w2")).contiguous())
            shared = (form, dense(fam.shared_key(i, "gate")) if d.shared_gated else None)
        return MoEBlock(self._router(w, fam, i), experts, self.accel, shared=shared)

    def _router(self, w, fam, i: int) -> router.Router:
        """Decoder layer i's router, of the family's kind (engine/layers/router.py)."""
        d, dense = self.dims, w.dense
        gate = dense(fam.router_key(i))
        bias = dense(fam.router_key(i, bias=True)) if d.router_bias else None
        if d.router_kind == "sigmoid_groups":
            return router.SigmoidGroups(gate, d.top_k, w.read(fam.correction_key(i)).float(), d.route_groups,
                                        d.route_scale, d.norm_topk)
        if d.router_kind == "gemma":  # its own input scale [D] (times 1/sqrt(D)) and per-expert scale [E]
            return router.GemmaRouter(gate, d.top_k, dense(fam.block(i) + "router.scale") * d.hidden ** -0.5,
                                      dense(fam.block(i) + "router.per_expert_scale").float(), d.rms_eps)
        if d.router_kind == "topk_softmax":
            return router.TopKSoftmax(gate, d.top_k, bias)
        return router.SoftmaxTopK(gate, d.top_k, d.norm_topk, bias)

    def _shared_from_file(self, fam, i: int):
        """A GGUF file's shared expert in its own blocks, mapped, where the native kernels run the dense
        matrices from the file (file_dense): as one of its routed experts would be; else None."""
        if not self.file_dense:
            return None
        from ..experts.expert import QuantExpert

        ck, d = self.ckpt, self.dims
        names = [fam.shared_key(i, k) for k in ("w1", "w3", "w2")]
        types = [ck.tensor_type(n) for n in names]
        views = [ck.raw_view(n) for n in names]
        if types[0] != types[1] or not all(t in BLOCK_TYPES for t in types) or any(v is None for v in views):
            return None
        w13 = BlockQuant.from_file(types[0], views[:2], (2 * d.shared_ffn, d.hidden))
        return QuantExpert(Tier.CPU16, w13, BlockQuant.from_file(types[2], views[2:], (d.hidden, d.shared_ffn)),
                           torch.device("cpu"))

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

    def _any_cpu_expert(self):
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
        """Bytes of the experts: 'accelerator' (VRAM), 'host' (RAM the process owns: anonymous) and
        'mapped' (the model file's own pages, served from its mapping: page cache, not counted
        against free RAM; engine/files/gguf/reader.py)."""
        from ..experts.dense_forms import mapped_nbytes

        out = {"accelerator": 0, "host": 0, "mapped": 0}
        for block in self.moe:
            for ex in block.experts:
                if ex.tier.on_accelerator:
                    out["accelerator"] += ex.nbytes
                    continue
                m = mapped_nbytes(ex)
                out["host"] += ex.nbytes - m
                out["mapped"] += m
        return out

    def _dense_weights(self) -> list:
        ts = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            ts += layer.tensors()
        ts += [t for b in self.moe for t in b.router.tensors()]
        ts += [t for b in self.moe if b.shared for t in (b.shared[0].w13, b.shared[0].w2, b.shared[1]) if t is not None]
        return ts

    def dense_bytes(self) -> int:
        return sum(t.nbytes for t in self._dense_weights())

    def dense_mapped_bytes(self) -> int:
        """Of dense_bytes, those served from the mapped file (not the process's own memory)."""
        from ..experts.dense_forms import mapped_nbytes

        return sum(mapped_nbytes(t) for t in self._dense_weights())

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
        state = LinearState(d.decoder_layers - d.attention_layers, d.linear, self.accel) if d.linear is not None else None
        g, hk, hv = d.kv_shape
        cache = KVCache(0 if d.layer_attn else d.attention_layers, g, ctx, hk, self.kv_dtype, self.accel, state, hv,
                        self.kv_bits)
        if d.layer_attn is not None:  # layers of several widths: rows of their own [G, ctx, Hd] each
            width = kv8.row_bytes if self.kv_bits == 8 else int
            cache.k = [torch.empty(a[0], ctx, width(a[1]), dtype=self.kv_dtype, device=self.accel) for a in d.layer_attn]
            cache.v = [torch.empty_like(k) for k in cache.k]
        self._caches.add(cache)
        return cache

    def caches_resident_bytes(self) -> int:
        """Bytes the KV caches made for this model, and still alive, have touched (any thread)."""
        for _ in range(3):
            try:
                return sum(c.resident_bytes for c in list(self._caches))
            except RuntimeError:  # the set changed as it was read (the engine thread made a cache)
                continue
        return 0

    # ---- forward ----
    def rope_tables(self, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope.tables(upto)

    def rope_rows(self, positions: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope.rows(positions, T)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return norms.rms(x, self.dims.rms_eps, w)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, caches: list[KVCache] | KVCache, positions: list[int] | int,
                all_logits: bool = False, start: tuple[int, torch.Tensor] | None = None,
                cancel=None) -> torch.Tensor:
        """One sequence of T tokens (a prefill or a decode step, B=1), or B sequences of one token each
        (a batched decode step, T == B), each in its own KV cache: ids [T] long, sequence b's tokens
        at positions[b].. of caches[b] (a KVCache and an int stand for B=1). Returns fp32 logits of
        each sequence's last token [B, V], or of every token [T, V] with all_logits (B=1).
        start=(l, x) (B=1, calibration): begin at layer l with residual stream x (recorded in
        `layer_inputs` by an earlier pass over the same ids).
        The matmuls and MoE blocks take all T tokens at once (each weight, and each expert any token
        chose, is read once); attention runs per sequence over its own cache. A decode step runs as
        one native call where choice.decode_step says so; B=1 is the batched path's own case.
        cancel (anything with is_set(), or None): checked before each layer of a sequence without a
        linear-attention state (a state is updated in place, layer by layer, and could not be taken back);
        set, the forward raises ForwardStopped, its tokens' keys and values written only in rows the cache
        does not count (the caller keeps cache.tokens as it was). A Stop ends a long chunk within a layer."""
        torch.set_flush_denormal(True)  # for this forward only (engine/native/cpu.c flush_denormals):
        try:                            # the caller's thread may be the GUI's, whose Qt float code keeps IEEE
            return self._forward(ids, caches, positions, all_logits, start, cancel)
        finally:
            torch.set_flush_denormal(False)

    def _forward(self, ids, caches, positions, all_logits, start, cancel=None):
        if isinstance(caches, KVCache):
            caches, positions = [caches], [positions]
        T, B = ids.shape[0], len(caches)
        counts = [T] if B == 1 else [1] * B  # each sequence's new tokens
        if len(positions) != B or sum(counts) != T or (B > 1 and (all_logits or start is not None)):
            raise ValueError(f"{T} tokens for {B} caches at {len(positions)} positions: one sequence of T tokens, "
                             "or one token for each (all_logits and start: one sequence only)")
        for c, p, n in zip(caches, positions, counts):
            if p + n > c.ctx:
                raise ValueError(f"position {p + n} exceeds the cache ({c.ctx})")
            c.reach(p + n)
        if T == B and native.available():
            native.torch_threads.narrow()  # a decode step's torch ops are small: torch stays at one thread
            if choice.decode_step(self, ids, caches, start):
                return self.native_step(ids.to(self.accel), caches, positions)  # every layer in one call
        else:
            native.torch_threads.widen()  # a prefill's GEMMs get torch's threads back
        cos, sin = self.rope_rows(positions, T)  # [T, 1, R]
        windows = {layer.mixer.window for layer in self.layers if layer.mixer.kind != "deltanet"}
        spans = [{w: attention.span(n, p, w, self.accel) for w in windows} for p, n in zip(positions, counts)]
        run = Run(caches, positions, counts, cos, sin, spans)
        run.rope = {k: r.rows(positions, T) for k, r in self.ropes.items()}
        if start is None:
            x = embed_rows(self.embed, ids.to(self.accel))  # [T, D]
            if self.dims.embed_scale:  # Gemma: scaled by sqrt(D), in the embedding's dtype
                x = x * torch.tensor(self.dims.hidden ** 0.5, dtype=x.dtype)
            first, x = 0, x.to(self.residual_dtype)
        else:  # calibration: resume at a layer from its recorded input (earlier layers unchanged)
            first, x = start
        if cancel is not None and any(c.state is not None for c in caches):
            cancel = None
        for l in range(first, len(self.layers)):
            if cancel is not None and cancel.is_set():
                raise ForwardStopped(f"stopped before layer {l}")
            layer = self.layers[l]
            if self.layer_inputs is not None:
                self.layer_inputs.append(x)
            x = layer.forward(self, x, run)
        if T > B and not all_logits:
            x = x[-1:]  # one sequence: its last token
        logits = linear(self._rms(x, self.norm), self.lm_head).float()  # [B or T, V]
        cap = self.dims.softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
