"""The local OpenAI-compatible server (engine/tools/serve) on loopback, driven by the official
`openai` client: the models list, chat completions streamed and not, stop strings, errors with
OpenAI's shape and status, a client that disconnects mid-stream (its generation stops), two
clients at once (each gets what it gets alone), and the safe-by-default binding."""
import http.client
import json
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest


from engine.runtime.client import Client  # noqa: E402
from engine.protocol import Done  # noqa: E402
from engine.tools.serve import Server  # noqa: E402
from replies import watch_replies  # noqa: E402

from serve_helpers import KEY, api, openai  # noqa: E402,F401 (shared: tests/serve_helpers.py)


@pytest.fixture(scope="module")
def served(tiny):
    client = Client()
    client.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=256)
    client.session.loaded.generator.eos_ids.clear()  # replies run to max_tokens: lengths are known
    server = Server(client.session, "127.0.0.1", 0, api_key=KEY).start()
    yield server, client
    server.stop()
    client.close()


def raw(server, method, path, body=None, key=KEY):
    """A plain HTTP request (the standard library's client); returns (connection, response)."""
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    conn.request(method, u.path + path, body=data, headers=headers)
    return conn, conn.getresponse()


def sse_lines(resp):
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode().strip()
        if line:
            yield line


def test_models_and_a_chat_completion_streamed_and_not(served, tiny):
    server, _ = served
    c = api(server)
    assert [m.id for m in c.models.list().data] == [tiny.name]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = c.chat.completions.create(model=tiny.name, messages=msgs, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    chunks = list(c.chat.completions.create(model=tiny.name, messages=msgs, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12
    # the raw stream ends with data: [DONE]
    conn, resp = raw(server, "POST", "/chat/completions",
                     {"model": tiny.name, "messages": msgs, "max_tokens": 3, "stream": True})
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    lines = list(sse_lines(resp))
    conn.close()
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    time.sleep(0.2)  # a stream is logged when it ends, with its tokens
    assert [(e.path, e.status, e.tokens) for e in server.log][-1] == ("/v1/chat/completions", 200, 3)


def test_a_plain_completion_and_seeded_sampling(served, tiny):
    server, _ = served
    c = api(server)
    r = c.completions.create(model=tiny.name, prompt="The capital of France", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 6
    kw = dict(model=tiny.name, messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=1.0,
              top_p=0.9, seed=7)
    a, b = (c.chat.completions.create(**kw).choices[0].message.content for _ in range(2))
    assert a == b  # the same seed, the same reply


def test_stop_strings(served, tiny):
    server, _ = served
    c = api(server)
    msgs = [{"role": "user", "content": "count"}]
    full = c.chat.completions.create(model=tiny.name, messages=msgs, max_tokens=24, temperature=0).choices[0]
    text = full.message.content
    stop = text[5:8]
    assert stop and stop in text
    cut = c.chat.completions.create(model=tiny.name, messages=msgs, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_errors_have_openais_shape_and_status(served, tiny):
    server, _ = served
    c = api(server)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=tiny.name, messages=msgs, temperature=5)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=tiny.name, messages=[{"role": "wizard", "content": "x"}])
    assert "role" in e.value.body["message"]
    with pytest.raises(openai.AuthenticationError) as e:
        api(server, key="wrong").chat.completions.create(model=tiny.name, messages=msgs)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.body["code"] == "model_not_found"
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            r = c.chat.completions.create(model=tiny.name, messages=[{"role": "user", "content": "word " * 400}],
                                          stream=stream)
            list(r)
        assert e.value.body["code"] == "context_length_exceeded" and "context holds 256" in e.value.body["message"]
    _, r = raw(server, "POST", "/chat/completions", b"{not json")
    assert r.status == 400 and set(json.loads(r.read())["error"]) == {"message", "type", "param", "code"}
    assert raw(server, "GET", "/nothing")[1].status == 404
    # the server is still serving
    assert c.chat.completions.create(model=tiny.name, messages=msgs, max_tokens=2).usage.completion_tokens == 2


def test_a_client_that_disconnects_stops_its_generation(served, tiny):
    server, client = served
    session = client.session
    done = watch_replies(session, Done)  # the server's requests: their Done on the way to it
    gen = session.loaded.generator
    inner = gen.retrying
    gen.retrying = lambda step: (time.sleep(0.01), inner(step))[1]  # a long reply, paced
    try:
        conn, resp = raw(server, "POST", "/chat/completions",
                         {"model": tiny.name, "messages": [{"role": "user", "content": "go"}], "max_tokens": 200,
                          "stream": True})
        got = 0
        for line in sse_lines(resp):
            got += line.startswith("data: {")
            if got >= 5:
                break
        conn.sock.close()  # leave mid-stream: the connection closes
        conn.close()
        deadline = time.time() + 20
        while not done and time.time() < deadline:
            time.sleep(0.05)
        assert done and done[0].reason == "cancelled" and len(done[0].token_ids) < 200
        assert not session.scheduler.busy and session.scheduler.caches.pool_available()  # its slot is free
    finally:
        gen.retrying = inner
        del session.submit  # the method again


def test_two_clients_at_once_each_get_what_they_get_alone(served, tiny):
    server, client = served
    c = api(server)
    prompts = ["tell me about experts", "and now something else entirely"]

    def ask(p):
        return c.chat.completions.create(model=tiny.name, messages=[{"role": "user", "content": p}], max_tokens=30,
                                         temperature=0).choices[0].message.content
    alone = [ask(p) for p in prompts]
    gen = client.session.loaded.generator
    inner, widths = gen.retrying, []
    original_forward = gen.model.forward

    def counting(ids, caches, positions, *a, **k):
        if isinstance(caches, list):  # a decode step of one or more sequences (a prompt is one cache)
            widths.append(len(caches))
        return original_forward(ids, caches, positions, *a, **k)
    gen.model.forward = counting
    gen.retrying = lambda step: (time.sleep(0.003), inner(step))[1]
    try:
        out = [None, None]
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, ask(prompts[i]))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        gen.retrying = inner
        del gen.model.forward  # the method again
    assert out == alone
    assert widths and max(widths) == 2  # their decode steps ran as one batched forward


def test_binding_beyond_loopback_needs_a_key(served, tmp_path):
    server, client = served
    with pytest.raises(ValueError, match="give an API key"):
        Server(client.session, "0.0.0.0", 0)
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--api-key" in r.stderr and "Traceback" not in r.stderr
    # a keyless server on loopback takes requests without a key
    open_server = Server(client.session, "127.0.0.1", 0).start()
    try:
        _, r = raw(open_server, "GET", "/models", key=None)
        assert r.status == 200 and json.loads(r.read())["data"][0]["object"] == "model"
    finally:
        open_server.stop()
