"""A context that fits (issue 45, items 1 and 7) through the engine thread, the CLI and the local server:
"auto" by default (the model's own context as far as memory allows, with the memory pinned by a
scripted monitor source), an asked length (refused with the figures where memory cannot hold it),
SetContext without reading the weights again, and a prompt longer than the context refused with its
figures (the CLI's line, the server's 400 in OpenAI's shape)."""
import json
import re
import threading
import time

import pytest

from engine.machine.monitor import MemorySample, ScriptedSource
from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded, QueryDone, SamplingParams, SetContext
from engine.runtime.session import Session
from engine.sources.tiny_model import write_tiny_mixtral

MB = 10**6
PER_TOKEN = 2 * 2 * (16 + 16) * 4  # the tiny Mixtral: 2 layers x 2 kv heads x (key + value of 16) x fp32


def with_positions(folder, n: int):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = n
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    """The tiny Mixtral whose config allows 65,536 positions: longer than the memory pinned below holds."""
    return with_positions(write_tiny_mixtral(tmp_path_factory.mktemp("long")), 65536)


class Machine:
    """A session on a scripted machine with `available` bytes of RAM free (no GPU)."""

    def __init__(self, available: int, **kw):
        self.available = available
        self.events, self.cond = [], threading.Condition()
        source = ScriptedSource(lambda n: MemorySample(ram_total=64 * 10**9, ram_available=self.available))
        self.s = Session(self.emit, source=source, poll_s=0.05, **kw).start()

    def emit(self, ev):
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()

    def wait(self, pred, timeout=120):
        end = time.time() + timeout
        with self.cond:
            while not any(pred(e) for e in self.events):
                left = end - time.time()
                assert left > 0, f"timed out; last events: {self.events[-5:]}"
                self.cond.wait(left)
            return [e for e in self.events if pred(e)][-1]

    def submit(self, cmd):
        """cmd's answer: its Loaded, Done, QueryDone or ErrorEvent."""
        self.events.clear()
        rid = self.s.submit(cmd)
        if isinstance(cmd, Load):
            return self.wait(lambda e: isinstance(e, (Loaded, ErrorEvent)))
        return self.wait(lambda e: isinstance(e, (Done, QueryDone, ErrorEvent)) and e.request_id == rid)


def test_the_context_is_auto_by_default_the_models_own_as_far_as_memory_allows(long_tiny, measured_machine):
    m = Machine(available=40 * MB)  # the planner may use 34 MB: a quarter of it holds ~16,600 tokens
    try:
        ev = m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32"))  # no ctx: auto
        assert isinstance(ev, Loaded), ev
        budget = int(40 * MB * 0.85)
        assert ev.context.cost.per_token == PER_TOKEN
        assert ev.ctx == (budget // 4 // PER_TOKEN) // 1024 * 1024 == 16384 and ev.context.auto
        assert ev.context.line() == "16,384 tokens: 8.4 MB of keys and values"
        assert m.s.loaded.generator.ctx == m.s.scheduler.caches.make().ctx == 16384
        # the planner keeps the context's keys and values out of what it places the experts in
        ctl = m.s.controller
        assert ctl.reserve == (0, 16384 * PER_TOKEN)
        m.wait(lambda e: ctl.budgets is not None, timeout=30)
        assert ctl.budgets.ram <= int((40 * MB + sum(ctl.held)) * 0.85) - 16384 * PER_TOKEN
        m.available = 8 * 10**9  # memory enough for all of it: the model's own
        ev = m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32", placement="cpu"))
        assert ev.ctx == 65536 and ev.context.line() == "65,536 tokens: 34 MB of keys and values"
    finally:
        assert m.s.shutdown()


def test_an_asked_context_is_used_and_one_memory_cannot_hold_is_refused_with_the_figures(long_tiny, measured_machine):
    m = Machine(available=8 * MB)
    try:
        ev = m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32", placement="cpu", ctx=4000))
        assert isinstance(ev, Loaded) and ev.ctx == 4000 and not ev.context.auto
        ev = m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32", placement="cpu", ctx=65536))
        assert isinstance(ev, ErrorEvent) and ev.kind == "ContextTooLarge", ev
        assert ev.message.startswith("a context of 65,536 tokens needs 34 MB of keys and values; ")
        assert "of memory is free beside the model, enough for " in ev.message
        assert m.s.loaded is None  # nothing half-built (the model in use had been let go for it)
        ev = m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32", placement="cpu", ctx=7))
        assert isinstance(ev, ErrorEvent) and "not a context length" in ev.message
    finally:
        assert m.s.shutdown()


def test_set_context_changes_it_without_reading_the_weights_again(long_tiny, measured_machine):
    m = Machine(available=40 * MB)
    try:
        ev = m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32", placement="cpu", ctx=1024))
        assert ev.ctx == 1024
        ld = m.s.loaded
        model, experts = ld.model, [ex for block in ld.model.moe for ex in block.experts]
        caches = m.s.scheduler.caches
        answer = m.submit(SetContext(tokens=32768))
        assert isinstance(answer, QueryDone), answer
        assert answer.value == {"ctx": 32768, "bytes": 32768 * PER_TOKEN,
                                "line": "32,768 tokens: 17 MB of keys and values"}
        ev = m.wait(lambda e: isinstance(e, Loaded))
        assert ev.ctx == 32768 and not ev.context.auto
        assert m.s.loaded is ld and ld.model is model  # the same weights' objects: nothing read again
        assert all(a is b for a, b in zip(experts, [ex for block in model.moe for ex in block.experts]))
        assert m.s.scheduler.caches is not caches and m.s.scheduler.caches.make().ctx == 32768  # made anew
        assert ld.prompts.ctx == ld.generator.ctx == 32768 and m.s.controller.reserve == (0, 32768 * PER_TOKEN)
        # back to auto, then shorter: a prompt past the new length is refused with its figures
        assert m.submit(SetContext(tokens="auto")).value["ctx"] == 16384
        assert m.submit(SetContext(tokens=256)).value["ctx"] == 256
        done = m.submit(Generate(prompt_ids=list(range(5, 305))))
        assert isinstance(done, ErrorEvent) and done.kind == "ContextOverflow"
        assert done.message.startswith("the prompt is 300 tokens; the context holds 256")
        # one memory cannot hold now (another program took most of it): refused, the context as it was
        m.available = 10 * MB
        refused = m.submit(SetContext(tokens=65536))
        assert isinstance(refused, ErrorEvent) and "65,536 tokens needs" in refused.message
        assert ld.generator.ctx == 256 and m.s.scheduler.caches.make().ctx == 256
    finally:
        assert m.s.shutdown()


def test_the_kv_caches_touched_bytes_count_as_the_models_own_up_to_the_reservation(long_tiny, measured_machine):
    """As a cache fills, free memory falls; the monitor adds those bytes back (they are the context's,
    reserved already), so the experts' budget does not shrink twice for them."""
    m = Machine(available=40 * MB)
    try:
        m.submit(Load(path=str(long_tiny), device="cpu", dtype="fp32", placement="cpu", ctx=1024))
        ctl = m.s.controller
        assert ctl._held_with_cache() == ctl.held
        done = m.submit(Generate(prompt_ids=list(range(5, 305)), params=SamplingParams(max_new_tokens=4)))
        assert done.prompt_tokens == 300
        touched = m.s.scheduler.caches.chat.resident_bytes
        assert 300 * PER_TOKEN <= touched <= 320 * PER_TOKEN and m.s.controller.kv_resident() >= touched
        assert ctl._held_with_cache() == (ctl.held[0], ctl.held[1] + m.s.controller.kv_resident())
    finally:
        assert m.s.shutdown()


# ---- the CLI ----
def test_the_cli_says_the_context_it_took_and_refuses_a_bad_one(long_tiny, capsys, measured_machine):
    from engine.tools.cli import build_parser, run

    def chat(*args):
        a = build_parser().parse_args(["chat", "--model", str(long_tiny), "--dtype", "fp32", "--device", "cpu",
                                       "--placement", "cpu", "--max-new-tokens", "2", *args])
        return run(a), capsys.readouterr().err

    code, err = chat("--prompt", "hi", "--ctx", "3000")
    assert code == 0 and "context 3,000 tokens: 1.5 MB of keys and values (asked for: the model's own 65,536;" in err
    code, err = chat("--prompt", "hi")  # auto
    assert code == 0 and "context 65,536 tokens: 34 MB of keys and values (auto: the model's own 65,536;" in err
    code, err = chat("--prompt", "word " * 400, "--ctx", "1024")  # longer than the context
    assert code == 2 and re.search(r"mixdesk: the prompt is \d,\d{3} tokens; the context holds 1,024: shorten it", err)
    for bad in ("12k", "0", str(1 << 21)):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["chat", "--ctx", bad])
        assert e.value.code == 2
        assert "auto" in capsys.readouterr().err


def test_the_cli_refuses_a_context_memory_cannot_hold_before_building_anything(tmp_path, capsys, measured_machine):
    from engine.tools.cli import build_parser, run

    # 4 layers x 8 kv heads of 2,048: 512 KiB a token at fp32, so 2^20 tokens need 550 GB
    wide = with_positions(write_tiny_mixtral(tmp_path / "wide", layers=4, heads=8, kv_heads=8, head_dim=2048), 1 << 20)
    a = build_parser().parse_args(["chat", "--model", str(wide), "--dtype", "fp32", "--device", "cpu",
                                   "--ctx", str(1 << 20), "--prompt", "hi"])
    t0 = time.perf_counter()
    assert run(a) == 2
    err = capsys.readouterr().err
    assert "mixdesk: a context of 1,048,576 tokens needs 550 GB of keys and values; " in err, err
    assert "is free beside the model, enough for " in err and time.perf_counter() - t0 < 60


# ---- the server ----
def test_the_server_answers_a_prompt_past_the_context_with_openais_400(long_tiny, measured_machine):
    from engine.runtime.client import Client
    from engine.tools.serve import Server
    from rawhttp import send

    client = Client()
    try:
        loaded = client.load(str(long_tiny), placement="cpu", device="cpu", dtype="fp32", ctx=2048)
        server = Server(client.session, "127.0.0.1", 0).start()
        try:
            messages = [{"role": "user", "content": "word " * 1200}]
            n = len(client.session.loaded.prompts.template.ids(messages))
            assert n > 2048 and len(messages[0]["content"]) < 2048 * loaded.max_token_chars  # refused by its tokens
            body = json.dumps({"model": loaded.name, "messages": messages}).encode()
            status, _, answer = send(server.url, "POST", "/chat/completions", body,
                                     {"Content-Type": "application/json"})
            assert status == 400
            assert answer == {"error": {"message": f"the prompt is {n:,} tokens; the context holds 2,048: shorten it "
                                                   "or remove attached documents", "type": "invalid_request_error",
                                        "param": "messages", "code": "context_length_exceeded"}}
        finally:
            server.stop()
    finally:
        client.close()
