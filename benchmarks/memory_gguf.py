"""Peak memory of a GGUF model with every expert on the CPU (issue 26): the process's peak RSS while
it opens the file, builds every expert and dense matrix in the file's own blocks, and decodes, against
the bytes the model keeps resident (experts + dense + KV cache).

    python benchmarks/memory_gguf.py [FILE.gguf ...]     (default: the cpu_vs_llama_cpp Q4_K_M files)
    python benchmarks/memory_gguf.py --smoke    (benchmarks/real_scale_files.py's toy-sized Qwen3, ~10 MB)

Each file runs in a fresh child process: RSS before the model is built (Python, torch, the engine
imported) is the baseline, and the figure is (peak RSS - baseline) / resident bytes. The file is
read with positional reads into buffers the engine owns, so the page cache does not count.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import CACHE, record  # noqa: E402

CHILD = r"""
import json, resource, sys, time, torch, psutil
from engine.runtime.load import open_checkpoint
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.native.dense_linear import auto_dtype
cpu = torch.device("cpu")
dtype = auto_dtype(cpu)
base = psutil.Process().memory_info().rss
t0 = time.perf_counter()
ck = open_checkpoint(sys.argv[1])
d = ck.dims
m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU16), cpu, dtype)
load_s = time.perf_counter() - t0
cache = m.new_cache(1024)
tok = int(m.forward(torch.arange(3, 35), cache, 0)[-1].argmax())
for i in range(64):
    tok = int(m.forward(torch.tensor([tok]), cache, 32 + i)[-1].argmax())
cache.k[:, :, :96].zero_(); cache.v[:, :, :96].zero_()  # the 96 positions used are resident
eb = m.expert_bytes()
kv = 2 * cache.k[:, :, :96].numel() * cache.k.element_size()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"file": sys.argv[1], "label": ck.format_label(), "file_bytes": sum(p.stat().st_size for p in ck.file.parts),
                  "baseline_rss": base, "peak_rss": peak, "experts": eb["host"], "dense": m.dense_bytes(),
                  "kv_used": kv, "load_s": load_s}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="GGUF files (default: the cpu_vs_llama_cpp Q4_K_M files)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        from benchmarks import real_scale_files

        a.files = [real_scale_files.write(real_scale_files.SMOKE, log=lambda m: print(m, flush=True))]
    files = a.files or [CACHE / "demo-q4_k_m.gguf", CACHE / "mixtral-width-q4_k_m.gguf"]
    rows = ["| file | what it holds | resident (experts + dense + KV used) | peak RSS - baseline | ratio |",
            "|---|---|---|---|---|"]
    res = []
    for f in files:
        if not f.exists():
            print(f"skipping {f}: not there (run benchmarks/cpu_vs_llama_cpp.py first)")
            continue
        out = subprocess.run([sys.executable, "-c", CHILD, str(f)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["resident"] = r["experts"] + r["dense"] + r["kv_used"]
        r["ratio"] = (r["peak_rss"] - r["baseline_rss"]) / r["resident"]
        res.append(r)
        mib = 2 ** 20
        rows.append(f"| {f.name} ({r['file_bytes'] / mib:.0f} MiB) | {r['label']} | {r['resident'] / mib:.0f} MiB "
                    f"({r['experts'] / mib:.0f} + {r['dense'] / mib:.0f} + {r['kv_used'] / mib:.1f}) | "
                    f"{(r['peak_rss'] - r['baseline_rss']) / mib:.0f} MiB (baseline {r['baseline_rss'] / mib:.0f}) | "
                    f"**{r['ratio']:.2f}x** |")
    table = "\n".join(rows) + "\n\ntarget: peak RSS over the baseline <= 1.2x the resident bytes"
    print(table)
    print(f"recorded {record('memory_gguf', {'runs': res}, table)}")


if __name__ == "__main__":
    main()
