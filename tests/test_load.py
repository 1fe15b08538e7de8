"""The first placement ("auto"): planned from the model's shape and this machine's free memory, so
a model bigger than memory at 16 bits loads straight into 4-bit, and one that cannot fit is refused."""
import pytest

from engine.protocol.errors import ModelError
from engine.runtime.load import load
from engine.placement import Tier
from engine.planning.planner import Budgets


def _sizes(tiny):
    """(dense bytes, one expert at 16 bits) of the tiny model at fp32, as the engine holds them."""
    ld = load(tiny, "cpu", device="cpu", dtype="fp32")
    m = ld.model
    per16 = m.expert_bytes()["host"] // (m.dims.layers * m.dims.experts)
    dense = m.dense_bytes()
    ld.ckpt.close()
    return dense, per16, m.dims.layers * m.dims.experts


def test_auto_fits_ram_by_going_4bit(tiny):
    dense, per16, n = _sizes(tiny)
    ref = load(tiny, "cpu", device="cpu", dtype="fp32", ctx=256)
    kv = ref.context.nbytes  # the context's keys and values
    ref.ckpt.close()
    budget = Budgets(vram=0, ram=dense + n * per16 // 2 + kv)  # room for half of the experts at 16 bits beside them
    ld = load(tiny, "auto", device="cpu", dtype="fp32", ctx=256, budgets=budget)
    counts = ld.model.placement.counts()
    assert counts[Tier.CPU4] > 0 and counts[Tier.CPU16] > 0
    assert ld.model.expert_bytes()["host"] + ld.model.dense_bytes() + kv <= budget.ram
    ld.ckpt.close()


def test_auto_all_16bit_when_ram_allows(tiny):
    ld = load(tiny, "auto", device="cpu", dtype="fp32", budgets=Budgets(vram=0, ram=10**12))
    assert set(t for t, c in ld.model.placement.counts().items() if c) == {Tier.CPU16}
    ld.ckpt.close()


def test_auto_refuses_a_model_that_cannot_fit(tiny):
    with pytest.raises(ModelError) as e:
        load(tiny, "auto", device="cpu", dtype="fp32", budgets=Budgets(vram=0, ram=1000))
    msg = str(e.value)
    assert str(tiny) in msg and "does not fit" in msg and "GB" in msg


def test_synthetic_model_reads_the_same_weights_every_time(tmp_path):
    """A synthetic checkpoint (real size without a download): weights are a function of the name, so a
    re-placement re-reads what was there; a 16 -> 4 -> 16 round trip is bit-identical."""
    import json

    import torch

    from engine.sources.synthetic import SyntheticCheckpoint, write_synthetic

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mixtral", "vocab_size": 300, "hidden_size": 64,
                               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
                               "max_position_embeddings": 512, "eos_token_id": 2}))
    folder = write_synthetic(tmp_path / "m", cfg)
    assert sum(f.stat().st_size for f in folder.iterdir()) < 200_000  # no weights on disk
    ck = SyntheticCheckpoint(folder)
    name = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    a, b = ck.read(name), ck.read(name)
    assert torch.equal(a, b) and not torch.equal(a, ck.read(name.replace("experts.3", "experts.2")))
    ld = load(folder, "cpu", device="cpu", dtype="fp32")
    before = ld.model.moe[1].experts[3](torch.ones(1, 64)).clone()
    ld.model.move(1, 3, Tier.CPU4)
    ld.model.move(1, 3, Tier.CPU16)
    assert torch.equal(ld.model.moe[1].experts[3](torch.ones(1, 64)), before)
