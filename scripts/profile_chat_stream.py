"""Where the GUI thread spends a streamed reply's time, in the chat view alone (no engine, no window):
the same 2,000-token Markdown+code reply as tests/test_app.py test_streaming_render..., fed one
token every 4 ms into a shown ChatView with its own flush timer, while a 5 ms timer records the
event loop's gaps. Per flush it records the GUI thread's CPU time in the flush (its Python and the
document layout its edits cause, which Qt does synchronously) and in the paint that follows it.
The standalone view is sized as the chat view of a 1280x800 window (W, H in the environment).

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/profile_chat_stream.py [--profile] [--tokens N]

Prints one line of figures (and with --profile, cProfile's top functions of the whole stream).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

SECTION = ("## Part {i}\n\nThe **planner** moves `expert {i}` to the *GPU* when it pays.\n\n"
           "- first point {i}\n- second point with `code`\n\n"
           "| tier | experts |\n|---|---|\n| gpu-16 | {i} |\n| cpu-4 | 8 |\n\n"
           "```python\ndef step_{i}(x):\n    return x * {i}  # scaled\n```\n\n")
TOKEN = re.compile(r"\s?[^\s]{1,3}|\s")  # about the tests' tokenizer's 2.4 characters a token


def tokens(n: int) -> list[str]:
    text, i = "", 0
    while len(TOKEN.findall(text)) < n:
        text += SECTION.format(i=i)
        i += 1
    return TOKEN.findall(text)[:n]


def run(n_tokens: int, per_token_s: float, profile: bool) -> dict:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app import theme
    from app.chat.view import ChatView
    from app.store.chat_store import Message

    app = QApplication.instance() or QApplication([])
    theme.apply("Light")
    paints: list[float] = []
    cost: list[float] = []  # per flush: GUI-thread CPU seconds in it (its Python and the layout it causes) and its paint

    class Timed(ChatView):
        def paintEvent(self, e):
            t0 = time.thread_time()
            super().paintEvent(e)
            paints.append(time.thread_time() - t0)
            if cost:
                cost[-1] += paints[-1]

    v = Timed()
    v.resize(int(os.environ.get("W", 680)), int(os.environ.get("H", 385)))  # the chat view in a 1280x800 window
    v.show()
    from app.chat import markdown_render
    for t in getattr(markdown_render, "_warming", []):  # the window is up for seconds before a reply
        t.join()
    v.show_messages([Message(1, "user", "go", True, {})])
    toks = tokens(n_tokens)
    gaps, last, fed = [], [0.0], [0]
    flush_wall: list[float] = []
    inner = v._flush

    def flush():
        t0, c0 = time.perf_counter(), time.thread_time()
        dirty = v._dirty
        inner()
        flush_wall.append(time.perf_counter() - t0)
        if dirty:
            cost.append(time.thread_time() - c0)

    v._timer.timeout.disconnect()
    v._timer.timeout.connect(flush)

    def tick():
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    def feed():
        if fed[0] < len(toks):
            v.add_text(toks[fed[0]])
            fed[0] += 1

    ticker, feeder = QTimer(interval=5), QTimer(interval=max(round(per_token_s * 1000), 1))
    ticker.timeout.connect(tick)
    feeder.timeout.connect(feed)
    v.begin_stream()
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    last[0] = time.perf_counter()
    t_start = time.perf_counter()
    ticker.start()
    feeder.start()
    while fed[0] < len(toks):
        app.processEvents()
        time.sleep(0.0005)
    t_end_feed = time.perf_counter()
    t0 = time.perf_counter()
    v.end_stream("12 tokens/s")
    end_s = time.perf_counter() - t0
    app.processEvents()
    ticker.stop()
    feeder.stop()
    if prof is not None:
        prof.disable()
        import pstats
        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    k = max(len(cost) // 10, 1)
    first, final = cost[:k], cost[-k:]

    def mean_ms(xs):
        return 1e3 * sum(xs) / max(len(xs), 1)

    out = {
        "tokens": len(toks), "chars": len(v.streamed), "flushes": len(cost),
        "stream_s": t_end_feed - t_start,
        "worst_gap_ms": 1e3 * max(gaps), "p99_gap_ms": 1e3 * sorted(gaps)[int(len(gaps) * 0.99)],
        "gaps_over_50": sum(g > 0.05 for g in gaps),
        "flush+paint_ms_first10pc": mean_ms(first), "flush+paint_ms_last10pc": mean_ms(final),
        "flush_wall_max_ms": 1e3 * max(flush_wall), "paint_ms_mean": mean_ms(paints),
        "paint_ms_max": 1e3 * max(paints or [0]), "paints": len(paints), "end_stream_ms": 1e3 * end_s,
    }
    v.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--per-token-ms", type=float, default=4.0)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    r = run(a.tokens, a.per_token_ms / 1000, a.profile)
    print("load %.2f  " % os.getloadavg()[0] + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                                      for k, v in r.items()))


if __name__ == "__main__":
    main()
