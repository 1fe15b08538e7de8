"""Generation: prefill past a cached prefix, sampling, stopping, and streaming text that is correct
across multi-byte characters split between tokens (the prompt's ids come from engine/prompts/prompt.py).

`Generator.sequence` is one sequence's generation as a coroutine: it yields a `Need` whenever it
wants a forward pass (its feed, position and KV cache) and is sent the logits back, and it yields a
`Token` per new token and one `Done` at the end. Whoever drives it runs the forwards: `stream`
runs each alone in a fresh cache (the CLI's measurements), the scheduler (engine/runtime/scheduler.py) runs
the decode steps of several sequences as one batched forward, in the caches it owns. Cancellation is a threading.Event checked every step.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from .. import native
from ..protocol.errors import ContextOverflow, MixdeskError
from ..protocol.events import Done, PromptProgress, Token  # noqa: F401 - the events it makes (engine/protocol/events.py), imported here too
from ..prompts.formats import Delta, Parser
from ..kv.cache import turn_boundary
from ..kv.tensors import KVCache
from ..model.forward import MoEModel
from ..protocol.sampling import SamplingParams  # noqa: F401 - a leaf (engine/protocol/sampling.py), imported from here too


def sample(logits: torch.Tensor, p: SamplingParams, history: list[int],
           gen: torch.Generator | None) -> int:
    """logits [V] fp32 -> one token id."""
    if p.repetition_penalty != 1.0 and history:
        seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=logits.device)
        vals = logits[seen]
        logits = logits.clone()
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if p.temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = (sp.cumsum(-1) - sp) < p.top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


class TextStream:
    """Incremental detokenisation: emits text only once it is complete (no U+FFFD halves)."""

    def __init__(self, tokenizer, keep_special: bool = False):
        self.tok, self.skip = tokenizer, not keep_special
        self.ids: list[int] = []
        self.prefix = 0  # decode window start, for context-dependent spacing
        self.read = 0  # ids already turned into emitted text

    def _dec(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self._dec(self.ids[self.prefix:self.read])
        after = self._dec(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""


class StopMatcher:
    """Holds back text that could be the start of a stop string; reports when one appears."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.emitted = 0

    def feed(self, delta: str) -> tuple[str, bool]:
        self.text += delta
        for s in self.stops:
            i = self.text.find(s, max(0, self.emitted - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                out = self.text[self.emitted:]
                self.emitted = len(self.text)
                return out, True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        safe = max(self.emitted, len(self.text) - hold)
        out, self.emitted = self.text[self.emitted:safe], safe
        return out, False

    def flush(self) -> str:
        out, self.emitted = self.text[self.emitted:], len(self.text)
        return out


class Answer:
    """A reply's parts as they go out: the parser's deltas, the content ending at the first stop
    string (then nothing more goes out). The Done's reasoning, content and tool calls are what went
    out, so the streamed deltas always join to them."""

    def __init__(self, parser: Parser, stops: tuple[str, ...]):
        self.parser, self.stops = parser, StopMatcher(stops)
        self.reasoning = self.content = ""
        self.calls = 0  # tool calls sent
        self.stopped = False

    @property
    def tool_calls(self) -> tuple:
        return tuple(self.parser.tool_calls[:self.calls])

    def feed(self, text: str) -> list:
        return self._out(self.parser.feed(text))

    def finish(self) -> list:
        out = self._out(self.parser.finish())
        return out if self.stopped else out + self._out([Delta("content", self.stops.flush())], flush=True)

    def _out(self, parts: list, flush: bool = False) -> list:
        out = []
        for d in parts:
            if self.stopped:
                break
            if d.part == "content" and not flush:
                text, self.stopped = self.stops.feed(d.text)
                d = Delta("content", text)
            if d.part == "content" and d.text:
                self.content += d.text
            elif d.part == "reasoning":
                self.reasoning += d.text
            elif d.part == "tool_call" and d.name:
                self.calls += 1
            if d.text or d.part == "tool_call":
                out.append(d)
        return out


STOPPED = object()  # what a driver sends back for a Need whose forward a Stop ended (ForwardStopped)


@dataclass(frozen=True)
class Need:
    """A sequence asks for one forward pass: the logits after the last of `feed`, placed at
    positions pos.. of `cache` (send them back into the sequence)."""

    feed: list[int]
    pos: int
    cache: KVCache


def drive(seq, forward) -> Iterator["Token | Done"]:
    """Run a sequence on its own: each Need answered by forward(need) -> logits [V]."""
    try:
        item = next(seq)
        while True:
            if isinstance(item, Need):
                item = seq.send(forward(item))
            else:
                yield item
                item = next(seq)
    except StopIteration:
        return


class NonFiniteOutput(MixdeskError):
    def __init__(self, index: int, dtype: torch.dtype, damage: str | None = None):
        """damage: the checkpoint's own finding (a GGUF block whose scale is not a number), named first."""
        where = "reading the prompt" if index == 0 else f"at new token {index}"
        cause = damage or ("an activation overflowed fp16's range: try --dtype bf16 or fp32" if dtype == torch.float16
                           else "the weights may be corrupt, or the model is not one this format runs correctly")
        super().__init__(f"the model produced NaN/Inf scores {where}; " + (cause if damage else f"likely cause: {cause}"))


class Generator:
    def __init__(self, model: MoEModel, tokenizer, eos_ids: set[int], ctx: int = 4096):
        """Token ids in, tokens out: prompts are rendered before they reach it (engine/prompts/prompt.py)."""
        self.on_oom = None  # called when a step runs out of accelerator memory; the step is retried
        self.pick = sample  # logits -> the next token (tests script replies through it: tests/scripted_chat.py)
        self.model = model
        self.tok = tokenizer
        self.eos_ids = set(eos_ids)
        self.ctx = min(ctx, model.dims.max_positions)

    def retrying(self, step):
        """step(); on CUDA out-of-memory, let the owner evict, then retry (a step rewrites the same
        cache slots, so a retry is exact)."""
        for attempt in range(4):
            try:
                return step()
            except torch.cuda.OutOfMemoryError:
                if self.on_oom is None or attempt == 3:
                    raise
                self.on_oom()
        raise AssertionError("unreachable")

    def forward(self, need: Need, cancel=None) -> torch.Tensor:
        """One sequence's forward pass alone: logits [V] fp32. cancel: a Stop that may end it between
        layers (ForwardStopped: MoEModel.forward)."""
        return self.retrying(lambda: self.model.forward(torch.tensor(need.feed, dtype=torch.long), need.cache,
                                                        need.pos, cancel=cancel)[-1])

    def count_tokens(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))

    def stream(self, prompt: list[int], p: SamplingParams = SamplingParams(),
               cancel: threading.Event | None = None) -> Iterator[Token | Done]:
        """One sequence in a fresh KV cache, its forwards run one at a time (the CLI's measurements,
        tests). The engine's requests go through the scheduler (engine/runtime/scheduler.py), which owns
        the caches and their prefix reuse."""
        try:
            yield from drive(self.sequence(prompt, p, cancel, self.new_cache()), self.forward)
        finally:
            native.torch_threads.widen()  # decode steps kept torch at one thread; give its threads back

    def new_cache(self) -> KVCache:
        return self.model.new_cache(self.ctx)

    def sequence(self, prompt: list[int], p: SamplingParams, cancel, cache: KVCache, chunk=0,
                 request_id: int = 0, parser: Parser | None = None, opening: str = ""):
        """The coroutine behind stream (see the module's docstring). `cache` holds keys and values
        of the prompt's first len(cache.tokens) tokens already (its owner kept only a common prefix:
        engine/kv/cache.py); the rest is read. chunk > 0 (or a callable giving it before each chunk):
        the prompt is fed in chunks of that many tokens, each its own Need, so a driver can run other
        sequences' decode steps between them, with a PromptProgress as the read starts and after each
        chunk; a cancel acts after the chunk in progress (or within it, where the driver's forward stops
        between layers and sends back STOPPED), and the chunks read stay in the cache.
        cancel: anything with is_set(), or None. Its events carry request_id. parser reads the reply in
        the model's format as it streams (engine/prompts/formats; None: all of it is content). opening: text
        the prompt ends with that is the reply's own start (read first; Generate.reply_prefix)."""
        if len(prompt) == 0:
            raise ValueError("empty prompt")
        if len(prompt) >= self.ctx:
            raise ContextOverflow(len(prompt), self.ctx)
        reuse = len(cache.tokens)  # keys/values already cached from the previous turn
        if reuse >= len(prompt) or cache.tokens != prompt[:reuse]:
            raise ValueError("the cache does not hold a proper prefix of the prompt")
        gen = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        parser = parser if parser is not None else Parser()
        marked = TextStream(self.tok, keep_special=True) if parser.needs_special_tokens else None
        # stop strings end the answer: the visible text of a plain reply, the content of a parsed one
        text, stops = TextStream(self.tok), StopMatcher(p.stop if marked is None else ())
        answer = Answer(parser, p.stop if marked is not None else ())
        opened = answer.feed(opening) if opening else []  # goes out with the first token
        history = list(prompt)
        out_ids: list[int] = []
        pieces: list[str] = []
        t0 = time.perf_counter()
        feed = prompt[reuse:]
        pos = reuse
        prefill_s, reason = 0.0, "length"
        for i in range(p.max_new_tokens):
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if pos + len(feed) > self.ctx:
                reason = "context"
                break
            step0 = time.perf_counter()
            size = chunk() if callable(chunk) else chunk
            if size and len(feed) > size:  # a long prompt, a chunk at a time, its progress said as it goes
                yield PromptProgress(request_id=request_id, read=pos, total=len(prompt), reused=reuse)
            while size and len(feed) > size:
                if (yield Need(feed[:size], pos, cache)) is STOPPED:
                    break  # a Stop within the chunk: it is not kept (the cancel is set: "cancelled" below)
                cache.tokens.extend(feed[:size])  # kept whatever comes next: a Stop leaves what was read
                pos, feed = pos + size, feed[size:]
                yield PromptProgress(request_id=request_id, read=pos, total=len(prompt), reused=reuse,
                                     tok_s=(pos - reuse) / max(time.perf_counter() - step0, 1e-9))
                if cancel is not None and cancel.is_set():
                    break
                size = chunk() if callable(chunk) else chunk
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            logits = yield Need(feed, pos, cache)
            if logits is STOPPED:
                reason = "cancelled"
                break
            if not bool(torch.isfinite(logits).all()):
                raise NonFiniteOutput(i, self.model.dtype, self.model.ckpt.find_damage())
            cache.tokens.extend(feed)
            pos += len(feed)
            if i == 0:
                turn_boundary(cache)  # the whole prompt read (a hybrid model keeps its state here)
            tid = self.pick(logits, p, history, gen)
            dt = time.perf_counter() - step0
            if i == 0:
                prefill_s = time.perf_counter() - t0
            out_ids.append(tid)
            history.append(tid)
            if tid in self.eos_ids:
                reason = "eos"
                break
            delta, stopped = stops.feed(text.push(tid))
            if delta:
                pieces.append(delta)
            parts, opened = opened + answer.feed(marked.push(tid) if marked is not None else delta), []
            yield Token(request_id=request_id, token_id=tid, text=delta, index=i, seconds=dt, deltas=tuple(parts))
            if stopped or answer.stopped:
                reason = "stop"
                break
            feed = [tid]
        tail = stops.flush() if reason != "stop" else ""
        parts = opened + (answer.feed(tail) if marked is None else []) + answer.finish()
        if tail or parts:
            pieces.append(tail)
            yield Token(request_id=request_id, token_id=-1, text=tail, index=len(out_ids), seconds=0.0,
                        deltas=tuple(parts))
        total = time.perf_counter() - t0
        yield Done(request_id=request_id, reason=reason, text="".join(pieces), token_ids=out_ids,
                   prompt_tokens=len(prompt), reused_tokens=reuse, prefill_s=prefill_s, decode_s=total - prefill_s,
                   reasoning=answer.reasoning, content=answer.content, tool_calls=answer.tool_calls,
                   notes=tuple(parser.notes))
