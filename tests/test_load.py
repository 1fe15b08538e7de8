"""The first placement ("auto"): planned from the model's shape and this machine's free memory, so
a model bigger than memory at 16 bits loads straight into 4-bit, and one that cannot fit is refused."""
import pytest

from engine.errors import ModelError
from engine.load import load
from engine.placement import Tier
from engine.planner import Budgets


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
    budget = Budgets(vram=0, ram=dense + n * per16 // 2)  # room for half of the experts at 16 bits
    ld = load(tiny, "auto", device="cpu", dtype="fp32", budgets=budget)
    counts = ld.model.placement.counts()
    assert counts[Tier.CPU4] > 0 and counts[Tier.CPU16] > 0
    assert ld.model.expert_bytes()["host"] + ld.model.dense_bytes() <= budget.ram
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
