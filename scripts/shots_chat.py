"""Screenshots of the chat view (issue 29) in the real window, on a tiny model this script writes:

- chat-streaming-code-<theme>.png: a reply streaming, mid-way through a fenced code block (the
  complete lines highlighted, the open line plain), Markdown above it already rendered;
- chat-table-code-<theme>.png: a finished reply with a table and code, its footer under it;
- chat-attachments-<theme>.png: a message sent with two attached documents (named chips), and its reply.

The messages are seeded into the window's store as the window keeps them (a tiny random model
writes no such replies); the streaming one is fed to the view as the engine's tokens are.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/shots_chat.py   # -> docs/screenshots
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUESTION = "Which experts stay on the GPU, and how do I read the plan in code?"
TABLE_REPLY = """With a **12 GB** card the planner keeps the busiest experts on the GPU:

| layer | on the GPU | on the CPU | bits |
|---|---|---|---|
| 0–7 | 6 of 8 | 2 of 8 | 16 |
| 8–23 | 4 of 8 | 4 of 8 | 4 |
| 24–31 | 2 of 8 | 6 of 8 | 4 |

Read the plan from the engine like this:

```python
from engine.placement import Placement

def on_gpu(plan: Placement) -> dict[int, int]:
    \"\"\"How many experts of each layer live on the GPU.\"\"\"
    return {layer: sum(t.startswith("gpu") for t in tiers)
            for layer, tiers in plan.by_layer().items()}
```

- `gpu-16` and `gpu-4` run on the card;
- the rest run **on the CPU**, where moving a token is cheaper than moving an expert.
"""
STREAMING = """Here is a small router: each token goes to its **top-2** experts.

```python
import torch

def route(logits: torch.Tensor, k: int = 2):
    \"\"\"Top-k experts and their weights for each token.\"\"\"
    weights, experts = torch.topk(logits.softmax(-1), k)
    return experts, weights / weights.sum(-1, keep"""


def _wait(app, cond, timeout_s=300.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get ready")
        app.processEvents()
        time.sleep(0.01)


def _settle(app, s=0.3):
    end = time.monotonic() + s
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def shoot(out: Path, theme_name: str) -> list[Path]:
    from PySide6.QtWidgets import QApplication

    from app import theme
    from app.main_window import MainWindow
    from app.store.chat_store import Store
    from engine.sources.tiny_model import write_tiny_mixtral

    app = QApplication.instance() or QApplication([])
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mixdesk-shots-chat-"))
    model = write_tiny_mixtral(tmp / "tiny")
    report, notes = tmp / "quarterly-report.md", tmp / "notes.txt"
    report.write_text("# Quarterly report\n\n" + "Revenue grew in every region this quarter.\n" * 100)
    notes.write_text("Ask about the GPU plan.\n" * 13)
    store = Store(tmp / "chats.sqlite3")
    table = store.new_conversation(title="Experts on the GPU")
    store.add_message(table, "user", QUESTION)
    store.add_message(table, "assistant", TABLE_REPLY, meta={
        "stats": "14.2 tokens/s · 186 tokens · stopped: end of answer",
        "stats_detail": "decode: 185 tokens in 13.03 s (14.2 tok/s)\nprefill: 31 tokens in 0.40 s\nreason: eos"})
    files = store.new_conversation(title="Two documents")
    docs = [{"name": report.name, "path": str(report), "size": report.stat().st_size},
            {"name": notes.name, "path": str(notes), "size": notes.stat().st_size}]
    store.add_message(files, "user", "(what the model read)", meta={"attachments": docs,
                                                                     "typed": "Summarise both documents in two lines."})
    store.add_message(files, "assistant", "**Revenue grew** in every region this quarter, and the notes ask "
                      "how the GPU plan works.", meta={"stats": "15.0 tokens/s · 24 tokens · stopped: end of answer"})

    w = MainWindow(store, model=str(model), device="cpu", dtype="fp32")
    w.resize(1280, 800)
    w.set_theme(theme_name, remember=False)
    w.show()
    _wait(app, lambda: w.send_btn.isEnabled())
    shots = []

    def grab(name):
        _settle(app)
        path = out / f"{name}-{'dark' if theme.is_dark(app.palette()) else 'light'}.png"
        w.grab().save(str(path))
        shots.append(path)

    w._on_select(table)
    w.chat.verticalScrollBar().setValue(w.chat.verticalScrollBar().maximum())
    grab("chat-table-code")
    w._on_select(files)
    grab("chat-attachments")
    w.new_chat()
    store.add_message(w.cid, "user", "Show me a router in PyTorch")
    w.chat.show_messages(store.messages(w.cid))
    w.chat.begin_stream()
    for i in range(0, len(STREAMING), 7):  # as tokens arrive, flushed every 40 ms
        w.chat.add_text(STREAMING[i:i + 7])
        _settle(app, 0.02)
    grab("chat-streaming-code")
    w.chat.end_stream("", STREAMING)
    w.close()
    return shots


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    target = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
    for name in ("Light", "Dark"):
        for p in shoot(target, name):
            print(p)
    app.quit()
