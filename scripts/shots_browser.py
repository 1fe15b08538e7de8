"""Screenshots of the model browser (File > Open model…) in the real window on the demo model:
a hub search for "instruct" with each candidate's files, sizes and the planner's fit on this
machine. The hub is the tests' loopback server (tests/hub_server.py), so nothing is downloaded:
its repos hold the published Mixtral-8x7B and Qwen3-30B-A3B configs (resources/) and weight files known only by a
stand-in size (round figures, not the published ones), which the browser lists and never fetches.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/shots_browser.py   # -> docs/screenshots
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
GB = 10**9


# OLMoE-1B-7B's shape (16 layers x 64 experts of width 1024, top-8, hidden 2048: 6.9 B parameters, 1.3 B
# active), written here: the machines hold no copy of its published config.json.
OLMOE = {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 1024,
         "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
         "num_experts_per_tok": 8, "vocab_size": 50304, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "norm_topk_prob": False, "tie_word_embeddings": False}


def _repos() -> dict:
    from hub_server import Declared

    mixtral = (ROOT / "resources" / "mixtral-8x7b-config.json").read_bytes()
    qwen = (ROOT / "resources" / "qwen3-30b-a3b-config.json").read_bytes()  # the Instruct-2507 release's shape
    return {
        "mistralai/Mixtral-8x7B-Instruct-v0.1": {
            "config.json": mixtral, "model.safetensors.index.json": b"{}", "tokenizer.json": Declared(2 * 10**6),
            **{f"model-{i:05d}-of-00019.safetensors": Declared(5 * GB) for i in range(1, 20)}},
        "Qwen/Qwen3-30B-A3B-Instruct-2507": {
            "config.json": qwen, **{f"model-{i:05d}-of-00016.safetensors": Declared(4 * GB) for i in range(1, 17)}},
        "someone/Mixtral-8x7B-Instruct-GGUF": {"mixtral-8x7b-instruct.Q4_K_M.gguf": Declared(26 * GB),
                                               "mixtral-8x7b-instruct.Q8_0.gguf": Declared(50 * GB),
                                               "README.md": Declared(9000)},
        "allenai/OLMoE-1B-7B-0125-Instruct": {
            "config.json": json.dumps(OLMOE).encode(),
            **{f"model-{i:05d}-of-00003.safetensors": Declared(5 * GB) for i in range(1, 4)}},
        "HuggingFaceTB/SmolLM2-135M-Instruct": {"config.json": b'{"model_type": "llama"}',
                                                "model.safetensors": Declared(270 * 10**6)},
    }


from shot_wait import wait as _wait  # noqa: E402


def shoot(out: Path, theme_name: str) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import huggingface_hub.constants as hf
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.store.chat_store import Store
    from hub_server import HubServer
    from window_helpers import menu_actions

    app = QApplication.instance() or QApplication([])
    hub = HubServer(_repos()).serve()
    before = os.environ.get("HF_ENDPOINT"), hf.HF_HUB_CACHE
    os.environ["HF_ENDPOINT"] = hub.endpoint
    hf.HF_HUB_CACHE = tempfile.mkdtemp(prefix="mixdesk-shots-hf-")  # config.json lands here, not in ~/.cache
    w = MainWindow(Store(Path(tempfile.mkdtemp()) / "chats.sqlite3"), model="demo")
    shots = []
    try:
        w.set_theme(theme_name, remember=False)
        w.resize(1400, 860)
        w.show()
        if not _wait(app, w.send_btn.isEnabled, 300):
            raise RuntimeError("the demo model did not load")
        menu_actions(w)["File/Open model…"].trigger()
        picker = w.picker
        picker.resize(1000, 700)
        _wait(app, lambda: picker.machine.hw is not None, 120)
        QTest.keyClicks(picker.hub, "instruct")
        b = picker.browser

        def filled():
            rows = b.row_texts()
            return len(rows) == 5 and all("reading its files" not in v[1] for v in rows.values())
        if not _wait(app, filled, 120):
            raise RuntimeError(f"the search did not list its results: {b.status.text()}")
        _wait(app, lambda: "on disk" in picker.list.item(0).text(), 30)  # the demo's size and fit
        b.results.setCurrentItem(b.results.topLevelItem(3))  # OLMoE
        for col in (0, 1):
            b.results.resizeColumnToContents(col)
        _wait(app, lambda: False, 0.5)
        if set(hub.fetched()) - {"config.json"}:
            raise RuntimeError(f"weights were fetched: {hub.fetched()}")
        path = out / f"model-browser-{theme_name.lower()}.png"
        picker.grab().save(str(path))
        shots.append(path)
        picker.reject()
    finally:
        w.close()
        hub.close()
        hf.HF_HUB_CACHE = before[1]
        if before[0] is None:
            os.environ.pop("HF_ENDPOINT", None)
        else:
            os.environ["HF_ENDPOINT"] = before[0]
    return shots


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="mixdesk-shots-config-")  # no one's recent models
    target = ROOT / "docs" / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    for theme in ("Light", "Dark"):
        for p in shoot(target, theme):
            print(p)
