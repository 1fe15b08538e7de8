"""The local server as a hostile web page meets it (engine/tools/serve/guard.py), over real HTTP on
loopback, for `mixdesk serve` (Server) and the window's Local server (turned on through its menu
action): a "simple" cross-origin POST (text/plain, a form, no Content-Type) is refused with 415
before any generation starts; a DNS-rebound Host (evil.example, or empty) gets 403; an unlisted
Origin gets 403 and no CORS header, its preflight too; an origin the user allowed gets CORS."""
import socket

import pytest

from engine.runtime.client import Client
from engine.protocol import Generate
from engine.tools.serve import Server

from rawhttp import is_openai_error, send
from main_window_helpers import window  # noqa: F401  (the window fixture, for its Local server)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def engine(tiny):
    client = Client()
    client.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=256)
    started = []  # every Generate the engine is asked for
    inner = client.session.submit
    client.session.submit = lambda cmd, reply_to=None: (started.append(cmd) if isinstance(cmd, Generate) else None,
                                                         inner(cmd, reply_to))[1]
    yield client, started
    client.close()


@pytest.fixture(scope="module")
def served(engine):
    client, started = engine
    server = Server(client.session, "127.0.0.1", 0).start()  # the default: loopback, no key
    yield server, started
    server.stop()


def chat(tiny):
    return {"model": tiny.name, **CHAT}


# ---- each attack, one by one, on `mixdesk serve` ----------------------------------------------

SIMPLE_TYPES = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x", None]


@pytest.mark.parametrize("ctype", SIMPLE_TYPES)
def test_a_body_that_is_not_declared_json_is_refused_415_before_any_generation(served, tiny, ctype):
    server, started = served
    before = len(started)
    headers = {} if ctype is None else {"Content-Type": ctype}
    status, hs, body = send(server.url, "POST", "/chat/completions", chat(tiny), headers)
    assert status == 415 and is_openai_error(body) and "application/json" in body["error"]["message"]
    assert "access-control-allow-origin" not in hs
    assert len(started) == before  # nothing ran


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "", None])
def test_a_host_that_does_not_name_this_server_is_refused_403(served, tiny, host):
    server, started = served
    before = len(started)
    for method, path, body in (("GET", "/models", None), ("POST", "/chat/completions", chat(tiny))):
        headers = {"Content-Type": "application/json"} if body else {}
        if host is None and body is not None:
            # HTTP/1.1 requires a Host: h11 refuses the request before reading its body, and closing a
            # socket with unread bytes may reset the connection before the 400 arrives (seen once in
            # a loaded full run): either way it is refused, and nothing runs (checked below)
            try:
                status, _, answer = send(server.url, method, path, body, headers, host=host)
            except ConnectionResetError:
                status = 400
        else:
            status, _, answer = send(server.url, method, path, body, headers, host=host)
        if host is None:  # HTTP/1.1 requires a Host: h11 refuses the request itself
            assert status == 400
        else:
            assert status == 403 and is_openai_error(answer) and answer["error"]["code"] == "host_not_allowed"
    assert len(started) == before


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}",
                                  "app.localhost:{port}", "{hostname}"])
def test_this_servers_own_names_are_answered(served, host):
    server, _ = served
    h = host.format(port=server.port, hostname=socket.gethostname())
    status, _, body = send(server.url, "GET", "/models", host=h)
    assert status == 200 and body["object"] == "list"


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3000"])
def test_an_unlisted_origin_gets_403_and_no_cors_headers(served, tiny, origin):
    server, started = served
    before = len(started)
    status, hs, body = send(server.url, "POST", "/chat/completions", chat(tiny),
                            {"Content-Type": "application/json", "Origin": origin})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    assert not any(k.startswith("access-control-") for k in hs)
    status, hs, _ = send(server.url, "OPTIONS", "/chat/completions", None,  # the preflight a page would send
                         {"Origin": origin, "Access-Control-Request-Method": "POST",
                          "Access-Control-Request-Headers": "content-type"})
    assert status == 403 and not any(k.startswith("access-control-") for k in hs)
    status, hs, _ = send(server.url, "GET", "/models", None, {"Origin": origin})
    assert status == 403 and not any(k.startswith("access-control-") for k in hs)
    assert len(started) == before


def test_an_origin_the_user_allowed_gets_cors(engine, tiny):
    client, _ = engine
    server = Server(client.session, "127.0.0.1", 0, allowed_origins=["http://localhost:3000"]).start()
    try:
        ok = "http://localhost:3000"
        status, hs, _ = send(server.url, "OPTIONS", "/chat/completions", None,
                             {"Origin": ok, "Access-Control-Request-Method": "POST",
                              "Access-Control-Request-Headers": "content-type, authorization"})
        assert status == 204 and hs["access-control-allow-origin"] == ok
        assert "POST" in hs["access-control-allow-methods"] and "content-type" in hs["access-control-allow-headers"]
        status, hs, body = send(server.url, "POST", "/chat/completions", chat(tiny),
                                {"Content-Type": "application/json", "Origin": ok})
        assert status == 200 and hs["access-control-allow-origin"] == ok and body["usage"]["completion_tokens"] <= 2
        status, hs, _ = send(server.url, "GET", "/models", None, {"Origin": "http://evil.example"})
        assert status == 403 and "access-control-allow-origin" not in hs  # the others still may not
        # and an allowed origin still needs application/json: CORS does not open the door to forms
        status, _, _ = send(server.url, "POST", "/chat/completions", chat(tiny),
                            {"Content-Type": "text/plain", "Origin": ok})
        assert status == 415
    finally:
        server.stop()


def test_a_name_the_user_allowed_is_answered(engine):
    client, _ = engine
    server = Server(client.session, "127.0.0.1", 0, allowed_hosts=["mixdesk.lan"]).start()
    try:
        assert send(server.url, "GET", "/models", host="mixdesk.lan:1234")[0] == 200
        assert send(server.url, "GET", "/models", host="other.lan")[0] == 403
    finally:
        server.stop()


def test_plain_clients_still_work(served, tiny):
    """No Origin (curl, the SDKs), application/json with a charset: answered."""
    server, _ = served
    status, _, body = send(server.url, "POST", "/chat/completions", chat(tiny),
                           {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200 and body["object"] == "chat.completion"


# ---- every attack on the window's Local server, switched on through its menu action -----------

def attacks(url: str, model: str) -> list[str]:
    """The attacks above against one server; returns the ones that got through (none, we hope)."""
    body = {"model": model, **CHAT}
    failed = []
    for ctype in SIMPLE_TYPES:
        headers = {} if ctype is None else {"Content-Type": ctype}
        if send(url, "POST", "/chat/completions", body, headers)[0] != 415:
            failed.append(f"Content-Type {ctype}")
    for host in ("evil.example", ""):
        if send(url, "POST", "/chat/completions", body, {"Content-Type": "application/json"}, host=host)[0] != 403:
            failed.append(f"Host {host!r}")
    status, hs, _ = send(url, "POST", "/chat/completions", body,
                         {"Content-Type": "application/json", "Origin": "http://evil.example"})
    if status != 403 or any(k.startswith("access-control-") for k in hs):
        failed.append("Origin http://evil.example")
    status, hs, _ = send(url, "OPTIONS", "/chat/completions", None,
                         {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    if any(k.startswith("access-control-") for k in hs):
        failed.append("preflight from http://evil.example")
    return failed


def test_the_windows_local_server_refuses_the_same(qtbot, window, tiny):
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.serving import ServerDialog

    with socket.socket() as s:  # a free port for the dialog (which starts at 1024)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def fill(origins=""):
        dlg = QApplication.activeModalWidget()
        assert isinstance(dlg, ServerDialog)
        dlg.port.setValue(port)
        dlg.origins.setText(origins)
        dlg.accept()
    QTimer.singleShot(200, fill)
    window.server_action.trigger()  # Tools > Local server, as the user turns it on
    qtbot.waitUntil(lambda: window.server.running, timeout=10_000)
    url = window.server.server.url
    assert url == f"http://127.0.0.1:{port}/v1"
    assert attacks(url, tiny.name) == []
    status, _, body = send(url, "POST", "/chat/completions", {"model": tiny.name, **CHAT},
                           {"Content-Type": "application/json"})
    assert status == 200 and body["object"] == "chat.completion"  # a proper client is served
    window.server_action.trigger()
    assert not window.server.running
    # a web app the user lists in the dialog gets CORS; the rest stay refused
    QTimer.singleShot(200, lambda: fill("http://localhost:3000"))
    window.server_action.trigger()
    qtbot.waitUntil(lambda: window.server.running, timeout=10_000)
    try:
        status, hs, _ = send(url, "OPTIONS", "/chat/completions", None,
                             {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
        assert status == 204 and hs["access-control-allow-origin"] == "http://localhost:3000"
        assert attacks(url, tiny.name) == []
    finally:
        window.server_action.trigger()
        QSettings("mixdesk", "mixdesk").remove("server/origins")
