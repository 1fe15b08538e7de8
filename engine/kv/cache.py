"""Which KV cache a request uses, and how much of it carries over: the scheduler's caches.

Every cache is kept under a key. A request that continues a conversation uses that conversation's
cache (Generate.cache_key: the window's chat id; "chat" for a client with one conversation), whose
prefix carries over between turns and between returns to it. The others (the local server's, slot
"pool") take the free pool cache sharing the longest prefix with their prompt (a client that sends the
whole conversation each time reuses what it computed last time), but never one whose shared prefix is
short beside what it holds (`gives`): "Say hello." shares a chat template's opening with a document's
cache, and was handed it, and the document was read again at its next question. Such a request takes
a cache of its own, and the valuable one stays.

Caches live side by side within a budget of memory (`budget`: their keys and values as actually
filled, positions x KVCache.token_bytes, and any linear state), the least recently used evicted first;
torch allocates a cache's pages as its positions fill. With KV files (engine/kv/files.py), a cache is
written after its reply ends and as it is evicted, and a conversation with no cache in memory (evicted,
or from an earlier run) is restored from its file when that measures faster than reading it again.

This module is the only one that rewrites a cache's token list: a cache holds keys and values for
exactly `cache.tokens`, and a sequence only appends to it (engine/runtime/generate.py). A hybrid model's cache
also holds its linear-attention state, which cannot be cut back: a prefix is kept only as far as a copy
of that state taken at a turn boundary (engine/layers/state.py).
"""
from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Callable

from .tensors import KVCache

CHEAP_TOKENS = 64  # a pool cache may go to a prompt that loses at most this many of its tokens, or no
# more than it keeps; and a file is read only to save more than this many


def common_prefix(cache: KVCache, prompt: list[int]) -> int:
    return _common(cache.tokens, prompt)


def _common(tokens: list[int], prompt: list[int]) -> int:
    n = 0
    for a, b in zip(tokens, prompt):
        if a != b:
            break
        n += 1
    return n


def shared(tokens: list[int], prompt: list[int]) -> int:
    """The cached tokens a prompt can use (at least one prompt token is always read: its logits start
    the reply)."""
    return min(_common(tokens, prompt), len(prompt) - 1)


def gives(tokens: list[int], prompt: list[int]) -> bool:
    """Whether a pool cache holding `tokens` may be given to `prompt`: it keeps at least as many of them
    as it loses, or loses only a few."""
    p = shared(tokens, prompt)
    return len(tokens) - p <= max(p, CHEAP_TOKENS)


def keep_prefix(cache: KVCache, prompt: list[int]) -> int:
    """Keep the cached keys and values of the prompt's longest cached prefix (at least one prompt
    token is always read again: its logits start the reply); returns how many are kept."""
    n = shared(cache.tokens, prompt)
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


@dataclass(eq=False)
class Kept:
    """One cache in memory, under its key."""
    key: str
    cache: KVCache
    busy: bool = False  # a request uses it
    used: int = 0  # when it was last claimed (the caches' clock): the least recently used goes first
    reserve: int = 0  # positions the request using it may fill
    saved: list[int] | None = None  # the tokens its file holds (None: none written)
    job: object = None  # its file being written (kv_files.SaveJob)


class KVCaches:
    """The caches of one model. make() makes one (of the model's context); pool_size: pool requests
    at once; budget: bytes the caches in memory may hold (None: one whole context's, what the planner
    reserves for keys and values beside the weights, engine/planning/kv_reservation.py: several
    conversations shorter than the context share it); files: its KV files
    (engine/kv/files.py; None: nothing kept on disk); prefill_rate() the prompt tokens a second the
    telemetry measured (0: not yet)."""

    def __init__(self, make: Callable[[], KVCache], pool_size: int, budget: int | None = None, files=None,
                 prefill_rate: Callable[[], float] = lambda: 0.0):
        self.make, self.pool_size, self.budget, self.files = make, pool_size, budget, files
        self.prefill_rate = prefill_rate
        self.kept: dict[str, Kept] = {}
        self.last_chat: Kept | None = None  # the conversation claimed last (the context in use)
        self.evicted = 0  # caches evicted so far
        self._leaving: dict[str, object] = {}  # evicted caches still being written (their SaveJobs)
        self._clock = itertools.count(1)
        self._token_bytes = 0

    def available(self, key: str) -> bool:
        """A request of this key ("": a pool one) may start: its conversation's cache is free, or fewer
        than pool_size pool requests run."""
        if key:
            return key not in self.kept or not self.kept[key].busy
        return sum(e.busy and e.key.startswith("pool:") for e in self.kept.values()) < self.pool_size

    def pool_available(self) -> bool:
        return self.available("")

    @property
    def held(self) -> int:
        """Bytes the caches in memory hold (or may fill, for those in use)."""
        return sum(self._held(e) for e in self.kept.values())

    @property
    def chat(self) -> KVCache | None:
        """The cache of the conversation claimed last (None: none yet)."""
        return self.last_chat.cache if self.last_chat is not None else None

    @property
    def chat_tokens(self) -> int:
        return len(self.last_chat.cache.tokens) if self.last_chat is not None else 0

    def claim(self, key: str, prompt: list[int], fresh: bool = False, reserve: int = 0) -> KVCache:
        """The cache for a new request, holding only a prefix of its prompt (none when fresh): key's own
        ("": a pool cache, chosen by its prefix); reserve: the positions the request may fill."""
        if key in self._leaving:  # evicted a moment ago: its file is complete before it is looked at
            self._leaving.pop(key).wait()
        e, stored = (self.kept.get(key), None) if key else self._pooled(prompt, fresh)
        if e is None and key and not fresh and self.files is not None:
            stored = self.files.find(key)
        if e is not None:
            if e.job is not None:  # its file being written stops (the file stays as it was)
                e.job.stop()
                e.job = None
        else:
            self._fit(None, max(reserve, len(stored.tokens) if stored is not None else 0))
            name = stored.key if stored is not None else key or f"pool:{uuid.uuid4().hex[:16]}"
            e = self.kept[name] = Kept(name, self._new_cache())
            if stored is not None:
                self._restore(e, stored, prompt)
        e.busy, e.used, e.reserve = True, next(self._clock), reserve
        if fresh:
            forget(e.cache)
        keep_prefix(e.cache, prompt)
        self._fit(e, reserve)
        if key:
            self.last_chat = e
        return e.cache

    def release(self, cache: KVCache, failed: bool = False) -> None:
        """A request ended with this cache; a failed one leaves nothing reusable in it. What a reply
        added is written to the cache's file, on a thread of its own."""
        e = next((x for x in self.kept.values() if x.cache is cache), None)
        if e is None:
            return
        e.busy, e.reserve = False, 0
        if failed:
            forget(cache)
        elif self._worth_saving(e):
            e.job = self.files.save_later(e.key, cache, lambda tokens, e=e: setattr(e, "saved", tokens))

    def close(self) -> None:
        """The model goes: the files being written are finished."""
        if self.files is not None:
            self.files.wait()

    # ---- choosing, restoring, evicting ----
    def _pooled(self, prompt: list[int], fresh: bool):
        """(a free pool cache in memory, None), or (None, a file of one) sharing more, or (None, None):
        a new cache. Only a cache that `gives` the prompt is considered, the one sharing most first."""
        free = [e for e in self.kept.values() if not e.busy and e.key.startswith("pool:")
                and gives(e.cache.tokens, prompt)]
        best = max(free, key=lambda e: (shared(e.cache.tokens, prompt), -len(e.cache.tokens)), default=None)
        if fresh or self.files is None:
            return best, None
        got = shared(best.cache.tokens, prompt) if best is not None else 0
        files = [s for s in self.files.pooled() if s.key not in self.kept and gives(s.tokens, prompt)]
        stored = max(files, key=lambda s: shared(s.tokens, prompt), default=None)
        if stored is not None and shared(stored.tokens, prompt) > got + CHEAP_TOKENS:
            return None, stored
        return best, None

    def _restore(self, e: Kept, stored, prompt: list[int]) -> None:
        p = shared(stored.tokens, prompt)
        if p <= CHEAP_TOKENS:
            return
        if self.files.restore(stored, e.cache, p, self.prefill_rate()):
            e.saved = list(stored.tokens)
        else:
            forget(e.cache)

    def _new_cache(self) -> KVCache:
        cache = self.make()
        if not self._token_bytes:
            self._token_bytes = cache.token_bytes
            if self.budget is None:
                self.budget = cache.nbytes
        return cache

    def _held(self, e: Kept, positions: int = 0) -> int:
        """Its memory: the rows it has touched (KVCache.reached), or may fill, and any linear state."""
        state = e.cache.state.nbytes if e.cache.state is not None else 0
        n = max(e.cache.reached, len(e.cache.tokens), e.reserve if e.busy else 0, positions)
        return n * self._token_bytes + state

    def _fit(self, claimed: Kept | None, positions: int) -> None:
        """Evict the least recently used free caches until those kept, and `positions` for the claimed
        one (or one still to be made), fit the budget; caches in use stay, whatever they hold."""
        if self.budget is None:
            return  # no cache made yet

        def total() -> int:
            others = sum(self._held(x) for x in self.kept.values() if x is not claimed)
            return others + (self._held(claimed, positions) if claimed is not None else positions * self._token_bytes)

        for x in sorted(self.kept.values(), key=lambda x: x.used):
            if total() <= self.budget:
                return
            if x is not claimed and not x.busy:
                self._evict(x)

    def _evict(self, e: Kept) -> None:
        """Out of memory: its file written first (off the engine thread) where what it holds is worth it."""
        del self.kept[e.key]
        self.evicted += 1
        if self.last_chat is e:
            self.last_chat = None
        if e.job is None and self._worth_saving(e):
            e.job = self.files.save_later(e.key, e.cache, lambda tokens: None)
        if e.job is not None:
            self._leaving[e.key] = e.job  # the job holds the cache until its file is written, then lets it go
        for k in [k for k, j in self._leaving.items() if not j.thread.is_alive()]:
            del self._leaving[k]

    def _worth_saving(self, e: Kept) -> bool:
        return (self.files is not None and len(e.cache.tokens) >= self.files.min_tokens
                and e.cache.tokens != e.saved)
