"""Qwen3-MoE, OLMoE, Qwen2-MoE and Qwen3.5-MoE (engine/families) against transformers' own classes: tiny random
models written by their save_pretrained (single file and sharded); fp32 logits within 1e-4 over a
prefill and 12 decode steps for all-CPU and mixed placements, identical greedy tokens, the same
perplexity through `mixdesk eval`, and the window chatting with a tiny Qwen3-MoE."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.sources.tiny_model import write_tiny_model

FAMILIES = ["qwen3_moe", "olmoe", "qwen2_moe", "qwen3_5_moe", "qwen3_next", "glm4_moe", "glm4_moe_lite", "gemma4"]
from family_checks import CPU, eval_matches_transformers, greedy, greedy_matches_transformers, logit_error, reference, run  # noqa: E402,F401 (shared: tests/family_checks.py)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def get(family: str, sharded: bool = False):
        key = (family, sharded)
        if key not in made:
            made[key] = write_tiny_model(tmp_path_factory.mktemp(family), family, seed=3,
                                         shard_size="60KB" if sharded else None)
        return made[key]
    return get


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("where", ["all-cpu", "mixed"])
def test_logits_match_transformers(folders, family, sharded, where):
    folder = folders(family, sharded)
    ck = Checkpoint(folder)
    assert ck.dims.family == family and (len(ck.files) > 1) == sharded
    assert logit_error(ck, where) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_are_identical(folders, family):
    greedy_matches_transformers(folders(family))


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"] + [  # 3 s each: the rest run with -m slow
    pytest.param(f, marks=pytest.mark.slow) for f in ("qwen3_next", "glm4_moe", "glm4_moe_lite", "gemma4")])
def test_eval_gives_transformers_perplexity(folders, tmp_path, window_cache, family):
    eval_matches_transformers(folders(family), tmp_path)


def test_unsupported_layouts_are_refused_by_name(tmp_path):
    folder = write_tiny_model(tmp_path / "q", "qwen3_moe", mlp_only_layers=[1])
    with pytest.raises(ModelError, match=r"config.json: has dense MLP layers .*mlp_only_layers \[1\]"):
        Checkpoint(folder)
    import json

    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "deepseek_v3", "mlp_only_layers": []}))
    with pytest.raises(ModelError, match=r"model_type is 'deepseek_v3'; Mixdesk runs .*Qwen3-MoE \(qwen3_moe\)"):
        Checkpoint(folder)


@pytest.mark.slow  # 20 s; test_plan_from_mixtral_config_alone covers --config-only in the default run
def test_plan_from_the_shipped_qwen3_config(tmp_path, pinned_machine):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "resources" / "qwen3-30b-a3b-config.json"
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "plan", "--config-only", "--model", str(cfg),
                        "--gpu-budget", "24", "--ram-budget", "64", "--png", ""], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ))  # pinned_machine
    assert r.returncode == 0, r.stderr
    assert "frontier computed in" in r.stdout and "NOTHING FITS" not in r.stdout
    rows = [line for line in r.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) > 50  # a frontier, not a handful of points
    for row in (rows[0], rows[-1]):  # every one of the 48 x 128 experts is placed
        assert sum(int(n) for n in re.findall(r"(\d+) [cg]pu-(?:16|4)", row.split("|")[2])) == 6144, row
    assert "gpu-4" in rows[-1] and "gpu-4" not in rows[0]  # fastest: 4-bit on the GPU; best: all 16-bit


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"] + [pytest.param(f, marks=pytest.mark.slow) for f in
                                    ("qwen3_next", "glm4_moe", "glm4_moe_lite", "gemma4")])
def test_the_window_opens_a_tiny_qwen3_moe_and_chats(qtbot, folders, tmp_path, monkeypatch, window_cache, family):
    pytest.importorskip("PySide6")
    from PySide6.QtCore import Qt

    from app.main_window import MainWindow
    from app.store.chat_store import Store
    from engine.runtime.generate import SamplingParams

    w = MainWindow(Store(tmp_path / "chats.sqlite3"), model=str(folders(family)), session_kwargs={"poll_s": 0.1},
                   device="cpu", dtype="fp32")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.send_btn.isEnabled(), timeout=120_000)
    assert w.model_info is not None and "CPU only" in w.model_label.text()
    w.params = SamplingParams(max_new_tokens=8)
    w.input.setPlainText("hello qwen")
    qtbot.mouseClick(w.send_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.generating and w.cid is not None and len(w.store.messages(w.cid)) == 2,
                    timeout=60_000)
    reply = w.store.messages(w.cid)[1]
    assert reply.complete and reply.content and "tokens/s" in reply.meta["stats"]
    d = w.bridge.session.loaded.ckpt.dims
    assert sum(w.tiers_now.values()) == d.layers * d.experts  # every expert placed (GLM: its first layer is dense)
    w.close()


def test_gpt_oss_is_planned_from_its_config_and_its_release_config_accepted(tmp_path, pinned_machine):
    import json
    import shutil
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "resources" / "gpt-oss-20b-config.json"
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "plan", "--config-only", "--model", str(cfg),
                        "--gpu-budget", "24", "--ram-budget", "64", "--png", ""], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ))  # pinned_machine
    assert r.returncode == 0 and "gpu-4" in r.stdout, r.stderr
    folder = tmp_path / "gpt-oss"
    folder.mkdir()
    shutil.copy(cfg, folder / "config.json")
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    # the release's MXFP4 quantization_config is read, not refused: what is missing is named
    with pytest.raises(ModelError, match="model.safetensors: is missing tensor 'model.embed_tokens.weight'"):
        Checkpoint(folder)
    assert json.loads(cfg.read_text())["model_type"] == "gpt_oss"


def test_the_placement_map_stays_readable_at_48_by_128(qtbot):
    """Qwen3-30B-A3B's 6,144 experts: too many cells for the panel, so each layer is drawn as the bar
    of its tier mix; Mixtral's 32 x 8 keeps one cell per expert."""
    pytest.importorskip("PySide6")
    from app.panel.placement_map import PlacementMap

    m = PlacementMap()
    qtbot.addWidget(m)
    m.resize(340, 260)
    m.show()
    m.set_placement(Placement.random(48, 128, [Tier.GPU16, Tier.GPU4, Tier.CPU16, Tier.CPU4], seed=1))
    img = m.grab().toImage()  # paints it
    assert m.aggregate and "one bar per layer" in m.toolTip() and "128 experts" in m.toolTip()
    row = {img.pixelColor(x, 3).name() for x in range(0, 340, 2)}  # the first layer's bar: all four tiers
    assert {"#2e7d32", "#81c784", "#1565c0", "#64b5f6"} <= row
    m.set_placement(Placement.random(32, 8, [Tier.GPU16, Tier.CPU4], seed=1))
    m.grab()
    assert not m.aggregate and "one cell per expert" in m.toolTip()


@pytest.mark.parametrize("config, attend", [  # 14-21 s each for 10,240 and 24,576 experts: slow
    pytest.param("qwen3.5-35b-a3b", "10 of 40 layers attend", marks=pytest.mark.slow),
    pytest.param("qwen3-next-80b-a3b", "12 of 48 layers attend", marks=pytest.mark.slow),
    ("glm-4.5-air", "46 of 46 layers attend"),
    pytest.param("glm-4.7-flash", "1,692 MiB of keys and values (47 of 47",  # MLA: a 576-number row a token a layer
                 marks=pytest.mark.slow)])
def test_the_2026_families_are_planned_from_their_published_configs(tmp_path, pinned_machine, config, attend):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "resources" / f"{config}-config.json"
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "plan", "--config-only", "--model", str(cfg),
                        "--gpu-budget", "24", "--ram-budget", "64", "--png", ""], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ))  # pinned_machine
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) > 10 and "NOTHING FITS" not in r.stdout and attend in r.stdout
    assert "gpu-4" in rows[-1]  # the fastest end holds 4-bit experts on the GPU


@pytest.mark.parametrize("family", ["glm4_moe", "gemma4"])
def test_a_2026_family_runs_at_bf16_through_a_long_prompt(folders, family):
    """bf16 with a prompt past the native GEMV's rows: GLM's fp32 sigmoid router and Gemma's router
    take their own paths (a bf16 input meeting an fp32 router once failed here); logits stay near fp32's."""
    ck = Checkpoint(folders(family))
    d = ck.dims
    pl = Placement.uniform(d.layers, d.experts, Tier.CPU16)
    ids = torch.randint(0, d.vocab, (40,), generator=torch.Generator().manual_seed(2))
    lo = MoEModel(ck, pl, CPU, torch.bfloat16).forward(ids, MoEModel(ck, pl, CPU, torch.bfloat16).new_cache(48), 0,
                                                       all_logits=True)
    hi = MoEModel(ck, pl, CPU, torch.float32).forward(ids, MoEModel(ck, pl, CPU, torch.float32).new_cache(48), 0,
                                                      all_logits=True)
    assert torch.isfinite(lo).all() and (lo - hi).abs().max() < 0.1 * hi.abs().max()
