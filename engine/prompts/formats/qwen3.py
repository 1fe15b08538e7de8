"""Qwen3 / Qwen3-MoE / Qwen2.5 replies: `<think>…</think>` reasoning, `<tool_call>{json}</tool_call>` calls.

The published template (Qwen3's chat_template.jinja) renders a past assistant turn as
`<think>\\n{reasoning}\\n</think>\\n\\n{content}` with `reasoning.strip('\\n')` and `content.lstrip('\\n')`,
then each call as `\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`. Reading a reply undoes
exactly that:
- `<think>` opens reasoning only at the start of the reply (whitespace before it is dropped); with
  `thinking_open` the prompt already ended with it and the reply is reasoning from its first byte.
  The newlines at both edges of the reasoning block are dropped, and so are the newlines right after
  `</think>` (the answer's content starts at its first other character). Anywhere else `<think>` and
  `</think>` are plain content; an unclosed block is all reasoning (its edge newlines dropped).
- `<tool_call>` opens a call anywhere in the content; its body up to `</tool_call>` is JSON
  `{"name": str, "arguments": object}` ("arguments" may also be a JSON string holding an object, or be
  absent: {}). The whitespace right before a valid call and right after it is not content (the
  template's separators), except that between two pieces of content the whitespace after the last
  call stays (`A\\n<tool_call>…</tool_call>\\nB`: "A\\nB"). The arguments are re-serialised
  (`json.dumps(obj, ensure_ascii=False)`). A malformed call (broken JSON, no name, arguments not an
  object, a function the request did not offer, no `</tool_call>` before the end) is content, exactly
  as generated (with the whitespace before it), plus one line in `notes`.
- `<tool_call>` inside the reasoning block is reasoning. `<|im_end|>` never arrives (it ends generation).

Also the small pieces the other formats' parsers share: `StreamParser` (a buffer read by the current
state's handler), `held_tag` (how much of a buffer's end could still be the start of a tag),
`read_call`, `load_json` and `arguments_of` (a call's JSON read, or why it cannot be).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .base import Delta, Parser, ToolCall

UNREADABLE = "the model's tool call could not be read: "


def held_tag(buf: str, tags: tuple[str, ...]) -> int:
    """The length of the longest end of `buf` that is the start (not the whole) of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:k]):
                best = k
                break
    return best


def load_json(text: str) -> tuple[object, str | None]:
    """JSON text's value, or (None, why it cannot be read): never an exception."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, json_problem(e)
    except (ValueError, RecursionError):
        return None, "its JSON is broken (nested too deeply)"


def arguments_of(value) -> dict | str:
    """A call's arguments as an object, or why they are not one (a JSON string holding an object is one)."""
    if isinstance(value, str):
        value, why = load_json(value)
        if why:
            return "its arguments are a string that is not JSON"
    if not isinstance(value, dict):
        return f"its arguments are not a JSON object (a {type(value).__name__})"
    return value


def unclosed(text: str) -> bool:
    """Whether JSON text ends inside a string or with brackets open (it was cut short)."""
    depth, in_str, esc = 0, False, False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
    return in_str or depth > 0


def json_problem(e: json.JSONDecodeError) -> str:
    if e.pos >= len(e.doc.rstrip()) or unclosed(e.doc):
        return "its JSON is broken (cut short)"
    return f"its JSON is broken ({e.msg.removesuffix(' at')} at character {e.pos})"


@dataclass
class StreamParser(Parser):
    """A parser as a state machine over the text not yet read: feed() appends to the buffer and runs
    the current state's handler (`_on_<state>`) until it needs more text; each handler returns whether
    it made progress, and with `final` (finish()) it must read the buffer to its end."""

    _buf: str = field(default="", init=False, repr=False)
    _state: str = field(default="", init=False, repr=False)
    _out: list[Delta] = field(default_factory=list, init=False, repr=False)

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        return self._run(False)

    def finish(self) -> list[Delta]:
        return self._run(True)

    def _run(self, final: bool) -> list[Delta]:
        while getattr(self, "_on_" + self._state)(final):  # the state changes inside the loop
            pass
        out, self._out = self._out, []
        return out

    # what the handlers say
    def _say_content(self, text: str) -> None:
        self._out += self._content(text)

    def _say_reasoning(self, text: str) -> None:
        self._out += self._reasoning(text)

    def _note(self, why: str) -> None:
        self.notes.append(UNREADABLE + " ".join(why.split()))  # one line

    def _check_name(self, name) -> str | None:
        """Why `name` cannot be called, or None."""
        if not isinstance(name, str) or not name.strip():
            return "it names no function"
        if self.tools is not None and name not in self.tools:
            return f"it calls {name!r}, which the request did not offer"
        return None

    def _on_after_call(self, final: bool) -> bool:
        """Whitespace after a call is content only between content (`A\\n<call>\\nB`: "A\\nB")."""
        rest = self._buf.lstrip()
        if not rest:
            if final:
                self._buf = ""
            return False
        if not self.content:
            self._buf = rest
        self._state = "content"
        return True

    def _call(self, name: str, arguments: dict) -> None:
        """A complete, valid call: its deltas (index, id and name; then its arguments in one piece)."""
        i = len(self.tool_calls)
        call = ToolCall(f"call_{i}", name, json.dumps(arguments, ensure_ascii=False))
        self.tool_calls.append(call)
        self._out += [Delta("tool_call", index=i, id=call.id, name=name),
                      Delta("tool_call", call.arguments, index=i)]


def read_call(parser: StreamParser, body: str) -> tuple[str, dict] | str:
    """A `{"name": ..., "arguments": {...}}` object's name and arguments, or why it is not a valid call."""
    obj, why = load_json(body)
    if why:
        return why
    if not isinstance(obj, dict):
        return f"it is not a JSON object (a {type(obj).__name__})"
    name = obj.get("name")
    why = parser._check_name(name)
    if why:
        return why
    args = arguments_of(obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        return f"{args} (calling {name!r})"
    return name, args


THINK, END_THINK = "<think>", "</think>"
CALL, END_CALL = "<tool_call>", "</tool_call>"


@dataclass
class Qwen3Parser(StreamParser):
    thinking_open: bool = False  # the prompt ended with `<think>`: the reply starts inside the block

    needs_special_tokens = True

    _think_edge: bool = field(default=True, init=False, repr=False)  # no reasoning text read yet
    _gap: str = field(default="", init=False, repr=False)  # whitespace before the open call

    def __post_init__(self):
        self._state = "think" if self.thinking_open else "start"

    def _on_start(self, final: bool) -> bool:
        """The reply's first bytes: `<think>` (after any whitespace) opens the reasoning block."""
        rest = self._buf.lstrip()
        if rest.startswith(THINK):
            self._buf = rest[len(THINK):]
            self._state = "think"
            return True
        if not final and THINK.startswith(rest):  # nothing yet, or whitespace, or a start of `<think>`
            return False
        self._state = "content"
        return True

    def _on_think(self, final: bool) -> bool:
        if self._think_edge:
            self._buf = self._buf.lstrip("\n")
            if not self._buf and not final:
                return False
            self._think_edge = False
        buf = self._buf
        p = buf.find(END_THINK)
        if p >= 0:
            self._say_reasoning(buf[:p].rstrip("\n"))
            self._buf = buf[p + len(END_THINK):]
            self._state = "after_think"
            return True
        if final:
            self._say_reasoning(buf.rstrip("\n"))
            self._buf = ""
            return False
        j = len(buf) - held_tag(buf, (END_THINK,))
        while j and buf[j - 1] == "\n":  # newlines right before `</think>` are not reasoning
            j -= 1
        self._say_reasoning(buf[:j])
        self._buf = buf[j:]
        return False

    def _on_after_think(self, final: bool) -> bool:
        self._buf = self._buf.lstrip("\n")
        if self._buf or final:
            self._state = "content"
            return True
        return False

    def _on_content(self, final: bool) -> bool:
        buf = self._buf
        p = buf.find(CALL)
        if p >= 0:
            text = buf[:p].rstrip()
            self._say_content(text)
            self._gap = buf[len(text):p]
            self._buf = buf[p + len(CALL):]
            self._state = "call"
            return True
        if final:
            self._say_content(buf)
            self._buf = ""
            return False
        j = len(buf) - held_tag(buf, (CALL,))
        while j and buf[j - 1].isspace():  # whitespace right before a call is not content
            j -= 1
        self._say_content(buf[:j])
        self._buf = buf[j:]
        return False

    def _on_call(self, final: bool) -> bool:
        buf = self._buf
        p = buf.find(END_CALL)
        if p < 0:
            if final:
                self._say_content(self._gap + CALL + buf)
                self._note("it ended before </tool_call>")
                self._gap = self._buf = ""
                self._state = "content"
            return False
        body = buf[:p]
        self._buf = buf[p + len(END_CALL):]
        got = self._read(body)
        if isinstance(got, str):
            self._say_content(self._gap + CALL + body + END_CALL)
            self._note(got)
            self._state = "content"
        else:
            self._call(*got)
            self._state = "after_call"
        self._gap = ""
        return True

    def _read(self, body: str) -> tuple[str, dict] | str:
        """A call's body (between `<tool_call>` and `</tool_call>`): its name and arguments, or why it
        is not a valid call. The formats that write calls as tags (tagged_calls.py) read it their way."""
        return read_call(self, body)
