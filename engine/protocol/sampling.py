"""How a reply is sampled: SamplingParams, a value every client builds (the window, the CLI, the
server) and the engine checks. A leaf: it imports nothing heavy (no torch, no model code)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def check(self) -> "SamplingParams":
        """Raises InputError naming the first value that cannot be used."""
        def bad(name: str, value, want: str) -> InputError:
            return InputError(name, f"{value!r} is not valid; it must be {want}")

        def num(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", self.max_new_tokens, "a whole number of at least 1")
        if not num(self.temperature) or self.temperature < 0:
            raise bad("temperature", self.temperature, "a number >= 0 (0 = greedy)")
        if not num(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", self.top_p, "a number in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", self.top_k, "a whole number >= 0 (0 = off)")
        if not num(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", self.repetition_penalty, "a number > 0 (1 = off)")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise bad("seed", self.seed, "a whole number >= 0")
        if not all(isinstance(x, str) for x in self.stop):
            raise bad("stop", self.stop, "a list of strings")
        return self
