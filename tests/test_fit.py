"""engine/measures/fit.py: what the model browser says of a model before any download — the
planner's prediction from a config.json alone, on a given machine, in one line of plain words."""
import json
from pathlib import Path

import pytest

from engine.protocol.errors import ModelError
from engine.measures import fit
from engine.measures.hardware import HardwareProfile
from engine.measures.inputs import from_dims
from engine.planning.planner import Budgets, frontier

RES = Path(__file__).resolve().parents[1] / "resources"
GB = 10**9
CPU = HardwareProfile("test", True, {"cpu-16": [2e-5, 1 / 20e9], "cpu-4": [2e-5, 1 / 35e9]}, None, None, 0, 64 * GB)
GPU = HardwareProfile("test-gpu", False, {**CPU.tier_costs, "gpu-16": [2e-5, 1 / 800e9], "gpu-4": [3e-5, 1 / 500e9]},
                      25e9, 25e9, 24 * GB, 64 * GB)


def test_a_cpu_only_machine_gets_the_planners_best_quality_rate():
    f = fit.predict(RES / "mixtral-8x7b-config.json", CPU, Budgets(vram=0, ram=100 * GB))
    assert f.fits and f.cpu_only and f.four_bit == 0  # 93 GB at 16 bits fits in 100 GB
    inp, _ = fit.inputs_of(RES / "mixtral-8x7b-config.json", CPU)
    points = frontier(inp, Budgets(vram=0, ram=100 * GB))
    assert f.best_tok_s == points[0].tok_s and f.fastest_tok_s == max(p.tok_s for p in points)
    assert f.line() == (f"CPU only: {points[0].ram / GB:.0f} GB of 100 GB RAM · about {f.best_tok_s:.1f} tok/s "
                        f"at best quality, up to {f.fastest_tok_s:.1f} tok/s at fastest")


def test_a_tight_machine_is_told_the_share_compressed_and_a_small_one_that_it_does_not_fit():
    f = fit.predict(RES / "mixtral-8x7b-config.json", CPU, Budgets(vram=0, ram=40 * GB))
    assert f.fits and 0 < f.four_bit < 1 and f.ram <= 40 * GB
    assert f"({f.four_bit:.0%} of experts compressed)" in f.line()
    small = fit.predict(RES / "mixtral-8x7b-config.json", CPU, Budgets(vram=0, ram=20 * GB))
    assert not small.fits
    assert small.line() == "does not fit: needs 29 GB, this machine has 20 GB RAM"  # 4-bit experts + dense


def test_a_gpu_machine_plans_with_its_vram():
    f = fit.predict(RES / "mixtral-8x7b-config.json", GPU, Budgets(vram=22 * GB, ram=40 * GB))
    assert f.fits and not f.cpu_only and 0 < f.vram <= 22 * GB
    assert f.line().startswith(f"fits: {f.vram / GB:.0f} GB of 22 GB VRAM + {f.ram / GB:.0f} GB RAM · about ")
    no = fit.predict(RES / "mixtral-8x7b-config.json", GPU, Budgets(vram=8 * GB, ram=8 * GB))
    assert no.line() == "does not fit: needs 29 GB, this machine has 8.0 GB RAM + 8.0 GB VRAM"


def test_a_dict_a_file_and_a_folder_give_the_same_fit(tmp_path):
    raw = json.loads((RES / "qwen3-30b-a3b-config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw))
    b = Budgets(vram=0, ram=30 * GB)
    lines = {fit.predict(c, CPU, b).line() for c in (raw, tmp_path / "config.json", tmp_path)}
    assert len(lines) == 1


def test_the_inputs_are_the_planners_from_the_shape():
    from engine.files.checkpoint import dims_from_config, hf_config

    raw = json.loads((RES / "qwen3-30b-a3b-config.json").read_text())
    inp, note = fit.inputs_of(raw, CPU)
    d = dims_from_config(hf_config(raw, Path("c")), Path("c"))
    assert inp == from_dims(d, CPU, 2) and inp.cpu_only and "ASSUMED" in note


def test_a_model_mixdesk_does_not_run_is_one_clear_error():
    with pytest.raises(ModelError, match="'llama' model; Mixdesk runs"):
        fit.predict({"model_type": "llama", "num_hidden_layers": 2}, CPU, Budgets(0, GB))
    with pytest.raises(ModelError, match="lacks the field"):
        fit.predict({"model_type": "mixtral"}, CPU, Budgets(0, GB))


def test_budgets_of_the_machine_leave_the_engines_margins():
    from engine.measures.inputs import RAM_MARGIN, VRAM_MARGIN

    assert fit.machine_budgets(CPU, ram_available=10 * GB) == Budgets(0, int(10 * GB * (1 - RAM_MARGIN)))
    b = fit.machine_budgets(GPU, ram_available=10 * GB, vram_free=20 * GB)
    assert b.vram == int(20 * GB * (1 - VRAM_MARGIN))
    assert fit.machine_budgets(GPU, ram_available=GB).vram == int(24 * GB * (1 - VRAM_MARGIN))


def test_a_file_known_by_its_size():
    assert fit.by_size(4 * GB, Budgets(0, 12 * GB)) == "fits in memory by its size: 4.0 GB of this machine's 12 GB RAM"
    assert fit.by_size(60 * GB, Budgets(8 * GB, 24 * GB)) == \
        "does not fit: needs 60 GB, this machine has 24 GB RAM + 8.0 GB VRAM"
