"""The GGUF stage: one Q4_K_M GGUF file with its experts on both sides.

The file is written here: the Qwen3-30B-A3B shape cut to a few layers (gpu_check_shapes.GGUF_LAYERS;
its published vocabulary, embeddings and experts) is read from its synthetic checkpoint into a
safetensors folder, one shard per layer, and engine/files/gguf/writer.py converts that folder as
llama.cpp's converter and llama-quantize would (Q4_K gate/up, Q6_K or Q4_K down per layer, Q6_K
output). Then it is loaded with every GGUF tier at random over its experts (engine/experts/gguf_tiers.py):
gpu-16 the exact dequantisation on the GPU, gpu-4 NF4 of it, cpu-16 the file's own blocks in the
native kernel, cpu-4 its 4-bit blocks as they are and the rest re-quantised, cpu-3 and cpu-2 likewise at 3
and 2 bits, and decodes.

Checked: the reply's length and finite logits, and one expert built both as gpu-16 and as cpu-16
from the same blocks (the largest difference of their outputs over the largest output).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from benchmarks import gpu_check_shapes as shapes

GB = 10**9


def to_safetensors(src: Path, dst: Path) -> Path:
    """The synthetic checkpoint at src as a safetensors folder (bf16, a shard per layer), with its
    config and tokenizer: what the GGUF writer reads."""
    from safetensors.torch import save_file

    from engine.sources.synthetic import MARKER, SyntheticCheckpoint

    ck = SyntheticCheckpoint(src)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != MARKER:
            shutil.copy(f, dst / f.name)
    groups: dict[str, list[str]] = {}
    for name in ck.expected:
        part = name.split(".")[2] if name.startswith("model.layers.") else "dense"
        groups.setdefault(part, []).append(name)
    weight_map = {}
    for i, (part, names) in enumerate(sorted(groups.items())):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: ck.read(n).to(torch.bfloat16).contiguous() for n in names}, str(dst / file),
                  metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def expert_agreement(model, layer: int = 0, expert: int = 0) -> float:
    """Largest |gpu-16 - cpu-16| over the largest output of one expert on the same inputs."""
    from engine.placement import Tier

    x = torch.randn(4, model.dims.hidden, generator=torch.Generator().manual_seed(9)).to(model.dtype)
    on_gpu = model.build(layer, expert, Tier.GPU16)(x.to(model.accel)).float().cpu()
    on_cpu = model.build(layer, expert, Tier.CPU16)(x).float()
    return float((on_gpu - on_cpu).abs().max() / on_gpu.abs().max())


def prefill_copy(model, tokens: int = 256, rehearse: bool = False) -> dict:
    """A long prompt's CPU-resident GGUF experts copied to the GPU for the prompt (issue 45, item 6):
    one such expert's copy (its file rows across, dequantised there: engine/files/gguf/torch_dequant.py) timed
    and checked against the native kernels, the offload costs the model measured at load, and a
    `tokens`-token prefill with those costs (the copy taken where they say it wins) against one that
    keeps every CPU expert on the CPU. rehearse: on a CPU model too (the CPU rehearsal runs the code;
    its figures mean nothing)."""
    from engine.machine.devices import best_time
    from engine.experts.expert import QuantExpert

    ex = next((e for b in model.moe for e in b.experts if isinstance(e, QuantExpert) and e.copyable
               and not e.tier.on_accelerator), None)
    if ex is None or (model.accel.type != "cuda" and not rehearse):
        return {"skipped": "no copyable CPU expert on a CUDA model"}
    x = torch.randn(tokens, model.dims.hidden, generator=torch.Generator().manual_seed(4)).to(model.dtype)
    copy = ex.to(model.accel, model.dtype)
    y_cpu, y_gpu = ex(x).float(), copy(x.to(model.accel)).float().cpu()
    out = {"expert_bytes": ex.nbytes, "expert_format": [ex.w13.qtype.name, ex.w2.qtype.name],
           "copy_s": best_time(lambda: ex.to(model.accel, model.dtype), model.accel, 3),
           "cpu_expert_s": best_time(lambda: ex(x), torch.device("cpu"), 3),
           "gpu_expert_s": best_time(lambda: copy(x.to(model.accel)), model.accel, 3),
           "max_rel_diff": float((y_cpu - y_gpu).abs().max() / y_cpu.abs().max())}
    costs = model.offload
    if costs is not None:
        out["costs"] = {k: getattr(costs, k) for k in ("cpu_fixed_s", "cpu_per_token_s", "gpu_fixed_s",
                                                          "gpu_per_token_s", "h2d_bytes_per_s")}
        out["copy_wins_at"] = {n: costs.copy_wins(n, ex.nbytes) for n in (1, 16, 64, tokens)}
    ids = torch.randint(3, model.dims.vocab, (tokens,), generator=torch.Generator().manual_seed(5))
    for label, c in (("cpu_only", None), ("measured", costs)):
        model.set_offload(c)
        for b in model.moe:
            b.copied = 0
        cache = model.new_cache(tokens + 8)
        model.forward(ids[:32], cache, 0)  # warm
        t0 = time.perf_counter()
        model.forward(ids, cache, 0)
        if model.accel.type == "cuda":
            torch.cuda.synchronize()
        out[f"prefill_{label}_tok_s"] = round(tokens / (time.perf_counter() - t0), 1)
        out[f"prefill_{label}_copied"] = sum(b.copied for b in model.moe)
    model.set_offload(costs)
    return out


def run(ctx) -> dict:
    from benchmarks.gpu_check_sweep import release
    from engine.runtime.generate import SamplingParams
    from engine.files.gguf import open_gguf
    from engine.files.gguf.writer import write_gguf
    from engine.runtime.load import load
    from engine.placement import ALL_TIERS, Placement

    o, cuda = ctx.opts, torch.cuda.is_available()
    layers = shapes.GGUF_LAYERS
    res = {"model": shapes.label("qwen3", ctx.small, layers), "recipe": "q4_k_m"}
    t0 = time.perf_counter()
    src = shapes.synthetic(ctx.work, "qwen3", ctx.small, layers)
    folder = to_safetensors(src, ctx.work / "gguf-safetensors")
    res["safetensors_gb"] = round(sum(f.stat().st_size for f in folder.glob("*.safetensors")) / GB, 3)
    res["safetensors_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    path = write_gguf(folder, ctx.work / "qwen3-q4_k_m.gguf", "q4_k_m")[0]
    res["write_s"] = round(time.perf_counter() - t0, 1)
    shutil.rmtree(folder)  # the device's disk holds the file, not both
    ck = open_gguf(path)
    res.update(file_gb=round(path.stat().st_size / GB, 3), format=ck.format_label(),
               expert_types=sorted(t.name for t in ck.expert_formats()))
    d = ck.dims
    ck.close()
    ctx.emit("gguf", res)
    t0 = time.perf_counter()
    loaded = load(path, Placement.random(d.layers, d.experts, ALL_TIERS, 2), None if cuda else "cpu",
                  ctx=o.prompt_tokens + o.new_tokens + 16)
    m = loaded.model
    res["load_s"] = round(time.perf_counter() - t0, 1)
    res["tiers"] = {t.value: n for t, n in m.placement.counts().items() if n}
    loaded.generator.eos_ids.clear()
    prompt = torch.randint(3, d.vocab, (o.prompt_tokens,), generator=torch.Generator().manual_seed(3)).tolist()
    fin = list(loaded.generator.stream(prompt, SamplingParams(max_new_tokens=o.new_tokens)))[-1]
    logits = m.forward(torch.tensor(prompt[:8]), m.new_cache(16), 0, all_logits=True)
    res.update(tokens=len(fin.token_ids), tokens_asked=o.new_tokens, decode_tok_s=round(fin.decode_tok_s, 2),
               prefill_s=round(fin.prefill_s, 3), finite=bool(torch.isfinite(logits).all()),
               gpu16_vs_cpu16_max_rel_diff=round(expert_agreement(m), 5))
    if cuda or ctx.small:
        try:
            res["prefill_copy"] = prefill_copy(m, rehearse=not cuda)
        except Exception as e:  # noqa: BLE001 - its own result; the stage's others stand
            res["prefill_copy"] = {"error": f"{type(e).__name__}: {e}"}
    loaded.ckpt.close()
    del loaded, m
    release()
    ctx.emit("gguf", res)
    return res
