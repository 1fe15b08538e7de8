"""The real CUDA path: run with `pytest -m gpu` on a machine with an NVIDIA GPU."""
import pytest
import torch

from engine.files.checkpoint import Checkpoint
from engine.experts.offload import OffloadCosts, measure
from engine.machine.devices import detect
from engine.experts.build import materialise
from engine.runtime.generate import Generator, SamplingParams
from engine.runtime.load import auto_placement
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("name", ["all-gpu", "all-cpu", "mixed"])
def test_cuda_logits_match_transformers(tiny, reference, name):
    ck = Checkpoint(tiny)
    d = ck.dims
    pl = {"all-gpu": Placement.uniform(d.layers, d.experts, Tier.GPU16),
          "all-cpu": Placement.uniform(d.layers, d.experts, Tier.CPU16),
          "mixed": Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], 1)}[name]
    ids = torch.randint(0, d.vocab, (36,), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = reference(tiny)(ids[None]).logits[0]
    model = MoEModel(ck, pl, CUDA, torch.float32)
    cache = model.new_cache(64)
    got = [model.forward(ids[:16], cache, 0, all_logits=True)]
    got += [model.forward(ids[i:i + 1], cache, i) for i in range(16, 36)]
    assert (torch.cat(got).cpu() - want).abs().max().item() < 1e-4


def test_costs_are_measured_and_copy_path_matches(tiny, reference):
    ck = Checkpoint(tiny)
    costs = measure(materialise(ck, 0, 0, Tier.CPU16, CUDA, torch.float32), CUDA)
    assert isinstance(costs, OffloadCosts) and costs.h2d_bytes_per_s > 0
    ids = torch.randint(0, ck.dims.vocab, (20,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = reference(tiny)(ids[None]).logits[0]
    always = OffloadCosts(1.0, 1.0, 0.0, 0.0, 1e15)
    model = MoEModel(ck, Placement.uniform(ck.dims.layers, ck.dims.experts, Tier.CPU16), CUDA,
                         torch.float32, offload_costs=always)
    got = model.forward(ids, model.new_cache(32), 0, all_logits=True).cpu()
    assert sum(b.copied for b in model.moe) > 0 and (got - want).abs().max().item() < 1e-4


def test_auto_placement_respects_budget(tiny):
    from engine.protocol.errors import ModelError
    from engine.measures.hardware import load_or_measure
    from engine.measures.inputs import from_dims
    from engine.planning.planner import Budgets

    ck = Checkpoint(tiny)
    acc = detect()
    n = ck.dims.layers * ck.dims.experts
    dense = from_dims(ck.dims, load_or_measure(acc.device), 2).dense_bytes
    pl = auto_placement(ck, acc, torch.bfloat16, Budgets(vram=10**10, ram=10**12))
    assert pl.counts()[Tier.GPU16] == n
    pl = auto_placement(ck, acc, torch.bfloat16, Budgets(vram=dense + 1, ram=10**12))  # room for the dense part only
    assert not any(t.on_accelerator for _, _, t in pl.items())
    with pytest.raises(ModelError):
        auto_placement(ck, acc, torch.bfloat16, Budgets(vram=0, ram=10**12))  # not even the dense part fits


def test_bf16_generation_on_cuda(tiny):
    ck = Checkpoint(tiny)
    tok = ck.load_tokenizer()
    pl = Placement.random(ck.dims.layers, ck.dims.experts, [Tier.GPU16, Tier.CPU16], 2)
    model = MoEModel(ck, pl, CUDA, torch.bfloat16)
    from engine.prompts.chat_template import ChatTemplate
    from engine.prompts.prompt import Prompts

    gen = Generator(model, tok, set(), ctx=128)
    prompt = Prompts(ChatTemplate.of(tok, ck.folder), tok, gen.ctx).chat([{"role": "user", "content": "hello"}])
    fin = list(gen.stream(prompt, SamplingParams(max_new_tokens=16)))[-1]
    assert len(fin.token_ids) == 16


def test_engine_shrinks_when_another_process_takes_vram(tmp_path, monkeypatch):
    """A second process allocates VRAM; the monitor (NVML) sees free memory fall and the engine
    evicts experts from the GPU before it would run out."""
    import subprocess
    import sys
    import threading
    import time as _time

    from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded, Stats
    from engine.runtime.session import Session
    from engine.sources.tiny_model import write_tiny_mixtral

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write_tiny_mixtral(tmp_path / "m", layers=4, hidden=1024, ffn=4096, experts=8, heads=8, kv_heads=4,
                              dtype="bfloat16")
    events, loaded = [], threading.Event()
    s = Session(lambda e: (events.append(e), isinstance(e, (Loaded, ErrorEvent)) and loaded.set()),
                poll_s=0.1, slider=1.0).start()
    s.submit(Load(path=str(path)))
    assert loaded.wait(300) and not [e for e in events if isinstance(e, ErrorEvent)]
    _time.sleep(1.0)
    held_before = s.controller.held[0]
    free, total = torch.cuda.mem_get_info()
    hog = int(free - held_before * 0.5)  # leaves room for only half of what the model holds
    code = (f"import torch,time; x=torch.empty({hog}, dtype=torch.uint8, device='cuda'); "
            "print('ok', flush=True); time.sleep(20)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        s.submit(Generate(prompt_ids=list(range(1, 20)), params=SamplingParams(max_new_tokens=50)))
        deadline = _time.time() + 15
        while s.controller.held[0] >= held_before * 0.9 and _time.time() < deadline:
            _time.sleep(0.1)
        assert s.controller.held[0] < held_before * 0.9
    finally:
        p.kill()
    assert not [e for e in events if isinstance(e, ErrorEvent)]
    assert s.shutdown()
