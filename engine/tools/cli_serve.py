"""`mixdesk serve`: the local OpenAI-compatible server on the engine thread (engine/tools/serve).
It loads the model (the demo by default), prints the URL and serves until Ctrl-C."""
from __future__ import annotations

import sys
import time

from ..protocol.errors import MixdeskError


def add_parser(sub, add_model_args, int_type) -> None:
    s = sub.add_parser("serve", help="a local OpenAI-compatible server (/v1/chat/completions, /v1/completions, "
                       "/v1/models) on the engine thread")
    add_model_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --api-key)")
    s.add_argument("--port", type=int_type(0, 65535), default=8080, help="port (default 8080; 0: any free one)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a host name this server answers to besides IP addresses, localhost and this machine's "
                   "name (a defence against DNS rebinding; repeat for more)")
    s.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (e.g. http://localhost:3000) whose pages may call this server; by default "
                   "none may (requests from web pages are refused); '*' allows any; repeat for more")
    s.add_argument("--max-body-mb", type=int_type(1, 1024), default=16, help="the largest request body (default 16 MB)")
    s.add_argument("--read-timeout", type=float, default=10.0,
                   help="seconds a request's headers, and each part of its body, may take to arrive (default 10)")
    s.add_argument("--parallel", type=int_type(1, 64), default=4,
                   help="requests decoded together, each with its own KV cache (default 4)")
    s.add_argument("--quiet", action="store_true", help="no progress bar and no request log")
    s.set_defaults(fn=cmd_serve)


class ServeError(MixdeskError):
    pass


def cmd_serve(a) -> int:
    from ..runtime.client import for_terminal
    from .serve import Server, is_loopback

    if not 0.1 <= a.read_timeout <= 3600:
        raise ServeError("--read-timeout must be between 0.1 and 3600 seconds")
    if not is_loopback(a.host) and not a.api_key:
        raise ServeError(f"--host {a.host} reaches other machines: give --api-key KEY too (or serve on 127.0.0.1)")
    client = for_terminal(a.quiet, max_streams=a.parallel)
    try:
        loaded = client.load(a.model or "demo", a.placement, a.device, a.dtype, a.ctx, a.kv_bits)

        def log(entry) -> None:
            if not a.quiet:
                extra = f", {entry.tokens} tokens" if entry.tokens else ""
                print(f"{time.strftime('%H:%M:%S')} {entry.method} {entry.path} {entry.status} "
                      f"({entry.seconds:.2f} s{extra})", flush=True)
        try:
            server = Server(client.session, a.host, a.port, a.api_key, on_log=log, allowed_hosts=a.allowed_host,
                            allowed_origins=a.allowed_origin, max_body=a.max_body_mb << 20,
                            read_timeout=a.read_timeout)
            server.start()
        except (OSError, ValueError) as e:
            raise ServeError(str(e)) from None
        print(f"serving {loaded.name} at {server.url} (OpenAI-compatible; model id {loaded.name!r}"
              + (", API key required" if a.api_key else "") + "). Ctrl-C stops.", flush=True)
        print(loaded.context.summary(), flush=True)
        try:
            while server.thread.is_alive():
                server.thread.join(0.5)
        except KeyboardInterrupt:
            print("stopping", file=sys.stderr)
        server.stop()
        return 0 if server.error is None else 2
    finally:
        client.close()
