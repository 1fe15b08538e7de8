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
