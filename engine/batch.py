"""Several sequences at once: their decode steps batched, their prompts read a chunk at a time.

The engine thread owns one Batch. Each request in it is a Stream: its sequence coroutine
(`Generator.sequence`), the forward pass it waits on (a `Need`), its cancel event and its KV cache.
`step()` runs one round:
- one prompt chunk of the oldest stream still reading its prompt, so the streams already decoding
  stall for at most one chunk;
- one decode step for every stream waiting on one token, as one batched forward of B tokens, each
  at its own position in its own cache (`MoEModel.forward_batch`): every layer's dense weights,
  and every expert that any of the B tokens chose, are read once for all of them.
What comes back is per stream: its Tokens, its Finished, or the exception that ended it alone. A
failure of the batched forward itself ends every stream in it.

KV caches: a request that continues the chat (slot "chat") uses the generator's own cache, whose
prefix carries over between turns. Others take one of a pool of caches, the one sharing the
longest prefix with their prompt (a client that sends the whole conversation each time reuses
what it computed last time); the pool grows to `max_streams` caches, which torch allocates lazily
(pages are touched as positions fill).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .generate import Finished, Generator, Need, SamplingParams
from .model import KVCache

CHUNK = 64  # prompt tokens read per round while other streams decode


class Either:
    """Set when either event is: a stream's own Stop, or the session's stop-everything."""

    def __init__(self, own, every):
        self.own, self.every = own, every

    def is_set(self) -> bool:
        return self.own.is_set() or self.every.is_set()


@dataclass
class Stream:
    request_id: int
    seq: object                  # the Generator.sequence coroutine
    cache: KVCache
    pooled: bool                 # the cache goes back to the pool when the stream ends
    need: Need | None = None     # the forward pass it waits on
    events: list = field(default_factory=list)  # Tokens / Finished / an exception, not yet collected
    done: bool = False


class CachePool:
    def __init__(self, generator: Generator, size: int):
        self.gen, self.size = generator, size
        self.free: list[KVCache] = []
        self.made = 0

    def available(self) -> bool:
        return bool(self.free) or self.made < self.size

    def take(self, prompt: list[int]) -> KVCache:
        def common(c: KVCache) -> int:
            n = 0
            for a, b in zip(c.tokens, prompt):
                if a != b:
                    break
                n += 1
            return n
        if self.free:
            best = max(self.free, key=common)
            if common(best) > 0 or self.made >= self.size:
                self.free.remove(best)
                return best
        self.made += 1
        return self.gen.new_cache()

    def give(self, cache: KVCache) -> None:
        self.free.append(cache)


class Batch:
    def __init__(self, generator: Generator, max_streams: int = 4, chunk: int = CHUNK):
        self.gen = generator
        self.max_streams = max_streams
        self.chunk = chunk
        self.streams: list[Stream] = []
        self.pool = CachePool(generator, max_streams)
        self.last_decode: tuple[int, float] = (0, 0.0)  # (tokens, seconds) of the last batched decode step
        self.last_width = 0  # sequences the last step decoded together (0: it decoded none)

    @property
    def active(self) -> bool:
        return bool(self.streams)

    def chat_busy(self) -> bool:
        return any(not s.pooled for s in self.streams)

    def can_take(self, slot: str) -> bool:
        if len(self.streams) >= self.max_streams:
            return False
        return not self.chat_busy() if slot == "chat" else self.pool.available()

    def add(self, request_id: int, prompt: list[int], params: SamplingParams, cancel, slot: str = "chat") -> None:
        """Start a request (check can_take first). Its first events come with the next step()."""
        pooled = slot != "chat"
        cache = self.pool.take(prompt) if pooled else self.gen.cache
        s = Stream(request_id, self.gen.sequence(prompt, params, cancel, cache, chunk=self.chunk), cache, pooled)
        self.streams.append(s)
        self._advance(s, None, first=True)

    def _advance(self, s: Stream, logits, first: bool = False) -> None:
        """Run stream s up to its next Need (or its end), collecting what it yields."""
        try:
            item = next(s.seq) if first else s.seq.send(logits)
            while not isinstance(item, Need):
                s.events.append(item)
                if isinstance(item, Finished):
                    s.done = True
                    return
                item = next(s.seq)
            s.need = item
        except StopIteration:
            s.done = True
        except Exception as e:  # noqa: BLE001 - it ends this stream alone; the session reports it
            s.events.append(e)
            s.done = True
            s.cache.tokens = []  # the cache may hold a step that did not finish

    def step(self) -> list[tuple[int, object]]:
        """One round (see the module's docstring): [(request_id, Token | Finished | Exception), ...]."""
        reading = [s for s in self.streams if not s.done and s.need is not None and len(s.need.feed) > 1]
        if reading:  # the oldest prompt, one chunk
            s = reading[0]
            self._advance(s, self.gen.forward(s.need))
        decoding = [s for s in self.streams if not s.done and s.need is not None and len(s.need.feed) == 1]
        self.last_width = len(decoding)
        if len(decoding) == 1:
            self._advance(decoding[0], self.gen.forward(decoding[0].need))
        elif decoding:
            t0 = time.perf_counter()
            try:
                logits = self.gen.retrying(lambda: self.gen.model.forward_batch(
                    torch.tensor([s.need.feed[0] for s in decoding]), [s.need.cache for s in decoding],
                    [s.need.pos for s in decoding]))
            except Exception as e:  # noqa: BLE001 - every stream of this step ends with it
                for s in decoding:
                    s.events.append(e)
                    s.done = True
                    s.cache.tokens = []
                logits = None
            if logits is not None:
                self.last_decode = (len(decoding), time.perf_counter() - t0)
                for s, row in zip(decoding, logits):
                    self._advance(s, row)
        out = []
        for s in self.streams:
            out += [(s.request_id, ev) for ev in s.events]
            s.events = []
        for s in [s for s in self.streams if s.done]:
            self.streams.remove(s)
            if s.pooled:
                self.pool.give(s.cache)
        return out

    def end_all(self) -> list[int]:
        """Drop every stream (after an engine error); their caches start clean. Returns their ids."""
        ids = [s.request_id for s in self.streams]
        for s in self.streams:
            s.cache.tokens = []
            if s.pooled:
                self.pool.give(s.cache)
        self.streams = []
        return ids
