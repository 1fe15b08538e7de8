"""The scheduler without a model: admission, batched decode, per-request stop, stop-all, prefix
reuse, chunked prompts and failures, against a scripted forward (each token's successor is the
next id) and a real KV cache. The scheduler is driven step by step, as the engine thread does."""
import torch

from engine.runtime.generate import Done, Generator, SamplingParams, Token
from engine.protocol.errors import ForwardStopped
from engine.kv.tensors import KVCache
from engine.protocol import ErrorEvent, Generate, Query
from engine.runtime.scheduler import Scheduler

from scheduler_helpers import Dims, Letters, Replies, ScriptedModel, V, gen, run, submit  # noqa: E402,F401 (shared: tests/scheduler_helpers.py)


def scheduler(max_streams=4, chunk=64, poison=()):
    model = ScriptedModel(poison)
    s = Scheduler(max_streams, chunk)
    s.attach(Generator(model, Letters(), eos_ids=set(), ctx=128))
    return s, model


def test_ids_are_handed_out_and_each_request_hears_only_its_own_events():
    s, _ = scheduler()
    (a, ra), (b, rb) = submit(s, gen([1, 2, 3])), submit(s, gen([7, 8]))
    assert b.id > a.id > 0
    run(s)
    for req, r, first in ((a, ra, 3), (b, rb, 8)):
        assert {e.request_id for e in r.events} == {req.id}
        assert [t.token_id for t in r.of(Token)] == [first + 1 + i for i in range(4)]
        assert r.done.reason == "length" and r.done.token_ids == [t.token_id for t in r.of(Token)]


def test_pool_requests_decode_together_up_to_max_streams():
    s, model = scheduler(max_streams=2)
    reqs = [submit(s, gen([i, i + 1], n=3)) for i in (1, 10, 20)]
    s.admit()
    assert len(s.running) == 2 and len(s.waiting) == 1
    run(s)
    assert all(r.done.reason == "length" for _, r in reqs)
    widths = [b for t, b in model.calls if t == b and b > 1]
    assert widths and max(widths) == 2  # batched decode steps, never wider than max_streams


def test_a_chat_request_waits_for_the_chat_cache_and_a_query_for_every_request():
    s, _ = scheduler()
    (a, ra), (b, rb) = submit(s, gen([1, 2], slot="chat")), submit(s, gen([3, 4], slot="chat"))
    task, _ = submit(s, Query(name="vocab"))
    s.admit()
    assert s.running == [a] and list(s.waiting) == [b, task]
    assert run(s) is task  # the query comes out once both replies have ended
    assert ra.done.reason == rb.done.reason == "length" and not s.busy


def test_stop_ends_one_running_request_and_the_others_go_on():
    s, _ = scheduler()
    (a, ra), (b, rb) = submit(s, gen([1], n=50)), submit(s, gen([5], n=6))
    s.admit()
    s.step()
    s.step()
    s.stop(a.id)
    run(s)
    assert ra.done.reason == "cancelled" and 1 <= len(ra.done.token_ids) < 50
    assert rb.done.reason == "length" and len(rb.done.token_ids) == 6


def test_a_stopped_waiting_request_ends_without_a_token():
    s, _ = scheduler(max_streams=1)
    (a, ra), (b, rb) = submit(s, gen([1], n=5)), submit(s, gen([2], n=5))
    s.admit()
    s.stop(b.id)
    run(s)
    assert rb.done.reason == "cancelled" and not rb.of(Token)
    assert ra.done.reason == "length"


def test_stop_all_ends_every_request_waiting_or_running():
    s, _ = scheduler(max_streams=1)
    pairs = [submit(s, gen([i], n=100)) for i in (1, 2, 3)]
    s.admit()
    s.step()
    s.stop()
    run(s)
    assert [r.done.reason for _, r in pairs] == ["cancelled"] * 3
    later, rl = submit(s, gen([4], n=2))  # a stop does not stick to requests made after it
    run(s)
    assert rl.done.reason == "length"


def test_the_chat_cache_carries_its_prefix_into_the_next_turn():
    s, model = scheduler()
    _, r1 = submit(s, gen([1, 2, 3, 4, 5], n=4, slot="chat"))
    run(s)
    reply = r1.done.token_ids
    model.calls.clear()
    _, r2 = submit(s, gen([1, 2, 3, 4, 5] + reply + [30, 31], n=2, slot="chat"))
    run(s)
    # every token the first turn fed is reused: the prompt and its reply but the last token
    assert r2.done.reused_tokens == 5 + len(reply) - 1
    assert model.calls[0] == (1 + 2, 1)  # only what is new is read
    _, r3 = submit(s, gen([1, 2, 3, 4, 5], n=2, slot="chat", fresh=True))
    run(s)
    assert r3.done.reused_tokens == 0


def test_a_pool_request_takes_the_cache_sharing_the_longest_prefix():
    s, _ = scheduler(max_streams=2)
    _, ra = submit(s, gen([1, 2, 3, 4, 5, 6], n=2))
    _, rb = submit(s, gen([20, 21, 22], n=2))
    run(s)
    _, rc = submit(s, gen([20, 21, 22, 23, 24], n=2))
    _, rd = submit(s, gen([1, 2, 3, 4, 9], n=2))
    run(s)
    # b cached 20 21 22 and its first reply token, 23; a cached 1..6 and 7
    assert rc.done.reused_tokens == 4 and rd.done.reused_tokens == 4


def test_a_long_prompt_is_read_a_chunk_at_a_time_between_decode_steps():
    s, model = scheduler(chunk=4)
    _, ra = submit(s, gen([1], n=20))
    s.admit()
    s.step()
    s.step()
    _, rb = submit(s, gen(list(range(2, 20)), n=2))  # 18 tokens: chunks of 4, then the rest
    model.calls.clear()
    run(s)
    assert model.calls[:4] == [(4, 1), (1, 1), (4, 1), (1, 1)]  # a chunk, a decode step of the other, ...
    assert ra.done.reason == rb.done.reason == "length"


def test_a_failing_prefill_ends_its_request_alone_and_leaves_nothing_cached():
    s, model = scheduler(poison={40})
    _, ra = submit(s, gen([1, 2], n=6))
    _, rb = submit(s, gen([40, 41, 42], n=6))
    run(s)
    assert isinstance(rb.done, ErrorEvent) and "scripted failure" in rb.done.message
    assert ra.done.reason == "length"
    _, rc = submit(s, gen([40, 41, 42], n=2))  # the same prompt again: nothing reused from the failure
    model.poison.clear()
    run(s)
    assert rc.done.reason == "length" and rc.done.reused_tokens == 0


def test_a_failing_batched_step_ends_every_request_in_it():
    s, model = scheduler()
    _, ra = submit(s, gen([1], n=10))
    _, rb = submit(s, gen([20], n=10))
    s.admit()
    s.step()
    model.poison.add(23)  # b's third token: the step that reads it fails
    run(s)
    assert isinstance(ra.done, ErrorEvent) and isinstance(rb.done, ErrorEvent)
    assert ra.done.message == rb.done.message


def test_bad_requests_end_with_their_own_error():
    s, _ = scheduler()
    _, r1 = submit(s, Generate(prompt_ids=[1], params=SamplingParams(max_new_tokens=0)))
    _, r2 = submit(s, gen(list(range(1, 129)), n=2))  # as long as the context
    run(s)
    assert "max_new_tokens" in r1.done.message
    assert r2.done.kind == "ContextOverflow"
    empty = Scheduler()
    _, r3 = submit(empty, gen([1]))
    run(empty)
    assert r3.done.kind == "NoModel"


def test_closing_the_model_ends_every_running_request_with_a_word():
    s, _ = scheduler()
    pairs = [submit(s, gen([i], n=50)) for i in (1, 2, 3)]
    s.admit()
    s.step()
    s.detach()
    assert [r.done.kind for _, r in pairs] == ["Unloaded"] * 3 and not s.busy


def test_every_decode_step_is_reported_with_its_width_and_time():
    steps = []
    model = ScriptedModel()
    s = Scheduler(4, on_decode=lambda n, sec: steps.append((n, sec)))
    s.attach(Generator(model, Letters(), eos_ids=set(), ctx=128))
    pairs = [submit(s, gen([i, i + 1], n=5)) for i in (1, 20)]
    run(s)
    tokens = sum(len(r.done.token_ids) for _, r in pairs)
    assert sum(n for n, _ in steps) == tokens - 2  # each first token comes from its prompt's forward
    assert max(n for n, _ in steps) == 2 and all(sec > 0 for _, sec in steps)


def test_the_scheduler_takes_ids_only():
    """It renders nothing: a request's messages or text are prepared before it (engine/prompts/prompt.py,
    by the session); one that was not ends with a word, not a render."""
    s, model = scheduler()
    _, r1 = submit(s, Generate(messages=[{"role": "user", "content": "hi"}]))
    _, r2 = submit(s, Generate(prompt_text="hi"))
    run(s)
    assert all(isinstance(r.done, ErrorEvent) and "not rendered" in r.done.message for r in (r1, r2))
    assert model.calls == []
