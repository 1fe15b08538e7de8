"""The context a model opens at on this machine: "auto", or a length asked for, against the memory free
beside its weights (the arithmetic is engine/planning/kv_reservation.py). The session chooses it as it
loads a model and again on SetContext; the placement controller then keeps the chosen context's keys
and values out of the budgets it plans the experts under (`net`), so the two never over-commit.

The cache lives where the model runs (engine/model/forward.py new_cache): in GPU memory on a GPU, else in
RAM, and its bytes a value are the cache's own format's (KVCache.element_bytes: the dtype's, or 1.0625 at
8 bits)."""
from __future__ import annotations

import torch

from ..planning.kv_reservation import ContextChoice, ContextCost, choose_length, cost_of
from ..planning.planner import Budgets


def model_cost(dims, dtype: torch.dtype, kv_bits: int = 16) -> ContextCost:
    """A model's context cost with its cache's dtype (or 8 bits) and its linear-attention state's copies."""
    from ..layers.state import SNAPSHOTS
    from ..kv.tensors import KVCache

    return cost_of(dims, KVCache.element_bytes(dtype, kv_bits), 1 + SNAPSHOTS, kv_bits=kv_bits)


def model_need(ckpt, accel, dtype: torch.dtype, placement=None) -> tuple[int, int]:
    """(VRAM, RAM) bytes of its own memory the model's weights take at least: the dense part where it
    runs, and every expert at its smallest form (or, given a placement, at its tier there). Bytes
    served from the mapped file are page cache, not counted (engine/experts/tier_bytes.py)."""
    from ..measures.inputs import dense_bytes_of
    from ..experts.tier_bytes import mapped_bytes, tier_bytes

    d = ckpt.dims
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = tier_bytes(ckpt, itemsize)
    mapped, dense_mapped = mapped_bytes(ckpt, dtype, accel.cpu_only)
    own = {t: b - mapped.get(t, 0) for t, b in sizes.items()}
    dense = ckpt.dense_nbytes() if ckpt.is_gguf and accel.cpu_only else dense_bytes_of(d, dtype)
    vram, ram = (0, dense - dense_mapped) if accel.cpu_only else (dense, 0)
    if placement is not None:
        for _, _, t in placement.items():
            if t.on_accelerator:
                vram += own[t.value]
            else:
                ram += own[t.value]
        return vram, ram
    return vram, ram + d.layers * d.experts * min(own["cpu-16"], own["cpu-4"])


def choose(ckpt, accel, dtype: torch.dtype, budgets: Budgets, asked, placement=None,
           kv_bits: int = 16) -> ContextChoice:
    """The context for this model under these budgets (the memory it may use now: free memory and what
    it holds, within the user's caps). asked: "auto" or a length (engine/planning/kv_reservation.py
    choose_length, which raises for one memory cannot hold). placement: a pinned placement (None: the
    planner's, whose experts can be made as small as their smallest form). kv_bits: the cache's format
    (16, or 8: engine/kv/int8.py), whose bytes a value the reservation counts."""
    need_v, need_r = model_need(ckpt, accel, dtype, placement)
    on_gpu = not accel.cpu_only
    budget = budgets.vram if on_gpu else budgets.ram
    room = budget - (need_v if on_gpu else need_r)
    return choose_length(model_cost(ckpt.dims, dtype, kv_bits), room, budget, asked, on_gpu)


def net(budgets: Budgets, reserve: tuple[int, int]) -> Budgets:
    """What the placement may use: the budgets less the context's reservation (VRAM, RAM)."""
    return Budgets(vram=max(budgets.vram - reserve[0], 0), ram=max(budgets.ram - reserve[1], 0))
