"""4-bit tiers: error bounds, run-time re-quantisation without drift, sensitivity and popularity."""
import threading

import pytest
import torch

from engine.files.checkpoint import Checkpoint
from engine.model.evaluate import perplexity
from engine.model.forward import MoEModel
from engine.placement import ALL_TIERS, Placement, Tier
from engine.measures.profile import Cancelled, ModelProfile, calibrate
from engine.experts.quant import NF4, Int4CPU, Q4Native, cpu4_format

CPU = torch.device("cpu")
# Stated bounds: relative output error of one 4-bit matrix against 16-bit, on Gaussian weights
# and activations (4 bits with groups/blocks of 64 give ~9-10%; see docs in engine/experts/quant.py).
MATRIX_BOUND = 0.12
# Whole tiny model, all experts 4-bit: relative error of the logits.
MODEL_BOUND = 0.15


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("shape", [(256, 64), (3072, 576), (576, 1536)])
def test_matrix_error_bounds_random_weights(shape):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(*shape, generator=g) * shape[1] ** -0.5
    x = torch.randn(8, shape[1], generator=g)
    ref = x @ w.t()
    i4 = Int4CPU.quantize(w)
    assert rel(i4.matmul(x), ref) < MATRIX_BOUND
    assert rel(i4.dequantize(), w) < MATRIX_BOUND
    nf4 = NF4.quantize(w, CPU, torch.float32)
    assert rel(nf4.matmul(x), ref) < MATRIX_BOUND
    assert i4.nbytes <= w.numel() * 5 / 8 and nf4.nbytes <= w.numel() * 4.5 / 8  # 5 and 4.5 bits a weight
    if cpu4_format() is Q4Native:  # the native cpu-4 form: the same bound and size, and no worse
        q = Q4Native.quantize(w)
        assert rel(q.matmul(x), ref) < MATRIX_BOUND and rel(q.dequantize(), w) < MATRIX_BOUND
        assert q.nbytes <= w.numel() * 5 / 8
        assert rel(q.dequantize(), w) <= rel(i4.dequantize(), w) * 1.01  # fp16 scale/min vs bf16


def test_int4_matmul_agrees_with_its_dequantised_weight():
    w = torch.randn(128, 64)
    q = Int4CPU.quantize(w)
    x = torch.randn(3, 64)
    assert rel(q.matmul(x), x @ q.dequantize().t()) < 1e-2  # bf16 compute


@pytest.mark.parametrize("tier", [Tier.CPU4, Tier.GPU4])
def test_all_4bit_model_within_bound(tiny, tier):
    ck = Checkpoint(tiny)
    d = ck.dims
    ids = torch.randint(0, d.vocab, (24,), generator=torch.Generator().manual_seed(1))
    ref = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    want = ref.forward(ids, ref.new_cache(32), 0, all_logits=True)
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, tier), CPU, torch.float32)
    got = m.forward(ids, m.new_cache(32), 0, all_logits=True)
    assert 0 < rel(got, want) < MODEL_BOUND
    assert m.expert_bytes()["accelerator" if tier.on_accelerator else "host"] < \
        ref.expert_bytes()["host"] * 0.4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_no_drift_16_to_4_to_16(tiny, dtype):
    ck = Checkpoint(tiny)
    d = ck.dims
    ids = torch.randint(0, d.vocab, (12,), generator=torch.Generator().manual_seed(2))
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.GPU16), CPU, dtype)
    before = m.forward(ids, m.new_cache(32), 0, all_logits=True)
    path = [Tier.CPU4, Tier.GPU4, Tier.CPU16, Tier.CPU4, Tier.GPU16]  # every kind of move
    for t in path:
        for e in range(d.experts):
            m.move(0, e, t)
        mid = m.forward(ids, m.new_cache(32), 0, all_logits=True)
        if t.bits == 4:
            assert not torch.equal(mid, before)
    assert m.placement == Placement.uniform(d.layers, d.experts, Tier.GPU16)
    after = m.forward(ids, m.new_cache(32), 0, all_logits=True)
    assert torch.equal(before, after)  # bit-identical


def test_apply_placement_moves_every_differing_expert(tiny):
    ck = Checkpoint(tiny)
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    target = Placement.random(d.layers, d.experts, ALL_TIERS, seed=4)
    m.apply(target)
    assert m.placement == target
    assert [[ex.tier for ex in b.experts] for b in m.moe] == [list(r) for r in target.tiers]


def test_calibration_profile(tiny, tmp_path):
    ck = Checkpoint(tiny)
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    ids = torch.randint(0, d.vocab, (64,), generator=torch.Generator().manual_seed(3)).tolist()
    seen = []
    prof = calibrate(m, ids, progress=lambda done, total, what: seen.append((done, total)))
    assert seen[-1] == (d.layers * (d.experts + 1), d.layers * (d.experts + 1))
    for row in prof.popularity:
        assert sum(row) == 64 * d.top_k
    for tier in ("cpu-4", "gpu-4"):
        flat = [v for r in prof.error[tier] for v in r]
        assert len(flat) == d.layers * d.experts and all(0 < v < MATRIX_BOUND * 2 for v in flat)
        sens = [v for r in prof.sensitivity[tier] for v in r]
        assert len(sens) == d.layers * d.experts and all(v >= 0 for v in sens)
    # the quality model is scaled so that a layer's share x sensitivity adds up to its measured KL
    # (with the lossier 4-bit form), and 4-bit weights do change the predictions of a random model
    assert len(prof.layer_kl) == d.layers and all(kl > 0 for kl in prof.layer_kl)
    for l in range(d.layers):
        share = [c / sum(prof.popularity[l]) for c in prof.popularity[l]]
        per_tier = [sum(s * v for s, v in zip(share, prof.sensitivity[t][l])) for t in ("cpu-4", "gpu-4")]
        assert max(per_tier) == pytest.approx(prof.layer_kl[l], rel=1e-6)
    assert prof.expert_bytes["cpu-4"] < prof.expert_bytes["cpu-16"] * 0.4
    path = tmp_path / "p.json"
    prof.save(path)
    assert ModelProfile.load(path) == prof
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        calibrate(m, ids, cancel=cancel)


def test_forward_resumed_at_a_layer_matches_the_full_pass(tiny):
    ck = Checkpoint(tiny)
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    ids = torch.randint(0, d.vocab, (24,), generator=torch.Generator().manual_seed(5))
    m.layer_inputs = inputs = []
    full = m.forward(ids, m.new_cache(32), 0, all_logits=True)
    m.layer_inputs = None
    assert len(inputs) == d.layers
    for l in range(d.layers):
        again = m.forward(ids, m.new_cache(32), 0, all_logits=True, start=(l, inputs[l]))
        assert torch.equal(again, full)


def test_calibration_of_a_model_holding_4bit_experts(tiny):
    """A model loaded with some experts at 4 bits (memory forced it) still gets each layer's KL
    measured against that layer at 16 bits."""
    ck = Checkpoint(tiny)
    d = ck.dims
    ids = torch.randint(0, d.vocab, (64,), generator=torch.Generator().manual_seed(3)).tolist()
    full = calibrate(MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32), ids)
    mixed = Placement.uniform(d.layers, d.experts, Tier.CPU16)
    for e in range(d.experts):  # the lossier form on this model: what the KL pass itself uses
        mixed = mixed.with_tier(0, e, Tier.GPU4)
    m = MoEModel(ck, mixed, CPU, torch.float32)
    prof = calibrate(m, ids)
    assert [ex.tier for ex in m.moe[0].experts] == [Tier.GPU4] * d.experts  # the model is left as it was
    # layer 0's 16-bit reference is rebuilt, so its KL matches the all-16-bit model's (other layers
    # see slightly different inputs: same order of magnitude, not equal)
    assert 0.5 < prof.layer_kl[0] / full.layer_kl[0] < 2


def test_perplexity_matches_one_full_forward(tiny):
    import math

    import torch.nn.functional as F

    ck = Checkpoint(tiny)
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), CPU, torch.float32)
    ids = torch.randint(0, d.vocab, (50,), generator=torch.Generator().manual_seed(5)).tolist()
    logits = m.forward(torch.tensor(ids), m.new_cache(64), 0, all_logits=True)
    want = math.exp(float(F.cross_entropy(logits[:-1], torch.tensor(ids[1:]))))
    assert abs(perplexity(m, ids, chunk=16) - want) / want < 1e-4
