"""The panel's and the slider's readouts in words people use; the technical terms (tier names, the
planner's predicted KL divergence) go to tooltips. Pure functions, no Qt: tested directly."""
from __future__ import annotations

TIER_NAMES = {"gpu-16": "GPU, full precision", "gpu-4": "GPU, 4-bit",
              "cpu-16": "CPU, full precision", "cpu-4": "CPU, 4-bit", "cpu-3": "CPU, 3-bit", "cpu-2": "CPU, 2-bit"}
ORDER = ("gpu-16", "gpu-4", "cpu-16", "cpu-4", "cpu-3", "cpu-2")
_WHERE = {"gpu": "on the GPU", "cpu": "in CPU memory"}
_BITS = {"16": "at full precision", "4": "at 4-bit", "3": "at 3-bit", "2": "at 2-bit"}


def _key(tier) -> str:
    return getattr(tier, "value", tier)


def tier_words(tier) -> str:
    """"gpu-4" -> "on the GPU at 4-bit"."""
    where, bits = _key(tier).split("-")
    return f"{_WHERE.get(where, where)} {_BITS.get(bits, bits + '-bit')}"


def placement_words(counts: dict) -> str:
    """{"gpu-16": 24, "cpu-4": 40} -> "24 experts on the GPU at full precision · 40 in CPU memory at 4-bit"."""
    counts = {_key(t): n for t, n in counts.items() if n}
    tiers = sorted(counts, key=lambda t: ORDER.index(t) if t in ORDER else len(ORDER))
    parts = [f"{counts[t]} {tier_words(t)}" for t in tiers]
    if parts:
        n = counts[tiers[0]]
        parts[0] = f"{n} expert{'' if n == 1 else 's'} {tier_words(tiers[0])}"
    return " · ".join(parts)


def placement_tooltip(counts: dict) -> str:
    """The same counts in the engine's tier names (as the CLI and the logs say them)."""
    counts = {_key(t): n for t, n in counts.items() if n}
    return "tiers: " + " · ".join(f"{n} {t}" for t, n in sorted(counts.items()))


def quality_words(loss: float, frontier) -> str:
    """How close a plan's answers are to the best this memory allows, from where its predicted loss
    sits between the frontier's least and largest (frontier: ((loss, tok/s), ...))."""
    losses = [lo for lo, _ in frontier] or [loss]
    lo, hi = min(losses + [loss]), max(losses + [loss])
    if loss <= 1e-9:
        return "the model's own answers (full precision)"
    if hi - lo <= 1e-12 or loss <= lo + 1e-12:
        return "the best answers this memory allows"
    f = (loss - lo) / (hi - lo)
    if f < 1 / 3:
        return "about the same answers"
    if f < 2 / 3:
        return "slightly different answers"
    return "answers differ the most this slider allows"


def speed_words(tok_s: float, frontier) -> str:
    """"1.6x faster than best quality" (the frontier's least-loss point), or "as fast as best quality"."""
    if not frontier:
        return ""
    best = frontier[0][1]
    if best <= 0 or tok_s < best * 1.05:
        return "as fast as best quality" if tok_s >= best * 0.95 else f"{tok_s / best:.1f}x the speed of best quality"
    return f"{tok_s / best:.1f}x faster than best quality"


def plan_words(ev) -> str:
    """A PlacementChanged's plan: "about the same answers, 1.6x faster than best quality"."""
    q = quality_words(ev.predicted_loss, ev.frontier)
    s = speed_words(ev.predicted_tok_s, ev.frontier)
    if s == "as fast as best quality" and q.startswith(("the best", "the model's")):
        return q
    return f"{q}, {s}" if s else q


def plan_tooltip(ev) -> str:
    """The technical line behind plan_words."""
    best = ev.frontier[0] if ev.frontier else (ev.predicted_loss, ev.predicted_tok_s)
    return (f"predicted quality loss (KL divergence from the 16-bit model) {ev.predicted_loss:.4f} nats/token; "
            f"predicted decode {ev.predicted_tok_s:.1f} tok/s; best quality under this budget: KL {best[0]:.4f}, "
            f"{best[1]:.1f} tok/s; {len(ev.frontier)} frontier points; "
            + placement_tooltip(ev.placement.counts()))


def requantised_words(n4: int, file_bits: str, advice: str = "") -> str:
    """A GGUF file's experts that a plan puts at 4 bits though the file holds them at more, said
    plainly ("" : none): "12 experts re-quantised from the file's 8-bit to 4-bit", and the advice
    after a colon."""
    if not n4:
        return ""
    words = f"{n4} {'expert' if n4 == 1 else 'experts'} re-quantised " + (
        f"from the file's {file_bits} to 4-bit" if file_bits else "to 4-bit")
    return f"{words}: {advice}" if advice else words


def four_bit_experts(counts: dict) -> int:
    """Experts at a 4-bit tier in {tier: count} (tier values or Tier members)."""
    return sum(n for t, n in counts.items() if _key(t).endswith("-4"))


def position_words(value: float, cpu_only: bool = False) -> str:
    """What a slider position means, in plain words (cpu_only: no GPU to speak of)."""
    pct = round(value * 100)
    if pct <= 0:
        if cpu_only:
            return "Fastest: every expert at 4-bit, whatever it costs in quality."
        return "Fastest: as many experts at 4-bit and on the GPU as memory allows, whatever it costs in quality."
    if pct >= 100:
        return "Best quality: every expert at full precision that memory allows; faster placements are not used."
    return (f"{pct}% towards best quality: the least used experts go to 4-bit first, the most used stay at "
            "full precision, until the predicted answers drift this far.")


SLIDER_TIP = ("Quality ↔ speed, applied live (no reload). Left: faster, some experts at 4-bit. Right: closer "
              "to the model's own answers. Technically: the slider picks a point on the planner's frontier of "
              "placements (predicted tok/s against predicted KL divergence); experts migrate while you chat.")
