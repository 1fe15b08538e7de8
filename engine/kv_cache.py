"""Which KV cache a request uses, and how much of it carries over: the scheduler's caches.

A request that continues the chat (slot "chat") uses the chat's own cache, whose prefix carries
over between turns. Others take one of a pool of caches, the one sharing the longest prefix with
their prompt (a client that sends the whole conversation each time reuses what it computed last
time); the pool grows to `size` caches, which torch allocates lazily (pages are touched as
positions fill). This module is the only one that rewrites a cache's token list: a cache holds
keys and values for exactly `cache.tokens`, and a sequence only appends to it (engine/generate.py).
A hybrid model's cache also holds its linear-attention state, which cannot be cut back: a prefix is
kept only as far as a copy of that state taken at a turn boundary (engine/layers/state.py).
"""
from __future__ import annotations

from typing import Callable

from .model import KVCache


def common_prefix(cache: KVCache, prompt: list[int]) -> int:
    n = 0
    for a, b in zip(cache.tokens, prompt):
        if a != b:
            break
        n += 1
    return n


def keep_prefix(cache: KVCache, prompt: list[int]) -> int:
    """Keep the cached keys and values of the prompt's longest cached prefix (at least one prompt
    token is always read again: its logits start the reply); returns how many are kept."""
    n = min(common_prefix(cache, prompt), len(prompt) - 1)
    if cache.state is not None:  # a linear-attention state stands for all its tokens: a turn boundary's copy
        n = cache.state.rewind(n, len(cache.tokens))
    cache.tokens = cache.tokens[:n]
    return n


def forget(cache: KVCache) -> None:
    """The cache holds nothing usable (a cold prefill next, or a step that did not finish)."""
    cache.tokens = []
    if cache.state is not None:
        cache.state.drop_after(0)


def turn_boundary(cache: KVCache) -> None:
    """The cache has just read a whole prompt: where a model keeps a linear-attention state, keep a
    copy of it here, so the next turn (this prompt, the reply, a new message) resumes from it."""
    if cache.state is not None:
        cache.state.snapshot(len(cache.tokens))


class KVCaches:
    """The chat's cache and the pool. make() makes one cache (of the model's context)."""

    def __init__(self, make: Callable[[], KVCache], pool_size: int):
        self.make, self.pool_size = make, pool_size
        self.chat: KVCache = make()
        self.free: list[KVCache] = []
        self.made = 0

    def pool_available(self) -> bool:
        return bool(self.free) or self.made < self.pool_size

    def claim(self, slot: str, prompt: list[int], fresh: bool = False) -> KVCache:
        """The cache for a new request, holding only a prefix of its prompt (none when fresh)."""
        if slot == "chat":
            cache = self.chat
        elif self.free and (self.made >= self.pool_size or max(common_prefix(c, prompt) for c in self.free)):
            cache = max(self.free, key=lambda c: common_prefix(c, prompt))
            self.free.remove(cache)
        else:
            self.made += 1
            cache = self.make()
        if fresh:
            forget(cache)
        keep_prefix(cache, prompt)
        return cache

    def release(self, cache: KVCache, failed: bool = False) -> None:
        """A request ended with this cache; a failed one leaves nothing reusable in it."""
        if failed:
            forget(cache)
        if cache is not self.chat:
            self.free.append(cache)
