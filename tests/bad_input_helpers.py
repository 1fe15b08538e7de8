"""Shared by several test modules (moved out of tests/test_bad_input.py, which uses them too): chat, home, refused."""
from __future__ import annotations
import time
from pathlib import Path
import pytest
from engine.tools.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Every folder the app may write to, empty; checked afterwards by `nothing_written`."""
    dirs = {v: tmp_path / "home" / v.lower() for v in
            ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    for var, d in dirs.items():
        d.mkdir(parents=True)
        monkeypatch.setenv(var, str(d))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


def files(*roots: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for r in roots for p in sorted(r.rglob("*")) if p.is_file()}


def refused(capsys, home: Path, argv: list[str], *words: str, folder: Path | None = None,
            max_s: float = 60.0) -> str:
    """Run mixdesk argv; assert exit code 2, one line on stderr naming the problem, no traceback,
    nothing written, and a bounded time. Returns the line."""
    watched = [home] + ([folder] if folder else [])
    before = files(*watched)
    t0 = time.perf_counter()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse refuses before anything runs
        rc = e.code
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("\r") and "[" not in ln[:2]]
    assert rc == 2, err
    assert "Traceback" not in err, err
    problem = lines[-1]
    assert problem.startswith(("mixdesk: ", "usage:", "mixdesk chat: error", "mixdesk bench: error", "mixdesk runtime: error", "mixdesk serve: error",
                               "mixdesk: error")), err
    for w in words:  # a word, or a tuple of words any one of which will do
        assert any(a.lower() in problem.lower() for a in ((w,) if isinstance(w, str) else w)), problem
    assert files(*watched) == before, "something was written"
    assert seconds < max_s
    print("REFUSED:", problem)
    return problem


def chat(folder: Path, *extra: str) -> list[str]:
    return ["chat", "--model", str(folder), "--prompt", "hi", "--max-new-tokens", "4", "--quiet",
            "--placement", "cpu", *extra]

