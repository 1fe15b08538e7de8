"""The native stage: accelerator experts beside native CPU experts in one decode step.

On a small synthetic Mixtral (the rehearsal's shape on either machine: this checks what runs where
and that it agrees, not speed):
1. fp32, every expert gpu-16, against the same model with the odd experts of every layer cpu-16
   (run by the native kernel where it loaded): the logits of a 16-token prompt and 8 decode steps,
   the largest difference over the largest logit (fp32 on both sides: TF32 is off for the check);
2. the routes of those 8 decode steps, counted per layer and step: top-k slots that went to
   accelerator experts, to CPU experts the native kernel runs, to CPU experts torch runs; and in
   how many (layer, step) pairs both sides ran;
3. bf16 with all four tiers mixed at random: 16 tokens decoded, all logits finite.
Without CUDA the gpu-* tiers live on the CPU device (the engine's test seam), so the rehearsal runs
the same code with nothing crossing a bus.
"""
from __future__ import annotations

import time

import torch

from benchmarks import gpu_check_shapes as shapes


def _logits(model, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    cache = model.new_cache(len(ids) + 8)
    out = [model.forward(ids[:prompt], cache, 0, all_logits=True)]
    out += [model.forward(ids[i:i + 1], cache, i) for i in range(prompt, len(ids))]
    return torch.cat(out).float().cpu()


def _slots(model, records: list) -> dict:
    """Top-k slots of the recorded decode steps (T = 1) by where their expert ran."""
    counts = {"accelerator": 0, "cpu_native": 0, "cpu_torch": 0, "layer_steps": 0, "layer_steps_both_sides": 0}
    for l, (_, idx, _, _) in enumerate(records):
        if idx.shape[0] != 1:
            continue  # the prompt's pass
        block = model.moe[l % len(model.moe)]
        sides = set()
        for e in idx[0].tolist():
            ex = block.experts[e]
            where = ("accelerator" if ex.tier.on_accelerator else
                     "cpu_native" if getattr(ex, "desc", None) is not None else "cpu_torch")
            counts[where] += 1
            sides.add(where == "accelerator")
        counts["layer_steps"] += 1
        counts["layer_steps_both_sides"] += len(sides) == 2
    return counts


def run(ctx) -> dict:
    from benchmarks.gpu_check_sweep import release
    from engine import native
    from engine.runtime.generate import Generator, SamplingParams
    from engine.model.forward import MoEModel
    from engine.placement import Placement, Tier
    from engine.sources.synthetic import SyntheticCheckpoint

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    ck = SyntheticCheckpoint(shapes.synthetic(ctx.work, "mixtral", small=True))
    d = ck.dims
    out = {"model": shapes.label("mixtral", True), "native": native.status(),
           "accelerator": "cuda" if cuda else "cpu (rehearsal: the gpu-* tiers live on the CPU device)"}
    ids = torch.randint(3, d.vocab, (24,), generator=torch.Generator().manual_seed(5))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        want = _logits(MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.GPU16), dev, torch.float32), ids, 16)
        mixed = Placement(tuple(tuple(Tier.CPU16 if e % 2 else Tier.GPU16 for e in range(d.experts))
                                for _ in range(d.layers)))
        model = MoEModel(ck, mixed, dev, torch.float32)
        with model.recording() as records:
            got = _logits(model, ids, 16)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    out["fp32_max_rel_diff"] = float((got - want).abs().max() / want.abs().max())
    out["decode_slots"] = _slots(model, records)
    del model, records
    tiers = [Tier.GPU16, Tier.GPU4, Tier.CPU16, Tier.CPU4]
    model = MoEModel(ck, Placement.random(d.layers, d.experts, tiers, 3), dev, torch.bfloat16)
    gen = Generator(model, ck.load_tokenizer(), set(), ctx=128)
    t0 = time.perf_counter()
    fin = list(gen.stream(ids[:16].tolist(), SamplingParams(max_new_tokens=16)))[-1]
    logits = model.forward(ids[:16], model.new_cache(32), 0, all_logits=True)
    out["bf16_four_tiers"] = {"tiers": {t.value: n for t, n in model.placement.counts().items() if n},
                              "tokens": len(fin.token_ids), "decode_tok_s": round(fin.decode_tok_s, 1),
                              "finite": bool(torch.isfinite(logits).all()), "seconds": round(time.perf_counter() - t0, 2)}
    del model, gen
    release()  # the gpu tests after this stage measure the device's free memory
    ctx.emit("native", out)
    return out
