"""What a reply is made of, in the model's own format: reasoning, content and tool calls.

Models of 2026 reason before they answer and call tools, each family in its own markup: Qwen3's
`<think>…</think>` and `<tool_call>{json}</tool_call>`, GPT-OSS's harmony channels (`analysis`,
`final`, `commentary to=functions.NAME`), Mistral's `[TOOL_CALLS][…]`. A `Parser` reads the text a
reply generates, as it arrives (any split of it: a token may end mid-tag), and says what each piece
is as a list of `Delta`s; it never loses a byte: text that turns out not to be markup is content, and
a malformed tool call (broken JSON, an unknown function) becomes content with a one-line note.

The invariants every parser keeps (tests/test_formats.py checks them on every split of every example):
- the `text` of the reasoning deltas, joined, is `reasoning`; of the content deltas, `content`;
- a tool call's deltas are emitted once it is complete and valid: first one with its index, id and
  name, then its arguments (`text`) in one or more fragments, which join to `ToolCall.arguments`;
- the result of feed(a); feed(b) equals feed(a + b) once finish() is called.
"""
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


FORMATS = ("plain", "qwen3", "harmony", "mistral")


def format_of(template_source: str | None) -> str:
    """Which format a model replies in, from its chat template's text."""
    src = template_source or ""
    if "<|channel|>" in src:
        return "harmony"
    if "<tool_call>" in src or "<think>" in src:
        return "qwen3"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    return "plain"


def parser_for(fmt: str, tools: tuple[str, ...] | None = None, thinking_open: bool = False) -> Parser:
    """A new parser for one reply. tools: the function names offered (None: no check). thinking_open:
    the prompt already opened a reasoning block (a template that ends its prompt with `<think>`)."""
    if fmt == "qwen3":
        from .qwen3 import Qwen3Parser

        return Qwen3Parser(tools=tools, thinking_open=thinking_open)
    if fmt == "harmony":
        from .harmony import HarmonyParser

        return HarmonyParser(tools=tools)
    if fmt == "mistral":
        from .mistral import MistralParser

        return MistralParser(tools=tools)
    return Parser(tools=tools)
