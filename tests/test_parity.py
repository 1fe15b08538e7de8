"""The engine's logits equal transformers' reference forward (fp32, 1e-4) for any 16-bit placement,
over a prefill plus 20 decode steps; greedy generations are identical token for token."""
import pytest
import torch

from engine.files.checkpoint import Checkpoint
from engine.experts.offload import OffloadCosts
from engine.runtime.generate import Generator, SamplingParams
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier

CPU = torch.device("cpu")


def placements(d):
    return {
        "all-gpu": Placement.uniform(d.layers, d.experts, Tier.GPU16),
        "all-cpu": Placement.uniform(d.layers, d.experts, Tier.CPU16),
        "mixed-1": Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], seed=1),
        "mixed-2": Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], seed=2),
    }


@pytest.mark.parametrize("which", ["tiny", "tiny_sharded"])
@pytest.mark.parametrize("name", ["all-gpu", "all-cpu", "mixed-1", "mixed-2"])
def test_logits_match_transformers(which, name, request, reference):
    folder = request.getfixturevalue(which)
    ck = Checkpoint(folder)
    if which == "tiny_sharded":
        assert len(ck.files) > 1 and ck.index_map
    ref = reference(folder)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, ck.dims.vocab, (16 + 20,), generator=g)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]  # [36, V]
    model = MoEModel(ck, placements(ck.dims)[name], CPU, torch.float32)
    cache = model.new_cache(64)
    got = [model.forward(ids[:16], cache, 0, all_logits=True)]  # prefill
    for i in range(16, 36):  # 20 decode steps
        got.append(model.forward(ids[i:i + 1], cache, i))
    got = torch.cat(got)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-4


def test_prefill_in_two_chunks_matches(tiny, reference):
    """A prefill that continues a cached prefix (chat turn 2) attends to the right keys."""
    ck = Checkpoint(tiny)
    ids = torch.randint(0, ck.dims.vocab, (24,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference(tiny)(ids[None]).logits[0]
    model = MoEModel(ck, placements(ck.dims)["mixed-1"], CPU, torch.float32)
    cache = model.new_cache(64)
    a = model.forward(ids[:10], cache, 0, all_logits=True)
    b = model.forward(ids[10:], cache, 10, all_logits=True)
    assert (torch.cat([a, b]) - want).abs().max().item() < 1e-4


def test_copy_to_accelerator_path_matches(tiny, reference):
    """When the measured costs say 'copy the weights over', a CPU expert runs on the accelerator
    for that prefill, with the same result."""
    ck = Checkpoint(tiny)
    ids = torch.randint(0, ck.dims.vocab, (20,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = reference(tiny)(ids[None]).logits[0]
    always_copy = OffloadCosts(cpu_fixed_s=1.0, cpu_per_token_s=1.0, gpu_fixed_s=0.0,
                              gpu_per_token_s=0.0, h2d_bytes_per_s=1e15)
    model = MoEModel(ck, placements(ck.dims)["all-cpu"], CPU, torch.float32, offload_costs=always_copy)
    got = model.forward(ids, model.new_cache(32), 0, all_logits=True)
    assert sum(b.copied for b in model.moe) > 0
    assert (got - want).abs().max().item() < 1e-4


def test_cost_model_decision():
    c = OffloadCosts(cpu_fixed_s=1e-4, cpu_per_token_s=1e-3, gpu_fixed_s=1e-4, gpu_per_token_s=1e-5,
                    h2d_bytes_per_s=1e10)
    nbytes = 100_000_000  # 10 ms to copy
    assert not c.copy_wins(1, nbytes)  # decode: move activations, not weights
    assert c.copy_wins(64, nbytes)  # big prefill batch: copying pays off


@pytest.mark.parametrize("name", ["all-gpu", "all-cpu", "mixed-1"])
def test_greedy_generation_identical(tiny, reference, name):
    ck = Checkpoint(tiny)
    tok = ck.load_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "The capital of France is"}],
                                     add_generation_prompt=True, tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    ref = reference(tiny)
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    want = out[0, len(prompt):].tolist()
    model = MoEModel(ck, placements(ck.dims)[name], CPU, torch.float32)
    gen = Generator(model, tok, eos_ids=set(), ctx=128)
    fin = list(gen.stream(prompt, SamplingParams(max_new_tokens=24)))[-1]
    assert fin.token_ids == want
