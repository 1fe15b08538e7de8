"""The GPU check's report: OUT/gpu_check-<date>.json, its markdown summary gpu_check-<date>.md and
a plot gpu_check-<date>.png, named as benchmarks/results/ keeps them (issue 30), so a device session
only copies them. The JSON and the markdown are rewritten whole whenever a stage adds to them, so a
run cut short keeps every stage that finished; the plot is redrawn after each group of stages.

The targets of issue 30 are read off the Mixtral-8x7B sweep under the 24 GB card: more than
3 tok/s at the fastest setting (every setting keeps attention at 16 bits: only experts are ever
4-bit), decode within 25% of the prediction at every setting, and at least 70% of the bandwidth
bound at the fastest setting.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

SWEEPS = {"mixtral_24gb": "Mixtral-8x7B shape, 24 GB card", "qwen3_24gb": "Qwen3-30B-A3B shape, 24 GB card",
          "mixtral_12gb": "Mixtral-8x7B shape, 12 GB card", "qwen3_12gb": "Qwen3-30B-A3B shape, 12 GB card"}
TITLES = {"machine": "The machine", "native": "Native CPU experts beside CUDA experts", "gpu_tests": "pytest -m gpu",
          "budget_drop": "Live budget drop, 24 -> 12 GB", "batched": "Batched decode", "gguf": "A GGUF model",
          "plot": "Plot", **SWEEPS}


def targets(data: dict) -> dict:
    rows = [r for r in (data.get("mixtral_24gb") or {}).get("rows") or [] if "error" not in r]
    if not rows:
        return {"note": "the Mixtral-8x7B sweep under the 24 GB card has no setting measured"}
    fastest = rows[0]  # the sweep runs fastest first (a setting that ran out of memory has no figures)
    errs = [abs(r["decode_error"]) for r in rows if r.get("decode_error") is not None]
    out = {"fastest_over_3_tok_s": {"slider": fastest["slider"], "decode_tok_s": fastest["decode_tok_s"],
                                    "met": fastest["decode_tok_s"] > 3},
           "decode_within_25pct": {"worst_error": max(errs) if errs else None, "met": bool(errs) and max(errs) <= 0.25},
           "of_bound_70pct": {"of_bound": fastest["of_bound"], "met": fastest["of_bound"] >= 0.7}}
    if data.get("small"):
        out["note"] = "rehearsal on a CPU with a tiny model: the targets are the device run's"
    return out


class Report:
    def __init__(self, out: Path, header: dict):
        self.out = out
        self.base = f"gpu_check-{time.strftime('%Y-%m-%d')}"
        self.data = {**header, "stages": {}}
        self._written = ""
        self._plotted = None  # what the plot was last drawn from

    @property
    def json_path(self) -> Path:
        return self.out / f"{self.base}.json"

    @property
    def md_path(self) -> Path:
        return self.out / f"{self.base}.md"

    @property
    def png_path(self) -> Path:
        return self.out / f"{self.base}.png"

    def update(self, results: dict | None = None, stages: dict | None = None) -> None:
        self.data.update(results or {})
        for name, st in (stages or {}).items():
            self.data["stages"][name] = {**self.data["stages"].get(name, {}), **st}
        self.data["targets"] = targets(self.data)
        text = json.dumps(self.data, indent=1, default=str)
        if text == self._written:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(text)
        self.md_path.write_text(markdown(self.data, self.png_path.name if self.png_path.exists() else None))
        self._written = text

    def plot(self) -> None:
        """The plot, or why there is none: a report without its picture is still the report."""
        try:
            self._plot()
        except Exception as e:  # noqa: BLE001 - matplotlib missing or failing must not end the run
            self.update({"plot": f"not drawn: {type(e).__name__}: {e}"})

    def _plot(self) -> None:
        """Predicted and measured tok/s of each sweep; the budget drop's held bytes per token."""
        sweeps = [(k, [r for r in self.data[k]["rows"] if "error" not in r]) for k in SWEEPS
                  if (self.data.get(k) or {}).get("rows")]
        drop = (self.data.get("budget_drop") or {}).get("timeline")
        if (not sweeps and not drop) or self._plotted == (sweeps, drop):
            return
        self._plotted = (sweeps, drop)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110)
        for k, rows in sweeps:
            line = a.plot([r["slider"] for r in rows], [r["decode_tok_s"] for r in rows], "o-", label=f"{k} measured")
            a.plot([r["slider"] for r in rows], [r["predicted_tok_s"] for r in rows], "x--",
                   color=line[0].get_color(), label=f"{k} predicted")
        a.set_xlabel("slider (0 fastest, 1 best quality)")
        a.set_ylabel("decode tok/s")
        a.set_yscale("log")
        if sweeps:
            a.legend(fontsize=7)
        if drop:
            d = self.data["budget_drop"]
            b.plot([p[0] for p in drop], [p[2] for p in drop], ".-", label="held by the placement")
            b.axhline(d["budget_after_gb"], color="red", ls=":", label="budget after the drop")
            if d.get("dropped_at_s") is not None:
                b.axvline(d["dropped_at_s"], color="gray", ls="--", label="budget drops")
            b.set_xlabel("seconds into the reply (a point per token)")
            b.set_ylabel(f"{d['pool'].upper()} held, GB")
            b.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(self.png_path)
        plt.close(fig)
        self._written = ""  # the markdown now links the plot
        self.update()


# ---- markdown -------------------------------------------------------------------------------------

def _table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join("" if v is None else str(v) for v in r) + " |" for r in rows]


def _tiers(t: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in t.items())


def _yes(v) -> str:
    return "met" if v else "not met"


def _machine(m: dict) -> list[str]:
    c, n, g = m.get("cpu", {}), m.get("native", {}), m.get("gpu", {})
    out = [(f"- CPU: {c.get('model')}, {c.get('cores')} cores, {c.get('ram_gb')} GB RAM; AMX: {c.get('amx')}; "
           f"features: {' '.join(c.get('features', []))}"),
           f"- native CPU kernels: {'on' if n.get('on') else 'OFF'} ({n.get('status')}, {n.get('threads')} threads)",
           (f"- GPU: {g.get('name')}, {g.get('total_gb', '-')} GB, driver {g.get('driver', '-')}; torch {g.get('torch')}, "
           f"CUDA {g.get('cuda', '-')}; Python {m.get('python')}")]
    if m.get("nf4"):
        out += [f"- NF4 (gpu-4): {'runs' if m['nf4'].get('ok') else 'FAILS'} ({m['nf4'].get('bitsandbytes') or m['nf4'].get('error')})"]
    hp = m.get("hardware_profile")
    if hp:
        out += [f"- hardware profile ({hp['seconds']} s): " + "; ".join(
            f"{t} {v['fixed_us']} us + {v['gb_s']} GB/s" for t, v in hp["tiers"].items())
            + (f"; copies h2d {hp.get('h2d_gb_s')} GB/s, d2h {hp.get('d2h_gb_s')} GB/s" if hp.get("h2d_gb_s") else "")]
    if m.get("bandwidth_gb_s"):
        gpu_bw = m["bandwidth_gb_s"]["accelerator"]
        out += [f"- read bandwidth: GPU {f'{gpu_bw} GB/s' if gpu_bw else '(none)'}, RAM {m['bandwidth_gb_s']['host']} GB/s"]
    return out


def _card(c) -> str:
    if not isinstance(c, dict):
        return str(c)
    if "memory_fraction" in c:
        return f"{c['card_gb']:g} GB of the device's {c['device_total_gb']} GB (memory fraction {c['memory_fraction']})"
    return "; ".join(f"{k} {v}" for k, v in c.items())


def _peaks(p: dict) -> str:
    return "Peak memory: " + ", ".join(f"{k} {v}" for k, v in p.items()) + "."


def _sweep(s: dict) -> list[str]:
    load = s.get("load", {})
    out = [(f"{s.get('model')}; {s.get('budgets')}: VRAM {s['budgets_gb']['vram']} GB, RAM {s['budgets_gb']['ram']} GB; "
           f"card: {_card(s.get('card'))}"), "",
           f"Loaded in {load.get('seconds')} s ({load.get('placement', load.get('at'))}; CPU kernel {load.get('native')})."]
    if s.get("inputs"):
        i = s["inputs"]
        out += [(f"Planner inputs measured on it: popularity over {i['popularity_tokens']} tokens ({i['capture_s']} s), "
                f"dense {i['dense_s'] * 1e3:.3f} ms a step, {i['dense_prefill_s_per_token'] * 1e3:.4f} ms a prompt token "
                f"({i['dense_timing_s']} s).")]
    rows = [[r["slider"], _tiers(r["tiers"]), r["predicted_tok_s"], r["decode_tok_s"], r["decode_error"],
             r["predicted_prefill_s"], r["prefill_s"], r["bound_tok_s"], r["of_bound"], r["migration_s"]]
            if "error" not in r else [r["slider"], _tiers(r["tiers"]), r["error"]] + [""] * 7
            for r in s.get("rows", [])]
    out += [""] + _table(["slider", "tiers", "predicted tok/s", "measured tok/s", "error", "predicted prefill s",
                          "prefill s", "bound tok/s", "of bound", "migration s"], rows)
    if s.get("summary"):
        sm = s["summary"]
        out += ["", (f"Spearman (decode, predicted vs measured): {sm['spearman_decode']}; worst decode error "
                    f"{sm['worst_decode_error']}; worst prefill error {sm['worst_prefill_error']}.")]
    if s.get("peak_vram"):
        out += [_peaks(s["peak_vram"])]
    if s.get("not_run"):
        out += [f"Not run: sliders {s['not_run']['sliders']} ({s['not_run']['why']})."]
    return out


def _drop(d: dict) -> list[str]:
    out = [(f"{d.get('model')}; {d['pool']} budget {d['budget_before_gb']} GB -> {d['budget_after_gb']} GB after token "
           f"{d.get('dropped_after_token')} (at {d.get('dropped_at_s')} s); profile: {d.get('profile')}; load {d.get('load_s')} s")]
    if "tokens" in d:
        out += [(f"- held {d['held_before_gb']} GB before, {d['held_after_gb']} GB at the end; steps over the new budget "
                f"after the drop: {d['steps_over_new_budget']} ({'within one step' if d['within_one_step'] else 'MORE than one step'})"),
                (f"- tokens: asked {d['tokens_asked']}, streamed {d['tokens']}, in the Done {d['finished_tokens']} "
                f"({'none lost' if d['no_token_lost'] else 'TOKENS LOST'}); gaps: median {d['median_gap_s']} s, "
                f"longest {d['max_gap_s']} s"),
                f"- placement before: {d.get('placement_before')}; after: {d.get('placement_after')}"]
    return out + [f"- errors: {d.get('errors') or d.get('error') or 'none'}"]


def _section(key: str, v) -> list[str]:
    """The key's section; where a partial result lacks what its layout shows, its JSON instead."""
    try:
        out = _layout(key, v)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError):
        out = ["```json", json.dumps(v, indent=1, default=str)[:3000], "```"]
    if isinstance(v, dict) and v.get("error") and key != "budget_drop":
        out += ["", f"**Error:** {v['error']}", "", "```", str(v.get("traceback", ""))[-1500:], "```"]
    return out


def _layout(key: str, v) -> list[str]:
    if key == "machine":
        return _machine(v)
    if key in SWEEPS:
        return _sweep(v)
    if key == "budget_drop":
        return _drop(v)
    if key == "gpu_tests":
        return [(f"`{v.get('command')}`: {v.get('line') or ('timed out' if v.get('timed_out') else v.get('rc'))}"
                f" ({v.get('seconds')} s; app.window_state stand-in: {v.get('window_state_stand_in')})"),
                "", "```", v.get("tail", "")[-1500:], "```"]
    if key == "native":
        sl, b = v["decode_slots"], v["bf16_four_tiers"]
        return [f"{v['model']}; CPU kernel {v['native']}; accelerator {v['accelerator']}",
                (f"- fp32, half the experts cpu-16, against all gpu-16: largest logit difference {v['fp32_max_rel_diff']:.2e} "
                "of the largest logit"),
                (f"- 8 decode steps' top-k slots: {sl['accelerator']} on the accelerator, {sl['cpu_native']} native CPU, "
                f"{sl['cpu_torch']} torch CPU; {sl['layer_steps_both_sides']} of {sl['layer_steps']} (layer, step) pairs "
                "ran experts on both sides"),
                f"- bf16, {_tiers(b['tiers'])}: {b['tokens']} tokens at {b['decode_tok_s']} tok/s, logits finite: {b['finite']}"]
    if key == "gguf":
        return [(f"{v['model']}; {v.get('format')} (expert types {', '.join(v.get('expert_types', []))}), "
                f"{v.get('file_gb')} GB; bf16 safetensors {v.get('safetensors_gb')} GB made in {v.get('safetensors_s')} s, "
                f"GGUF written in {v.get('write_s')} s"),
                f"- loaded in {v.get('load_s')} s with {_tiers(v.get('tiers', {}))}",
                (f"- {v.get('tokens')} of {v.get('tokens_asked')} tokens at {v.get('decode_tok_s')} tok/s, prefill "
                f"{v.get('prefill_s')} s; logits finite: {v.get('finite')}; one expert as gpu-16 vs cpu-16: "
                f"{v.get('gpu16_vs_cpu16_max_rel_diff')} of the largest output")] + _prefill_copy(v.get("prefill_copy"))
    if key == "batched":
        return [f"Model: {v.get('model')}; tiers {_tiers(v.get('tiers', {}))}", ""] + _table(
            ["streams", "aggregate tok/s", "x one stream", "per-stream tok/s", "predicted aggregate", "all finished"],
            [[r["streams"], r["aggregate_tok_s"], r.get("x_one_stream"), r["per_stream_tok_s"], r["predicted_tok_s"],
              r["finished"]] for r in v.get("rows", [])])
    return ["```json", json.dumps(v, indent=1, default=str)[:3000], "```"]


def _prefill_copy(c: dict | None) -> list[str]:
    """The GGUF stage's prefill copy (issue 45, item 6): a CPU expert's file rows dequantised on the GPU."""
    if not c:
        return []
    if "skipped" in c or "error" in c:
        return [f"- prefill copy: {c.get('skipped') or c.get('error')}"]
    return [(f"- prefill copy of a CPU GGUF expert ({'/'.join(c['expert_format'])}, {c['expert_bytes'] / 1e6:.1f} MB): "
             f"copy and dequantise {c['copy_s'] * 1e3:.2f} ms; 256 tokens on the CPU {c['cpu_expert_s'] * 1e3:.1f} ms, "
             f"on the GPU {c['gpu_expert_s'] * 1e3:.2f} ms; outputs differ by {c['max_rel_diff']:.2e} of the largest; "
             f"copy wins at {c.get('copy_wins_at')}"),
            (f"- a 256-token prefill: CPU experts kept on the CPU {c.get('prefill_cpu_only_tok_s')} tok/s; with the "
             f"measured costs {c.get('prefill_measured_tok_s')} tok/s ({c.get('prefill_measured_copied')} expert "
             "batches copied)")]


def markdown(data: dict, png: str | None) -> str:
    out = [f"# GPU check, {data.get('date')}", "", f"- command: `{data.get('command')}`",
           f"- {'REHEARSAL on the CPU (--small): tiny shapes, figures not comparable with a device run' if data.get('small') else 'device run'}",
           f"- run budget {data.get('budget_s')} s; commit {data.get('commit')}", ""]
    out += ["## Stages", ""] + _table(["stage", "status", "seconds", "budget s", "device estimate"], [
        [n, s.get("status"), s.get("seconds"), s.get("budget_s"), s.get("estimate")] for n, s in data["stages"].items()])
    t = data.get("targets", {})
    out += ["", "## Targets (issue 30)", ""]
    if "fastest_over_3_tok_s" in t:
        fast, err, bound = t["fastest_over_3_tok_s"], t["decode_within_25pct"], t["of_bound_70pct"]
        out += [(f"- Mixtral-8x7B shape under 24 GB, > 3 tok/s at the fastest setting (slider {fast['slider']}): "
                f"{fast['decode_tok_s']} ({_yes(fast['met'])})"),
                f"- decode within 25% of the prediction: worst {err['worst_error']} ({_yes(err['met'])})",
                f"- at least 70% of the bandwidth bound at the fastest setting: {bound['of_bound']} ({_yes(bound['met'])})"]
    if t.get("note"):
        out += [f"- {t['note']}"]
    if png:
        out += ["", f"![sweeps and the budget drop]({png})"]
    skip = {"date", "command", "small", "budget_s", "commit", "stages", "targets", "title"}
    for key, v in data.items():
        if key not in skip:
            out += ["", f"## {TITLES.get(key, key)}", ""] + _section(key, v)
    return "\n".join(out) + "\n"
