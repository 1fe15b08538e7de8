"""Concurrent requests (engine/runtime/scheduler.py, MoEModel.forward of B sequences): a batched decode step gives
each sequence the logits it gets alone; requests running together through the session produce the
greedy tokens each produces alone; a long prompt is read in chunks while another request keeps
streaming; Stop ends one request and not the other."""
import threading
import time

import pytest
import torch

from engine.files.checkpoint import Checkpoint
from engine.runtime.generate import SamplingParams
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded, Stop, Token
from engine.runtime.session import Session
from engine.sources.tiny_model import write_tiny_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    made = {}

    def get(family):
        if family not in made:
            made[family] = write_tiny_model(tmp_path_factory.mktemp(family), family, seed=4,
                                            **({"sliding_window": 6} if family == "mixtral" else {}))
        return made[family]
    return get


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("tier", [Tier.CPU16, Tier.CPU4])
def test_a_batched_step_gives_each_sequence_its_own_logits(models, family, tier):
    ck = Checkpoint(models(family))
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, tier), CPU, torch.float32)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, d.vocab, (n,), generator=g) for n in (3, 9, 14)]  # past the sliding windows
    caches = [m.new_cache(32) for _ in prompts]
    for p, c in zip(prompts, caches):
        m.forward(p, c, 0)
    alone = [m.new_cache(32) for _ in prompts]
    for p, c in zip(prompts, alone):
        m.forward(p, c, 0)
    nxt = torch.randint(0, d.vocab, (3,), generator=g)
    pos = [len(p) for p in prompts]
    calls, inner = [], m.native_step
    if inner is not None:  # Mixtral and Qwen3-MoE: all B sequences in one native call
        m.native_step = lambda *a: calls.append(1) or inner(*a)
    got = m.forward(nxt, caches, pos)
    m.native_step = inner
    assert calls == ([1] if family != "gpt_oss" else [])
    want = torch.cat([m.forward(nxt[b:b + 1], alone[b], pos[b]) for b in range(3)])
    tol = 1e-5 if tier == Tier.CPU16 else 2e-3  # cpu-4: int8 activations, quantised per call
    assert (got - want).abs().max() <= tol * want.abs().max()
    for c, a, p in zip(caches, alone, pos):  # the caches hold the same keys and values
        assert torch.allclose(c.k[:, :, :p + 1], a.k[:, :, :p + 1], atol=1e-5)
        assert torch.allclose(c.v[:, :, :p + 1], a.v[:, :, :p + 1], atol=1e-5)


def run(session_kwargs, folder, requests, stop_after=None, pace_s=0.0, placement="cpu", then=()):
    """Submit requests [(name, prompt_ids, max_new)] at once, then (when those are done) the
    requests `then`; returns ({name: its Done}, event log, {name: the request id the engine gave it})."""
    events, got, ids = [], threading.Event(), {}
    s = Session(events.append, **session_kwargs).start()
    try:
        s.submit(Load(path=str(folder), device="cpu", dtype="fp32", placement=placement, ctx=256))
        deadline = time.time() + 120
        while not any(isinstance(e, Loaded) for e in events):
            assert time.time() < deadline and not any(isinstance(e, ErrorEvent) for e in events), events
            time.sleep(0.05)
        s.loaded.generator.eos_ids.clear()
        if pace_s:
            inner = s.loaded.generator.retrying
            s.loaded.generator.retrying = lambda step: (time.sleep(pace_s), inner(step))[1]
        for name, prompt, n in requests:
            ids[name] = s.submit(Generate(prompt_ids=prompt, params=SamplingParams(max_new_tokens=n), slot="pool"))
        if stop_after is not None:
            name, k = stop_after
            while sum(isinstance(e, Token) and e.request_id == ids[name] for e in events) < k:
                time.sleep(0.01)
            s.submit(Stop(request_id=ids[name]))
        for batch in (requests, then):
            if batch is then:
                for name, prompt, n in then:
                    ids[name] = s.submit(Generate(prompt_ids=prompt, params=SamplingParams(max_new_tokens=n),
                                                  slot="pool"))
            while sum(isinstance(e, (Done, ErrorEvent)) and e.request_id in {ids[r] for r, _, _ in batch}
                      for e in list(events)) < len(batch):
                assert time.time() < deadline + 120
                time.sleep(0.02)
    finally:
        s.shutdown()
    del got
    name_of = {rid: name for name, rid in ids.items()}
    done = {name_of[e.request_id]: e for e in events if isinstance(e, Done)}
    return done, events, ids


def test_two_requests_at_once_give_what_each_gives_alone(models):
    folder = models("mixtral")
    a, b = [5, 9, 11, 3], [7, 7, 2, 40, 41, 42, 8]
    alone_a, _, _ = run({}, folder, [(1, a, 24)])
    alone_b, _, _ = run({}, folder, [(2, b, 24)])
    both, events, ids = run({}, folder, [(1, a, 24), (2, b, 24)], pace_s=0.002)
    assert both[1].token_ids == alone_a[1].token_ids and both[2].token_ids == alone_b[2].token_ids
    # they ran together: each had tokens out before the other was done
    order = [e for e in events if isinstance(e, (Token, Done))]
    first_done = min(i for i, e in enumerate(order) if isinstance(e, Done))
    assert {ids[1], ids[2]} <= {e.request_id for e in order[:first_done]}


def test_a_long_prompt_is_read_in_chunks_while_another_streams(models):
    folder = models("mixtral")
    long = list(range(10, 10 + 200))  # four chunks of 64
    both, events, ids = run({}, folder, [(1, [5, 6, 7], 60), (2, long, 4)], pace_s=0.002)
    assert both[1].reason == "length" and both[2].reason == "length"
    seq = [(e.request_id, e.index) for e in events if isinstance(e, Token)]
    first_b = seq.index((ids[2], 0))
    a_before = [i for r, i in seq[:first_b] if r == ids[1]]
    assert len(a_before) >= 3  # request 1 kept streaming while request 2's prompt was read


def test_stop_ends_one_request_and_not_the_other(models):
    folder = models("mixtral")
    done, _, _ = run({}, folder, [(1, [5, 6, 7], 200), (2, [8, 9], 30)], stop_after=(1, 5), pace_s=0.002)
    assert done[1].reason == "cancelled" and len(done[1].token_ids) < 200
    assert done[2].reason == "length" and len(done[2].token_ids) == 30


def test_more_requests_than_streams_wait_their_turn(models):
    folder = models("mixtral")
    reqs = [(r, [5 + r, 6, 7], 6) for r in range(1, 6)]
    done, _, _ = run({"max_streams": 2}, folder, reqs)
    alone, _, _ = run({}, folder, [reqs[4]])
    assert sorted(done) == [1, 2, 3, 4, 5] and all(f.reason == "length" for f in done.values())
    assert done[5].token_ids == alone[5].token_ids


def test_the_plan_follows_how_many_requests_decode_together(models):
    """The planner's cost model of batched decode: once two requests have decoded together for a
    while the session re-plans for two streams (the predicted rate is both streams' together), and
    back to one when a request runs alone."""
    from engine.protocol import PlacementChanged

    folder = models("mixtral")
    done, events, _ = run({}, folder, [(1, [5, 6, 7], 48), (2, [8, 9], 48)], placement="auto",
                          then=[(3, [4, 4, 4], 48)])
    assert all(f.reason == "length" for f in done.values())
    plans = [e for e in events if isinstance(e, PlacementChanged)]
    follow = [e.streams for e in plans if e.reason == "streams"]
    assert follow == [2, 1], [(e.reason, e.streams) for e in plans]
    two = next(e for e in plans if e.reason == "streams")
    assert two.predicted_tok_s > plans[0].predicted_tok_s  # two streams' tokens together


def test_loading_another_model_ends_running_requests_with_a_word(models):
    """A request never hangs: one still running when another model loads ends with an error event."""
    folder = models("mixtral")
    events = []
    s = Session(events.append).start()
    try:
        s.submit(Load(path=str(folder), device="cpu", dtype="fp32", placement="cpu", ctx=256))
        deadline = time.time() + 120
        while not any(isinstance(e, Loaded) for e in events):
            assert time.time() < deadline
            time.sleep(0.05)
        s.loaded.generator.eos_ids.clear()
        inner = s.loaded.generator.retrying
        s.loaded.generator.retrying = lambda step: (time.sleep(0.01), inner(step))[1]
        rids = [s.submit(Generate(prompt_ids=[5, 6, k], slot="pool", params=SamplingParams(max_new_tokens=200)))
                for k in (1, 2)]
        while sum(isinstance(e, Token) for e in events) < 6:
            time.sleep(0.01)
        s.submit(Load(path=str(folder), device="cpu", dtype="fp32", placement="cpu", ctx=256))
        while sum(isinstance(e, Loaded) for e in events) < 2:
            assert time.time() < deadline + 60
            time.sleep(0.05)
    finally:
        s.shutdown()
    ended = {e.request_id: e for e in events if isinstance(e, (Done, ErrorEvent)) and e.request_id in rids}
    assert set(ended) == set(rids) and all(isinstance(e, ErrorEvent) and e.kind == "Unloaded" for e in ended.values())


def test_the_kv_cache_is_kept_in_the_models_dtype(models):
    """A bf16 model's keys and values are cached in bf16 (half the RAM and the bytes attention
    reads of an fp32 cache); attention still runs in fp32, and a batched step of a bf16 model gives
    each sequence what its own step gives."""
    ck = Checkpoint(models("mixtral"))
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.bfloat16)
    f = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    c16, c32 = m.new_cache(32), f.new_cache(32)
    assert c16.k.dtype == torch.bfloat16 and c32.k.dtype == torch.float32 and 2 * c16.nbytes == c32.nbytes
    prompts = [torch.tensor([5, 9, 11, 3]), torch.tensor([7, 7, 2, 40, 41, 42, 8])]
    caches, alone = [m.new_cache(32) for _ in prompts], [m.new_cache(32) for _ in prompts]
    for p, c, a in zip(prompts, caches, alone):
        m.forward(p, c, 0)
        m.forward(p, a, 0)
    nxt, pos = torch.tensor([12, 13]), [len(p) for p in prompts]
    got = m.forward(nxt, caches, pos)
    want = torch.cat([m.forward(nxt[b:b + 1], alone[b], pos[b]) for b in range(2)])
    assert (got - want).abs().max() <= 1e-2 * want.abs().max()
    # and the bf16 model with its bf16 cache stays close to the fp32 model with an fp32 one
    ref = f.forward(prompts[1], c32, 0)
    err = (m.forward(prompts[1], m.new_cache(32), 0) - ref).abs().max() / ref.abs().max()
    assert err <= 0.03, err  # bf16 weights and activations: 0.7% measured
