"""Record `mixdesk bench kernels`: one Mixtral-size expert (4096 x 14336) in every tier present,
time per token at batch 1/4/16/128 and the fraction of read bandwidth at batch 1.

    python benchmarks/kernels.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402
from engine import bench_kernels  # noqa: E402


def main() -> None:
    lines: list[str] = []

    def out(s: str) -> None:
        print(s)
        lines.append(s)

    res = bench_kernels.run(out=out)
    table = "```\n" + "\n".join(lines) + "\n```\nTarget: CPU tiers at batch 1 reach >= 80% of the read bandwidth."
    print(f"recorded {record('kernels', res, table)}")


if __name__ == "__main__":
    main()
