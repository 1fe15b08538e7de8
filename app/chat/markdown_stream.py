"""A reply's Markdown cut into blocks as it streams, so the view renders each block once.

A block is a run of text ended by a blank line or a heading (a paragraph, a list, a table, a
heading), or a fenced code block (``` or ~~~, ended by its closing fence). `feed` takes the new
text and returns the blocks it completed; `open` is the block still being written (its complete
lines and the partial last line). Only complete lines are scanned, each once: the work of a feed is
proportional to the new text, never to the reply. No Qt here: the view (app/chat/view.py) renders.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([\w+#.-]*)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]")


@dataclass
class Block:
    kind: str  # "text" (Markdown) or "code" (a fenced block)
    lines: list[str] = field(default_factory=list)  # its complete lines, without their newlines
    lang: str = ""  # a code block's language, as its opening fence names it
    fence: str = ""  # the opening fence (``` or ~~~, maybe longer): the closing one matches it
    closed: bool = False

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class BlockSplitter:
    def __init__(self):
        self.done: list[Block] = []  # the completed blocks, in order
        self._cur = Block("text")
        self._partial = ""  # the last line, not ended yet

    def feed(self, text: str) -> list[Block]:
        """Take the next piece of the reply; the blocks it completed, in order."""
        first = len(self.done)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._line(line)
        return self.done[first:]

    def close(self) -> list[Block]:
        """The reply ended: its last line and block are complete (an unclosed fence ends with it)."""
        first = len(self.done)
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        self._end()
        return self.done[first:]

    @property
    def open(self) -> Block:
        """The block being written (its lines so far); `partial` is its unfinished line."""
        return self._cur

    @property
    def partial(self) -> str:
        return self._partial

    def _end(self) -> None:
        b = self._cur
        if b.kind == "code" or any(line.strip() for line in b.lines):
            b.closed = True
            self.done.append(b)
        self._cur = Block("text")

    def _line(self, line: str) -> None:
        b = self._cur
        if b.kind == "code":
            s = line.strip()
            if s.startswith(b.fence) and not s.strip(b.fence[0]):
                self._end()
            else:
                b.lines.append(line)
            return
        m = FENCE_OPEN.match(line)
        if m:
            self._end()
            self._cur = Block("code", lang=m.group(2), fence=m.group(1))
        elif not line.strip():
            if any(x.strip() for x in b.lines):
                self._end()
        elif HEADING.match(line):
            self._end()
            self._cur.lines.append(line)
            self._end()
        else:
            b.lines.append(line)


def blocks(text: str) -> list[Block]:
    """A whole (finished) message's blocks."""
    s = BlockSplitter()
    s.feed(text)
    s.close()
    return s.done
