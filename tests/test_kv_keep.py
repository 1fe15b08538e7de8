"""Documents kept between questions and chats (issue 45, items 3 and 4), in the engine: a long prompt's
progress as it is read, Stop while it is read (the chunks read stay), each conversation's own cache,
a pool that never hands a document's cache to an unrelated short request, the caches' memory budget
(least recently used evicted first), and the cache files that outlive an eviction and a restart
(damaged or stale ones ignored with a log line). The scheduler is driven step by step against a
scripted forward that writes each token's id into its cache's keys (so a file's round trip shows);
the restart runs two sessions of the tiny model on one user cache folder."""
import logging
import os

import torch

from engine.kv.files import KVFiles, fingerprint
from engine.protocol import PromptProgress, Token
from engine.runtime.generate import Generator
from engine.runtime.scheduler import Scheduler

from scheduler_helpers import Letters, ScriptedModel, gen, run, submit

PROMPT = list(range(1, 301))  # 300 tokens: with chunks of 16, eighteen chunks and the last 12


class Dims:
    max_positions = 4096


class Writing(ScriptedModel):
    """The scripted forward, which also writes each token's id into its cache's keys at its position."""

    dims = Dims()

    def forward(self, ids, caches, positions, all_logits=False, cancel=None):
        one = not isinstance(caches, list)
        for i, (c, p) in enumerate(zip([caches] if one else caches, [positions] if one else positions)):
            fed = ids if one else ids[i:i + 1]
            c.k[0, 0, p:p + len(fed), 0] = fed.float()
        return super().forward(ids, caches, positions, all_logits, cancel)


def sched(chunk=16, budget=None, files=None):
    model = Writing()
    s = Scheduler(4, chunk)
    s.solo_chunk = chunk  # chunks of `chunk` tokens whatever else decodes (the test counts them)
    s.cache_budget = budget
    s.attach(Generator(model, Letters(), eos_ids=set(), ctx=1024), files)
    return s, model


def chat(key, ids, n=3):
    return gen(ids, n=n, slot="chat", cache_key=key)


def fed(model):
    """Prompt tokens the forwards read (a decode step's token not counted)."""
    return sum(t for t, b in model.calls if not (t == b == 1))


def test_a_long_prompt_says_how_far_it_is_read_chunk_by_chunk():
    s, model = sched()
    _, r = submit(s, chat("chat:1", PROMPT))
    run(s)
    said = r.of(PromptProgress)
    assert [p.read for p in said] == list(range(0, 300, 16))  # as the read starts, then after each chunk
    assert all(p.total == 300 and p.request_id == r.done.request_id for p in said)
    assert said[0].tok_s == 0 and all(p.tok_s > 0 for p in said[1:])  # the rate measured so far
    first_token = next(i for i, e in enumerate(r.events) if isinstance(e, Token))
    assert max(i for i, e in enumerate(r.events) if isinstance(e, PromptProgress)) < first_token
    assert model.calls[:18] == [(16, 1)] * 18 and model.calls[18] == (12, 1)
    _, short = submit(s, chat("chat:2", [5, 6, 7]))  # a prompt of one chunk says nothing
    run(s)
    assert not short.of(PromptProgress) and short.done.reason == "length"


def test_the_progress_line_says_tokens_and_time_left():
    p = PromptProgress(request_id=1, read=4096, total=18512, tok_s=200.0)
    assert p.describe("the document") == "Reading the document: 4,096 of 18,512 tokens · about 1 min left"
    assert PromptProgress(request_id=1, read=0, total=500).describe() == "Reading the prompt: 0 of 500 tokens"
    assert PromptProgress(request_id=1, read=100, total=500, tok_s=10).describe().endswith("about 40 s left")


def test_stop_while_the_prompt_is_read_keeps_the_chunks_read_and_a_resend_reads_only_the_rest():
    s, model = sched()
    req, r = submit(s, chat("chat:1", PROMPT))
    s.admit()
    for _ in range(5):
        s.step()
    s.stop(req.id)
    run(s)
    assert r.done.reason == "cancelled" and not r.done.token_ids and not r.of(Token)
    read = r.of(PromptProgress)[-1].read
    assert read == 5 * 16  # the chunks read before Stop came: the next one's forward stops before a layer
    cache = s.caches.kept["chat:1"].cache
    assert cache.tokens == PROMPT[:read] and cache.k[0, 0, :read, 0].tolist() == PROMPT[:read]
    model.calls.clear()
    _, again = submit(s, chat("chat:1", PROMPT))
    run(s)
    assert again.done.reused_tokens == read and fed(model) == 300 - read
    assert again.done.reason == "length"


class StopsWithin(Writing):
    """Its third forward sets the request's Stop as it runs (a user's Stop while a long chunk is read),
    then, as MoEModel.forward does between two layers, stops."""

    stopped = False

    def forward(self, ids, caches, positions, all_logits=False, cancel=None):
        if cancel is not None and len(self.calls) == 2 and not self.stopped:
            self.stopped = True
            cancel.set()
        return super().forward(ids, caches, positions, all_logits, cancel)


def test_a_stop_within_a_chunk_ends_it_there_and_the_cache_keeps_the_chunks_before():
    s, _ = sched()
    model = StopsWithin()
    s.attach(Generator(model, Letters(), eos_ids=set(), ctx=1024))
    req, r = submit(s, chat("chat:1", PROMPT))
    run(s)
    assert r.done.reason == "cancelled" and not r.of(Token)
    assert model.calls == [(16, 1), (16, 1)]  # the third chunk stopped before anything was computed
    cache = s.caches.kept["chat:1"].cache
    assert cache.tokens == PROMPT[:32] and r.of(PromptProgress)[-1].read == 32
    model.calls.clear()
    _, again = submit(s, chat("chat:1", PROMPT))
    run(s)
    assert again.done.reused_tokens == 32 and again.done.reason == "length"


def test_the_chunk_is_larger_when_nothing_else_decodes_and_that_is_one_decision():
    s, model = sched()
    s.solo_chunk = 128
    assert s.prompt_chunk() == 128  # nothing else decodes: the long chunk at once (a Stop acts within it)
    other, ro = submit(s, gen([1], n=40))
    s.admit()
    s.step()
    assert s.prompt_chunk() == 16  # another request decodes: it stalls for one chunk at most
    s.stop(other.id)
    run(s)
    model.calls.clear()
    _, r = submit(s, chat("chat:1", PROMPT))
    run(s)
    assert model.calls[0] == (128, 1) and [p.read for p in r.of(PromptProgress)] == [0, 128, 256]


def test_a_long_prompt_started_beside_a_short_one_reads_in_short_chunks_from_its_first():
    """Both start in one admit: the long one's first chunk is decided while the short one still reads its
    prompt (not yet decoding), and must be the short chunk all the same (CI of stop 51: read whole)."""
    s, model = sched()
    s.solo_chunk = 128
    submit(s, gen([5, 6, 7], n=40))
    submit(s, gen(list(range(10, 210)), n=4))
    run(s)
    reads = [t for t, b in model.calls if t > 1]
    assert reads[0] == 3 and max(reads[1:]) == 16, reads  # the short prompt, then chunks of 16 only


def test_each_conversation_keeps_its_own_cache_and_a_return_reads_only_the_new_tokens():
    s, model = sched()
    a = [1, 2, 3] + list(range(100, 400))
    b = [1, 2, 3] + list(range(500, 800))
    _, ra = submit(s, chat("chat:1", a))
    run(s)
    _, rb = submit(s, chat("chat:2", b))
    run(s)
    assert rb.done.reused_tokens == 0  # another chat: none of chat 1's cache
    model.calls.clear()
    follow = a + ra.done.token_ids + [9, 9, 9]
    _, back = submit(s, chat("chat:1", follow))
    run(s)
    assert back.done.reused_tokens == len(a) + len(ra.done.token_ids) - 1  # everything read before
    assert fed(model) == len(follow) - back.done.reused_tokens


def test_the_pool_never_hands_a_documents_cache_to_an_unrelated_short_request():
    s, model = sched()
    doc = [1, 2, 3] + list(range(100, 400))  # the chat template's opening, then the document
    _, rd = submit(s, gen(doc, n=4))
    run(s)
    _, rh = submit(s, gen([1, 2, 3, 7, 8], n=4))  # "Say hello.": the same opening
    run(s)
    assert rh.done.reason == "length"
    model.calls.clear()
    follow = doc + rd.done.token_ids + [9, 9]
    _, rf = submit(s, gen(follow, n=2))
    run(s)
    assert rf.done.reused_tokens == len(doc) + len(rd.done.token_ids) - 1  # the document was kept
    assert fed(model) == 3
    _, rh2 = submit(s, gen([1, 2, 3, 7, 8, 9, 10], n=2))  # the short one's cache is still its own to go on with
    run(s)
    assert rh2.done.reused_tokens == 6  # its prompt and the replies' tokens read, but its own last one


def test_the_caches_live_within_a_budget_least_recently_used_evicted_first():
    per_token = 8  # the scripted cache: keys and values of one layer, one head of one float each
    s, model = sched(budget=per_token * 700)
    a, b, c = ([k] + list(range(100 * k, 100 * k + 299)) for k in (1, 2, 3))
    for key, ids in (("chat:a", a), ("chat:b", b)):
        submit(s, chat(key, ids))
        run(s)
    assert set(s.caches.kept) == {"chat:a", "chat:b"} and s.caches.held <= per_token * 700
    _, rb = submit(s, chat("chat:b", b + [5]))  # b used last: a is the least recently used
    run(s)
    submit(s, chat("chat:c", c))
    run(s)
    assert set(s.caches.kept) == {"chat:b", "chat:c"} and s.caches.evicted == 1
    assert s.caches.held <= per_token * 700
    _, rb2 = submit(s, chat("chat:b", b + [5, 6, 7]))
    run(s)
    assert rb2.done.reused_tokens > len(b)  # kept
    _, ra = submit(s, chat("chat:a", a + [5]))
    run(s)
    assert ra.done.reused_tokens == 0  # evicted, and no file to restore it from


def files_at(tmp_path, fp="scripted-1", min_tokens=32):
    return KVFiles(tmp_path / "kv", model="scripted", fingerprint=fp, limit=1 << 30, min_tokens=min_tokens)


def test_an_evicted_cache_is_written_and_a_return_restores_it_from_its_file(tmp_path, caplog):
    files = files_at(tmp_path)
    s, model = sched(budget=8 * 700, files=files)
    a, b, c = ([k] + list(range(100 * k, 100 * k + 299)) for k in (1, 2, 3))
    _, ra = submit(s, chat("chat:a", a))
    run(s)
    for key, ids in (("chat:b", b), ("chat:c", c)):
        submit(s, chat(key, ids))
        run(s)
    assert "chat:a" not in s.caches.kept  # evicted: its file was written as its reply ended
    model.calls.clear()
    follow = a + ra.done.token_ids + [9]
    with caplog.at_level(logging.INFO, logger="mixdesk.kv"):
        _, back = submit(s, chat("chat:a", follow))
        run(s)
    held = len(a) + len(ra.done.token_ids) - 1
    assert back.done.reused_tokens == held and fed(model) == len(follow) - held
    assert s.caches.kept["chat:a"].cache.k[0, 0, :held, 0].tolist() == follow[:held]  # the keys, read back
    assert any("KV cache restored" in r.message and "tok" in r.message for r in caplog.records)
    s.detach()
    assert len(list((tmp_path / "kv").glob("*.safetensors"))) == 3


def test_a_damaged_or_stale_file_is_ignored_with_one_log_line(tmp_path, caplog):
    files = files_at(tmp_path)
    s, _ = sched(files=files)
    _, r = submit(s, chat("chat:a", PROMPT))
    run(s)
    s.detach()  # its file written
    path = files.path_of("chat:a")
    follow = PROMPT + r.done.token_ids + [9]

    def ask(fp):  # a session of a model with that fingerprint, which writes nothing itself
        s, _ = sched(files=files_at(tmp_path, fp, min_tokens=10**9))
        _, back = submit(s, chat("chat:a", follow))
        run(s)
        s.detach()
        return back.done

    caplog.set_level(logging.INFO, logger="mixdesk.kv")
    assert ask("scripted-2").reused_tokens == 0  # another version of the model, or other settings
    assert [m for m in caplog.messages if "ignored" in m and "another version" in m]
    assert ask("scripted-1").reused_tokens > 0 and path.exists()  # the one it was made for restores it
    caplog.clear()
    s, _ = sched(files=files_at(tmp_path))  # written again with the follow-up, then damaged in its data
    submit(s, chat("chat:a", follow))
    run(s)
    s.detach()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert ask("scripted-1").reused_tokens == 0
    assert len([m for m in caplog.messages if "ignored" in m]) == 1 and "checksum" in caplog.messages[-1]
    assert not path.exists()  # of no use to anyone
    s, _ = sched(files=files_at(tmp_path))  # written again, then cut short
    submit(s, chat("chat:a", follow))
    run(s)
    s.detach()
    path.write_bytes(path.read_bytes()[:-100])  # cut short
    caplog.clear()
    assert ask("scripted-1").reused_tokens == 0
    assert len(caplog.messages) == 1 and "ignored" in caplog.messages[0] and "truncated" in caplog.messages[0]


def test_a_file_is_not_read_when_reading_it_measures_slower_than_reading_the_tokens_again(tmp_path, caplog):
    files = files_at(tmp_path)
    s, _ = sched(files=files)
    _, r = submit(s, chat("chat:a", PROMPT))
    run(s)
    s.detach()
    later = files_at(tmp_path)
    later.read_bps = 10.0  # ten bytes a second, as a restore measured it
    s, model = sched(files=later)
    s.caches.prefill_rate = lambda: 1000.0
    caplog.set_level(logging.INFO, logger="mixdesk.kv")
    _, back = submit(s, chat("chat:a", PROMPT + r.done.token_ids + [9]))
    run(s)
    assert back.done.reused_tokens == 0
    line = next(m for m in caplog.messages if "not read" in m)
    assert "MB/s" in line and "1,000 tok/s" in line  # both figures


def test_the_fingerprint_changes_with_the_model_file_and_what_makes_keys_and_values(tmp_path):
    from types import SimpleNamespace

    from transformers import MixtralConfig

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x" * 10)

    def ld(dtype=torch.bfloat16, theta=1e6):
        cfg = MixtralConfig(rope_theta=theta)
        return SimpleNamespace(ckpt=SimpleNamespace(folder=tmp_path, config=cfg),
                               model=SimpleNamespace(dtype=dtype, kv_dtype=dtype))

    base = fingerprint(ld())
    assert fingerprint(ld()) == base
    assert fingerprint(ld(torch.float16)) != base and fingerprint(ld(theta=1e4)) != base
    os.utime(weights, (1, 1))  # the model's file changed
    assert fingerprint(ld()) != base


def test_a_restart_restores_the_conversation_from_disk(tiny, window_cache, caplog):
    """Two sessions, one after the other, on the same user folders: the second reads from the file what
    the first read, and only the new tokens."""
    from engine.runtime.client import Client
    from engine.protocol.sampling import SamplingParams

    msgs = [{"role": "user", "content": "Tell me about this: " + " ".join(f"item {i} of the list" for i in range(20))}]
    first = Client()
    try:
        first.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=512)
        one = first.generate(msgs, params=SamplingParams(max_new_tokens=6))
    finally:
        first.close()
    assert one.prompt_tokens > 256 and list((window_cache / "mixdesk" / "kv").glob("*.safetensors"))
    msgs += [{"role": "assistant", "content": one.content}, {"role": "user", "content": "And then?"}]
    second = Client()
    try:
        second.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=512)
        with caplog.at_level(logging.INFO, logger="mixdesk.kv"):
            two = second.generate(msgs, params=SamplingParams(max_new_tokens=6))
        warm = second.session.loaded.prompts.chat(msgs)
        cold = second.generate(prompt_ids=warm, params=SamplingParams(max_new_tokens=6), fresh=True)
    finally:
        second.close()
    assert two.reused_tokens >= one.prompt_tokens and any("KV cache restored" in m for m in caplog.messages)
    assert two.token_ids == cold.token_ids  # the same reply a cold read gives


def test_the_terminal_chat_draws_the_reading_and_ctrl_c_keeps_what_was_read(tiny, window_cache, monkeypatch, capsys):
    """`mixdesk chat`: a bar on stderr while the prompt is read, wiped when the reply starts; Ctrl+C
    while it is drawn stops the read within a chunk, and the same message sent again reads the rest."""
    import re
    import time

    from engine.runtime import scheduler
    from engine.runtime.generate import Generator
    from engine.tools.cli import build_parser, cmd_chat
    from engine.tools.cli_reply import ReadingBar

    monkeypatch.setattr(scheduler, "CHUNK", 16)
    monkeypatch.setattr(scheduler, "SOLO_CHUNK", 16)
    forward = Generator.forward
    monkeypatch.setattr(Generator, "forward", lambda self, need, cancel=None: (time.sleep(0.03), forward(self, need, cancel))[1])
    text = "Tell me about this: " + " ".join(f"item {i} of the list" for i in range(20))
    lines = iter([text, text])

    def typed(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    drawn, show = [], ReadingBar.show

    def ctrl_c_on_the_third(self, ev):
        show(self, ev)
        drawn.append(ev)
        if len(drawn) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", typed)
    monkeypatch.setattr(ReadingBar, "show", ctrl_c_on_the_third)
    a = build_parser().parse_args(["chat", "--model", str(tiny), "--max-new-tokens", "4", "--dtype", "fp32",
                                   "--device", "cpu", "--placement", "cpu", "--ctx", "512"])
    assert cmd_chat(a) == 0
    out = capsys.readouterr()
    assert re.search(r"\r\[#*\.*\] Reading the prompt: 32 of \d+ tokens", out.err)
    stopped = re.search(r"\[stopped while reading the prompt: (\d+) of (\d+) tokens read, kept", out.out)
    read, total = int(stopped.group(1)), int(stopped.group(2))
    assert 32 <= read <= 64 < total
    assert f"prefill {total - read} tok" in out.err  # sent again: only the rest was read
    assert "\r" + " " * 10 in out.err  # the bar wiped before the reply


def test_the_model_stops_between_two_layers_and_a_later_read_is_exact(tiny):
    """MoEModel.forward with a cancel: set while layer 0 runs, the forward ends before layer 1 with
    ForwardStopped; the rows it wrote are not counted, and the same tokens read again give what an
    uninterrupted read gives."""
    import threading

    import pytest

    from engine.protocol.errors import ForwardStopped
    from engine.runtime.load import load

    model = load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=256).model
    ids = torch.arange(3, 67)
    want = model.forward(ids, model.new_cache(256), 0)
    stop, ran = threading.Event(), []
    first, second = model.layers[0], model.layers[1]
    f0, f1 = first.forward, second.forward
    first.forward = lambda *a: (stop.set(), ran.append(0), f0(*a))[-1]
    second.forward = lambda *a: (ran.append(1), f1(*a))[-1]
    try:
        cache = model.new_cache(256)
        with pytest.raises(ForwardStopped):
            model.forward(ids, cache, 0, cancel=stop)
        assert ran == [0]  # layer 0 ran, layer 1 never began
        assert torch.equal(model.forward(ids, cache, 0, cancel=threading.Event()), want)
    finally:
        first.forward, second.forward = f0, f1
