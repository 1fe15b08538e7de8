"""The machine stage: what the other stages' numbers were measured on.

The CPU (model, cores, the AVX-512 and AMX features it reports), whether the native CPU kernels
loaded and which code path they chose (engine/native: AVX-512 VNNI, AVX2 or portable C, from
CPUID at load), the GPU and its driver, whether bitsandbytes' NF4 runs there, and the hardware
profile the planner predicts from (each tier's measured cost, host<->device copy bandwidth;
measured once here and cached for the stages after, as at the app's first start), with the read
bandwidth of GPU memory and of RAM.
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

GB = 10**9


def cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    import psutil

    wanted = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma", "f16c"))
    return {"model": model, "cores": os.cpu_count(), "ram_gb": round(psutil.virtual_memory().total / GB, 1),
            "features": wanted, "amx": any(f.startswith("amx") for f in flags)}


def native_kernels() -> dict:
    from engine import native

    return {"on": native.available(), "status": native.status(), "threads": native.threads() if native.available() else 0,
            "disabled_by_env": os.environ.get("MIXDESK_NATIVE") == "0"}


def gpu() -> dict:
    if not torch.cuda.is_available():
        return {"name": "no CUDA device (rehearsal)", "torch": torch.__version__}
    p = torch.cuda.get_device_properties(0)
    out = {"name": p.name, "total_gb": round(p.total_memory / GB, 1), "multiprocessors": p.multi_processor_count,
           "torch": torch.__version__, "cuda": torch.version.cuda, "bf16": torch.cuda.is_bf16_supported()}
    try:
        import pynvml

        pynvml.nvmlInit()
        out["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as e:  # noqa: BLE001 - NVML missing: the rest still stands
        out["driver"] = f"NVML unavailable: {type(e).__name__}"
    return out


def nf4() -> dict:
    """bitsandbytes' NF4 on the accelerator, once: every gpu-4 expert needs it, and so does the
    hardware profile (it times that tier), so where it fails every load fails, and this says why."""
    from engine.experts.quant import NF4

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        import bitsandbytes

        q = NF4.quantize(torch.randn(256, 512), dev, torch.bfloat16)
        y = q.matmul(torch.randn(1, 512, device=dev, dtype=torch.bfloat16))
        return {"bitsandbytes": bitsandbytes.__version__, "ok": bool(torch.isfinite(y).all())}
    except Exception as e:  # noqa: BLE001 - the failure is the finding
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def accelerator_bandwidth(mib: int = 1024) -> float | None:
    """Bytes/s a sum reads from GPU memory (best of 5), or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device="cuda")
    best = float("inf")
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.sum()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del x
    torch.cuda.empty_cache()
    return mib * 2**20 / best


def bandwidths(mib: int = 1024) -> dict:
    """Read bandwidths in bytes/s over buffers of mib MiB (far past the caches): 'accelerator'
    (None without CUDA) and 'host'."""
    from engine.tools.bench_kernels import read_bandwidth

    return {"accelerator": accelerator_bandwidth(mib), "host": read_bandwidth(mib)}


def hardware_profile() -> dict:
    from engine.measures.hardware import load_or_measure

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    hw = load_or_measure(dev)
    tiers = {t: {"fixed_us": round(fixed * 1e6, 1), "gb_s": round(1 / per_byte / GB, 1)}
             for t, (fixed, per_byte) in hw.tier_costs.items()}
    copy = {k: round(v / GB, 1) for k, v in (("h2d_gb_s", hw.h2d_bytes_per_s), ("d2h_gb_s", hw.d2h_bytes_per_s)) if v}
    return {"seconds": round(time.perf_counter() - t0, 1), "tiers": tiers, **copy}


def run(ctx) -> dict:
    out = {"cpu": cpu(), "native": native_kernels(), "gpu": gpu(), "python": platform.python_version(), "nf4": nf4()}
    ctx.emit("machine", out)
    out["hardware_profile"] = hardware_profile()
    out["bandwidth_gb_s"] = {k: None if v is None else round(v / GB, 1) for k, v in bandwidths(ctx.opts.bandwidth_mib).items()}
    ctx.emit("machine", out)
    return out
