"""Shared pieces of the benchmarks: the model they run on, read bandwidth, and result files."""
from __future__ import annotations

import json
import os
import platform
import sys
from datetime import date
from pathlib import Path

import torch

from engine.tools.bench_kernels import read_bandwidth  # noqa: F401  (one definition, shared)

HERE = Path(__file__).resolve().parent


def _results() -> Path:
    """Where records go: MIXDESK_BENCH_RESULTS when set (versus_parent.py redirects a run, the smoke test its
    temporary folder), else benchmarks/results/, committed, which a smoke run (--smoke) never writes: its
    records go to a folder under the system's temporary one."""
    if os.environ.get("MIXDESK_BENCH_RESULTS"):
        return Path(os.environ["MIXDESK_BENCH_RESULTS"])
    if {"--smoke", "--quick"} & set(sys.argv[1:]):
        import tempfile

        return Path(tempfile.gettempdir()) / "mixdesk-bench-smoke"
    return HERE / "results"


RESULTS = _results()
CACHE = Path(os.environ.get("MIXDESK_BENCH_CACHE", HERE.parent / ".bench"))

# The demo model's shapes (SmolLM2-135M upcycled to 8 experts, top-2).
DEMO_SHAPE = dict(layers=30, hidden=576, ffn=1536, experts=8, top_k=2, heads=9, kv_heads=3, vocab=49152,
                  tie_word_embeddings=True, rope_theta=100000.0)


def demo_shaped_model() -> Path:
    """The built demo model when present; else a random-weight checkpoint of the same shapes (bf16),
    written once under .bench/. Speed depends on shapes, not on the weights' values."""
    try:
        from engine.sources.demo import demo_dir

        d = demo_dir()
        if (d / "config.json").exists():
            return d
    except ImportError:
        pass
    path = CACHE / "demo-shaped-random"
    if not (path / "config.json").exists():
        from engine.sources.tiny_model import write_tiny_mixtral

        print(f"writing a random checkpoint with the demo model's shapes to {path} ...", flush=True)
        write_tiny_mixtral(path, dtype="bfloat16", **DEMO_SHAPE)
    return path


def smoke_model(name: str = "tiny-mixtral-smoke", **shape) -> Path:
    """A tiny random Mixtral (engine.sources.tiny_model, bf16, with its tokenizer; `shape` overrides its
    sizes) for a --smoke run: written once under the benchmarks' cache (MIXDESK_BENCH_CACHE), into a
    temporary folder then renamed, so that a run cut short or one beside it never leaves half a model."""
    import shutil
    import tempfile

    path = CACHE / name
    if not (path / "config.json").exists():
        from engine.sources.tiny_model import write_tiny_mixtral

        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
        try:
            write_tiny_mixtral(tmp, dtype="bfloat16", **shape)
            tmp.chmod(0o755)  # mkdtemp's is 0o700
            tmp.rename(path)
        except OSError:  # another run wrote it first
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def cpu_tag() -> str:
    """A short name of this CPU's kind for a record's file name ("intel-xeon", "amd-epyc"): this machine
    kind's CPU varies between sessions, and one day's records of both must not overwrite each other."""
    words = machine().split(",")[0].lower().replace("(r)", "").replace("(tm)", "").split()
    return "-".join(w for w in words[:2] if w.isalnum()) or "cpu"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, {gpu}; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, Python {platform.python_version()}")


def record(name: str, payload: dict, table: str) -> Path:
    """Write results/<name>-<date>.json and .md (the table plus how it was made)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = date.today().isoformat()
    cmd = "python " + " ".join([os.path.relpath(sys.argv[0], HERE.parent)] + sys.argv[1:])
    payload = {"date": stamp, "machine": machine(), "command": cmd, **payload}
    base = RESULTS / f"{name}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    base.with_suffix(".md").write_text(
        f"# {name}\n\n- date: {stamp}\n- machine: {payload['machine']}\n- command: `{cmd}`\n\n{table}\n")
    return base.with_suffix(".md")
