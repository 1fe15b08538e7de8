"""The `mixdesk` command. With no arguments it opens the desktop app on the demo model (or on
--model PATH); with a command (chat, bench, plan, eval, demo-model, ...) it runs the engine's CLI."""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--self-test"]:
        from app.self_test import run as self_test

        return self_test()
    from engine.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    if argv and (argv[0] in commands or argv[0] in ("-h", "--help")):
        from engine.cli import main as cli_main

        return cli_main(argv)
    model = "demo"
    if len(argv) >= 2 and argv[0] == "--model":
        model = argv[1]
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
        from engine.cli import main as cli_main

        return cli_main(["chat"] + (["--model", model] if model != "demo" else []))
    return run(model)


if __name__ == "__main__":
    sys.exit(main())
