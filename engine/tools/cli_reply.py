"""A reply as the terminal chat shows it (`mixdesk chat`)."""
from __future__ import annotations

import sys


class Reply:
    """A reply as the terminal shows it: the reasoning dimmed in brackets (on a terminal), then the
    answer; tool calls named (the terminal chat has no tools to run)."""

    def __init__(self):
        self.thinking = False
        self.dim = sys.stdout.isatty()

    def reasoning(self, text: str) -> None:
        if not self.thinking:
            self.thinking = True
            print("\x1b[2m[thinking] " if self.dim else "[thinking] ", end="")
        print(text, end="", flush=True)

    def content(self, text: str) -> None:
        if self.thinking:
            self.thinking = False
            print("\x1b[0m\n" if self.dim else "\n", end="")
        print(text, end="", flush=True)

    def end(self, fin) -> None:
        if self.thinking:
            self.content("")
        for call in fin.tool_calls:
            print(f"\n[tool call: {call.name}({call.arguments}); the terminal chat has no tools to run]", end="")
        for note in fin.notes:
            print(f"\n[{note}]", end="")
        print()
