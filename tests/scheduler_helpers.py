"""Shared by several test modules (moved out of tests/test_scheduler.py, which uses them too): Letters, ScriptedModel, gen, run, submit."""
import torch
from engine.runtime.generate import Done, SamplingParams
from engine.protocol.errors import ForwardStopped
from engine.kv.tensors import KVCache
from engine.protocol import ErrorEvent, Generate


V = 50


class Dims:
    max_positions = 128


class ScriptedModel:
    """forward(ids, caches, positions): logits whose argmax is the last token + 1 (mod V). Records
    every call's (tokens fed, sequences); a token in `poison` makes the forward that reads it fail."""

    dims = Dims()
    dtype = torch.float32

    def __init__(self, poison=()):
        self.calls: list[tuple[int, int]] = []
        self.poison = set(poison)

    def new_cache(self, ctx):
        return KVCache(1, 1, ctx, 1, torch.float32, torch.device("cpu"))

    def forward(self, ids, caches, positions, all_logits=False, cancel=None):
        if cancel is not None and cancel.is_set():  # as MoEModel.forward: a Stop before the first layer
            raise ForwardStopped("stopped before layer 0")
        if isinstance(caches, KVCache):
            caches, positions = [caches], [positions]
        self.calls.append((ids.shape[0], len(caches)))
        if self.poison & set(ids.tolist()):
            raise RuntimeError("scripted failure")
        last = ids[-1:] if len(caches) == 1 else ids
        return torch.nn.functional.one_hot((last + 1) % V, V).float()


class Letters:
    """A tokenizer: id i is one letter."""

    def decode(self, ids, **kw):
        return "".join(chr(97 + i % 26) for i in ids)

    def encode(self, text, **kw):
        return [ord(c) - 97 for c in text]


class Replies:
    def __init__(self):
        self.events = []

    def __call__(self, ev):
        self.events.append(ev)

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def done(self):
        ends = self.of(Done) + self.of(ErrorEvent)
        assert len(ends) <= 1, ends
        return ends[0] if ends else None


def submit(s, cmd):
    r = Replies()
    req = s.new(cmd, r)
    s.enqueue(req)
    return req, r


def gen(ids, n=4, slot="pool", **kw):
    return Generate(prompt_ids=ids, params=SamplingParams(max_new_tokens=n), slot=slot, **kw)


def run(s, limit=500):
    for _ in range(limit):
        task = s.admit()
        if task is not None:
            return task
        if not s.busy and not s.waiting:
            return None
        s.step()
    raise AssertionError("the scheduler did not finish")

