"""The local server's KV caches over real HTTP (issue 45, items 3 and 4): the pool keeps a document's
cache through an unrelated short request (a 15,554-token document was read again after one "Say
hello." because their chat template's first tokens matched), and a client that leaves while its long
prompt is read stops the read within a chunk, the chunks read kept for its next request. The
usage's prompt_tokens_details.cached_tokens (OpenAI's field) says what was reused."""
import http.client
import json
import time
from urllib.parse import urlsplit

import pytest

openai = pytest.importorskip("openai")

from engine.runtime.client import Client  # noqa: E402
from engine.protocol import Done, PromptProgress  # noqa: E402
from engine.tools.serve import Server  # noqa: E402
from replies import watch_replies  # noqa: E402
from serve_helpers import KEY, api  # noqa: E402

DOC = "Read this and answer: " + " ".join(f"item {i} of the list" for i in range(20))
CHUNK = 16


@pytest.fixture(scope="module")
def served(tiny):
    client = Client()
    client.session.keep_caches = False  # the pool in memory (the files have tests of their own: test_kv_keep.py)
    client.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=512)
    client.session.loaded.generator.eos_ids.clear()  # replies run to max_tokens
    sched = client.session.scheduler
    sched.chunk = sched.solo_chunk = CHUNK
    server = Server(client.session, "127.0.0.1", 0, api_key=KEY).start()
    yield server, client
    server.stop()
    client.close()


def cached(r) -> int:
    return r.usage.prompt_tokens_details.cached_tokens


def test_a_documents_cache_is_not_handed_to_an_unrelated_short_request(served, tiny):
    server, _ = served
    c = api(server)

    def ask(messages):
        return c.chat.completions.create(model=tiny.name, messages=messages, max_tokens=4, temperature=0)

    doc = [{"role": "user", "content": DOC}]
    first = ask(doc)
    assert first.usage.prompt_tokens > 200 and cached(first) == 0
    hello = ask([{"role": "user", "content": "Say hello."}])
    assert hello.usage.prompt_tokens < 40
    follow = doc + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "And then?"}]
    again = ask(follow)
    assert cached(again) >= first.usage.prompt_tokens  # the document was not read again
    assert again.usage.prompt_tokens - cached(again) < 30


def test_a_client_that_leaves_while_its_prompt_is_read_stops_the_read_and_keeps_the_chunks(served, tiny):
    server, client = served
    session = client.session
    said = watch_replies(session, (PromptProgress, Done))
    gen = session.loaded.generator
    inner = gen.retrying
    gen.retrying = lambda step: (time.sleep(0.05), inner(step))[1]  # a chunk every 50 ms or more
    messages = [{"role": "user", "content": "Another one: " + " ".join(f"entry {i} of the table" for i in range(20))}]
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        body = json.dumps({"model": tiny.name, "messages": messages, "max_tokens": 50, "stream": True}).encode()
        conn.request("POST", u.path + "/chat/completions", body=body,
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        deadline = time.time() + 30
        while sum(isinstance(e, PromptProgress) for e in said) < 4:
            assert time.time() < deadline and not any(isinstance(e, Done) for e in said)
            time.sleep(0.01)  # the status waits for the first token: nothing has come back yet
        at_close = max(e.read for e in said if isinstance(e, PromptProgress))
        conn.sock.close()  # the client leaves while the prompt is read
        conn.close()
        while not any(isinstance(e, Done) for e in said) and time.time() < deadline:
            time.sleep(0.02)
    finally:
        gen.retrying = inner
        del session.submit  # the method again
    done = next(e for e in said if isinstance(e, Done))
    read = max(e.read for e in said if isinstance(e, PromptProgress))
    total = said[0].total
    assert done.reason == "cancelled" and not done.token_ids
    assert at_close <= read <= at_close + 2 * CHUNK < total  # within the chunk in progress (and one begun)
    assert any(len(e.cache.tokens) == read and not e.busy for e in session.scheduler.caches.kept.values())
    again = api(server).chat.completions.create(model=tiny.name, messages=messages, max_tokens=2, temperature=0)
    assert cached(again) == read  # sent again, only the rest is read
