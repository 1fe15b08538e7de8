"""Aggregate decode speed with 1, 2 and 4 requests at once, on the demo model on the CPU.

    python benchmarks/concurrent_streams.py [--tier cpu-4] [--tokens 96]

Each round submits N requests together (slot "pool", as the local server does), each a different
32-token prompt asking for `--tokens` new tokens (greedy, no end-of-sequence stop), and measures:
- aggregate decode tok/s: the tokens all N requests decoded after their first, over the wall time
  from the last request's first token to the last request's end;
- per-stream latency: each request's median time between two tokens.
The ratio is aggregate tok/s at N over N = 1, in the same run; the read bandwidth is measured in the
same process. The baseline is one stream (what Mixdesk did before batching: requests queued).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tier", default="cpu-4")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from engine import native
    from engine.generate import SamplingParams
    from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded, TokenOut
    from engine.session import Session
    from engine.sources.demo import demo_dir, ensure
    from engine.tools.bench_kernels import read_bandwidth

    ensure()
    events, lock, ready = [], threading.Lock(), threading.Event()

    def emit(ev):
        with lock:
            events.append((time.perf_counter(), ev))
        if isinstance(ev, (Loaded, ErrorEvent)):
            ready.set()

    counts = [int(n) for n in args.streams.split(",")]
    s = Session(emit, max_streams=max(counts)).start()
    import json
    import tempfile

    cfg = json.loads((demo_dir() / "config.json").read_text())
    pl = Path(tempfile.mkdtemp()) / "placement.json"
    pl.write_text(json.dumps([[args.tier] * cfg["num_local_experts"]] * cfg["num_hidden_layers"]))
    s.submit(Load(path=str(demo_dir()), device="cpu", placement=str(pl), ctx=1024))
    ready.wait(600)
    if s.loaded is None:
        raise SystemExit(f"the demo did not load: {[e for _, e in events if isinstance(e, ErrorEvent)]}")
    s.loaded.generator.eos_ids.clear()
    bw = read_bandwidth()
    rid = 0
    results = {}
    for n in counts:
        runs = []
        for _ in range(args.repeats):
            with lock:
                events.clear()
            ids = []
            for i in range(n):
                rid += 1
                ids.append(rid)
                prompt = [100 + 37 * ((rid * 7 + j) % 1000) % 40000 for j in range(32)]
                s.submit(Generate(request_id=rid, prompt_ids=prompt, slot="pool",
                                  params=SamplingParams(max_new_tokens=args.tokens)))
            while True:
                with lock:
                    done = sum(isinstance(e, Done) and e.request_id in ids for _, e in events)
                if done == n:
                    break
                time.sleep(0.01)
            with lock:
                evs = list(events)
            toks = {r: [t for t, e in evs if isinstance(e, TokenOut) and e.request_id == r and e.index >= 0
                        and e.token_id >= 0] for r in ids}
            start = max(ts[0] for ts in toks.values())  # every request past its prompt
            end = max(ts[-1] for ts in toks.values())
            decoded = sum(sum(1 for t in ts if t > start) for ts in toks.values())
            gaps = [b - a for ts in toks.values() for a, b in zip(ts[1:], ts[2:])]
            runs.append((decoded / (end - start), statistics.median(gaps)))
        agg = max(r[0] for r in runs)
        lat = min(r[1] for r in runs)
        results[n] = {"aggregate_tok_s": agg, "per_stream_gap_ms": lat * 1e3}
        print(f"{n} streams: aggregate {agg:.1f} tok/s, per-stream {1 / lat:.1f} tok/s "
              f"({lat * 1e3:.1f} ms between tokens)", flush=True)
    s.shutdown()
    one = results[counts[0]]["aggregate_tok_s"]
    rows = ["| streams | aggregate decode tok/s | × one stream | per-stream ms between tokens | per-stream tok/s |",
            "|---|---|---|---|---|"]
    for n in counts:
        r = results[n]
        rows.append(f"| {n} | {r['aggregate_tok_s']:.1f} | {r['aggregate_tok_s'] / one:.2f} | "
                    f"{r['per_stream_gap_ms']:.1f} | {1e3 / r['per_stream_gap_ms']:.1f} |")
    rows += ["", f"demo model, every expert {args.tier}, CPU kernel: {native.status()}; read bandwidth "
             f"{bw / 1e9:.1f} GB/s measured in the same process; best of {args.repeats} rounds of "
             f"{args.tokens} new tokens per request"]
    table = "\n".join(rows)
    print(table)
    print(f"recorded {record('concurrent_streams', {'results': results, 'bandwidth': bw}, table)}")


if __name__ == "__main__":
    main()
