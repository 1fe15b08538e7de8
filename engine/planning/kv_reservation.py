"""How much memory a context costs, and the longest context that fits: the arithmetic behind "auto".
A leaf (no torch): the engine (engine/control/context_fit.py), the events (Loaded.context) and the window use it.

One sequence's cache beside the weights (engine/model/forward.py KVCache):
    bytes(ctx) = sum over attending layers l of  per_token[l] * positions_l(ctx)  +  fixed
    per_token[l] = kv heads x (key width + value width) x bytes a stored value   (MLA: one latent row)
    positions_l(ctx) = ctx, or min(ctx, window_l) where a sliding-window layer keeps only its window
    fixed = the linear-attention state of the hybrid families with the copies a cache keeps (engine/layers/state.py)
Today's cache gives every attending layer a row for every position, windowed or not (attention writes
position p at row p), so `bounded_windows` is False where it is built; a ring-buffer cache sets it.
Bytes a stored value: 2 for bf16/fp16 keys and values, 4 for fp32; an 8-bit cache (Load.kv_bits 8)
stores 1 byte and an fp16 scale per block of 32 (int8_element_bytes: 1.0625, engine/kv/int8.py), which the
planner counts the same way, so "auto" opens nearly twice the context where memory bounds it.

"auto" (choose_length): the model's own context length, capped by the memory free beside its weights
with every expert at its smallest form (`room`, what the context may take at most), and by AUTO_SHARE
of the memory the model may use, so that a long context does not silently push experts to 4 bits; a
context asked for explicitly may take all of `room` (the planner then makes the experts smaller).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..protocol.errors import InputError, MixdeskError

AUTO_SHARE = 0.25  # auto takes at most this share of the memory the model may use for its keys and values
FLOOR = 2048  # auto never opens below this (or the model's own length): below it the model does not fit
MIN_CTX = 16  # the shortest context anyone may ask for (the CLI's bound)
MAX_CTX = 1 << 24  # the longest (engine/files/model_config.py bounds max_position_embeddings the same)
GB = 10**9


def size_text(n: float | None) -> str:
    """Bytes in plain words: "4.0 GB", "64 GB", "3.0 MB"."""
    if n is None:
        return ""
    for unit, k in (("GB", GB), ("MB", 10**6), ("KB", 10**3)):
        if n >= k * 0.995:
            x = n / k
            return f"{x:.1f} {unit}" if x < 9.95 else f"{x:.0f} {unit}"
    return f"{int(n)} bytes"


def int8_element_bytes(block: int = 32, scale_bytes: int = 2) -> float:
    """Bytes a stored value takes in an 8-bit cache: one byte, and a scale of scale_bytes per block."""
    return 1 + scale_bytes / block


class ContextTooLarge(MixdeskError):
    """A context asked for whose keys and values do not fit in the memory free beside the model."""

    def __init__(self, ctx: int, need: int, room: int, fits: int, on_accelerator: bool = False):
        self.ctx, self.need, self.room, self.fits = ctx, need, room, fits
        where = "GPU memory" if on_accelerator else "memory"
        super().__init__(f"a context of {ctx:,} tokens needs {size_text(need)} of keys and values; "
                         f"{size_text(room)} of {where} is free beside the model, enough for {fits:,} tokens. "
                         "Choose a shorter context (or auto), or close other programs")


@dataclass(frozen=True)
class ContextCost:
    """What one sequence's cache takes for a model: per attending layer (bytes a token, its sliding
    window or None), the fixed state, and the model's own context length."""

    layers: tuple  # ((bytes per token, window | None), ...), one per layer that keeps keys and values
    fixed: int
    max_positions: int
    bounded_windows: bool = False  # a windowed layer keeps only its window (see the module's docstring)
    kv_bits: int = 16  # 16: keys and values in the model's dtype; 8: int8 with scales (the line says so)

    @property
    def per_token(self) -> float:
        """Bytes of keys and values one more token adds (windowed layers counted in full)."""
        return sum(b for b, _ in self.layers)

    def kv_bytes(self, ctx: int) -> int:
        return int(sum(b * (min(ctx, w) if self.bounded_windows and w else ctx) for b, w in self.layers))

    def bytes(self, ctx: int) -> int:
        """All of one sequence's cache at ctx positions: keys and values and the fixed state."""
        return self.kv_bytes(ctx) + self.fixed

    def longest(self, nbytes: float) -> int:
        """The longest context (at most the model's own) whose cache fits in nbytes; 0 if none does."""
        if self.bytes(1) > nbytes:
            return 0
        lo, hi = 1, self.max_positions  # bytes() is monotone in ctx: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.bytes(mid) <= nbytes else (lo, mid - 1)
        return lo


def cost_of(dims, elem_bytes: float, state_copies: int, bounded_windows: bool = False,
            kv_bits: int = 16) -> ContextCost:
    """A model's ContextCost from its Dims (engine/files/model_config.py), at elem_bytes a stored value,
    with state_copies of its linear-attention state (the live one and a cache's turn-boundary copies).
    The layers are counted as the cache is built: one row set per layer_attn entry where layers differ
    in width (both keys and values stored, even where a layer's keys are its values), else every
    attention layer at kv_shape."""
    if dims.layer_attn is not None:
        layers = tuple((2 * a[0] * a[1] * elem_bytes, dims.window(i)) for i, a in enumerate(dims.layer_attn))
    else:
        g, hk, hv = dims.kv_shape
        layers = tuple((g * (hk + hv) * elem_bytes, dims.window(i)) for i in range(dims.decoder_layers)
                       if dims.mixer(i) != "deltanet")
    return ContextCost(layers, dims.state_bytes() * state_copies, int(dims.max_positions), bounded_windows, kv_bits)


def rounded(n: int, cap: int) -> int:
    """A length memory allows, in round figures: the model's own where it fits, else a multiple of
    1,024 (of 256 below 2,048; of 16 below 256)."""
    if n >= cap:
        return cap
    step = 1024 if n >= 2048 else 256 if n >= 256 else 16
    return max(n // step * step, min(n, MIN_CTX))


@dataclass(frozen=True)
class ContextChoice:
    """The context a model opens at, and what it costs. ctx: its length in tokens; auto: chosen by
    "auto"; auto_ctx: what "auto" takes now; fits: the longest memory allows now beside the weights
    (their experts at their smallest); room: the bytes free for a context there; budget: the memory
    the model may use in that pool; on_accelerator: the cache is in GPU memory (else RAM)."""

    ctx: int
    cost: ContextCost
    auto: bool = True
    auto_ctx: int = 0
    fits: int = 0
    room: int = 0
    budget: int = 0
    on_accelerator: bool = False

    @property
    def nbytes(self) -> int:
        return self.cost.bytes(self.ctx)

    def bytes_at(self, ctx: int) -> int:
        return self.cost.bytes(ctx)

    @property
    def reserve(self) -> tuple[int, int]:
        """(VRAM, RAM) bytes the planner keeps for this context's keys and values."""
        return (self.nbytes, 0) if self.on_accelerator else (0, self.nbytes)

    def line(self, ctx: int | None = None) -> str:
        """e.g. "32,768 tokens: 3.0 GB of keys and values" (and a hybrid model's fixed state; "(8-bit)"
        after the keys and values where they are stored at 8 bits)."""
        n = self.ctx if ctx is None else ctx
        where = " in GPU memory" if self.on_accelerator else ""
        bits = " (8-bit)" if self.cost.kv_bits == 8 else ""
        text = f"{n:,} tokens: {size_text(self.cost.kv_bytes(n))} of keys and values{bits}{where}"
        if self.cost.fixed:
            text += f" and {size_text(self.cost.fixed)} of linear-attention state"
        return text

    def summary(self) -> str:
        """For a terminal: "context 32,768 tokens: 3.0 GB of keys and values (auto: ...)"."""
        return f"context {self.line()} ({self.details()})"

    def details(self) -> str:
        """How it was chosen, in a line (the CLI's and the window's tooltip)."""
        how = "auto" if self.auto else "asked for"
        own = f"the model's own {self.cost.max_positions:,}"
        if self.room <= 0:
            return f"{how}: {own}; the weights alone take the memory free now"
        return f"{how}: {own}; {self.fits:,} fit in memory now, with {size_text(self.room)} free beside the weights"


def choose_length(cost: ContextCost, room: int, budget: int, asked, on_accelerator: bool = False) -> ContextChoice:
    """The context to open at: asked = "auto", or a number of tokens (at most the model's own: a
    longer one is cut to it). room: bytes free for the cache beside the weights at their smallest
    (<= 0: the weights alone do not fit; the planner says so, nothing is refused here); budget: the
    memory the model may use in the cache's pool. Raises InputError for a length that is not one,
    ContextTooLarge for an asked length whose keys and values memory cannot hold."""
    fits = cost.longest(room) if room > 0 else 0
    share = min(room, AUTO_SHARE * budget) if budget > 0 else room
    auto_ctx = max(rounded(cost.longest(share) if share > 0 else 0, cost.max_positions),
                   min(FLOOR, cost.max_positions))
    if asked == "auto":
        return ContextChoice(auto_ctx, cost, True, auto_ctx, fits, room, budget, on_accelerator)
    if isinstance(asked, bool) or not isinstance(asked, int) or not MIN_CTX <= asked <= MAX_CTX:
        raise InputError("context", f"{asked!r} is not a context length: use auto or a whole number of tokens "
                         f"from {MIN_CTX} to {MAX_CTX:,}")
    ctx = min(asked, cost.max_positions)
    if room > 0 and cost.bytes(ctx) > room:
        raise ContextTooLarge(ctx, cost.bytes(ctx), room, fits, on_accelerator)
    return ContextChoice(ctx, cost, False, auto_ctx, fits, room, budget, on_accelerator)
