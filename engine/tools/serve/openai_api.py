"""The OpenAI-compatible HTTP API (`mixdesk serve`, and the window's Local server switch): one more
client of the engine thread, through the same commands and events as the window.

Routes: GET /v1/models, POST /v1/chat/completions and POST /v1/completions, streamed (server-sent
events ending with `data: [DONE]`) or not. Errors have OpenAI's JSON shape
{"error": {"message", "type", "param", "code"}} and status: 400 for a bad field or a prompt longer
than the context, 401 for a wrong key, 404 for an unknown model or route, 503 while no model is
loaded. A streamed request's status is decided before its first byte: the response waits for the
first token (or the error) before it starts.

Chat completions speak the model's own format: tools, tool calls and reasoning (tool_fields.py
checks the request's tool and reasoning fields, chat_messages.py turns its messages into the chat
template's convention, chat_reply.py shapes the reply the engine read: message, deltas, finish).
`/v1/completions` stays plain text.

A client that disconnects stops its generation: the response's generator is closed, which sends
Stop for its request, and the engine frees its slot at the next step.

Stack: Starlette on uvicorn. FastAPI would add request models and docs pages on top of the same
Starlette; Mixdesk validates its few fields itself, to give OpenAI's error shape and status, so
the layer would go unused. benchmarks/server_stack.py measures both (results in
benchmarks/results/server_stack-*.md).
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass

from ...protocol.sampling import SamplingParams
from ...protocol import EngineStopped, ErrorEvent, Generate, Loaded, Stop

STOP_CHARS = 1000  # a stop string longer than this is a mistake (each step scans for it)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class RequestLog:
    """One line of the window's request log."""

    when: float
    method: str
    path: str
    status: int
    tokens: int = 0
    seconds: float = 0.0


class EngineLink:
    """The API's side of the engine thread: it submits its requests with a reply_to of their own,
    so their events (and only theirs) come back to it, and it listens for the broadcast events it
    needs (Loaded, EngineStopped). Both arrive on the engine thread, which hands them to the
    asyncio loop with call_soon_threadsafe."""

    def __init__(self, session, loop: asyncio.AbstractEventLoop):
        self.session, self.loop = session, loop
        self.queues: dict[int, asyncio.Queue] = {}  # the requests still answered, by the engine's id
        self.loaded: Loaded | None = session.last_loaded
        self.closed = False
        session.listeners.append(self._on_event)

    def close(self) -> None:
        self.closed = True  # the loop closes next: nothing more may be handed to it
        if self._on_event in self.session.listeners:
            self.session.listeners.remove(self._on_event)

    def _hand(self, q: asyncio.Queue, ev) -> None:  # on the engine thread
        if self.closed:
            return
        try:
            self.loop.call_soon_threadsafe(q.put_nowait, ev)
        except RuntimeError:  # the loop closed meanwhile (the server stopped): nobody waits for it
            pass

    def _on_event(self, ev) -> None:  # on the engine thread: a broadcast event
        if isinstance(ev, Loaded):
            self.loaded = ev
        if isinstance(ev, EngineStopped):  # every request waiting ends with it
            self.loaded = None
            for rid, q in list(self.queues.items()):
                self._hand(q, ErrorEvent(message=ev.message, request_id=rid, kind="Unloaded"))

    def start(self, **kw) -> tuple[int, asyncio.Queue]:
        """Submit a Generate (in a pool cache of its own); its id and the queue its events come on."""
        q: asyncio.Queue = asyncio.Queue()
        rid = self.session.submit(Generate(slot="pool", **kw), reply_to=lambda ev: self._hand(q, ev))
        self.queues[rid] = q
        return rid, q

    def stop(self, rid: int) -> None:
        if self.queues.pop(rid, None) is not None:
            self.session.submit(Stop(request_id=rid))

    def finish(self, rid: int) -> None:
        self.queues.pop(rid, None)


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class Departure:
    """Watches one request's connection while its answer is prepared: next(q) is q's next event,
    or ClientGone as soon as the client leaves (uvicorn's receive() reports it)."""

    def __init__(self, request):
        self.watch = asyncio.ensure_future(self._watch(request.receive))

    @staticmethod
    async def _watch(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def next(self, q: asyncio.Queue):
        get = asyncio.ensure_future(q.get())
        done, _ = await asyncio.wait({get, self.watch}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()  # a cancelled get takes nothing off the queue
        raise ClientGone

    def close(self) -> None:
        self.watch.cancel()


# ---- request fields --------------------------------------------------------------------------

def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object (400 otherwise: not JSON, not UTF-8, nested too deeply)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply to read") from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def text_of(s: str) -> str:
    """JSON may carry lone surrogates (\\ud800), which no tokenizer encodes: each becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", s)


_SURROGATE = re.compile("[\ud800-\udfff]")


def stream_fields(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage), each checked: true, false or absent."""
    stream = _field(body, "stream", bool, False, want="true or false", bools=True)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object such as {\"include_usage\": true}",
                       param="stream_options")
    usage = _field(opts or {}, "include_usage", bool, False, want="true or false", bools=True)
    return stream, bool(stream and usage)


def prompt_of(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", param="prompt")
    return text_of(prompt)


def _field(body: dict, name: str, kinds, default=None, check=None, want: str = "", bools: bool = False):
    """body[name] (default when absent or null); 400 naming it when it is not `want` (true and
    false are not numbers here, though Python counts them as ints; bools=True wants them)."""
    v = body.get(name)
    if v is None:
        return default
    if (isinstance(v, bool) and not bools) or not isinstance(v, kinds) or (check is not None and not check(v)):
        raise ApiError(400, f"'{name}' must be {want}, not {json.dumps(v)[:80]}", param=name)
    return v


def sampling(body: dict) -> SamplingParams:
    """OpenAI's sampling fields -> SamplingParams (a bad value: 400 naming the field)."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _field({"max_tokens": max_tokens}, "max_tokens", int, 512, lambda v: v >= 1, "a whole number >= 1")
    temperature = _field(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2, "a number from 0 to 2")
    top_p = _field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
    seed = _field(body, "seed", int, None, lambda v: 0 <= v < 2**63, "a whole number >= 0")
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise ApiError(400, "'stop' must be a string or a list of up to 4 strings", param="stop")
    if any(len(s) > STOP_CHARS for s in stop):
        raise ApiError(400, f"each 'stop' string may be at most {STOP_CHARS} characters", param="stop")
    stop = tuple(text_of(s) for s in stop if s)
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "'n' must be 1: Mixdesk returns one choice per request", param="n")
    return SamplingParams(max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                          seed=seed, stop=stop)


FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def error_of(ev: ErrorEvent) -> ApiError:
    if ev.kind == "ContextOverflow":
        return ApiError(400, ev.message, code="context_length_exceeded", param="messages")
    if ev.kind in ("InputError",):
        return ApiError(400, ev.message)
    if ev.kind in ("NoModel", "Unloaded"):
        return ApiError(503, ev.message, kind="server_error", code="model_not_loaded")
    return ApiError(500, ev.message, kind="server_error")


def usage_of(fin) -> dict:
    """A reply's usage in OpenAI's shape; cached_tokens: the prompt tokens whose keys and values were
    cached already (read only once; engine/kv/cache.py)."""
    n = len(fin.token_ids)
    return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": n, "total_tokens": fin.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": fin.reused_tokens}}


def chunk_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
