import pytest

from engine.placement import Placement, Tier


def test_uniform_counts_and_json_roundtrip():
    p = Placement.uniform(3, 4, Tier.CPU16)
    assert p.counts()[Tier.CPU16] == 12 and p[2, 3] is Tier.CPU16
    q = p.with_tier(1, 2, Tier.GPU16)
    assert p[1, 2] is Tier.CPU16 and q[1, 2] is Tier.GPU16  # immutable: a change is a new placement
    assert Placement.from_json(q.to_json()) == q


def test_diff_evicts_from_accelerator_first():
    old = Placement.uniform(2, 2, Tier.CPU16).with_tier(0, 0, Tier.GPU16).with_tier(1, 1, Tier.GPU16)
    new = Placement.uniform(2, 2, Tier.CPU16).with_tier(0, 1, Tier.GPU16).with_tier(1, 0, Tier.GPU16)
    moves = old.diff(new)
    assert len(moves) == 4
    kinds = [(m.old.on_accelerator, m.new.on_accelerator) for m in moves]
    assert kinds[:2] == [(True, False), (True, False)]  # free GPU memory before allocating it
    assert old.diff(old) == []


def test_tier_properties():
    assert Tier("gpu-4").bits == 4 and Tier.GPU4.on_accelerator
    assert Tier.CPU16.bits == 16 and not Tier.CPU16.on_accelerator


def test_ragged_placement_rejected():
    with pytest.raises(ValueError):
        Placement(((Tier.CPU16,), (Tier.CPU16, Tier.GPU16)))
