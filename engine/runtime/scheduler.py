"""The requests: admission, chunked prompts, batched decode steps, per-request stop, the KV caches.

Every job a client submits is a `Request` with an id the scheduler hands out (`new`, callable from
any thread) and its own stop event; its events go to the client that asked (`Request.reply`). A
Generate arrives with its prompt as ids (`Request.prompt`, prepared by the session with
engine/prompts/prompt.py): the scheduler renders nothing. The engine thread queues generation requests and
queries in order (`enqueue`) and lets them start as room allows (`admit`): a chat request waits for
its conversation's cache to be free (one reply a conversation at a time, its prefix carried over
between turns; engine/kv/cache.py keeps each conversation's cache by its key); a pool request (the
local server's) takes a pool cache; up to `max_streams` requests at once; a query waits for every
request to end.

`step()` runs one round, after vLLM's EngineCore.step (schedule -> execute -> update):
- one prompt chunk of the oldest request still reading its prompt, so the requests already
  decoding stall for at most one chunk (`chunk` tokens; larger when nothing else decodes:
  `prompt_chunk`, the one place that decides);
- one decode step for every request waiting on one token, as one forward of B tokens, each at its
  own position in its own cache (MoEModel.forward): every layer's dense weights, and every expert
  any of the B tokens chose, are read once for all of them.
Each request's Tokens and Done go out as they come; an exception ends its request alone (a failure
of the batched forward itself ends every request in it), never the engine thread.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import errorlog
from ..files import mapped
from .. import native
from ..protocol.errors import ForwardStopped, MixdeskError
from .generate import STOPPED, Done, Generator, Need
from ..kv.cache import KVCaches
from ..prompts.prompt import Prepared
from ..protocol import ErrorEvent, Generate, Query

CHUNK = 64  # prompt tokens read per round while other requests decode (the default of Scheduler.chunk)
SOLO_CHUNK = 512  # read per round when nothing else decodes (Scheduler.solo_chunk). The full-size
# Qwen3-30B-A3B Q4_K_M (128 experts, top-8), in-process, 2 Zen 5 cores, 2026-12-04: a forward of 64 / 128 /
# 256 / 512 / 1,024 tokens reads 62 / 84 / 97 / 105 / 110 tok/s (an expert sees 4 tokens of 64, 32 of 512,
# so its rows are read from memory once for that many). A Stop ends a chunk between two layers
# (MoEModel.forward's cancel), so its length costs no responsiveness.


@dataclass(eq=False)
class Request:
    id: int
    cmd: object                           # Generate, Query or Load
    reply: Callable[[object], None]       # where this request's own events go
    stop: threading.Event = field(default_factory=threading.Event)
    seq: object = None                    # the Generator.sequence coroutine, once started
    cache: object = None                  # its KV cache, once started
    need: Need | None = None              # the forward pass it waits on
    done: bool = False
    prompt: Prepared | None = None        # a Generate's prompt ids and parser (the session prepares them)

    @property
    def slot(self) -> str:
        return getattr(self.cmd, "slot", "")

    @property
    def key(self) -> str:
        """The cache it continues ("": a pool cache chosen by its prompt; engine/kv/cache.py)."""
        return getattr(self.cmd, "cache_key", "") or ("chat" if self.slot == "chat" else "")


class Scheduler:
    def __init__(self, max_streams: int = 4, chunk: int | None = None,
                 on_decode: Callable[[int, float], None] | None = None,
                 on_done: Callable[[Done], None] | None = None):
        """on_decode(width, seconds) after each decode step; on_done(done) after each request's end
        (telemetry)."""
        self.max_streams = max_streams
        self.chunk = CHUNK if chunk is None else chunk  # prompt tokens a round reads while others decode
        self.solo_chunk = SOLO_CHUNK  # the most a round reads when nothing else decodes (chunk: no more than chunk)
        self.cache_budget: int | None = None  # bytes the caches may hold (None: kv_cache.default_budget)
        self.on_decode = on_decode or (lambda n, s: None)
        self.on_done = on_done or (lambda d: None)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._known: dict[int, Request] = {}  # every request not ended: waiting, running or loading
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.gen: Generator | None = None
        self.caches: KVCaches | None = None
        self.last_width = 0  # requests the last round decoded together (0: it decoded none)
        self._last_end = 0.0  # when the last round's decode step ended (0: it decoded nothing)

    # ---- any thread ----
    def new(self, cmd, reply: Callable[[object], None]) -> Request:
        """A request for cmd with a fresh id, known (so a Stop finds it) before it is queued."""
        with self._lock:
            req = Request(next(self._ids), cmd, reply)
            self._known[req.id] = req
        return req

    def stop(self, request_id: int | None = None) -> None:
        """Stop one request (None: every one), waiting or running: it ends at its next step."""
        with self._lock:
            reqs = list(self._known.values()) if request_id is None else [self._known.get(request_id)]
        for r in reqs:
            if r is not None:
                r.stop.set()

    # ---- engine thread ----
    @property
    def busy(self) -> bool:
        return bool(self.running)

    def forget(self, req: Request) -> None:
        with self._lock:
            self._known.pop(req.id, None)

    def attach(self, generator: Generator, files=None, prefill_rate: Callable[[], float] = lambda: 0.0) -> None:
        """A model is ready: requests start on it, with caches of their own (files: its KV cache files,
        engine/kv/files.py; prefill_rate: the telemetry's, against which a file is worth reading)."""
        if self.caches is not None:  # caches made anew (another context): the old ones' files are finished
            self.caches.close()
        self.gen = generator
        self.caches = KVCaches(generator.new_cache, self.max_streams, self.cache_budget, files, prefill_rate)

    def detach(self) -> None:
        """The model goes: running requests end with a word, not silence; waiting ones stay."""
        for r in list(self.running):
            self._end(r, ErrorEvent(message="the model was closed while this request ran", request_id=r.id,
                                    kind="Unloaded"))
        self.running = []
        if self.caches is not None:
            self.caches.close()  # the files being written are finished
        self.gen = self.caches = None

    def enqueue(self, req: Request) -> None:
        self.waiting.append(req)

    def end_waiting(self, message: str) -> None:
        """The engine stops: every request still waiting ends with this error."""
        while self.waiting:
            r = self.waiting.popleft()
            self._end(r, ErrorEvent(message=message, request_id=r.id, kind="Unloaded"))

    def _room(self, req: Request) -> bool:
        if isinstance(req.cmd, Query) or self.gen is None:
            return not self.running
        if len(self.running) >= self.max_streams:
            return False
        return self.caches.available(req.key)

    def admit(self) -> Request | None:
        """Start waiting requests in order while there is room. A waiting request that was
        stopped ends here, without a token. Returns the query at the head of the queue once nothing
        runs (the caller answers it, then admits again), else None."""
        for r in [r for r in self.waiting if r.stop.is_set() and isinstance(r.cmd, Generate)]:
            self.waiting.remove(r)
            self._end(r, Done(request_id=r.id, reason="cancelled", text=""))
        while self.waiting and self._room(self.waiting[0]):
            r = self.waiting.popleft()
            if isinstance(r.cmd, Query):
                return r
            self._start(r)
        return None

    def _start(self, req: Request) -> None:
        try:
            gen, cmd = self.gen, req.cmd
            if gen is None:
                self._end(req, ErrorEvent(message="no model is loaded", request_id=req.id, kind="NoModel"))
                return
            cmd.params.check()
            prompt = req.prompt or self._as_given(cmd)
            reserve = min(gen.ctx, len(prompt.ids) + cmd.params.max_new_tokens)  # the positions it may fill
            req.cache = self.caches.claim(req.key, prompt.ids, cmd.fresh, reserve)
            req.seq = gen.sequence(prompt.ids, cmd.params, req.stop, req.cache, chunk=self.prompt_chunk,
                                   request_id=req.id, parser=prompt.parser, opening=prompt.opening)
        except Exception as e:  # noqa: BLE001 - the error boundary: this request ends, the engine serves on
            self._fail(req, e, "starting the reply")
            return
        self.running.append(req)
        self._advance(req, None, first=True)

    @staticmethod
    def _as_given(cmd) -> Prepared:
        """The prompt of a request no session prepared (the scheduler driven directly: tests, a
        benchmark): its ids as they are, the reply read as plain content."""
        if cmd.prompt_ids is None:
            raise ValueError("the request's prompt was not rendered (engine/prompts/prompt.py renders messages and text)")
        return Prepared.of_ids(cmd.prompt_ids)

    def _advance(self, req: Request, logits, first: bool = False) -> None:
        """Run req's sequence up to its next Need (or its end), sending on what it yields."""
        try:
            item = next(req.seq) if first else req.seq.send(logits)
            while not isinstance(item, Need):
                if isinstance(item, Done):
                    self.on_done(item)
                    self._end(req, item)
                    return
                req.reply(item)
                item = next(req.seq)
            req.need = item
        except StopIteration:
            self._end(req, None)
        except Exception as e:  # noqa: BLE001 - it ends this request alone
            self._fail(req, e, "generating")

    def _fail(self, req: Request, e: Exception, what: str, log: str | None = None) -> None:
        self._end(req, errorlog.error_event(e, what, req.id, log), failed=True)

    def _end(self, req: Request, event, failed: bool = False) -> None:
        """req is over: its cache goes back (a failed request's holds a step that did not finish), its
        last event goes out."""
        req.done = True
        if req.cache is not None and self.caches is not None:
            self.caches.release(req.cache, failed)
            req.cache = None
        if req in self.running:
            self.running.remove(req)
        self.forget(req)
        if event is not None:
            req.reply(event)
        if not self.running:
            native.torch_threads.widen()  # nothing decodes: torch gets its threads back
            self._last_end = 0.0

    def step(self) -> int:
        """One round (see the module's docstring). Returns how many requests ended in it."""
        before = len(self.running)
        try:
            self._round()
        except Exception as e:  # noqa: BLE001 - outside any one request: every running one ends
            log = errorlog.record(e, "generating")
            for r in list(self.running):
                self._fail(r, e, "generating", log)
        return before - len(self.running)

    def prompt_chunk(self) -> int:
        """How many prompt tokens the next chunk reads: `chunk` while other requests run (they decode, or
        will once their own prompt is read: each stalls for one chunk at most); solo_chunk when nothing
        else runs (larger products run faster: SOLO_CHUNK; a Stop still acts within a layer). Two requests
        started together: the second's first chunk is decided while the first still reads its prompt."""
        if len(self.running) > 1 or any(r.need is not None and len(r.need.feed) == 1 for r in self.running):
            return self.chunk
        return max(self.chunk, self.solo_chunk)

    def _round(self) -> None:
        reading = [r for r in self.running if r.need is not None and len(r.need.feed) > 1]
        if reading:  # the oldest prompt, one chunk
            r = reading[0]
            try:
                logits = self.gen.forward(r.need, cancel=r.stop)  # a Stop ends it between two layers
                mapped.check()  # a model file changed under the step: no token from it
            except ForwardStopped:
                self._advance(r, STOPPED)  # the chunk is not kept; the request ends "cancelled"
            except Exception as e:  # noqa: BLE001 - this request ends with it
                self._fail(r, e, "generating")
            else:
                self._advance(r, logits)
        decoding = [r for r in self.running if r.need is not None and len(r.need.feed) == 1]
        self.last_width = len(decoding)
        if not decoding:
            self._last_end = 0.0
            return
        model = self.gen.model
        t0 = time.perf_counter()
        try:
            logits = self.gen.retrying(lambda: model.forward(
                torch.tensor([r.need.feed[0] for r in decoding]), [r.need.cache for r in decoding],
                [r.need.pos for r in decoding]))
            mapped.check()
        except Exception as e:  # noqa: BLE001 - every request of this step ends with it
            log = None if isinstance(e, MixdeskError) else errorlog.record(e, "generating")
            for r in decoding:
                self._fail(r, e, "generating", log)
            return
        for r, row in zip(decoding, logits):
            self._advance(r, row)
        # The step as a client sees it: from the last round's tokens to this one's (the engine's
        # work between two steps included: migration slices, commands), or from this forward's
        # start after a round that decoded nothing. The migration's build budget is a share of it.
        end = time.perf_counter()
        self.on_decode(len(decoding), end - (self._last_end if self._last_end else t0))
        self._last_end = end

    @property
    def chat_tokens(self) -> int:
        """Positions the last conversation's cache holds (the context in use)."""
        return self.caches.chat_tokens if self.caches is not None else 0
