"""What a calibration measures (engine/measures/profile.py): the 4-bit forms the model would really
hold, and only where a choice depends on them.

- A CPU-only machine measures cpu-4 alone (NF4's error is of no use there, and building it on a CPU
  was the slowest step of a first start); a profile without gpu-4 is not a profile for a machine
  with a GPU, which calibrates again.
- A GGUF layer whose experts are 4-bit in the file holds the same blocks at cpu-4 as at cpu-16:
  nothing is built or measured there, its error is zero and its KL pass is skipped. A layer whose down
  matrices are Q6_K is measured with the cpu-4 form the model builds (the file's Q4_K gate/up, the
  down matrix re-quantised).
"""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as GT

from engine import native
from engine.files.gguf.writer import write_gguf
from engine.runtime.load import load
from engine.placement import Tier
from engine.measures import profile as P
from engine.sources.tiny_model import write_tiny_model

SHAPE = dict(layers=2, hidden=256, ffn=256, experts=4, top_k=2, heads=4, kv_heads=2, vocab=320)


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    """A Q4_K_M file whose layer 0 keeps Q6_K down matrices and layer 1 is 4-bit throughout."""
    root = tmp_path_factory.mktemp("calibration-tiers")
    src = write_tiny_model(root / "src", "mixtral", **SHAPE)
    return write_gguf(src, root / "mixed-q4_k_m.gguf", "q4_k_m",
                      types={"blk.0.ffn_down_exps.weight": GT.Q6_K, "blk.1.ffn_down_exps.weight": GT.Q4_K})[0]


def counting_builds(monkeypatch) -> list:
    built = []
    real = P.build_steps

    def build(ckpt, layer, expert, tier, *a, **k):
        built.append((layer, expert, tier))
        return real(ckpt, layer, expert, tier, *a, **k)

    monkeypatch.setattr(P, "build_steps", build)
    return built


def test_a_cpu_only_machine_measures_cpu_4_and_a_gpu_machine_needs_gpu_4_too(tmp_path, monkeypatch):
    assert P.calibrated_tiers(cpu_only=True) == (Tier.CPU4,)
    assert P.calibrated_tiers(cpu_only=False) == (Tier.CPU4, Tier.GPU4)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ld = load(write_tiny_model(tmp_path / "m", "mixtral", layers=2, experts=4), placement="cpu", device="cpu",
              dtype="fp32")
    built = counting_builds(monkeypatch)
    mp = P.load_or_calibrate(ld.model, ld.tokenizer, max_tokens=64, tiers=P.calibrated_tiers(cpu_only=True))
    assert set(mp.sensitivity) == set(mp.error) == {"cpu-4"}
    assert {t for _, _, t in built} == {Tier.CPU4}  # no NF4 form was built
    assert all(v > 0 for row in mp.error["cpu-4"] for v in row)  # a 16-bit model's experts all lose
    assert P.cached_profile(ld.ckpt, (Tier.CPU4,)) is not None
    assert P.cached_profile(ld.ckpt, (Tier.CPU4, Tier.GPU4)) is None  # a GPU appeared: measure again
    again = P.load_or_calibrate(ld.model, ld.tokenizer, max_tokens=64, tiers=(Tier.CPU4, Tier.GPU4))
    assert set(again.sensitivity) == {"cpu-4", "gpu-4"}
    assert P.cached_profile(ld.ckpt, (Tier.CPU4, Tier.GPU4)) is not None


@pytest.mark.skipif(not native.available(), reason="native library not built")
def test_a_gguf_layer_that_is_4_bit_in_the_file_is_not_measured(mixed_file, monkeypatch):
    ld = load(mixed_file, placement="cpu", device="cpu", dtype="bf16")
    try:
        ck = ld.ckpt
        assert [ck.expert_raw_info(l, 0, "w2").qtype for l in range(2)] == [GT.Q6_K, GT.Q4_K]
        built = counting_builds(monkeypatch)
        mp = P.calibrate(ld.model, P.calibration_ids(ld.tokenizer, 256), (Tier.CPU4,))
        assert sorted({(l, t) for l, _, t in built}) == [(0, Tier.CPU4)]  # nothing built for layer 1
        assert mp.error["cpu-4"][1] == [0.0] * 4 and mp.sensitivity["cpu-4"][1] == [0.0] * 4
        assert mp.layer_kl[1] == 0.0
        assert all(v > 0 for v in mp.error["cpu-4"][0]) and mp.layer_kl[0] > 0
        assert sorted((l, e) for l, e, _ in built) == [(0, e) for e in range(4)]  # each expert once
    finally:
        ck.close()


def test_the_engines_first_start_on_a_cpu_only_device_measures_cpu_4(tiny, window_cache):
    """The run's seed is a real first start (tests/conftest.py cache_seed: a Session on the tiny model,
    device cpu, its background calibration to the end): its saved profile holds cpu-4 alone."""
    from pathlib import Path

    mp = P.ModelProfile.load(P.profile_path(Path(tiny)))
    assert mp is not None and mp.calibration_tokens > 0
    assert set(mp.sensitivity) == {"cpu-4"}
