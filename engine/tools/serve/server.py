"""The local server: the routes of the OpenAI-compatible API (openai_api.py holds its pieces) on
Starlette, run by uvicorn in a thread of its own, beside an engine thread it shares with whoever
else drives it (the window's chat, or nothing more under `mixdesk serve`).

Safe by default: it binds to 127.0.0.1; any other address needs an API key (Server refuses to
start without one), and with a key every /v1 request must carry `Authorization: Bearer KEY`.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import threading
import time
from collections import deque
from functools import partial

from .chat_messages import messages_of
from .chat_reply import ChatReply
from .guard import Guard, protocol_with_header_deadline
from .openai_api import (FINISH, ApiError, ClientGone, Departure, EngineLink, RequestLog, chunk_id, error_of, now,
                         parse_body, prompt_of, sampling, sse, stream_fields, usage_of)
from .tool_fields import refuse_unsupported, tool_request
from ...protocol.errors import ContextOverflow, MixdeskError
from ...protocol import Done, ErrorEvent, PromptProgress, Token

LOG_LINES = 200  # the request log the window shows keeps this many
MAX_BODY = 16 << 20  # bytes: a long document pasted into a prompt is ~1 MB; the context refuses far less
READ_TIMEOUT_S = 10.0  # a request's headers, and each piece of its body, must arrive within this
MAX_CONNECTIONS = 32  # requests answered at once (and twice this many connections open)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server:
    """Serves `session` on http://host:port/v1 until stop(). on_log(RequestLog) is called (on the
    server's thread) after each request, for the window's log."""

    def __init__(self, session, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
                 on_log=None, allowed_hosts=(), allowed_origins=(), max_body: int = MAX_BODY,
                 read_timeout: float = READ_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
        if not is_loopback(host) and not api_key:
            raise ValueError(f"serving on {host} reaches other machines: give an API key (--api-key) to do that")
        self.session, self.host, self.port, self.api_key = session, host, port, api_key or None
        self.allowed_hosts, self.allowed_origins = tuple(allowed_hosts), tuple(allowed_origins)
        self.max_body, self.read_timeout, self.max_connections = max_body, read_timeout, max_connections
        self.on_log = on_log
        self.log: deque = deque(maxlen=LOG_LINES)
        self.requests = 0  # answered so far (the log keeps the last LOG_LINES)
        self.thread: threading.Thread | None = None
        self._server = None
        self.link: EngineLink | None = None
        self.ready = threading.Event()
        self.error: str | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    # ---- lifecycle ----
    def start(self, timeout: float = 15.0) -> "Server":
        """Start serving in a thread; returns once it listens (raises OSError when it cannot)."""
        import uvicorn

        config = uvicorn.Config(self.app(), host=self.host, port=self.port, log_level="warning", lifespan="off",
                                access_log=False, http=protocol_with_header_deadline(self.read_timeout),
                                limit_concurrency=2 * self.max_connections, timeout_keep_alive=5)
        self._server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="mixdesk-server", daemon=True)
        self.thread.start()
        for _ in range(int(timeout / 0.02)):
            if self._server.started or self.error or not self.thread.is_alive():
                break
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise OSError(self.error or f"the server could not listen on {self.host}:{self.port}")
        if self.port == 0:  # an ephemeral port: read the one the OS gave
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.link = EngineLink(self.session, loop)
        try:
            loop.run_until_complete(self._server.serve())
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self.error = f"the server stopped: {e}"
        finally:
            self.link.close()
            loop.close()
        if not self._server.started and self.error is None:
            self.error = f"the server could not listen on {self.host}:{self.port} (in use?)"

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)

    # ---- the app ----
    def app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        server = self

        def error(e: ApiError) -> JSONResponse:
            return JSONResponse(e.body(), status_code=e.status)

        async def logged(request: Request, call):
            t0 = time.perf_counter()
            try:
                server.check_key(request)
                response, tokens = await call(request)
            except ApiError as e:
                response, tokens = error(e), 0
            except ClientGone:  # nobody reads this answer: logged as nginx logs one ("client closed request")
                response, tokens = Response(status_code=499), 0
            entry = RequestLog(time.time(), request.method, request.url.path, response.status_code, 0, 0.0)
            if isinstance(tokens, dict):  # a stream: logged when it ends, with its tokens and time
                tokens.update(entry=entry, t0=t0)
            else:
                entry.tokens, entry.seconds = tokens, time.perf_counter() - t0
                server.record(entry)
            return response

        async def models(request: Request):
            async def run(_):
                ld = server.link.loaded
                data = [] if ld is None else [{"id": ld.name, "object": "model", "created": now(),
                                                "owned_by": "mixdesk"}]
                return JSONResponse({"object": "list", "data": data}), 0
            return await logged(request, run)

        async def chat(request: Request):
            return await logged(request, lambda r: server.complete(r, "chat"))

        async def completions(request: Request):
            return await logged(request, lambda r: server.complete(r, "text"))

        async def not_found(request: Request):
            async def run(_):
                raise ApiError(404, f"no route {request.method} {request.url.path}", code="not_found")
            return await logged(request, run)

        routes = [Route("/v1/models", models, methods=["GET"]),
                  Route("/v1/chat/completions", chat, methods=["POST"]),
                  Route("/v1/completions", completions, methods=["POST"]),
                  Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]
        async def http_error(request: Request, exc: HTTPException):  # Starlette's own (a method no route takes)
            return error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                  code="method_not_allowed" if exc.status_code == 405 else None))

        app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
        return Guard(app, self.host, self.allowed_hosts, self.allowed_origins, self.max_body, self.read_timeout,
                     self.max_connections)

    def record(self, entry: RequestLog) -> None:
        self.log.append(entry)
        self.requests += 1
        if self.on_log is not None:
            self.on_log(entry)

    def check_key(self, request) -> None:
        if self.api_key is None:
            return
        got = request.headers.get("authorization", "")
        token = got[7:] if got.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise ApiError(401, "a wrong or missing API key (send Authorization: Bearer KEY)",
                           kind="invalid_request_error", code="invalid_api_key")

    async def complete(self, request, kind: str):
        from starlette.responses import StreamingResponse

        body = parse_body(await request.body())
        ld = self.link.loaded
        if ld is None:
            raise ApiError(503, "no model is loaded yet", kind="server_error", code="model_not_loaded")
        model = body.get("model")
        if model != ld.name:
            shown = json.dumps(model)[:80] if not isinstance(model, str) else repr(model[:80])
            raise ApiError(404, f"the model {shown} does not exist; this server runs {ld.name!r}", param="model",
                           code="model_not_found")
        params = sampling(body)
        stream, usage_in_stream = stream_fields(body)
        refuse_unsupported(body, kind)
        reply = None
        if kind == "chat":
            messages = messages_of(body, ld.reply_format)
            tr = tool_request(body, ld)
            options = {"tools": tr.rendered, "reasoning_effort": tr.reasoning_effort, "thinking": tr.thinking}
            # the engine's one prompt pipeline (engine/prompts/prompt.py: its length checks, the template, the
            # tokenizer), off the engine thread; Generate.tools then only says which functions may be called
            ids = await self._prompt_ids(ld, messages, options)
            kw = {"prompt_ids": ids, "tools": tr.offered, "reply_prefix": tr.prefix}
            reply = ChatReply(hashlib.sha256(repr(ids).encode()).hexdigest(), tr.parallel)
        else:  # a plain text: the engine tokenises it, with the same checks (engine/prompts/prompt.py)
            kw = {"prompt_text": prompt_of(body)}
        departure = Departure(request)  # a client that leaves stops its request, streamed or not
        try:
            rid, q = self.link.start(params=params, **kw)
            try:
                first = await departure.next(q)  # the status is decided here: an error before any token is an HTTP error
                while isinstance(first, PromptProgress):  # a long prompt being read (a client that leaves stops it)
                    first = await departure.next(q)
            except ClientGone:
                self.link.stop(rid)
                raise
            if isinstance(first, ErrorEvent):
                self.link.finish(rid)
                raise error_of(first)
            cid, created = chunk_id(kind), now()
            if not stream:
                return await self._whole(rid, q, first, reply, cid, created, ld.name, departure)
        finally:
            departure.close()
        tally: dict = {"tokens": 0}  # the log entry and start time arrive here (logged), the count below
        return StreamingResponse(self._events(rid, q, first, reply, cid, created, ld.name, usage_in_stream, tally),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"}), tally

    async def _prompt_ids(self, ld, messages, options: dict) -> list[int]:
        try:
            return await asyncio.get_running_loop().run_in_executor(None, partial(ld.prompt_ids, messages, **options))
        except ContextOverflow as e:
            raise ApiError(400, str(e), code="context_length_exceeded", param="messages") from None
        except MixdeskError as e:  # the chat template refused this conversation
            raise ApiError(400, str(e), param="messages") from None

    async def _whole(self, rid, q, first, reply, cid, created, model, departure):
        """A request answered in one piece, once its last token is out (reply: a ChatReply for a chat
        completion, None for a plain one)."""
        from starlette.responses import JSONResponse

        ev = first
        try:
            while True:
                if isinstance(ev, ErrorEvent):
                    raise error_of(ev)
                if isinstance(ev, Done):
                    break
                ev = await departure.next(q)
        finally:
            self.link.stop(rid) if not isinstance(ev, Done) else self.link.finish(rid)
        fin = ev
        usage = usage_of(fin)
        if reply is not None:
            choice = {"index": 0, "message": reply.message(fin), "finish_reason": reply.finish_reason(fin),
                      "logprobs": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": fin.text, "finish_reason": FINISH.get(fin.reason, "stop"), "logprobs": None}
            obj = "text_completion"
        return JSONResponse({"id": cid, "object": obj, "created": created, "model": model,
                             "choices": [choice], "usage": usage}), len(fin.token_ids)

    async def _events(self, rid, q, first, reply, cid, created, model, include_usage, tally):
        """The SSE body (reply: a ChatReply, or None for a plain completion). If the client goes
        away, the generator is closed: its Stop ends the request."""
        chat = reply is not None
        obj = "chat.completion.chunk" if chat else "text_completion"
        done = False

        def chunk(delta, reason=None):
            """delta: a chat delta object (None: an empty one), or a completion's text."""
            if chat:
                choice = {"index": 0, "delta": delta or {}, "finish_reason": reason, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": reason, "logprobs": None}
            return {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice]}

        try:
            if chat:
                yield sse(chunk({"role": "assistant", "content": ""}))
            ev = first
            while True:
                if isinstance(ev, Token):
                    if chat:
                        for d in reply.deltas(ev):
                            yield sse(chunk(d))
                    elif ev.text:
                        yield sse(chunk(ev.text))
                elif isinstance(ev, ErrorEvent):
                    e = error_of(ev)
                    yield sse(e.body())
                    break
                elif isinstance(ev, Done):
                    fin = ev
                    tally["tokens"] = len(fin.token_ids)
                    yield sse(chunk(None, reply.finish_reason(fin) if chat else FINISH.get(fin.reason, "stop")))
                    if include_usage:
                        yield sse({"id": cid, "object": obj, "created": created, "model": model, "choices": [],
                                   "usage": usage_of(fin)})
                    done = True
                    break
                ev = await q.get()
            yield b"data: [DONE]\n\n"
        finally:
            if done:
                self.link.finish(rid)
            else:
                self.link.stop(rid)  # the client left (or an error ended it): stop generating
            entry = tally.get("entry")
            if entry is not None:
                entry.tokens, entry.seconds = tally["tokens"], time.perf_counter() - tally["t0"]
                self.record(entry)
