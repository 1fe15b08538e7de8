"""The `mixdesk` command. With no arguments it opens the desktop app on the demo model (or on
--model PATH); with a command (chat, bench, plan, eval, demo-model, ...) it runs the engine's CLI."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from engine.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    if argv and (argv[0] in commands or argv[0] in ("-h", "--help")):
        from engine.cli import main as cli_main

        return cli_main(argv)
    model = "demo"
    if len(argv) >= 2 and argv[0] == "--model":
        model = argv[1]
    try:
        from app.main import run
    except ImportError as e:  # no GUI libraries: fall back to the terminal chat
        print(f"mixdesk: the desktop app is not available ({e}); starting the terminal chat", file=sys.stderr)
        from engine.cli import main as cli_main

        return cli_main(["chat"] + (["--model", model] if model != "demo" else []))
    return run(model)


if __name__ == "__main__":
    sys.exit(main())
