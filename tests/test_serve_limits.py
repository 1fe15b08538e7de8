"""The local server under load a hostile or broken client makes (issue 25), over real HTTP on
loopback: abandoned non-streamed requests stop; a ten-million-character prompt is refused from its
length without stalling a stream beside it or growing the process; bodies past the limit get 413;
stalled headers and bodies are closed within the read timeout; bodies nested too deeply or with
fields of the wrong type get OpenAI-shaped 400s, never a traceback."""
import json
import threading
import time

import psutil
import pytest

from engine.runtime.client import Client
from engine.protocol import Done, ErrorEvent, Generate
from engine.tools.serve import Server

from replies import watch_replies
from rawhttp import closed_within, hostport, is_openai_error, open_socket, send

READ_TIMEOUT = 2.0
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def served(tiny):
    client = Client(max_streams=4)
    client.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=512)
    client.session.loaded.generator.eos_ids.clear()  # replies run to max_tokens
    server = Server(client.session, "127.0.0.1", 0, read_timeout=READ_TIMEOUT, max_body=16 << 20).start()
    yield server, client
    server.stop()
    client.close()


def request_bytes(server, body: dict) -> bytes:
    data = json.dumps(body).encode()
    h, p = hostport(server.url)
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {h}:{p}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def test_abandoned_requests_stop_and_the_next_is_answered_at_once(served, tiny, pace):
    server, client = served
    session = client.session
    gen = session.loaded.generator
    inner = gen.retrying
    pace(gen, 0.02)  # 256 tokens take >5 s a request: 8 of them, two rounds of 4, would take >10 s
    ended = watch_replies(session, Done)  # the server's requests: their Done on the way to it
    try:
        socks = []
        for i in range(8):
            s = open_socket(server.url)
            s.sendall(request_bytes(server, {"model": tiny.name, "max_tokens": 256,
                                             "messages": [{"role": "user", "content": f"story {i}"}]}))
            socks.append(s)
        deadline = time.time() + 20
        while len(server.link.queues) < 8 and time.time() < deadline:  # all 8 are in the engine
            time.sleep(0.02)
        assert len(server.link.queues) == 8
        for s in socks:
            s.close()  # each client leaves without its answer
        t0 = time.perf_counter()
        status, _, body = send(server.url, "POST", "/chat/completions",
                               {"model": tiny.name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                               JSON)
        took = time.perf_counter() - t0
        assert status == 200 and body["usage"]["completion_tokens"] == 4
        assert took < 5.0, f"the next request waited {took:.1f} s behind abandoned ones"
        deadline = time.time() + 10
        while len([e for e in ended if e.reason == "cancelled"]) < 8 and time.time() < deadline:
            time.sleep(0.05)
        cancelled = [e for e in ended if e.reason == "cancelled"]
        assert len(cancelled) == 8 and all(len(e.token_ids) < 256 for e in cancelled)
    finally:
        gen.retrying = inner
        del session.submit  # the method again


def test_a_ten_million_character_prompt_is_refused_at_once_beside_a_steady_stream(served, tiny, pace):
    server, client = served
    gen = client.session.loaded.generator
    inner = gen.retrying
    pace(gen, 0.01)
    proc = psutil.Process()
    arrivals, stream_done = [], threading.Event()

    def stream():
        import http.client
        h, p = hostport(server.url)
        conn = http.client.HTTPConnection(h, p, timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"model": tiny.name, "max_tokens": 300, "stream": True,
             "messages": [{"role": "user", "content": "a long story"}]}), JSON)
        r = conn.getresponse()
        while line := r.readline():
            if line.startswith(b"data: {"):
                arrivals.append(time.perf_counter())
        conn.close()
        stream_done.set()

    peak = [proc.memory_info().rss]
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            peak.append(proc.memory_info().rss)
            time.sleep(0.005)
    try:
        t = threading.Thread(target=stream)
        t.start()
        while len(arrivals) < 20:  # the stream is flowing
            time.sleep(0.01)
        big = json.dumps({"model": tiny.name, "messages": [{"role": "user", "content": "x" * 10_000_000}]}).encode()
        base = proc.memory_info().rss
        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.perf_counter()
        status, _, body = send(server.url, "POST", "/chat/completions", big, JSON)
        took = time.perf_counter() - t0
        sampling.set()
        sampler.join()
        mark = len(arrivals)
        assert status == 400 and is_openai_error(body) and body["error"]["code"] == "context_length_exceeded"
        assert "10,000,000 characters" in body["error"]["message"]
        assert took < 2.0, f"refused after {took:.2f} s"
        grew = (max(peak) - base) / 2**20
        assert grew < 300, f"RSS grew {grew:.0f} MB"
        assert stream_done.wait(60)
        assert len(arrivals) > mark  # the stream went on after it
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        assert max(gaps) < 1.0, f"the stream stalled {max(gaps):.2f} s"
    finally:
        gen.retrying = inner


def test_the_engine_refuses_a_huge_prompt_before_tokenising_it_for_every_client(served):
    """The window and the terminal chat reach the engine without the server: the same check."""
    _, client = served
    got = []
    t0 = time.perf_counter()
    rid = client.session.submit(Generate(messages=[{"role": "user", "content": "y" * 10_000_000}], slot="pool"),
                                reply_to=got.append)
    deadline = time.time() + 10
    while not any(getattr(e, "request_id", None) == rid for e in got) and time.time() < deadline:
        time.sleep(0.01)
    took = time.perf_counter() - t0
    err = [e for e in got if getattr(e, "request_id", None) == rid][0]
    assert isinstance(err, ErrorEvent) and err.kind == "ContextOverflow" and took < 2.0


def test_a_body_past_the_limit_gets_413(served, tiny):
    server, _ = served
    h, p = hostport(server.url)
    # declared: refused from Content-Length, before the body is read (here only 1 KB of it is sent)
    for declared in (50 << 20, 10_000_000_000):
        s = open_socket(server.url)
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {h}:{p}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {declared}\r\n\r\n".encode() + b"{" * 1024)
        closed, got = closed_within(s, 5)
        s.close()
        assert closed and got.startswith(b"HTTP/1.1 413"), got[:200]
        assert is_openai_error(json.loads(got.split(b"\r\n\r\n", 1)[1]))
    # undeclared (chunked): refused as it grows past the limit; 50 MB offered
    s = open_socket(server.url)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {h}:{p}\r\nContent-Type: application/json\r\n"
              "Transfer-Encoding: chunked\r\n\r\n".encode())
    answer = {}

    def read():
        answer["closed"], answer["got"] = closed_within(s, 20)
    reader = threading.Thread(target=read)
    reader.start()
    chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
    sent = 0
    try:
        for _ in range(50):
            s.sendall(chunk)
            sent += 1
    except OSError:
        pass  # the server closed the connection: the rest is not read
    reader.join()
    s.close()
    assert answer["got"].startswith(b"HTTP/1.1 413") and sent < 50
    assert send(server.url, "POST", "/chat/completions", {"model": tiny.name, "max_tokens": 1,
                                                           "messages": [{"role": "user", "content": "hi"}]},
                JSON)[0] == 200  # and the server still serves


def test_stalled_headers_and_bodies_are_closed_within_the_read_timeout(served):
    server, _ = served
    h, p = hostport(server.url)
    cases = {
        "nothing sent": b"",
        "half a request line": b"POST /v1/chat/compl",
        "headers never ended": f"POST /v1/chat/completions HTTP/1.1\r\nHost: {h}:{p}\r\n".encode(),
        "body short of its length": (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {h}:{p}\r\n"
                                     "Content-Type: application/json\r\nContent-Length: 2000\r\n\r\n").encode()
        + b" " * 1000,
    }
    for what, data in cases.items():
        s = open_socket(server.url)
        t0 = time.perf_counter()
        if data:
            s.sendall(data)
        closed, got = closed_within(s, 3 * READ_TIMEOUT)
        took = time.perf_counter() - t0
        s.close()
        assert closed, f"{what}: still open after {took:.1f} s"
        assert took < READ_TIMEOUT + 1.5, f"{what}: closed after {took:.1f} s"
        if what == "body short of its length":
            assert got.startswith(b"HTTP/1.1 408"), got[:100]


BAD_FIELDS = [
    ({"stream_options": "yes"}, "stream_options"),
    ({"stream_options": [1]}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ({"stream": "true"}, "stream"),
    ({"model": 5}, "model"),
    ({"model": ["x"]}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"temperature": []}, "temperature"),
    ({"top_p": {"a": 1}}, "top_p"),
    ({"seed": 1.5}, "seed"),
    ({"stop": {"a": 1}}, "stop"),
    ({"stop": ["x" * 5000]}, "stop"),
    ({"n": 3}, "n"),
]


@pytest.mark.parametrize("fields,param", BAD_FIELDS, ids=[p for _, p in BAD_FIELDS])
def test_wrong_typed_fields_get_openai_shaped_400s(served, tiny, fields, param, capfd):
    server, _ = served
    body = {"model": tiny.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    status, _, answer = send(server.url, "POST", "/chat/completions", body, JSON)
    assert status in (400, 404) and is_openai_error(answer), (status, answer)
    assert param in (answer["error"]["param"] or "") or param in answer["error"]["message"]
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("raw", [b"[" * 200_000 + b"]" * 200_000,
                                 b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
                                 b'{"model": "x", "messages": [{"role": "user", "content": "\\ud800"}]}',
                                 b"\xff\xfe{}", b'{"max_tokens": 1' + b"0" * 5000 + b"}", b"", b"null"])
def test_malformed_bodies_get_openai_shaped_400s(served, tiny, raw, capfd):
    server, _ = served
    status, _, answer = send(server.url, "POST", "/chat/completions", raw, JSON)
    assert status in (400, 404) and is_openai_error(answer), (status, answer)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("method,path", [("TRACE", "/models"), ("GET", "/chat/completions"), ("PUT", "/models"),
                                         ("GET", "/../../etc/passwd")])
def test_any_method_or_path_gets_openais_shape(served, method, path):
    server, _ = served
    status, _, answer = send(server.url, method, path, b"{}" if method == "PUT" else None, JSON)
    assert status in (404, 405) and is_openai_error(answer)


def test_a_lone_surrogate_in_a_message_is_answered(served, tiny):
    server, _ = served
    raw = json.dumps({"model": tiny.name, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "caf\ud800e"}]}).encode()
    status, _, body = send(server.url, "POST", "/chat/completions", raw, JSON)
    assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_requests_past_the_cap_get_503_in_openais_shape(served, tiny, pace):
    _, client = served
    gen = client.session.loaded.generator
    inner = gen.retrying
    pace(gen, 0.01)
    server = Server(client.session, "127.0.0.1", 0, max_connections=2).start()
    try:
        held = []
        for i in range(2):  # two streams that take a while
            s = open_socket(server.url)
            s.sendall(request_bytes(server, {"model": tiny.name, "max_tokens": 200, "stream": True,
                                             "messages": [{"role": "user", "content": f"tale {i}"}]}))
            assert s.recv(12).startswith(b"HTTP/1.1 200")
            held.append(s)
        status, _, body = send(server.url, "GET", "/models")
        assert status == 503 and is_openai_error(body) and body["error"]["code"] == "too_many_requests"
        for s in held:
            s.close()
        deadline = time.time() + 10
        while time.time() < deadline and send(server.url, "GET", "/models")[0] != 200:
            time.sleep(0.05)
        assert send(server.url, "GET", "/models")[0] == 200  # room again once they left
    finally:
        gen.retrying = inner
        server.stop()
