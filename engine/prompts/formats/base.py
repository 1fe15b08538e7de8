"""A reply's parts (engine/prompts/formats: the interface): a tool call, a delta, and the plain parser
every format's parser extends."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    id: str           # unique within the reply ("call_0", "call_1", ...)
    name: str         # the function's name
    arguments: str    # the arguments object as JSON text


@dataclass(frozen=True)
class Delta:
    part: str          # "reasoning" | "content" | "tool_call"
    text: str = ""     # reasoning or content text; for a tool call, a fragment of its arguments
    index: int = -1    # tool_call: which call of the reply (0-based)
    id: str = ""       # tool_call: set on the call's first delta
    name: str = ""     # tool_call: set on the call's first delta


@dataclass
class Parser:
    """The plain format: everything is content. The other formats subclass it (same interface)."""

    tools: tuple[str, ...] | None = None  # the functions the request offered (None: any name is accepted)
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per malformed call, for the user

    needs_special_tokens = False  # whether feed() wants the text with the model's special tokens kept

    def feed(self, text: str) -> list[Delta]:
        return self._content(text)

    def finish(self) -> list[Delta]:
        """The reply ended: what was held back (a possible start of markup) goes out."""
        return []

    def _content(self, text: str) -> list[Delta]:
        if not text:
            return []
        self.content += text
        return [Delta("content", text)]

    def _reasoning(self, text: str) -> list[Delta]:
        if not text:
            return []
        self.reasoning += text
        return [Delta("reasoning", text)]
