"""HTTP on loopback exactly as a hostile page or a broken client sends it: every header chosen by
the test (http.client adds none), the answer read whole; and a socket held open half-sent."""
from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import urlsplit


def hostport(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname, u.port


def send(url: str, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None,
         host: str | None = "auto", timeout: float = 60):
    """(status, headers as a lower-cased dict, body parsed as JSON when it is JSON, else bytes).
    path is below /v1; host="auto" sends the server's own address, None sends no Host at all."""
    h, p = hostport(url)
    conn = http.client.HTTPConnection(h, p, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.putrequest(method, "/v1" + path, skip_host=True, skip_accept_encoding=True)
    if host == "auto":
        host = f"{h}:{p}"
    if host is not None:
        conn.putheader("Host", host)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    if data is not None:
        conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    r = conn.getresponse()
    raw = r.read()
    hs = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw
    return r.status, hs, parsed


def is_openai_error(body) -> bool:
    return isinstance(body, dict) and set(body) == {"error"} and \
        {"message", "type", "param", "code"} <= set(body["error"])


def open_socket(url: str, timeout: float = 30) -> socket.socket:
    s = socket.create_connection(hostport(url), timeout=timeout)
    return s


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Reads until the server closes the connection (True) or `seconds` pass (False); the bytes read."""
    import time

    sock.settimeout(0.2)
    got, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            part = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionError:
            return True, got
        if not part:
            return True, got
        got += part
    return False, got
