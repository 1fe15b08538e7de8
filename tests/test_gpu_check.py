"""The prepared GPU validation script rehearses every stage on the CPU (a small synthetic model), so
that the device run, when a device is lent, does not fail on something a CPU could have caught."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_rehearsal_on_cpu(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "out"),
                        "--small", "--skip-tests", "--settings", "3"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    rows = rep["sweep"]
    assert len(rows) == 3 and all(x["decode_tok_s"] > 0 and x["predicted_tok_s"] > 0 for x in rows)
    assert all(0 < x["of_bound"] < 1.5 for x in rows)
    drop = rep["budget_drop"]
    assert not drop["errors"] and drop["within_new_budget"]
    assert drop["held_after_gb"] < drop["held_before_gb"]
    assert drop["finished_tokens"] == drop["tokens"]  # none lost across the re-placement
    assert (tmp_path / "out" / "gpu_check.png").stat().st_size > 1000
