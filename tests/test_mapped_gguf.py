"""A GGUF file's own blocks are served from its read-only mapping (issue 38): the CPU tiers and the
dense matrices the native kernels run point into the file's pages (no copy: page cache, not the
process's memory), the planner and the window count those bytes apart from the memory Mixdesk owns,
and a file truncated while in use is one error for that model, never a crash."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT

from engine import native
from engine.files.gguf.blockquant import BlockQuant
from engine.files.gguf.writer import write_gguf
from engine.runtime.load import load
from engine.placement import Tier
from engine.sources.tiny_model import write_tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

SHAPE = dict(layers=2, hidden=256, ffn=512, experts=8, top_k=2, heads=4, kv_heads=2, vocab=320)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def file(tmp_path_factory):
    root = tmp_path_factory.mktemp("mapped")
    src = write_tiny_model(root / "src", "qwen3_moe", **SHAPE)
    return write_gguf(src, root / "qwen3-q4_k_m.gguf", "q4_k_m")[0]


def mapping_range(ckpt) -> tuple[int, int]:
    m = ckpt.file._map(ckpt.file.path)
    base = np.frombuffer(m, dtype=np.uint8).ctypes.data
    return base, base + len(m)


def points_into(t: torch.Tensor, span) -> bool:
    return span[0] <= t.data_ptr() and t.data_ptr() + t.numel() <= span[1]


def parts_of(bq: BlockQuant) -> list[torch.Tensor]:
    return list(bq.file_rows) if bq.file_rows is not None else [bq.packed]


def test_the_cpu_tiers_and_dense_matrices_are_the_files_own_pages(file):
    ld = load(file, placement="cpu", device="cpu", dtype="bf16")
    try:
        ck, m = ld.ckpt, ld.model
        span = mapping_range(ck)
        for block in m.moe:
            for ex in block.experts:
                for w in (ex.w13, ex.w2):
                    assert isinstance(w, BlockQuant) and w.mapped
                    assert all(points_into(p, span) for p in parts_of(w)), "a copy, not the file's pages"
        eb = m.expert_bytes()
        file_experts = sum(ck.expert_raw_info(l, 0, w).nbytes for l in range(ck.dims.layers) for w in ("w1", "w2", "w3"))
        assert eb["host"] == 0 and eb["mapped"] == file_experts
        assert m.dense_mapped_bytes() > 0.5 * m.dense_bytes()  # the attention and output matrices (norms are copies)
        # cpu-4 keeps the Q4_K gate/up mapped; a Q6_K down is re-quantised: owned memory, counted so
        layer = next((l for l in range(ck.dims.layers) if ck.expert_raw(l, 0, "w2")[0] == GT.Q6_K), None)
        if layer is not None:
            q = m.build(layer, 0, Tier.CPU4)
            assert q.w13.mapped and not getattr(q.w2, "mapped", False)
        # the file's blocks exactly: the mapped rows dequantise to the file's values
        exact13, exact2 = ck.expert_float(0, 1)
        ex = m.moe[0].experts[1]
        assert torch.equal(ex.w13.dequantize(), exact13) and torch.equal(ex.w2.dequantize(), exact2)
    finally:
        ld.ckpt.close()


def test_the_mapped_model_answers_as_the_copied_one(file, monkeypatch):
    """Served from the mapping (the kernels on the file's rows) or repacked into tiles (MIXDESK_RAW_KERNELS=0):
    the same logits within float summation order, the same greedy tokens."""
    ids = torch.tensor([[1, 5, 9, 14, 2, 7, 30, 41]])

    def logits():
        ld = load(file, placement="cpu", device="cpu", dtype="bf16")
        try:
            with torch.no_grad():
                return ld.model.forward(ids[0], ld.model.new_cache(32), 0, all_logits=True).float()
        finally:
            ld.ckpt.close()

    a = logits()
    monkeypatch.setenv("MIXDESK_RAW_KERNELS", "0")
    b = logits()
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert float((a - b).abs().max()) <= 2e-2 * float(b.abs().max()), float((a - b).abs().max())


def test_the_planner_counts_the_files_pages_apart_from_owned_memory(file):
    """A file's own blocks cost no RAM budget: under a budget smaller than the file, every expert stays
    at cpu-16 (the file's precision); the fit line says what is mapped; a file larger than the memory
    left pages, with its predicted speed said."""
    from engine.files.gguf import open_gguf
    from engine.measures.fit import fit_of
    from engine.measures.hardware import HardwareProfile
    from engine.measures.inputs import from_dims, with_mapping
    from engine.planning.planner import Budgets, plan
    from engine.experts.tier_bytes import tier_bytes

    ck = open_gguf(file)
    try:
        hw = HardwareProfile("test", True, {"cpu-16": [2e-5, 1 / 20e9], "cpu-4": [2e-5, 1 / 35e9]}, None, None, 0,
                             64 * 10**9)
        inp = with_mapping(from_dims(ck.dims, hw, 2, sizes=tier_bytes(ck, 2), dense_bytes=ck.dense_nbytes()), ck)
        assert inp.mapped_bytes["cpu-16"] == tier_bytes(ck, 2)["cpu-16"] and inp.dense_mapped > 0
        file_bytes = ck.path.stat().st_size
        owned = inp.dense_bytes - inp.dense_mapped
        p = plan(inp, Budgets(vram=0, ram=owned + 1), 1.0)
        assert p.fits and set(p.counts()) == {"cpu-16"} and p.ram <= owned
        fit = fit_of(inp, Budgets(vram=0, ram=10 * file_bytes))
        assert "mapped from the file" in fit.line() and fit.paging_tok_s == 0
        tight = fit_of(inp, Budgets(vram=0, ram=owned + 1000))
        assert tight.fits and tight.paging_tok_s > 0 and "read from disk" in tight.line(), tight.line()
        assert tight.paging_tok_s < tight.best_tok_s
    finally:
        ck.close()


TRUNCATE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[3])
    from engine.runtime.client import Client, EngineError
    from engine.protocol.sampling import SamplingParams
    path, whole = sys.argv[1], sys.argv[2]
    c = Client()
    c.load(path, placement="cpu", device="cpu", dtype="bf16")
    c.wait_calibrated()
    c.generate(prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=2))
    os.truncate(path, int(sys.argv[4]))
    try:
        c.generate(prompt_ids=[4, 5, 6, 7, 8], params=SamplingParams(max_new_tokens=8))
        print("NO ERROR")
    except EngineError as e:
        print("ERROR:", e)
    c.load(whole, placement="cpu", device="cpu", dtype="bf16")  # the engine goes on: another model opens
    done = c.generate(prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=2))
    print("AGAIN:", len(done.token_ids) if hasattr(done, "token_ids") else "ok")
    c.close()
""")


@pytest.mark.parametrize("keep", ["half", "nothing"], ids=["truncated", "emptied (a drive gone)"])
def test_a_file_truncated_while_in_use_is_one_error_not_a_crash(file, tmp_path, window_cache, keep):
    """The file cut short (or emptied, as a file on a drive that went away reads) under the running
    model: the next touch of a lost page raises SIGBUS; the guard answers it, the reply ends with one
    error naming the file, the model is closed, and the engine opens another."""
    import shutil

    victim = tmp_path / "victim.gguf"
    shutil.copy(file, victim)
    size = victim.stat().st_size
    cut = size // 2 if keep == "half" else 0
    r = subprocess.run([sys.executable, "-c", TRUNCATE, str(victim), str(file), str(ROOT), str(cut)],
                       capture_output=True, text=True, timeout=300, env={**os.environ})
    assert r.returncode == 0, f"the process died (rc {r.returncode}):\n{r.stderr[-3000:]}"
    assert f"ERROR: {victim}: changed on disk while in use" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "AGAIN:" in r.stdout


def test_the_window_says_what_is_read_from_the_file(qtbot, file, tmp_path, window_cache):
    """The memory panel: Mixdesk's own memory on the RAM meter, the file's pages on their own meter
    (how much is mapped, how much of it is in RAM now), explained in its tooltip; the log says it."""
    pytest.importorskip("PySide6")
    from main_window_helpers import open_window

    w = open_window(qtbot, file, tmp_path, calibrated=False, dtype="bf16")  # (the file's blocks: below fp32)
    try:
        panel = w.panel
        qtbot.waitUntil(lambda: panel.mapped.isVisible(), timeout=30_000)
        text = panel.mapped.format()
        assert "GiB" in text and "in RAM now" in text, text
        assert "read straight from the file" in panel.mapped.toolTip()
        assert "own memory" in panel.ram.toolTip()
        assert any("read from the file as they are used" in line for line in w.log_lines), "not in the log"
    finally:
        w.close()


def test_a_file_truncated_under_the_window_is_said_and_the_window_stays(qtbot, file, tmp_path, window_cache):
    """The model's file cut short while the window chats from it: the reply ends with the file named
    and what happened, the model bar says it, Send waits for another model; the window lives on."""
    import shutil

    pytest.importorskip("PySide6")
    from PySide6.QtCore import Qt

    from main_window_helpers import open_window
    from engine.protocol.sampling import SamplingParams

    victim = tmp_path / "victim.gguf"
    shutil.copy(file, victim)
    w = open_window(qtbot, victim, tmp_path, dtype="bf16")
    try:
        os.truncate(victim, victim.stat().st_size // 3)
        w.params = SamplingParams(max_new_tokens=8)
        w.input.setPlainText("hello")
        qtbot.mouseClick(w.send_btn, Qt.LeftButton)
        said = lambda: any("changed on disk while in use" in line for line in w.log_lines)  # noqa: E731
        qtbot.waitUntil(said, timeout=60_000)
        qtbot.waitUntil(lambda: not w.generating, timeout=30_000)
        # the reply's own error comes first; the engine's word that it closed the model, after it
        qtbot.waitUntil(lambda: "changed on disk" in w.model_label.text(), timeout=30_000)
        assert str(victim.name) in w.model_label.text()
        assert not w.send_btn.isEnabled()
        assert w.isVisible() and w.bridge.session.loaded is None  # closed; the engine thread goes on
    finally:
        w.close()


def test_a_16_bit_checkpoints_cpu_experts_are_its_mapped_tensors(tmp_path, monkeypatch):
    """A bf16 safetensors checkpoint at cpu-16 (its own precision): each expert's w1, w3 and w2 are
    the file's tensors where it is mapped (gate's and up's rows in two places, one matrix to the
    kernel), no copy; the logits are exactly those of the copied experts."""
    from engine.experts.expert import MappedExpert16
    from engine.sources.tiny_model import write_tiny_mixtral

    src = write_tiny_mixtral(tmp_path / "bf16", hidden=256, ffn=512, experts=4, dtype="bfloat16")
    ids = torch.tensor([1, 5, 9, 14, 2, 7, 30, 41])

    def run():
        ld = load(src, placement="cpu", device="cpu", dtype="bf16")
        try:
            with torch.no_grad():
                out = ld.model.forward(ids, ld.model.new_cache(32), 0, all_logits=True).float()
            return out, ld.model.expert_bytes(), [ex for b in ld.model.moe for ex in b.experts]
        finally:
            ld.ckpt.close()

    got, eb, forms = run()
    d_bytes = sum(ex.nbytes for ex in forms)
    assert all(isinstance(ex, MappedExpert16) for ex in forms)
    assert eb["host"] == 0 and eb["mapped"] == d_bytes
    monkeypatch.setenv("MIXDESK_RAW_KERNELS", "0")  # no mapping: the experts read into memory
    want, eb2, forms2 = run()
    assert not any(isinstance(ex, MappedExpert16) for ex in forms2) and eb2["host"] == d_bytes
    assert torch.equal(got, want), float((got - want).abs().max())


def test_the_model_browser_says_mapped_and_warns_of_paging(qtbot, file, window_cache, monkeypatch):
    """File > Open model…'s recent GGUF: its line says what is read from the file apart from memory;
    with less memory free than the file, that it will read from disk as it runs, and how fast."""
    pytest.importorskip("PySide6")
    from PySide6.QtCore import Qt

    from app import theme
    from app.dialogs.model_picker import ModelPicker
    from engine.files.gguf import open_gguf
    from engine.measures import fit
    from engine.measures.inputs import RAM_MARGIN
    from engine.planning.planner import Budgets

    ck = open_gguf(file)
    try:
        owned = ck.dense_nbytes() - sum(ck.info(h).nbytes for h in ck.expected.dense if ck.raw_view_ok(h)
                                        and ck.tensor_type(h) not in (GT.F32, GT.F16, GT.BF16))
    finally:
        ck.close()
    tight = Budgets(vram=0, ram=int((owned + file.stat().st_size // 4) * (1 - RAM_MARGIN)))
    settings = theme.settings()
    before = settings.value("recent_models", [])
    settings.setValue("recent_models", [str(file)])
    try:
        for budgets, paging in ((Budgets(vram=0, ram=64 * 10**9), False), (tight, True)):
            monkeypatch.setattr(fit, "machine_budgets", lambda hw, *a, _b=budgets, **k: _b)
            picker = ModelPicker(None)
            qtbot.addWidget(picker)
            item = next(picker.list.item(i) for i in range(picker.list.count())
                        if picker.list.item(i).data(Qt.UserRole) == str(file))
            qtbot.waitUntil(lambda: "\n" in item.text(), timeout=30_000)
            line = item.text().split("\n", 1)[1]
            assert "mapped from the file" in line and "in memory" in line, line
            assert ("read from disk as it runs" in line and "tok/s" in line) == paging, line
            assert item.data(Qt.UserRole) == str(file)
            picker.reject()
    finally:
        settings.setValue("recent_models", before)


def test_what_the_planner_counts_as_mapped_is_what_the_model_maps(file, tmp_path):
    """The planner's mapped bytes (before anything is built) equal the built model's, for a GGUF file
    and a bf16 checkpoint; a source that cannot be mapped (a synthetic checkpoint) counts none."""
    from engine.sources.synthetic import write_synthetic
    from engine.sources.tiny_model import write_tiny_mixtral
    from engine.experts.tier_bytes import mapped_bytes

    bf16 = write_tiny_mixtral(tmp_path / "bf16", hidden=256, ffn=512, experts=4, dtype="bfloat16")
    for src in (file, bf16):
        ld = load(src, placement="cpu", device="cpu", dtype="bf16")
        try:
            d, m = ld.ckpt.dims, ld.model
            experts, dense = mapped_bytes(ld.ckpt, torch.bfloat16, True)
            assert experts["cpu-16"] * d.layers * d.experts == m.expert_bytes()["mapped"], src
            assert dense == m.dense_mapped_bytes(), src
        finally:
            ld.ckpt.close()
    from engine.runtime.load import open_checkpoint

    config = ROOT / "resources" / "mixtral-8x7b-config.json"
    syn = open_checkpoint(write_synthetic(tmp_path / "syn", config))
    assert mapped_bytes(syn, torch.bfloat16, True) == ({}, 0)


@pytest.mark.slow  # 18 s: it measures this machine's Q4_K/Q6_K tiers (pytest -m slow tests/test_mapped_gguf.py)
def test_plan_from_the_header_alone_fits_on_this_machine_counting_the_mapped_file(tmp_path, window_cache):
    """`mixdesk plan --config-only` on a full-size Qwen3-30B-A3B Q4_K_M (its header; the data a sparse
    hole), no GPU budget given: planned for this machine as it is (its CPU; before, a GPU was assumed
    into a zero VRAM budget and every file said 'NOTHING FITS'), the file's own blocks in the
    'mapped GB' column, apart from the memory Mixdesk owns."""
    import json

    import gguf_files

    cfg = json.loads((ROOT / "resources" / "qwen3-30b-a3b-config.json").read_text())
    big = gguf_files.header_only(tmp_path / "Qwen3-30B-A3B-Q4_K_M.gguf", cfg)
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "plan", "--model", str(big), "--config-only"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "NOTHING FITS" not in r.stdout and "mapped GB" in r.stdout, r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("| 0 |"))
    vram, ram, mapped_gb = (float(c) for c in row.strip("| ").split("|")[-3:])
    assert vram == 0 and mapped_gb > ram, row
