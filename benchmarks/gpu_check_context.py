"""What a stage of the GPU check gets (benchmarks/gpu_check.py runs the stages in child processes):
its options, the run's work folder, the card it runs under, its deadline, and emit(), which hands a
result on at once through the child's status file (the parent polls it and rewrites the report), so
that what a stage measured survives a kill later in the stage."""
from __future__ import annotations

import json
import time
from pathlib import Path


class Skip(Exception):
    """A stage that cannot run here, and why (recorded as skipped, not as an error)."""


class Context:
    def __init__(self, small: bool, work: Path, opts, status: Path, run_stages: list[str]):
        self.small, self.work, self.opts = small, work, opts
        self.run_stages = run_stages  # every stage of the run, not only this child's
        self.status, self.deadline = status, float("inf")
        self.results, self.stages = {}, {}
        self.keep = {}  # what a stage leaves to a later one in this process (a loaded model)
        self.card = None  # gpu_check_memory.emulate_card's account of the card

    def left(self) -> float:
        """Seconds left of the running stage's budget."""
        return self.deadline - time.time()

    def emit(self, key: str, value, show=None) -> None:
        """value is key's whole result so far; the log gets `show` (default: its newest row, or all of it)."""
        self.results[key] = value
        self._write()
        if show is None:
            show = value["rows"][-1] if isinstance(value, dict) and value.get("rows") else value
        print(f"[{key}] {json.dumps(show, default=str)[:400]}", flush=True)

    def mark(self, name: str, **status) -> None:
        self.stages[name] = {**self.stages.get(name, {}), **status}
        self._write()

    def _write(self) -> None:
        tmp = self.status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"results": self.results, "stages": self.stages}, default=str))
        tmp.replace(self.status)
