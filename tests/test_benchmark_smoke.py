"""The benchmarks' smoke settings, so that none rots unseen (issue 47): slow, outside the default run."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_migration_benchmark_moves_experts_and_prints_its_stall():
    r = subprocess.run([sys.executable, "benchmarks/migration.py", "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "expert moves:" in r.stdout and "the median step" in r.stdout, r.stdout
