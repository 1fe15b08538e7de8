import subprocess
import sys

import pytest


def mixdesk(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "engine.tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_chat_non_interactive(tiny, window_cache):  # the cache a first start left: no measuring
    r = mixdesk("chat", "--model", str(tiny), "--prompt", "hello", "--max-new-tokens", "8", "--dtype", "fp32")
    assert r.returncode == 0, r.stderr
    assert "CPU-only" in r.stderr  # says how it runs
    assert "decode" in r.stderr and "tok/s" in r.stderr


def test_chat_interactive_two_turns(tiny, window_cache):
    p = subprocess.run([sys.executable, "-m", "engine.tools.cli", "chat", "--model", str(tiny), "--max-new-tokens", "5"],
                       input="hello\nworld\n/quit\n", capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("mixdesk> ") == 2


def test_terminal_chat_help_lists_its_commands_and_exit_ends_it(tiny, window_cache):
    """/help lists the slash commands (and is not sent to the model); /exit ends the chat, exit code 0,
    with lines still waiting after it left unread; an unknown /word is said, not sent."""
    p = subprocess.run([sys.executable, "-m", "engine.tools.cli", "chat", "--model", str(tiny), "--dtype", "fp32",
                        "--max-new-tokens", "5"], input="/help\n/nonesuch\nhello\n  /exit  \nnever sent\n",
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("mixdesk> ") == 1, p.stdout  # "hello" only
    helped = p.stdout.split("you> ")[1]  # what /help printed
    for command in ("/help", "/exit", "/quit"):
        assert command in helped, helped
    assert "unknown command /nonesuch" in p.stdout and "/help lists" in p.stdout


def test_bench_prints_figures(tiny_sharded, window_cache):
    r = mixdesk("bench", "--model", str(tiny_sharded), "--new-tokens", "8", "--prompt-tokens", "8",
                "--repeats", "1")
    assert r.returncode == 0, r.stderr
    for word in ("prefill", "decode", "peak RSS", "peak VRAM"):
        assert word in r.stdout


def _cached(tmp_path):
    """The environment with this test's own cache (window_cache or pinned_machine, in the test's arguments:
    a copy of the run's measured one or a fixed one, so the child does not measure the machine again)."""
    import os

    assert os.environ["XDG_CACHE_HOME"] == str(tmp_path / "cache"), "the test needs the window_cache fixture"
    return dict(os.environ)


@pytest.mark.slow  # 28 s (measures the machine twice); test_cli_exit runs plan in the default run
def test_plan_prints_the_frontier_and_writes_a_plot(tiny, tmp_path, window_cache):
    png = tmp_path / "f.png"
    args = [sys.executable, "-m", "engine.tools.cli", "plan", "--model", str(tiny), "--dtype", "fp32", "--png", str(png)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "tok/s (pred.)" in r.stdout and "prefill 512 tok" in r.stdout and "frontier computed in" in r.stdout
    assert png.stat().st_size > 1000
    hw = next((tmp_path / "cache").rglob("hardware.json"))
    before = hw.stat().st_mtime_ns
    r = subprocess.run(args + ["--remeasure"], capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    assert hw.stat().st_mtime_ns > before  # measured anew


def test_plan_from_mixtral_config_alone(tmp_path, pinned_machine):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "resources" / "mixtral-8x7b-config.json"
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "plan", "--model", str(cfg), "--config-only",
                        "--gpu-budget", "24", "--ram-budget", "64", "--png", ""],
                       capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "ASSUMED" in r.stdout and "gpu-4" in r.stdout and "NOTHING FITS" not in r.stdout
    # --streams 4: the same placements' aggregate rate with four requests decoding together
    r4 = subprocess.run([sys.executable, "-m", "engine.tools.cli", "plan", "--model", str(cfg), "--config-only",
                         "--gpu-budget", "24", "--ram-budget", "64", "--png", "", "--streams", "4"],
                        capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r4.returncode == 0, r4.stderr

    def fastest(out):
        return max(float(line.split("|")[3]) for line in out.splitlines() if line.startswith("| ") and
                   line.split("|")[1].strip().isdigit())
    assert "4 requests decoding together" in r4.stdout
    assert fastest(r.stdout) < fastest(r4.stdout) < 4 * fastest(r.stdout)


@pytest.mark.slow  # 14 s; eval's numbers are checked directly in test_families and test_gguf_model
def test_eval_measures_quality_and_speed(tiny, tmp_path, window_cache):
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "eval", "--model", str(tiny), "--dtype", "fp32",
                        "--slider", "0", "--tokens", "64", "--new-tokens", "8"],
                       capture_output=True, text=True, timeout=300, env=_cached(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout.lower()
    assert "perplexity" in out and "kl" in out and "tok/s" in out


def test_terminal_chat_is_a_client_of_the_engine_thread(tiny, capsys, window_cache):
    """Issue 14, must show 3: `mixdesk chat` runs through Session. The terminal chat receives the
    engine thread's events (placement, tokens, done), sent from that thread."""
    import threading

    from engine.tools.cli import build_parser, cmd_chat
    from engine.protocol import Done, Loaded, PlacementChanged, Stats, Token

    seen = []
    a = build_parser().parse_args(["chat", "--model", str(tiny), "--prompt", "hello", "--max-new-tokens", "6",
                                   "--dtype", "fp32", "--device", "cpu"])
    assert cmd_chat(a, on_event=lambda e: seen.append((type(e), threading.current_thread().name))) == 0
    kinds = {k for k, _ in seen}
    assert {Loaded, PlacementChanged, Token, Done, Stats} <= kinds
    assert {name for _, name in seen} == {"MainThread"}  # handed over from the engine thread's queue
    assert capsys.readouterr().out.strip()  # the reply was printed


def test_interactive_chat_that_outgrows_the_context_says_so_and_carries_on(tiny, monkeypatch, capsys, window_cache):
    from engine.tools.cli import build_parser, cmd_chat

    lines = iter(["a" * 40, "b" * 40, "c" * 300, "hi"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    a = build_parser().parse_args(["chat", "--model", str(tiny), "--ctx", "96", "--max-new-tokens", "8",
                                   "--dtype", "fp32", "--device", "cpu", "--placement", "cpu"])
    assert cmd_chat(a) == 0
    out = capsys.readouterr()
    assert "oldest exchange was dropped" in out.err
    assert "the prompt is" in out.err and "context holds" in out.err  # the 300-character message alone
    assert out.out.count("mixdesk> ") == 4
    assert out.err.count("decode") == 3  # three replies: before, after the drop, and after the refusal


def test_mixdesk_without_a_display_starts_the_terminal_chat_on_the_same_engine(tiny, window_cache):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    p = subprocess.run([sys.executable, "-m", "app.entry", "--model", str(tiny), "--device", "cpu"],
                       input="hello\n", capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "no display" in p.stderr and "terminal chat" in p.stderr
    assert p.stdout.count("mixdesk> ") == 1 and "decode" in p.stderr


@pytest.mark.parametrize("argv", [["server"], ["runtime", "upgrade"], ["--no-such-flag"], ["chat", "--bogus"]])
def test_the_app_entry_uses_the_one_parser(argv, capsys):
    from app.entry import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: mixdesk" in err and "Traceback" not in err
