"""A reply as the terminal chat shows it (`mixdesk chat`), and the bar of a long prompt's reading."""
from __future__ import annotations

import sys


class ReadingBar:
    """A long prompt's reading as a bar on stderr, redrawn at each chunk the engine reads (its
    PromptProgress events); wiped once the reply starts, the reply's prefix written again."""

    WIDTH = 30

    def __init__(self, on: bool = True, prefix: str = ""):
        self.on, self.prefix = on, prefix
        self.last = None  # the last progress said (a Stop kept what it read)
        self._drawn = 0  # characters of the bar on the line now

    def show(self, ev) -> None:
        self.last = ev
        if not self.on:
            return
        fill = int(self.WIDTH * ev.read / max(ev.total, 1))
        text = f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {ev.describe()}"
        sys.stderr.write("\r" + text.ljust(self._drawn))
        sys.stderr.flush()
        self._drawn = len(text)

    def clear(self) -> None:
        if self._drawn:
            sys.stderr.write("\r" + " " * self._drawn + "\r")
            sys.stderr.flush()
            self._drawn = 0
            if self.prefix and sys.stdout.isatty() and sys.stderr.isatty():  # the bar was drawn over it
                print(self.prefix, end="", flush=True)


class Reply:
    """A reply as the terminal shows it: the reasoning dimmed in brackets (on a terminal), then the
    answer; tool calls named (the terminal chat has no tools to run). reading: the bar of its prompt's
    reading, wiped as the reply starts."""

    def __init__(self, reading: ReadingBar | None = None):
        self.thinking = False
        self.dim = sys.stdout.isatty()
        self.reading = reading or ReadingBar(on=False)

    def reasoning(self, text: str) -> None:
        self.reading.clear()
        if not self.thinking:
            self.thinking = True
            print("\x1b[2m[thinking] " if self.dim else "[thinking] ", end="")
        print(text, end="", flush=True)

    def content(self, text: str) -> None:
        self.reading.clear()
        if self.thinking:
            self.thinking = False
            print("\x1b[0m\n" if self.dim else "\n", end="")
        print(text, end="", flush=True)

    def end(self, fin) -> None:
        self.reading.clear()
        if self.thinking:
            self.content("")
        for call in fin.tool_calls:
            print(f"\n[tool call: {call.name}({call.arguments}); the terminal chat has no tools to run]", end="")
        for note in fin.notes:
            print(f"\n[{note}]", end="")
        print()
