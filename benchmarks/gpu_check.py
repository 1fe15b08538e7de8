"""The GPU validation run (issue 9), prepared to run in one go on a lent device:

    python benchmarks/gpu_check.py --out "$OUT"            # on the device (scripts/device_check.sh)
    python benchmarks/gpu_check.py --out /tmp/g --small    # a CPU rehearsal of every stage (minutes)

Stages, each recorded as it finishes in OUT/gpu_check.json (a crash keeps what came before):
1. the gpu-marked tests (tests/test_gpu.py: CUDA parity for every 16-bit tier against transformers,
   the copy path, bf16 generation, the VRAM hog);
2. a Mixtral-8x7B-shaped model with seeded random weights made on demand (engine/synthetic.py: no
   file, no download), the GPU capped at --vram-cap GB: across slider settings, decode tok/s and
   prefill time next to the cost model's prediction, and the fraction of the bandwidth bound
   (bytes each tier reads per token / that tier's measured read bandwidth, summed);
3. a live budget drop from --vram-cap to --drop-to GB in the middle of a generation, through the
   engine thread (the same path as a game taking VRAM): the placement follows, no token is lost.
Plus OUT/gpu_check.png (predicted vs measured tok/s; VRAM held over the drop).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import machine, read_bandwidth  # noqa: E402

GB = 10**9
SMALL = {"model_type": "mixtral", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 1024,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 8,
         "num_experts_per_tok": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
         "rope_theta": 1e6, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


class Report:
    def __init__(self, out: Path):
        self.out, self.data = out, {"machine": machine(), "command": " ".join(sys.argv),
                                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}

    def add(self, key, value) -> None:
        self.data[key] = value
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1, default=str))
        shown = value[-1] if isinstance(value, list) and value else value
        print(f"[{key}] {json.dumps(shown, default=str)[:600]}", flush=True)


def gpu_tests(rep: Report, timeout: int) -> None:
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                            str(ROOT / "tests" / "test_gpu.py")], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
        rep.add("gpu_tests", {"rc": r.returncode, "tail": r.stdout[-3000:] + r.stderr[-1500:],
                              "seconds": round(time.time() - t0, 1)})
    except subprocess.TimeoutExpired:
        rep.add("gpu_tests", {"rc": None, "tail": f"timed out after {timeout} s"})


def accel_bandwidth(dev: torch.device) -> float:
    if dev.type != "cuda":
        return read_bandwidth()
    x = torch.ones(2 * GB // 4, dtype=torch.float32, device=dev)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.sum()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def sweep(rep: Report, folder: Path, cap: int, settings: int, new_tokens: int, prompt: int) -> list:
    from engine.generate import SamplingParams
    from engine.planning.hardware import load_or_measure
    from engine.load import load
    from engine.planning.inputs import default_budgets, from_dims, measure_dense_s
    from engine.planning.planner import Budgets, choose, frontier
    from engine.planning.profile import capture
    from dataclasses import replace

    t0 = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hw = load_or_measure(dev)
    free = default_budgets(dev.type != "cuda", dev)
    budgets = Budgets(vram=min(free.vram, cap) if dev.type == "cuda" else 0, ram=free.ram)
    loaded = load(folder, "auto", None if dev.type == "cuda" else "cpu", budgets=budgets, slider=0.0)
    m, d, gen = loaded.model, loaded.ckpt.dims, loaded.generator
    rep.add("load", {"seconds": round(time.time() - t0, 1), "placement": m.placement.summary(),
                     "budgets_gb": [budgets.vram / GB, budgets.ram / GB]})
    ids = torch.randint(3, min(d.vocab, 4000), (256,), generator=torch.Generator().manual_seed(0)).tolist()
    records = capture(m, ids)  # popularity of the random router on random tokens
    share = tuple(tuple((torch.bincount(idx.reshape(-1).cpu(), minlength=d.experts).float() / idx.numel()).tolist())
                  for _, idx, _, _ in records)
    del records
    inp = replace(from_dims(d, hw, m.dtype.itemsize), share=share,
                  dense_s=measure_dense_s(m, hw))
    if dev.type != "cuda":
        inp = replace(inp, cpu_only=True)
    bw = {"accelerator": accel_bandwidth(dev), "host": read_bandwidth()}
    rep.add("bandwidth_gb_s", {k: round(v / 1e9, 1) for k, v in bw.items()})
    pts = frontier(inp, budgets)
    gen.eos_ids.clear()
    rows = []
    for k in range(settings):
        s = 1.0 - k / max(settings - 1, 1)  # best quality first, so the sweep ends on the fastest
        p = choose(pts, s, inp)
        t1 = time.time()
        m.apply(p.placement)
        moved_s = time.time() - t1
        fin = list(gen.stream(ids[:prompt], SamplingParams(max_new_tokens=new_tokens)))[-1]
        bytes_tier = {"accelerator": inp.dense_bytes if not inp.cpu_only else 0, "host": inp.dense_bytes if inp.cpu_only else 0}
        for l, e, t in p.placement.items():
            bytes_tier["accelerator" if t.on_accelerator and dev.type == "cuda" else "host"] += \
                inp.share[l][e] * d.top_k * inp.expert_bytes[t.value]
        bound_s = sum(b / bw[k_] for k_, b in bytes_tier.items())
        row = {"slider": round(s, 3), "tiers": {t: n for t, n in sorted(p.counts().items())},
               "predicted_tok_s": round(p.tok_s, 2), "decode_tok_s": round(fin.decode_tok_s, 2),
               "prompt_tokens": prompt, "prefill_s": round(fin.prefill_s, 3),
               "bound_tok_s": round(1 / bound_s, 2), "of_bound": round(fin.decode_tok_s * bound_s, 3),
               "migration_s": round(moved_s, 1)}
        rows.append(row)
        rep.add("sweep", rows)
    loaded.ckpt.close()
    return rows


def budget_drop(rep: Report, folder: Path, cap: int, drop_to: int, new_tokens: int) -> dict:
    """Through the engine thread: the cap falls from `cap` to `drop_to` bytes after 20 tokens."""
    from types import SimpleNamespace

    from engine.generate import SamplingParams
    from engine.planning.profile import profile_path, uniform_profile
    from engine.protocol import Done, ErrorEvent, Generate, Load, Loaded, SetBudgets
    from engine.session import Session
    from engine.sources.synthetic import SyntheticCheckpoint

    cuda = torch.cuda.is_available()
    ck = SyntheticCheckpoint(folder)
    # a uniform profile stands in for calibration (minutes at this size, and not what is checked here)
    uniform_profile(SimpleNamespace(dims=ck.dims, ckpt=ck, dtype=torch.bfloat16)).save(profile_path(folder))
    events, tokens, held = [], [], []
    ready, done = threading.Event(), threading.Event()

    def on_event(ev):
        events.append(ev)
        if type(ev).__name__ == "Token":
            tokens.append(time.perf_counter())
        if isinstance(ev, (Loaded, ErrorEvent)):
            ready.set()
        if isinstance(ev, (Done, ErrorEvent)) and ready.is_set():
            done.set()

    pool = 0 if cuda else 1
    first = SetBudgets(vram=cap) if cuda else SetBudgets(ram=cap)
    s = Session(on_event, poll_s=0.1, slider=1.0).start()
    s.submit(first)
    s.submit(Load(path=str(folder), device=None if cuda else "cpu"))
    ready.wait(1800)
    errors = [str(e.message) for e in events if isinstance(e, ErrorEvent)]
    if errors:
        s.shutdown()
        result = {"error": errors}
        rep.add("budget_drop", result)
        return result
    t0 = time.perf_counter()
    s.submit(Generate(prompt_ids=list(range(3, 40)), params=SamplingParams(max_new_tokens=new_tokens)))
    dropped_at = None
    while not done.wait(0.05):
        held.append((time.perf_counter() - t0, s.controller.held[pool]))
        if dropped_at is None and len(tokens) >= 20:
            s.submit(SetBudgets(vram=drop_to) if cuda else SetBudgets(ram=drop_to))
            dropped_at = time.perf_counter() - t0
    held.append((time.perf_counter() - t0, s.controller.held[pool]))
    fin = [e for e in events if isinstance(e, Done)]
    gaps = [b - a for a, b in zip(tokens, tokens[1:])]
    result = {"pool": "vram" if cuda else "ram", "cap_gb": cap / GB, "drop_to_gb": drop_to / GB,
              "dropped_at_s": dropped_at, "tokens": len(tokens),
              "finished_tokens": len(fin[-1].token_ids) if fin else None,
              "held_before_gb": held[0][1] / GB, "held_after_gb": held[-1][1] / GB,
              "within_new_budget": held[-1][1] <= drop_to,
              "max_gap_s": round(max(gaps), 3) if gaps else None,
              "errors": [str(e.message) for e in events if isinstance(e, ErrorEvent)],
              "held_timeline": [(round(t, 2), round(h / GB, 3)) for t, h in held[:: max(len(held) // 200, 1)]]}
    s.shutdown()
    rep.add("budget_drop", result)
    return result


def plot(out: Path, rows: list, drop: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    a.plot([r["slider"] for r in rows], [r["predicted_tok_s"] for r in rows], "o--", label="predicted")
    a.plot([r["slider"] for r in rows], [r["decode_tok_s"] for r in rows], "o-", label="measured")
    a.plot([r["slider"] for r in rows], [r["bound_tok_s"] for r in rows], ":", label="bandwidth bound")
    a.set_xlabel("slider (0 fastest, 1 best quality)")
    a.set_ylabel("decode tok/s")
    a.legend()
    if drop.get("held_timeline"):
        t, h = zip(*drop["held_timeline"])
        b.plot(t, h)
        b.axhline(drop["drop_to_gb"], color="red", ls=":", label="new budget")
        if drop.get("dropped_at_s"):
            b.axvline(drop["dropped_at_s"], color="gray", ls="--", label="budget drops")
        b.set_xlabel("seconds into the generation")
        b.set_ylabel(f"{drop['pool'].upper()} held by experts + dense, GB")
        b.legend()
    fig.tight_layout()
    fig.savefig(out / "gpu_check.png")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="a 4-layer, 256-wide model: a rehearsal on any machine")
    ap.add_argument("--vram-cap", type=float, default=24.0)
    ap.add_argument("--drop-to", type=float, default=12.0)
    ap.add_argument("--settings", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--tests-timeout", type=int, default=240)
    a = ap.parse_args()
    out = Path(a.out)
    rep = Report(out)
    if not a.skip_tests:
        gpu_tests(rep, a.tests_timeout)
    from engine.sources.synthetic import write_synthetic

    with tempfile.TemporaryDirectory() as tmp:
        cfg = ROOT / "resources" / "mixtral-8x7b-config.json"
        if a.small:
            cfg = Path(tmp) / "config.json"
            cfg.write_text(json.dumps(SMALL))
        folder = write_synthetic(Path(tmp) / "model", cfg)
        cap, drop_to = int(a.vram_cap * GB), int(a.drop_to * GB)
        if a.small and not torch.cuda.is_available():  # rehearse the drop on RAM: half of what the model holds
            from engine.sources.synthetic import SyntheticCheckpoint

            ck = SyntheticCheckpoint(folder)
            cap = 4 * (ck.dense_nbytes() + ck.dims.layers * ck.dims.experts * ck.expert_nbytes())
            drop_to = ck.dense_nbytes() + ck.dims.layers * ck.dims.experts * ck.expert_nbytes() // 2
        rows = sweep(rep, folder, cap, a.settings, a.new_tokens, a.prompt_tokens)
        drop = budget_drop(rep, folder, cap, drop_to, max(a.new_tokens * 4, 80))
    plot(out, rows, drop)
    print(f"report: {out / 'gpu_check.json'}, {out / 'gpu_check.png'}")


if __name__ == "__main__":
    main()
