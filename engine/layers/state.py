"""The state a linear-attention mixer keeps beside the KV cache: per sequence and per Gated DeltaNet
layer, the conv inputs of the last K-1 tokens and the delta rule's recurrent state, in fp32.

Unlike keys and values, this state cannot be cut back to a shorter prefix: it is the sum of every
token read. So a cache keeps copies of it at turn boundaries (after each prompt's prefill, as
llama.cpp and vLLM do for hybrid models), and a prompt that shares a prefix with the cached tokens
resumes from the latest copy inside that prefix, or from the live state when it shares all of them.
Shapes: L' DeltaNet layers, C conv channels, K conv taps, Hv value heads, Dk/Dv key/value head dims.
"""
from __future__ import annotations

import torch

SNAPSHOTS = 2  # copies kept per cache: the last two turn boundaries (Qwen3.5-35B-A3B: 63 MB each)


class LinearState:
    def __init__(self, layers: int, linear: tuple, device):
        hk, dk, hv, dv, k = linear
        channels = 2 * hk * dk + hv * dv
        self.conv = torch.zeros(layers, channels, k - 1, dtype=torch.float32, device=device)  # [L', C, K-1]
        self.rec = torch.zeros(layers, hv, dk, dv, dtype=torch.float32, device=device)  # [L', Hv, Dk, Dv]
        self.snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # tokens read -> (conv, rec)

    @property
    def nbytes(self) -> int:
        one = self.conv.nbytes + self.rec.nbytes
        return one * (1 + len(self.snapshots))

    def snapshot(self, tokens: int) -> None:
        """Keep a copy of the state after `tokens` tokens (a turn boundary); the oldest copy goes."""
        self.snapshots[tokens] = (self.conv.clone(), self.rec.clone())
        while len(self.snapshots) > SNAPSHOTS:
            del self.snapshots[min(self.snapshots)]

    def rewind(self, n: int, held: int) -> int:
        """The state is to stand for the first n of the `held` tokens read so far: the live state
        where n == held, else the latest copy taken within n tokens (restored), else none (0: the
        next read starts from position 0, where the mixer zeroes the state). Returns the tokens kept."""
        if n >= held:
            return held
        at = max((t for t in self.snapshots if t <= n), default=0)
        if at:
            conv, rec = self.snapshots[at]
            self.conv.copy_(conv)
            self.rec.copy_(rec)
        self.drop_after(at)
        return at

    def drop_after(self, tokens: int) -> None:
        """Forget the copies past `tokens` (the cache's tokens were cut back to that many)."""
        for t in [t for t in self.snapshots if t > tokens]:
            del self.snapshots[t]

    # ---- by name, as the KV cache keeps it on disk (engine/model/forward.py KVCache.tensors) ----
    def tensors(self) -> dict[str, torch.Tensor]:
        """The live state and each turn boundary's copy: state.conv, state.rec, state.at.T.conv, ..."""
        out = {"state.conv": self.conv, "state.rec": self.rec}
        for t, (conv, rec) in sorted(self.snapshots.items()):
            out[f"state.at.{t}.conv"], out[f"state.at.{t}.rec"] = conv, rec
        return out

    def slot(self, name: str, tokens: int) -> torch.Tensor:
        """Where the tensor of that name goes back (a cache of `tokens` tokens restored): the live
        state, or a turn boundary's copy within those tokens, made here. ValueError for another name."""
        if name in ("state.conv", "state.rec"):
            return self.conv if name.endswith("conv") else self.rec
        parts = name.split(".")
        if len(parts) == 4 and parts[1] == "at" and parts[2].isdigit() and parts[3] in ("conv", "rec"):
            t = int(parts[2])
            if 0 < t <= tokens:
                if t not in self.snapshots:
                    if len(self.snapshots) >= SNAPSHOTS:
                        raise ValueError(f"more than {SNAPSHOTS} copies of the linear state")
                    self.snapshots[t] = (torch.empty_like(self.conv), torch.empty_like(self.rec))
                return self.snapshots[t][0 if parts[3] == "conv" else 1]
        raise ValueError(f"the linear state has no tensor {name!r}")

    def required(self, seen: set) -> set:
        """The names a restore must have given, once `seen` were: the live state, and both halves of
        every copy one half of which came."""
        out = {"state.conv", "state.rec"}
        for name in seen:
            if name.startswith("state.at."):
                base = name.rsplit(".", 1)[0]
                out |= {base + ".conv", base + ".rec"}
        return out
