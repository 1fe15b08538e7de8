"""Aggregate decode speed with 1, 2 and 4 requests at once, on the demo model on the CPU.

    python benchmarks/concurrent_streams.py [--tier cpu-4] [--tokens 96] [--prompt 32]

Each round submits N requests together (slot "pool", as the local server does), each a different
prompt of --prompt tokens asking for `--tokens` new tokens (greedy, no end-of-sequence stop), and measures:
- aggregate decode tok/s: the tokens all N requests decoded after their first, over the wall time
  from the last request's first token to the last request's end;
- per-stream latency: each request's median time between two tokens.
The ratio is aggregate tok/s at N over N = 1, in the same run; the read bandwidth is measured in the
same process. The baseline is one stream (what Mixdesk did before batching: requests queued).

Also, for each N:
- the experts a step runs, counted: N sequences are decoded 16 batched steps with the model's
  routes recorded, and each layer's distinct experts are counted;
- the bytes a step reads (dense weights, lm_head, those experts, each sequence's cached keys and
  values at its mean length), the time they take at the measured
  bandwidth, and the fraction of it reached; the ratio the bytes alone allow (N x bytes at 1 / bytes
  at N: the ceiling where every step ran at the same fraction of the bandwidth);
- the planner's predicted aggregate tok/s (its cost model of batched decode, PlanInputs.streams).

--smoke: 1 and 2 streams, one round of 8 new tokens after an 8-token prompt, on a tiny random Mixtral
(benchmarks/common.py: smoke_model(), written once under .bench/) instead of the demo; recorded as the
full run is (a test runs it).
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
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per request (attention's length)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.streams, args.tokens, args.repeats, args.prompt = "1,2", 8, 1, 8
    from engine import native
    from engine.runtime.generate import SamplingParams
    from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded, Token
    from engine.runtime.session import Session
    from engine.sources.demo import demo_dir, ensure
    from engine.tools.bench_kernels import read_bandwidth

    if args.smoke:
        from benchmarks.common import smoke_model

        folder = smoke_model()
    else:
        ensure()
        folder = demo_dir()
    label = folder.name if args.smoke else "demo"
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

    cfg = json.loads((folder / "config.json").read_text())
    ids_below = min(40000, cfg["vocab_size"] - 100)  # the prompts' token ids: 100 + (0 .. ids_below - 1)
    pl = Path(tempfile.mkdtemp()) / "placement.json"
    pl.write_text(json.dumps([[args.tier] * cfg["num_local_experts"]] * cfg["num_hidden_layers"]))
    s.submit(Load(path=str(folder), device="cpu", placement=str(pl), ctx=max(1024, args.prompt + args.tokens + 64)))
    ready.wait(600)
    if s.loaded is None:
        raise SystemExit(f"the {label} did not load: {[e for _, e in events if isinstance(e, ErrorEvent)]}")
    s.loaded.generator.eos_ids.clear()
    bw = read_bandwidth()
    made = 0  # requests so far: each gets a prompt of its own
    results = {}
    for n in counts:
        runs = []
        for _ in range(args.repeats):
            with lock:
                events.clear()
            ids = []
            for i in range(n):
                made += 1
                prompt = [100 + 37 * ((made * 7 + j) % 1000) % ids_below for j in range(args.prompt)]
                ids.append(s.submit(Generate(prompt_ids=prompt, slot="pool",
                                             params=SamplingParams(max_new_tokens=args.tokens))))
            while True:
                with lock:
                    done = sum(isinstance(e, Done) and e.request_id in ids for _, e in events)
                if done == n:
                    break
                time.sleep(0.01)
            with lock:
                evs = list(events)
            toks = {r: [t for t, e in evs if isinstance(e, Token) and e.request_id == r and e.index >= 0
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
    model, gen = s.loaded.model, s.loaded.generator
    inputs = planner_inputs(s)
    for n in counts:
        experts = routed_experts(model, gen, n, ids_below=ids_below)
        results[n]["experts_per_layer"] = experts
        b = step_bytes(model, experts) + n * kv_bytes(model, args.prompt + args.tokens // 2)
        results[n]["step_bytes"] = b
        results[n]["bandwidth_fraction"] = b / bw / (results[n]["per_stream_gap_ms"] / 1e3)
        if inputs is not None:
            from dataclasses import replace

            from engine.planning.planner import decode_tok_s
            results[n]["predicted_tok_s"] = decode_tok_s(replace(inputs, streams=n), model.placement)
    s.shutdown()
    one = results[counts[0]]["aggregate_tok_s"]
    b1 = results[counts[0]]["step_bytes"]
    rows = ["| streams | aggregate decode tok/s | × one stream | per-stream ms between tokens | per-stream tok/s "
            "| experts a layer (of E) | MB a step | bytes' time ms | of bandwidth | × the bytes allow "
            "| planner's predicted tok/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in counts:
        r = results[n]
        pred = f"{r['predicted_tok_s']:.1f}" if "predicted_tok_s" in r else f"({label} not profiled yet)"
        rows.append(f"| {n} | {r['aggregate_tok_s']:.1f} | {r['aggregate_tok_s'] / one:.2f} | "
                    f"{r['per_stream_gap_ms']:.1f} | {1e3 / r['per_stream_gap_ms']:.1f} | "
                    f"{r['experts_per_layer']:.2f} | {r['step_bytes'] / 1e6:.0f} | {r['step_bytes'] / bw * 1e3:.1f} | "
                    f"{r['bandwidth_fraction']:.0%} | {n * b1 / r['step_bytes']:.2f} | {pred} |")
    rows += ["", f"{label} model, every expert {args.tier}, CPU kernel: {native.status()}; read bandwidth "
             f"{bw / 1e9:.1f} GB/s measured in the same process; best of {args.repeats} rounds of "
             f"{args.tokens} new tokens per request after a {args.prompt}-token prompt"]
    table = "\n".join(rows)
    print(table)
    name = 'concurrent_streams' + (f'-prompt{args.prompt}' if args.prompt != 32 else '')
    print(f"recorded {record(name, {'results': results, 'bandwidth': bw}, table)}")


def routed_experts(model, gen, n: int, steps: int = 16, ids_below: int = 40000) -> float:
    """Distinct experts a layer runs in one batched decode step of n sequences, averaged over
    `steps` greedy steps of n different prompts (routes recorded: these steps run in torch)."""
    import torch

    prompts = [[100 + 53 * ((7 * b + j) % 997) % ids_below for j in range(32)] for b in range(n)]
    caches = [gen.new_cache() for _ in range(n)]
    for c, p in zip(caches, prompts):
        model.forward(torch.tensor(p), c, 0)
    ids = torch.tensor([p[-1] for p in prompts])
    counts = []
    with model.recording() as records:
        for i in range(steps):
            ids = model.forward(ids, caches, [len(p) + i for p in prompts]).argmax(-1)
    for _, idx, _, _ in records:
        counts.append(len(set(idx.reshape(-1).tolist())))
    return sum(counts) / len(counts)


def planner_inputs(s):
    """The planner's inputs for the loaded demo from its cached profiles (a pinned placement is not
    planned, so the session has none of its own), or None before the app has profiled it."""
    from engine.measures.profile import cached_profile, dense_timings

    ld = s.loaded
    mp = cached_profile(ld.ckpt)
    timings = dense_timings(mp, ld.accel.device, ld.model.dtype) if mp is not None else None
    if timings is None:
        return None
    return s.controller.profiling.inputs(mp, ld.accel, ld.ckpt.dims, ld.model.dense_bytes(), timings, streams=1)


def kv_bytes(model, positions: int) -> float:
    """Bytes of one sequence's cached keys and values that attention reads at `positions`."""
    d = model.dims
    return 2 * d.layers * d.kv_heads * d.head_dim * positions * model.kv_dtype.itemsize


def step_bytes(model, experts_per_layer: float) -> float:
    """Bytes one decode step reads: every layer's dense weights, the lm_head, one embedding row, and
    experts_per_layer experts a layer (their mean size as placed)."""
    dense = sum(t.numel() * t.element_size() for layer in model.layers for t in layer.tensors())
    dense += model.lm_head.numel() * model.lm_head.element_size()
    dense += sum(b.gate.numel() * b.gate.element_size() for b in model.moe if getattr(b, "gate", None) is not None)
    sizes = [ex.nbytes for b in model.moe for ex in b.experts]
    return dense + len(model.moe) * experts_per_layer * sum(sizes) / len(sizes)


if __name__ == "__main__":
    main()
