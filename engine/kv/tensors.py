"""The keys and values of one sequence: preallocated tensors per attention layer (KVCache), at 16 bits or
8 (engine/kv/int8.py), and the check that a model's rows take the 8-bit format. Which cache a request uses
and what carries over between requests is engine/kv/cache.py; a cache kept on disk, engine/kv/files.py.
"""
from __future__ import annotations

import torch

from . import int8 as kv8
from ..layers.state import LinearState


class KVCache:
    """Preallocated keys and values for every attention layer: k, v [L, G, ctx, Hd]. torch.empty leaves
    the pages untouched, so memory grows with the context actually used. A model with linear-attention
    layers keeps their state beside them (`state`, engine/layers/state.py). bits 8: each row is stored
    as int8 codes and a scale per block of 32 (engine/kv/int8.py), uint8 [L, G, ctx, row bytes]; the
    forward writes and reads rows through store() and span(), which quantise and widen."""

    def __init__(self, layers: int, kv_heads: int, ctx: int, head_dim: int, dtype, device,
                 state: LinearState | None = None, v_dim: int | None = None, bits: int = 16):
        v_dim = head_dim if v_dim is None else v_dim
        self.bits = bits
        if bits == 8:
            dtype, head_dim, v_dim = torch.uint8, kv8.row_bytes(head_dim), kv8.row_bytes(v_dim)
        self.k = torch.empty(layers, kv_heads, ctx, head_dim, dtype=dtype, device=device)
        self.v = torch.empty(layers, kv_heads, ctx, v_dim, dtype=dtype, device=device)
        self.ctx = ctx
        self.state = state
        self.tokens: list[int] = []  # the token ids whose keys/values are in the cache, in order
        self.reached = 0  # the furthest position written so far: the rows whose pages are touched

    @staticmethod
    def element_bytes(dtype, bits: int = 16) -> float:
        """Bytes one stored key or value takes in a cache of this dtype, or at 8 bits its code and its
        share of a block's scale (what the planner reserves for a context:
        engine/planning/kv_reservation.py)."""
        return kv8.VALUE_BYTES if bits == 8 else torch.empty((), dtype=dtype).element_size()

    def store(self, l: int, pos: int, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """Attention layer l's keys (and values) of positions pos.., k [G, n, Hd], v [G, n, Hv], into
        their rows (rounded to the cache's format)."""
        end = pos + k.shape[1]
        for t, x in ((self.k, k), (self.v, v)):
            if x is None:
                continue
            if self.bits == 8:
                kv8.pack(x, t[l][:, pos:end])
            else:
                t[l][:, pos:end] = x

    def span(self, l: int, first: int, end: int, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention layer l's keys and values of positions first..end-1 ([G, S, Hd], [G, S, Hv]): in
        dtype, or (None) as stored (views) where the cache is 16-bit; an 8-bit cache's widened (fp32
        unless dtype says otherwise)."""
        k, v = self.k[l][:, first:end], self.v[l][:, first:end]
        if self.bits == 8:
            return kv8.unpack(k, dtype or torch.float32), kv8.unpack(v, dtype or torch.float32)
        return (k, v) if dtype is None else (k.to(dtype), v.to(dtype))

    def reach(self, end: int) -> None:
        """Positions up to `end` are being written (a forward's check, before it writes them)."""
        if end > self.reached:
            self.reached = end

    @property
    def resident_bytes(self) -> int:
        """Bytes of the cache touched so far: the rows up to `reached` of every layer (torch.empty
        leaves later pages untouched), and the whole linear-attention state."""
        state = self.state.nbytes if self.state is not None else 0
        return (self.nbytes - state) * min(self.reached, self.ctx) // max(self.ctx, 1) + state

    @property
    def nbytes(self) -> int:
        kv = sum(t.nbytes for t in (self.k, self.v)) if isinstance(self.k, torch.Tensor) else \
            sum(t.nbytes for t in self.k + self.v)  # (one tensor, or one per layer)
        return kv + (self.state.nbytes if self.state is not None else 0)

    # ---- what it holds, by name (kept on disk between runs: engine/kv/files.py) ----
    def _rows(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor that holds a row per position, by name, one per attention layer: [G, ctx, Hd]
        (position is dim 1). Whatever else the storage keeps per position (scales) belongs here too."""
        ks, vs = (list(self.k), list(self.v))  # one tensor [L, G, ctx, Hd] (its layers are views), or a list
        return [(f"k.{i}", t) for i, t in enumerate(ks)] + [(f"v.{i}", t) for i, t in enumerate(vs)]

    @property
    def token_bytes(self) -> int:
        """Bytes one position takes: keys and values of every attention layer. The cache's own
        memory grows by this as positions fill (torch.empty leaves the rest untouched); a linear
        state does not grow."""
        return sum(t.nbytes for _, t in self._rows()) // self.ctx

    def tensors(self) -> dict[str, torch.Tensor]:
        """Everything it holds for its tokens, by name, as views (no copy): each layer's rows up to
        len(tokens), and a linear state's tensors (engine/layers/state.py)."""
        n = len(self.tokens)
        out = {name: t[:, :n] for name, t in self._rows()}
        if self.state is not None:
            out.update(self.state.tensors())
        return out

    def from_tensors(self, tokens: list[int], tensors) -> None:
        """Hold `tokens`, with what tensors() named for them copied in: a dict, or (name, tensor)
        pairs taken one at a time (a file read a tensor at a time never holds more than one beside
        the cache). A name it does not have, a shape or dtype other than its own, or one missing
        raises ValueError; the cache then holds nothing (tokens stays [] until every tensor is in)."""
        n = len(tokens)
        if n > self.ctx:
            raise ValueError(f"{n:,} positions do not fit this cache's {self.ctx:,}")
        self.tokens = []
        rows, seen = dict(self._rows()), set()
        for name, t in (tensors.items() if isinstance(tensors, dict) else tensors):
            if name in rows:
                dst = rows[name][:, :n]
            elif name.startswith("state.") and self.state is not None:
                dst = self.state.slot(name, n)
            else:
                raise ValueError(f"this model's cache has no tensor {name!r}")
            if tuple(t.shape) != tuple(dst.shape) or t.dtype != dst.dtype:
                raise ValueError(f"{name} is {t.dtype} {tuple(t.shape)}; this cache holds {dst.dtype} {tuple(dst.shape)}")
            self.reach(n)
            dst.copy_(t)
            seen.add(name)
        missing = (set(rows) | (self.state.required(seen) if self.state is not None else set())) - seen
        if missing:
            raise ValueError(f"missing {', '.join(sorted(missing)[:4])}")
        self.tokens = list(tokens)


KV_BITS = (16, 8)


def check_kv_bits(dims, bits) -> None:
    """kv_bits is one the cache stores, and at 8 bits every row this model caches splits into blocks
    of 32 (engine/kv/int8.py); else InputError, in a line."""
    from ..protocol.errors import InputError

    if bits not in KV_BITS or isinstance(bits, bool):
        raise InputError("kv-bits", f"{bits!r} is not a keys-and-values format: use 16 or 8")
    if bits == 8:
        widths = {a[1] for a in dims.layer_attn} if dims.layer_attn is not None else set(dims.kv_shape[1:]) - {0}
        if not all(kv8.supports(w) for w in widths):
            raise InputError("kv-bits", f"8-bit keys and values need rows of a multiple of {kv8.BLOCK} values; "
                             f"this model's are {', '.join(map(str, sorted(widths)))} wide: use 16")
