"""Who may ask the local server, and how much: the checks every request passes before a route sees
it (`Guard`, an ASGI middleware around the Starlette app), and connections that must send their
request headers in time (`protocol_with_header_deadline`, a uvicorn protocol).

A web page in the user's browser can reach 127.0.0.1. With no key, it could send a "simple"
cross-origin POST (text/plain or a form: no preflight) and run a completion, and through DNS
rebinding (its own name resolving to 127.0.0.1) it could read the answers. So:
- Host must name this server: an IP address, `localhost` or `*.localhost`, the machine's own
  name, or a name the user allowed (`--allowed-host`). Anything else, an empty Host too: 403.
- A request that carries an Origin header (browsers send it; curl and the SDKs do not) is refused
  (403) unless the user allowed that origin (`--allowed-origin`, none by default). Only allowed
  origins get CORS headers, and an answer to their preflight (OPTIONS).
- A body must be `application/json` (415), at most `max_body` bytes (413: from Content-Length
  before a byte is read, or as a chunked body grows) and arrive in time (408), and at most
  `max_requests` run at once (503). The connection closes after each of these refusals.
- An exception in a route becomes OpenAI's error shape (500); its traceback goes to the engine's
  log file, never to the terminal or to the client.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket

from ...runtime.errorlog import one_line, record

BODY_METHODS = ("POST", "PUT", "PATCH")
ALLOWED_HEADERS = "authorization, content-type"  # what a browser client may send in a preflighted request

log = logging.getLogger("mixdesk.serve")


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind


def error_body(status: int, message: str, code: str | None, kind: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def host_name(header: str) -> str:
    """The name in a Host header, without its port or brackets, lower-cased ('' if there is none)."""
    h = header.strip().lower()
    if h.startswith("["):  # [::1]:8080
        return h[1:h.find("]")] if "]" in h else ""
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class Guard:
    """The ASGI middleware (see the module's docstring). allowed_origins may hold "*" (any origin,
    the user's explicit choice)."""

    def __init__(self, app, bound_host: str, allowed_hosts=(), allowed_origins=(), max_body: int = 16 << 20,
                 read_timeout: float = 10.0, max_requests: int = 32):
        self.app = app
        names = {"localhost", host_name(bound_host)}
        try:
            names.add(socket.gethostname().lower())
        except OSError:
            pass
        self.hosts = names | {host_name(h) for h in allowed_hosts if h}
        self.origins = {o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()}
        self.max_body, self.read_timeout, self.max_requests = max_body, read_timeout, max_requests
        self.running = 0

    # ---- the checks ----
    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        name = host_name(header)
        return bool(name) and (is_ip(name) or name in self.hosts or name.endswith(".localhost"))

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/").lower() in self.origins

    # ---- ASGI ----
    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        origin = headers.get("origin")
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")] \
            if origin is not None and self.origin_allowed(origin) else []
        try:
            self.check(scope, headers, origin)
            if scope["method"] == "OPTIONS":  # a preflight of an allowed origin
                return await self.respond(send, 204, b"", cors + [
                    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                    (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
                    (b"access-control-max-age", b"600")])
            if self.running >= self.max_requests:
                raise Refused(503, f"the server is already answering {self.max_requests} requests; try again soon",
                              "too_many_requests", "server_error")
            body = await self.read_body(receive, headers) if scope["method"] in BODY_METHODS else b""
        except Refused as r:
            return await self.respond(send, r.status, error_body(r.status, r.message, r.code, r.kind), cors,
                                      close=True)
        await self.run(scope, body, receive, send, cors)

    def check(self, scope, headers: dict, origin: str | None) -> None:
        if not self.host_allowed(headers.get("host")):
            raise Refused(403, "this server answers only requests addressed to it by an IP address or an allowed "
                          "name (Host header; add names with --allowed-host)", "host_not_allowed")
        if origin is not None and not self.origin_allowed(origin):
            raise Refused(403, f"requests from the web origin {origin[:100]!r} are not allowed "
                          "(add it with --allowed-origin)", "origin_not_allowed")
        if scope["method"] in BODY_METHODS:
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                raise Refused(415, "the request body must be JSON, sent with Content-Type: application/json",
                              "unsupported_media_type")
            length = headers.get("content-length")
            if length is not None:
                if not length.strip().isdigit():
                    raise Refused(400, "the Content-Length header is not a number", "bad_request")
                if int(length) > self.max_body:
                    raise Refused(413, f"the request body is {int(length):,} bytes; this server takes at most "
                                  f"{self.max_body:,}", "request_too_large")

    async def read_body(self, receive, headers: dict) -> bytes:
        """The whole body, within max_body bytes; each piece must arrive within read_timeout, and
        all of it within 6x that (a client sending a byte at a time is a stalled client)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 6 * self.read_timeout
        chunks, n = [], 0
        while True:
            wait = min(self.read_timeout, deadline - loop.time())
            try:
                msg = await asyncio.wait_for(receive(), max(wait, 0.001))
            except asyncio.TimeoutError:
                raise Refused(408, f"the request body did not arrive within {self.read_timeout:g} s",
                              "request_timeout") from None
            if msg["type"] == "http.disconnect":
                raise Refused(400, "the client closed the connection before its body arrived", "client_closed")
            part = msg.get("body", b"")
            n += len(part)
            if n > self.max_body:
                raise Refused(413, f"the request body is more than {self.max_body:,} bytes", "request_too_large")
            chunks.append(part)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    async def run(self, scope, body: bytes, receive, send, cors: list) -> None:
        """The route, given the body already read; a later receive() reports the client leaving."""
        given = False
        started = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def sending(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                if cors:
                    msg = {**msg, "headers": list(msg.get("headers", [])) + cors}
            await send(msg)

        self.running += 1
        try:
            await self.app(scope, replay, sending)
        except Exception as e:  # noqa: BLE001 - any route's failure: OpenAI's shape, the traceback to the log
            where = record(e, f"serving {scope['method']} {scope['path']}")
            log.warning("a request failed: %s%s", one_line(e), f" (details in {where})" if where else "")
            if not started:
                msg = "the server failed to answer this request: " + one_line(e) + \
                    (f" (details in {where})" if where else "")
                await self.respond(send, 500, error_body(500, msg, "internal_error", "server_error"), cors,
                                   close=True)
        finally:
            self.running -= 1

    @staticmethod
    async def respond(send, status: int, body: bytes, headers: list, close: bool = False) -> None:
        hs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())] if body else \
            [(b"content-length", b"0")]
        if close:
            hs.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": hs + headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def protocol_with_header_deadline(header_timeout: float):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request's headers
    within header_timeout seconds of connecting or of its previous response (uvicorn itself waits
    for ever on a connection that sends nothing, or half a request line)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        _deadline = None
        _armed_for = object()  # the request cycle the deadline was set after (None: the first)

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._waiting() and self._armed_for is not self.cycle:
                self._arm()  # a new request has begun to arrive after the previous response

        def connection_lost(self, exc):
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._armed_for = self.cycle
            self._deadline = self.loop.call_later(header_timeout, self._expired)

        def _expired(self) -> None:
            if self.cycle is self._armed_for and self._waiting() and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline
