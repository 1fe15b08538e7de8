"""The arithmetic of a context that fits (engine/planning/kv_reservation.py): bytes a token of keys and
values per model shape, the longest context in N bytes, and what "auto" or an asked length takes."""
import json
from pathlib import Path

import pytest

from engine.files.checkpoint import dims_from_config, hf_config
from engine.planning.kv_reservation import (AUTO_SHARE, FLOOR, ContextCost, ContextTooLarge, choose_length, cost_of,
                                            int8_element_bytes, rounded)
from engine.protocol.errors import InputError

RESOURCES = Path(__file__).resolve().parents[1] / "resources"


def dims_of(path: Path):
    raw = json.loads(path.read_text())
    return dims_from_config(hf_config(raw, path), path)


def test_mixtral_bytes_a_token_from_its_shape():
    d = dims_of(RESOURCES / "mixtral-8x7b-config.json")  # 32 layers, 8 kv heads of 128
    c = cost_of(d, 2, 3)
    assert c.per_token == 32 * 8 * (128 + 128) * 2 == 131_072  # 128 KiB a token at bf16
    assert c.bytes(32768) == 4 * 2**30 and c.fixed == 0
    assert cost_of(d, 4, 3).bytes(1000) == 2 * c.bytes(1000)  # fp32 keys and values: twice
    assert cost_of(d, int8_element_bytes(), 3).per_token == pytest.approx(c.per_token / 2 * (1 + 2 / 32))


def test_qwen3_30b_a3b_holds_its_whole_context_in_4_gb():
    d = dims_of(RESOURCES / "qwen3-30b-a3b-config.json")  # 48 layers, 4 kv heads of 128; 40,960 positions
    c = cost_of(d, 2, 3)
    assert c.per_token == 48 * 4 * 256 * 2 == 98_304
    assert c.max_positions == 40960 and c.bytes(40960) == 4_026_531_840


def test_a_hybrid_model_counts_its_attention_layers_and_a_fixed_state():
    d = dims_of(RESOURCES / "qwen3.5-35b-a3b-config.json")
    c = cost_of(d, 2, 3)
    assert len(c.layers) == d.attention_layers < d.decoder_layers  # the DeltaNet layers keep no keys and values
    assert c.fixed == 3 * d.state_bytes() > 0  # the live state and its two turn-boundary copies
    assert c.bytes(0) == c.fixed and c.bytes(1000) - c.bytes(0) == 1000 * c.per_token


def test_sliding_window_layers_hold_their_window_only_where_the_cache_bounds_them():
    d = dims_of(RESOURCES / "gpt-oss-20b-config.json")  # every other layer a 128-token window
    full, bounded = cost_of(d, 2, 3), cost_of(d, 2, 3, bounded_windows=True)
    windowed = [b for b, w in full.layers if w]
    assert windowed and len(windowed) < len(full.layers)
    assert full.bytes(128) == bounded.bytes(128)
    assert full.bytes(10_000) - bounded.bytes(10_000) == sum(windowed) * (10_000 - 128)


def test_the_longest_context_that_fits():
    c = ContextCost(((1000, None), (500, 64)), 10_000, 40960)
    for n in (10_000 + 1500, 123_456_789, 50_000_000):
        k = c.longest(n)
        assert c.bytes(k) <= n and (k == 40960 or c.bytes(k + 1) > n)
    assert c.longest(10_000) == 0 and c.longest(10**12) == 40960  # nothing; the model's own at most
    bounded = ContextCost(((1000, None), (500, 64)), 0, 40960, bounded_windows=True)
    assert bounded.longest(1000 * 1000 + 500 * 64) == 1000


def test_auto_is_the_models_own_where_it_fits_and_a_round_length_where_memory_caps_it():
    c = ContextCost(((100_000, None),), 0, 40960)  # 100 KB a token
    roomy = choose_length(c, room=40 * 10**9, budget=40 * 10**9, asked="auto")
    assert roomy.auto and roomy.ctx == roomy.auto_ctx == 40960 and roomy.fits == 40960
    assert roomy.reserve == (0, 40960 * 100_000) and roomy.line() == "40,960 tokens: 4.1 GB of keys and values"
    # a quarter of the budget at most: 8 GB of budget, 2 GB for the context -> 20,000 tokens -> 19,456
    tight = choose_length(c, room=6 * 10**9, budget=8 * 10**9, asked="auto")
    assert tight.ctx == 19456 == rounded(int(AUTO_SHARE * 8 * 10**9) // 100_000, 40960)
    assert tight.fits == 40960  # asked for, memory holds it all (the experts made smaller)
    # room beside the weights at their smallest is the bound when it is the smaller
    small = choose_length(c, room=1_000_000_000, budget=40 * 10**9, asked="auto")
    assert small.ctx == 9216 and small.fits == 10000
    # below the floor, auto still asks for it (the planner then says the model does not fit)
    assert choose_length(c, room=-5, budget=10, asked="auto").ctx == FLOOR
    gpu = choose_length(c, room=10**10, budget=10**10, asked="auto", on_accelerator=True)
    assert gpu.reserve == (gpu.nbytes, 0) and "GPU memory" in gpu.line()


def test_an_asked_length_is_checked_against_memory_with_the_figures():
    c = ContextCost(((100_000, None),), 0, 40960)
    asked = choose_length(c, room=10**9, budget=8 * 10**9, asked=8192)
    assert not asked.auto and asked.ctx == 8192 and asked.nbytes == 819_200_000
    assert choose_length(c, room=10**10, budget=10**10, asked=100_000).ctx == 40960  # cut to the model's own
    with pytest.raises(ContextTooLarge) as e:
        choose_length(c, room=10**9, budget=8 * 10**9, asked=32768)
    assert str(e.value) == ("a context of 32,768 tokens needs 3.3 GB of keys and values; 1.0 GB of memory is free "
                            "beside the model, enough for 10,000 tokens. Choose a shorter context (or auto), or "
                            "close other programs")
    for bad in (0, 15, True, "12k", 2.5, 1 << 30):
        with pytest.raises(InputError, match="context"):
            choose_length(c, room=10**9, budget=8 * 10**9, asked=bad)
