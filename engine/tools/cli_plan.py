"""`mixdesk plan` and `mixdesk eval`: the frontier as a table and a plot, and checks of its
predictions against measurement."""
from __future__ import annotations

import sys
import time
from pathlib import Path

GB = 10**9


def _budgets(a, default):
    from ..planning.planner import Budgets

    vram, ram = _bytes(a.gpu_budget), _bytes(a.ram_budget)
    return Budgets(vram=default.vram if vram is None else vram, ram=default.ram if ram is None else ram)


def prepare(a):
    """An engine thread with the model loaded and both profiles (measured anew with --remeasure;
    on a model's first start, the background calibration is waited for); returns the client (the
    caller closes it)."""
    from ..runtime.client import for_terminal

    client = for_terminal(False)
    try:
        client.load(a.model or "demo", "auto", a.device, a.dtype, a.ctx, a.kv_bits)
        if a.remeasure:
            client.reprofile()
        client.wait_calibrated()
    except BaseException:
        client.close()
        raise
    return client


PREFILL_TOKENS = 512


def table(points, note: str = "", inp=None) -> str:
    """The frontier as a Markdown table; with the planner's inputs, a predicted prefill column too."""
    from ..planning.planner import prefill_s

    from ..measures.fit import mapped_total

    pre = f" prefill {PREFILL_TOKENS} tok, s (pred.) |" if inp is not None else ""
    maps = inp is not None and (inp.mapped_bytes or inp.dense_mapped)
    rows = [f"| # | {'tiers':<44} | tok/s (pred.) |{pre} quality loss (KL) | VRAM GB | RAM GB |"
            + (" mapped GB |" if maps else ""),
            "|---|---|---|" + ("---|" if inp is not None else "") + "---|---|---|" + ("---|" if maps else "")]
    for i, p in enumerate(points):
        tiers = ", ".join(f"{n} {t}" for t, n in sorted(p.counts().items()))
        cell = f" {prefill_s(inp, p.placement, PREFILL_TOKENS):8.2f} |" if inp is not None else ""
        rows.append(f"| {i} | {tiers:<44} | {p.tok_s:13.2f} |{cell} {p.loss:12.4f} | {p.vram / GB:7.2f} | {p.ram / GB:6.2f} |"
                    + (f" {mapped_total(inp, p) / GB:9.2f} |" if maps else ""))
    if maps:
        rows.append("\nRAM GB: memory Mixdesk owns (counted against the RAM budget); mapped GB: the file's own "
                    "blocks, read from the file as it runs (page cache: shared, and freed when memory is short)")
    if note:
        rows.append(f"\n{note}")
    if points and not points[0].fits:
        rows.append("\nNOTHING FITS these budgets: the row above is the least-memory placement.")
    return "\n".join(rows)


def plot(points, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot([p.loss for p in points], [p.tok_s for p in points], "o-")
    ax.set_xlabel("predicted quality loss (KL divergence, nats/token)")
    ax.set_ylabel("predicted decode tok/s")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def cmd_plan(a) -> int:
    import torch

    from ..measures.hardware import load_or_measure
    from ..measures.inputs import default_budgets, from_config
    from ..planning.planner import frontier

    t_start = time.perf_counter()
    if a.config_only:
        from ..files.gguf import is_gguf
        from ..measures.inputs import from_gguf

        cfg = Path(a.model or "")
        hw = load_or_measure(torch.device("cpu"))
        name = cfg.name  # a GGUF file by its name; a config by its folder's
        if is_gguf(cfg):  # its header holds the config and every tensor's size; without a GPU budget,
            inp, note = from_gguf(cfg, hw, assume_gpu=a.gpu_budget is not None)  # for this machine as it is
        else:
            cfg = cfg / "config.json" if cfg.is_dir() else cfg
            inp, note = from_config(cfg, hw)
            name = cfg.parent.name or cfg.name
        b = _budgets(a, default_budgets(False))
        title = f"{name}, VRAM {b.vram / GB:.0f} GB, RAM {b.ram / GB:.0f} GB (config only)"
    else:
        client = prepare(a)
        try:
            got = client.query("plan_inputs")
        finally:
            client.close()
        inp, name, where, free, measured = got["inputs"], got["name"], got["where"], got["free"], got["measured"]
        b = _budgets(a, free)
        note = (f"profiles measured on this machine; {where}" if measured else
                f"ASSUMED: uniform expert popularity and 4-bit sensitivity (the model's calibration did not "
                f"finish); {where}")
        title = f"{name}, VRAM {b.vram / GB:.1f} GB, RAM {b.ram / GB:.1f} GB"
    from dataclasses import replace

    inp = replace(inp, lowest_bits=a.lowest_bits)
    if a.streams > 1:
        inp = replace(inp, streams=a.streams)
        note += f"\ntok/s: {a.streams} requests decoding together (all their tokens)"
    t0 = time.perf_counter()
    points = frontier(inp, b)
    ms = (time.perf_counter() - t0) * 1e3
    print(table(points, inp=inp, note=f"{note}\nbudgets: VRAM {b.vram / GB:.2f} GB, RAM {b.ram / GB:.2f} GB; "
                        f"frontier computed in {ms:.1f} ms"))
    if a.png:
        if plot(points, Path(a.png), title):
            print(f"plot: {a.png}")
    print(f"[{time.perf_counter() - t_start:.1f} s]", file=sys.stderr)
    return 0


def cmd_eval(a) -> int:
    """Perplexity all 16-bit, then at the slider's plan, and decode speed (measured on the engine
    thread: the query "evaluate", engine/runtime/queries.py)."""
    if a.placement != "auto":
        return _eval_pinned(a)
    client = prepare(a)
    try:
        got = client.query("evaluate", slider=a.slider, text=a.text, tokens=a.tokens, new_tokens=a.new_tokens,
                           vram=_bytes(a.gpu_budget), ram=_bytes(a.ram_budget), lowest_bits=a.lowest_bits)
    finally:
        client.close()
    p, q, n, fin = got["plan"], got["quality"], got["tokens"], got["done"]
    print(f"slider {a.slider}: {', '.join(f'{n} {t}' for t, n in sorted(p.counts().items()))}")
    print(f"perplexity {q['ppl']:.3f} (all 16-bit {q['ref_ppl']:.3f}), KL {q['kl']:.5f} nats/token, "
          f"{n} tokens")
    print(f"decode {fin.decode_tok_s:.2f} tok/s measured, {p.tok_s:.2f} predicted; "
          f"predicted quality loss {p.loss:.4f}")
    return 0


def _bytes(gb: float | None) -> int | None:
    return int(gb * GB) if gb is not None else None


def _eval_pinned(a) -> int:
    """`eval --placement P` (anything but auto): the perplexity of the model kept at that placement."""
    from ..runtime.client import for_terminal

    client = for_terminal(False)
    try:
        client.load(a.model or "demo", a.placement, a.device, a.dtype, a.ctx, a.kv_bits)
        got = client.query("evaluate_pinned", text=a.text, tokens=a.tokens, new_tokens=a.new_tokens)
    finally:
        client.close()
    ppl, n, counts, fin = got["perplexity"], got["tokens"], got["counts"], got["done"]
    tiers = ", ".join(f"{k} {getattr(t, 'value', t)}" for t, k in counts.items() if k)
    print(f"placement {a.placement}: {tiers}")
    print(f"perplexity {ppl:.6f}, {n} tokens")
    print(f"decode {fin.decode_tok_s:.2f} tok/s measured")
    return 0


def _lowest_bits(p) -> None:
    from ..placement import DEFAULT_LOWEST_BITS, LOWEST_BITS

    p.add_argument("--lowest-bits", type=int, choices=LOWEST_BITS, default=DEFAULT_LOWEST_BITS,
                   help=f"the lowest precision for experts on the CPU: 4, 3 or 2 bits a weight (tiers cpu-4, "
                        f"cpu-3, cpu-2; default {DEFAULT_LOWEST_BITS})")


def add_parsers(sub, add_model_args, number) -> None:
    p = sub.add_parser("plan", help="the speed/quality frontier under memory budgets")
    add_model_args(p)
    p.add_argument("--gpu-budget", type=number(0, 1e6), default=None, help="GB of VRAM for the model")
    p.add_argument("--ram-budget", type=number(0, 1e6), default=None, help="GB of RAM for the model")
    p.add_argument("--config-only", action="store_true", help="plan from config.json or a GGUF file's header alone (no weights read)")
    p.add_argument("--png", default=None, metavar="PATH", help="also draw the frontier into this PNG file "
                   "(default: no file)")
    p.add_argument("--streams", type=int, choices=range(1, 65), default=1, metavar="N",
                   help="plan for N requests decoding together (a local server's --parallel)")
    p.add_argument("--remeasure", action="store_true",
                   help="measure this machine and calibrate the model anew (replacing the cached profiles)")
    _lowest_bits(p)
    p.set_defaults(fn=cmd_plan)
    e = sub.add_parser("eval", help="perplexity, KL vs all-16-bit, and tok/s at a slider value")
    add_model_args(e)
    e.add_argument("--slider", type=number(0, 1), default=0.5)
    e.add_argument("--text", default=None, help="a text file (default: Python's pydoc topics)")
    e.add_argument("--tokens", type=lambda t: max(2, int(t)), default=1024)
    e.add_argument("--new-tokens", type=lambda t: max(1, int(t)), default=64)
    e.add_argument("--gpu-budget", type=number(0, 1e6), default=None)
    e.add_argument("--ram-budget", type=number(0, 1e6), default=None)
    e.add_argument("--remeasure", action="store_true",
                   help="measure this machine and calibrate the model anew (replacing the cached profiles)")
    _lowest_bits(e)
    e.set_defaults(fn=cmd_eval)
