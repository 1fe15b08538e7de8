import subprocess
import sys


def mixdesk(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_chat_non_interactive(tiny):
    r = mixdesk("chat", "--model", str(tiny), "--prompt", "hello", "--max-new-tokens", "8", "--dtype", "fp32")
    assert r.returncode == 0, r.stderr
    assert "CPU-only" in r.stderr  # says how it runs
    assert "decode" in r.stderr and "tok/s" in r.stderr


def test_chat_interactive_two_turns(tiny):
    p = subprocess.run([sys.executable, "-m", "engine.cli", "chat", "--model", str(tiny), "--max-new-tokens", "5"],
                       input="hello\nworld\n/quit\n", capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("mixdesk> ") == 2


def test_bench_prints_figures(tiny_sharded):
    r = mixdesk("bench", "--model", str(tiny_sharded), "--new-tokens", "8", "--prompt-tokens", "8",
                "--repeats", "1")
    assert r.returncode == 0, r.stderr
    for word in ("prefill", "decode", "peak RSS", "peak VRAM"):
        assert word in r.stdout


def _cached(tmp_path):
    import os

    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_plan_prints_the_frontier_and_writes_a_plot(tiny, tmp_path):
    png = tmp_path / "f.png"
    args = [sys.executable, "-m", "engine.cli", "plan", "--model", str(tiny), "--dtype", "fp32", "--png", str(png)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "tok/s (pred.)" in r.stdout and "prefill 512 tok" in r.stdout and "frontier computed in" in r.stdout
    assert png.stat().st_size > 1000
    hw = next((tmp_path / "cache").rglob("hardware.json"))
    before = hw.stat().st_mtime_ns
    r = subprocess.run(args + ["--remeasure"], capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    assert hw.stat().st_mtime_ns > before  # measured anew


def test_plan_from_mixtral_config_alone(tmp_path):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "resources" / "mixtral-8x7b-config.json"
    r = subprocess.run([sys.executable, "-m", "engine.cli", "plan", "--model", str(cfg), "--config-only",
                        "--gpu-budget", "24", "--ram-budget", "64", "--png", ""],
                       capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "ASSUMED" in r.stdout and "gpu-4" in r.stdout and "NOTHING FITS" not in r.stdout


def test_eval_measures_quality_and_speed(tiny, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine.cli", "eval", "--model", str(tiny), "--dtype", "fp32",
                        "--slider", "0", "--tokens", "64", "--new-tokens", "8"],
                       capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout.lower()
    assert "perplexity" in out and "kl" in out and "tok/s" in out
