"""Every benchmark's smoke setting (`--smoke`: the smallest run through every stage), so that none rots unseen
(issue 47). The runs are slow (10-60 s each, ~15 min for all): `pytest -m slow tests/test_benchmark_smoke.py`.
The default run checks only that every benchmark script has the setting and a line here to look for.

Each run records where MIXDESK_BENCH_RESULTS says (a temporary folder here; benchmarks/common.py sends a
smoke run's records to the system's temporary folder when it is unset, never to benchmarks/results/)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
NUM = r"[\d.]+"

# script -> (a line its smoke output always prints: its headline figure or table row, whether it records a .md)
SMOKE = {
    "calibration_memory": (rf"^peak RssAnon over \d+ steps: {NUM} GiB$", False),
    "concurrent_streams": (rf"^\| 2 \| {NUM} \| {NUM} \| ", True),
    "cpu_vs_llama_cpp": (rf"^\| engine cpu-4 \(\d+ MiB/step\) \| {NUM} \| \d+% \| {NUM} \|$", True),
    "decode_step": (r"^\| cpu-16 \| native step \| .* \|$", True),
    "decode_vs_transformers": (rf"^- ratio engine / best stock at bf16 \(\w+\): \*\*{NUM}x\*\*$", True),
    "expert_kernels": (r"^\| cpu-4 \| \d+% \|$", True),
    "first_start_calibration": (rf"^calibrated after \d+ steps in {NUM} s; peak RssAnon {NUM} GiB, peak RssFile "
                                rf"{NUM} GiB$", False),
    "frontier_from_config": (rf"^Frontier computed in {NUM} ms, median of \d+ \(first call {NUM} ms; \d+ points\)\.$",
                             True),
    "hybrid_vs_llama_cpp": (r"^\d+ new tokens after a 32-token prompt, greedy, \d+ threads on both sides, best of \d+ "
                            r"interleaved rounds$", True),
    "kernels_raw": (r"^\| qwen3 down \| Q4_K \| \[2048, 768\] \| ", True),
    "kv8_quality": (r"^\| 0-63 \| [\d.e+-]+ \| ", True),
    "low_bit_decode": (rf"^\| qwen3-smoke-q3_k_m\.gguf \| {NUM} \| \d+ MB \| .*\*\*{NUM}x\*\*", True),
    "mapped_16bit": (rf"Decode, best of each: mapped {NUM} vs copied {NUM} tok/s \({NUM}x\)", True),
    "memory_gguf": (rf"^\| qwen3-smoke-q4_k_m\.gguf \(\d+ MiB\) \| .* \| \*\*{NUM}x\*\* \|$", True),
    "memory_real_width": (rf"^\| all cpu-16 \| {NUM} GiB \| {NUM} GiB \| {NUM} \| {NUM} GiB \|$", True),
    "migration": (r"expert moves: [1-9]\d* .*\n.*\*\*[\d.]+x\*\* the median step", True),
    "mixtral_frontier": (rf"^Frontier computed in {NUM} ms, median of \d+ \(first call {NUM} ms; \d+ points\)\.$", True),
    "mla_absorbed": (rf"^\| 256 \| {NUM} \| {NUM} \| {NUM}x \| {NUM} \|$", True),
    "planner_predictions": (r"^- Spearman\(predicted, measured tok/s\) = \*\*(-?[\d.]+|nan)\*\*; worst error \d+%$", True),
    "prefill": (r"^Mixdesk's prefill at 64 tokens is \d+% of its rate at 32\.$", True),
    "prefill_raw_vs_tiles": (r"^\| \[1024, 2048\] \| 16 \| ", True),
    "q4_grid_quality": (rf"^- row-offset .*: Q4_K {NUM} at {NUM} bits vs the 5-bit grid", True),
    "real_scale": (r"^\| Mixdesk cpu \| 1 \| ok \| ", True),
    "real_scale_files": (rf"^wrote \S+/qwen3-smoke-q4_k_m\.gguf \({NUM} GB\) in \d+ s$", False),
    "serve_document": (r"^- the request: \d+ prompt tokens \(the document counted [\d,]+ by the file's tokenizer\), "
                       rf"\d+ reply tokens in {NUM} s", True),
    "server_stack": (rf"^\| starlette \+ uvicorn \| {NUM} \| {NUM} \| \d+ \| \d+ \|$", True),
    "small_experts_scale": (rf"^migration, all [\d,]+ experts cpu-16 -> cpu-4 \(Model\.apply\): {NUM} s = {NUM} ms an "
                            r"expert", True),
    "versus_parent": (rf"^  frontier ms \(median\)\s+base\s+{NUM}\s+this\s+{NUM}\s+ratio {NUM}$", True),
}
# its smoke setting is `--small`'s CPU rehearsal, run stage by stage by tests/test_gpu_check.py (slow)
REHEARSED_ELSEWHERE = {"gpu_check"}


def scripts() -> set[str]:
    return {p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8")}


def test_every_benchmark_has_a_smoke_setting_and_a_line_to_look_for():
    assert scripts() == set(SMOKE) | REHEARSED_ELSEWHERE
    for name in scripts():
        assert '"--smoke"' in (BENCH / f"{name}.py").read_text(encoding="utf-8"), name


def test_no_benchmark_shadows_an_installed_package():
    """A script runs with benchmarks/ first on the path: benchmarks/kernels.py once stood in for the `kernels`
    package transformers imports, and every benchmark that wrote a model failed."""
    import importlib.util

    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() not in (BENCH, ROOT)]
    try:
        shadowing = [p.stem for p in BENCH.glob("*.py") if p.stem != "__init__" and importlib.util.find_spec(p.stem)]
    finally:
        sys.path[:] = saved
    assert not shadowing


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_smoke_setting_runs(name, tmp_path):
    pattern, records = SMOKE[name]
    env = {**os.environ, "MIXDESK_BENCH_RESULTS": str(tmp_path / "results")}
    r = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--smoke"], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(pattern, r.stdout, re.M), r.stdout[-3000:]
    if records:
        assert list((tmp_path / "results").glob("*.md")), sorted((tmp_path / "results").glob("*"))
