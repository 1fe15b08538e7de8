"""Placement: the tier of every expert (layer l, expert e). Immutable; a change is a new placement
plus the diff between the two."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Iterator


class Tier(str, Enum):
    """Where and how one expert lives."""

    GPU16 = "gpu-16"
    GPU4 = "gpu-4"
    CPU16 = "cpu-16"
    CPU4 = "cpu-4"
    CPU3 = "cpu-3"  # GGUF's Q3_K (3.44 bits a weight), where a matrix's rows are whole 256-weight blocks
    CPU2 = "cpu-2"  # GGUF's Q2_K (2.63 bits a weight), likewise

    @property
    def on_accelerator(self) -> bool:
        return self.value.startswith("gpu")

    @property
    def bits(self) -> int:
        return int(self.value.split("-")[1])

    def __str__(self) -> str:
        return self.value


ALL_TIERS = (Tier.GPU16, Tier.GPU4, Tier.CPU16, Tier.CPU4, Tier.CPU3, Tier.CPU2)
# the tiers below 4 bits, offered on the CPU down to the user's "lowest precision for experts"
LOW_TIERS = (Tier.CPU3, Tier.CPU2)
LOWEST_BITS = (4, 3, 2)  # the choices of that setting
DEFAULT_LOWEST_BITS = 2


@dataclass(frozen=True)
class Move:
    layer: int
    expert: int
    old: Tier
    new: Tier


@dataclass(frozen=True)
class Placement:
    tiers: tuple[tuple[Tier, ...], ...]  # [layer][expert]

    def __post_init__(self):
        widths = {len(row) for row in self.tiers}
        if len(widths) > 1:
            raise ValueError("every layer must have the same number of experts")

    # ---- construction ----
    @classmethod
    def uniform(cls, layers: int, experts: int, tier: Tier) -> "Placement":
        return cls(tuple(tuple([Tier(tier)] * experts) for _ in range(layers)))

    @classmethod
    def random(cls, layers: int, experts: int, tiers: Iterable[Tier], seed: int) -> "Placement":
        rng = random.Random(seed)
        choices = [Tier(t) for t in tiers]
        return cls(tuple(tuple(rng.choice(choices) for _ in range(experts)) for _ in range(layers)))

    @classmethod
    def from_json(cls, text: str) -> "Placement":
        return cls(tuple(tuple(Tier(t) for t in row) for row in json.loads(text)))

    def to_json(self) -> str:
        return json.dumps([[t.value for t in row] for row in self.tiers])

    def with_tier(self, layer: int, expert: int, tier: Tier) -> "Placement":
        rows = [list(r) for r in self.tiers]
        rows[layer][expert] = Tier(tier)
        return Placement(tuple(tuple(r) for r in rows))

    # ---- queries ----
    @property
    def layers(self) -> int:
        return len(self.tiers)

    @property
    def experts(self) -> int:
        return len(self.tiers[0]) if self.tiers else 0

    def __getitem__(self, key: tuple[int, int]) -> Tier:
        l, e = key
        return self.tiers[l][e]

    def items(self) -> Iterator[tuple[int, int, Tier]]:
        for l, row in enumerate(self.tiers):
            for e, t in enumerate(row):
                yield l, e, t

    def counts(self) -> dict[Tier, int]:
        c = {t: 0 for t in Tier}
        for _, _, t in self.items():
            c[t] += 1
        return c

    def diff(self, new: "Placement") -> list[Move]:
        """Moves that turn self into new; accelerator evictions first, so memory is freed before
        it is allocated."""
        if (self.layers, self.experts) != (new.layers, new.experts):
            raise ValueError("placements of different models")
        moves = [Move(l, e, t, new[l, e]) for l, e, t in self.items() if new[l, e] != t]
        return sorted(moves, key=lambda m: (not (m.old.on_accelerator and not m.new.on_accelerator),
                                            m.new.on_accelerator))

    def summary(self) -> str:
        return ", ".join(f"{n} {t.value}" for t, n in self.counts().items() if n)
