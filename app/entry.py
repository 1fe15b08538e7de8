"""The `mixdesk` command. With no command it opens the desktop app on the demo model (or on
--model PATH), or the terminal chat where there is no display; with a command (chat, bench, plan,
eval, demo-model, ...) it runs it. One parser (engine.tools.cli.build_parser) reads the command line."""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--runtime-probe"] and len(argv) == 2:  # the frozen app as its own child (runtime/activate.py)
        from engine.tools.runtime.activate import probe

        return probe(argv[1])
    # before anything imports torch: the fetched GPU runtime's torch, or the bundled one and why
    from engine.tools.runtime.activate import activate

    started = activate()
    if started.state == "fallback":
        print(f"mixdesk: {started.message}", file=sys.stderr)
    if started.state == "active":
        _engine_runs_on_the_runtime(started)
    from engine.tools.cli import build_parser, chat_args, run as run_command

    a = build_parser().parse_args(argv)  # unknown input: exit code 2
    if a.self_test:
        from app.self_test import run as self_test

        return self_test()
    if getattr(a, "fn", None):
        return run_command(a)
    reason = None
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                                 or os.environ.get("QT_QPA_PLATFORM")):
        reason = "no display (DISPLAY/WAYLAND_DISPLAY unset)"
    else:
        try:
            from app.main import run
        except ImportError as e:
            reason = f"the GUI libraries are missing ({e})"
    if reason:  # a terminal or a server: the same engine, in the terminal chat
        print(f"mixdesk: {reason}; starting the terminal chat instead of the window", file=sys.stderr)
        return run_command(chat_args(a.window_model, a.window_device, a.window_ctx, a.window_kv_bits))
    return run(a.window_model, a.window_device, a.window_ctx, a.window_kv_bits)


def _engine_runs_on_the_runtime(started) -> None:
    """The runtime's torch imported; if the engine then fails to import on it (a torch too new or too
    old for this Mixdesk), set the runtime aside and start again on the bundled torch: a start never
    fails because of the runtime. Its native libraries are loaded by now, so this process cannot
    switch torch: a fresh one does."""
    try:
        import engine.runtime.session  # noqa: F401  (the engine's whole import chain: transformers, the model, ...)
    except Exception as e:  # noqa: BLE001 - any failure here is the runtime's
        from engine.tools.runtime.activate import set_aside

        why = (f"Mixdesk's engine does not import on its torch ({type(e).__name__}: "
               f"{str(e).splitlines()[0][:200] if str(e) else ''})")
        set_aside(started.folder, why)
        os.environ.update(MIXDESK_RUNTIME="off", MIXDESK_RUNTIME_WHY=why)  # no loop, even if set_aside could not write
        sys.stdout.flush()
        sys.stderr.flush()
        args = sys.argv[1:] if getattr(sys, "frozen", False) else sys.orig_argv[1:]  # -c CODE / -m MODULE kept
        os.execv(sys.executable, [sys.executable] + args)


if __name__ == "__main__":
    sys.exit(main())
