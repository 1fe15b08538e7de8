"""Screenshots of the real window on the demo model, in the light and the dark theme.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/screenshots.py docs/screenshots
    (or under Xvfb: xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python scripts/screenshots.py ...)

For each theme it starts the app on the demo, sends a prompt and waits for the reply, moves the
slider towards speed and waits for the migration, then saves:
- window-<theme>.png: the whole window. The first exchange of the chat is seeded into its
  database before the window opens (a question and a reply holding a Python code block), to show
  how code is rendered (the 135M demo rarely writes code); the second exchange is the demo's own.
- panel-<theme>.png: the live panel (meters, the tok/s chart with its axes, the placement map).
- download-<theme>.png: the progress row during a hub download. The events are those the engine
  sends while huggingface_hub fetches files (stage "download"), fed to the window here: no network.
- reasoning-folded-<theme>.png, reasoning-unfolded-<theme>.png: a chat with a reasoning model's
  replies, their reasoning folded above the answer ("Thought for N s"), then the first one unfolded
  (clicked open), and a tool call the model made shown as a call. The chat is seeded into the
  database as the window stores such replies (the demo model does not reason).

Then each view's own script, for both themes (each says how it stages its view):
- scripts/shots_chat.py: chat-streaming-code, chat-table-code, chat-attachments;
- scripts/shots_browser.py: model-browser (a hub search with each candidate's fit on this machine);
- scripts/shots_settings.py: chat-settings;
- scripts/shots_panel.py: the panel mid-migration and the slider's frontier.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.main_window import MainWindow  # noqa: E402
from app.store.chat_store import Store  # noqa: E402
from engine.runtime.generate import SamplingParams  # noqa: E402
from engine.protocol import Progress  # noqa: E402

SEEDED_REPLY = """Sure, here is a small function that routes a token to its top-2 experts:

```python
import torch

def route(logits: torch.Tensor, k: int = 2):
    \"\"\"Top-k experts and their weights for each token.\"\"\"
    weights, experts = torch.topk(logits.softmax(-1), k)
    return experts, weights / weights.sum(-1, keepdim=True)
```

Each token then runs only **2 of the 8 experts** in the layer."""

REASONING = [  # (question, answer, what the window stores of the reply besides its answer)
    ("A train leaves at 9:40 and arrives at 13:15. How long is the trip?",
     "The trip takes **3 hours 35 minutes**.",
     {"reasoning": "From 9:40 to 12:40 is 3 hours.\nFrom 12:40 to 13:15 is 35 minutes.\n"
                   "So the trip is 3 hours and 35 minutes. Double-check: 9:40 + 3:35 = 13:15. Correct.",
      "thought_s": 4.2, "stats": "seeded example reply"}),
    ("And what's the weather like in Paris right now?", "",
     {"reasoning": "The user asks for the current weather in Paris. I cannot know it myself; "
                   "the get_weather function answers that.", "thought_s": 1.6,
      "tool_calls": [{"id": "call_0", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}],
      "stats": "seeded example reply"}),
]


def shoot(app: QApplication, out: Path, theme_name: str) -> bool:
    store = Store(Path(tempfile.mkdtemp()) / "chats.sqlite3")
    cid = store.new_conversation("Routing in a mixture of experts")
    store.add_message(cid, "user", "Show me how a router picks experts, in Python.")
    store.add_message(cid, "assistant", SEEDED_REPLY, meta={"stats": "seeded example reply"})
    w = MainWindow(store, model="demo")
    w.set_theme(theme_name, remember=False)
    w.resize(1400, 860)
    w.show()
    w.cid = cid
    w.chat.show_messages(store.messages(cid))
    state = {"step": 0, "ticks": 0, "ok": False}

    def tick():
        state["ticks"] += 1
        s = state["step"]
        if s == 0 and w.send_btn.isEnabled():
            w.params = SamplingParams(max_new_tokens=60)
            w.input.setPlainText("What is the capital of France? Answer in one sentence.")
            w.send()
            state["step"] = 1
        elif s == 1 and not w.generating:
            w.slider.set_value(0.2)
            state["step"], state["wait"] = 2, state["ticks"]
        elif s == 2 and state["ticks"] - state["wait"] > 30 and not w.bridge.session.controller.migrating:
            w.grab().save(str(out / f"window-{theme_name.lower()}.png"))
            w.panel.grab().save(str(out / f"panel-{theme_name.lower()}.png"))
            w.cid = thinking = state["thinking"] = store.new_conversation("Train times (a reasoning model)")
            for question, answer, meta in REASONING:
                store.add_message(thinking, "user", question)
                store.add_message(thinking, "assistant", answer, meta=meta)
            w.refresh_conversations()
            w.chat.show_messages(store.messages(thinking))
            state["step"], state["wait"] = 5, state["ticks"]
        elif s == 5 and state["ticks"] - state["wait"] > 3:
            w.grab().save(str(out / f"reasoning-folded-{theme_name.lower()}.png"))
            w.chat.toggle_thought(0)  # what a click on its header does
            state["step"], state["wait"] = 6, state["ticks"]
        elif s == 6 and state["ticks"] - state["wait"] > 3:
            w.grab().save(str(out / f"reasoning-unfolded-{theme_name.lower()}.png"))
            store.delete(state["thinking"])  # the other shots show the first chat alone, as before
            w.cid = cid
            w.refresh_conversations()
            w.chat.show_messages(store.messages(cid))
            w.loading = True
            w.on_event(Progress(stage="download", done=3, total=7, what="mistralai/Mixtral-8x7B-v0.1: files"))
            state["step"], state["wait"] = 4, state["ticks"]
        elif s == 4 and state["ticks"] - state["wait"] > 3:
            w.loading = False
            w.grab().save(str(out / f"download-{theme_name.lower()}.png"))
            state["ok"] = True
            w.close()
            app.quit()
        elif state["ticks"] > 3000:
            print("timed out", file=sys.stderr)
            w.close()
            app.quit()

    t = QTimer()
    t.timeout.connect(tick)
    t.start(100)
    app.exec()
    return state["ok"]


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = Path(args[0] if args else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv)
    app.setApplicationName("Mixdesk")
    ok = all(shoot(app, out, name) for name in ("Light", "Dark"))
    if ok and "--main-only" not in sys.argv:
        import importlib

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        for view in ("shots_chat", "shots_browser", "shots_settings", "shots_panel"):
            for name in ("Light", "Dark"):
                for png in importlib.import_module(view).shoot(out, name):
                    print(png)
    print(f"saved screenshots to {out}" if ok else "failed", file=sys.stderr if not ok else sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
