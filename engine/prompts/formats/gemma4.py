"""Gemma 4 replies: a `thought` channel for reasoning, `<|tool_call>call:NAME{…}<tool_call|>` calls with
Gemma's own argument syntax. Its markup is special tokens (`<|channel>`, `<channel|>`, `<|tool_call>`,
`<tool_call|>`, `<|"|>`, `<turn|>`, `<|tool_response>`), kept in the text the parser reads.

The published template (Gemma 4's chat_template.jinja) ends the prompt with `<|turn>model\\n` when
thinking is on (the model may open `<|channel>thought\\n` itself) and with
`<|turn>model\\n<|channel>thought\\n<channel|>` (an empty thought) when it is off. It renders a past
model turn as `<|channel>thought\\n{reasoning}\\n<channel|>`, then each call as

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,hours:[9,12],options:{wind:true}}<tool_call|>

(arguments sorted by key; a string between two `<|"|>` tokens, written as it is; a number, `true`,
`false` bare, None as `None`; a list `[a,b]`; a mapping `{key:value}` with bare keys), then the
content, then `<|tool_response>` after calls (the model stops there for the tools' results) or
`<turn|>`. How a reply is read:
- `<|channel>` opens a reasoning block anywhere in the content (the token cannot be plain text); its
  first word, when it is `thought`, is the channel's name, not reasoning; the block runs to
  `<channel|>`. The newlines at both edges of the reasoning are dropped; several blocks are joined.
  `thinking_open`: the prompt ended inside the block (after `<|channel>thought`), the reply is
  reasoning from its first byte. Inside the block, `<|tool_call>` and `<|channel>` are reasoning.
- `<|tool_call>` opens a call anywhere in the content; its body up to the first `<tool_call|>` is
  `call:NAME{ARGUMENTS}` (edge whitespace allowed), NAME one word of letters, digits, `_`, `.`, `:`
  and `-`, ARGUMENTS Gemma's syntax above read exactly (whitespace allowed between its pieces, a key
  also as a `<|"|>` string; a number is a JSON number; `null` is read as None is). The arguments are
  re-serialised as JSON (`json.dumps(obj, ensure_ascii=False)`). A malformed call (no `call:`, a name
  that is not a word, broken syntax, a key given twice, a function the request did not offer, no
  `<tool_call|>` before the reply's end) is content, exactly as generated, plus one note.
- The whitespace right before a call or a reasoning block, and right after one, is not content,
  except that between two pieces of content the whitespace after it stays (`A\\n<call>\\nB`: "A\\nB"),
  as Qwen3's parser reads its calls (qwen3.py).
- `<turn|>` and `<|tool_response>` end the reply (the model's end of turn; a tool's result is not
  the model's to write): they, and anything generated after them, are not read. One that cuts a
  call makes the call malformed; one inside reasoning ends the reasoning.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from .qwen3 import StreamParser, held_tag
from .tagged_calls import function_name, short

CHANNEL, END_CHANNEL = "<|channel>", "<channel|>"
CALL, END_CALL = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
ENDS = ("<turn|>", "<|tool_response>")  # the reply's end
THOUGHT = "thought"  # the reasoning channel's name
CALL_PREFIX = "call:"
MAX_DEPTH = 64  # lists and objects nested in a call's arguments

_CONTENT_TAGS = (CALL, CHANNEL) + ENDS
_IN_CONTENT = re.compile("|".join(re.escape(t) for t in _CONTENT_TAGS))
_THINK_TAGS = (END_CHANNEL,) + ENDS
_IN_THINK = re.compile("|".join(re.escape(t) for t in _THINK_TAGS))
_IN_CALL = re.compile("|".join(re.escape(t) for t in (END_CALL,) + ENDS))
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_BARE = re.compile(r"[^\s,:\[\]{}<]+")  # a bare value's text: up to a separator, bracket or token
_BAD_KEY = set('{}[],"<>\n\r')


class _Broken(Exception):
    """Why a call's arguments cannot be read."""


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _string(s: str, i: int) -> tuple[str, int]:
    """The string starting with the `<|"|>` at i, and where it ends."""
    j = s.find(QUOTE, i + len(QUOTE))
    if j < 0:
        raise _Broken(f"a string is not closed ({short(s[i:])})")
    return s[i + len(QUOTE):j], j + len(QUOTE)


def _value(s: str, i: int, depth: int) -> tuple[object, int]:
    """The value starting at i (after whitespace), and where it ends."""
    i = _ws(s, i)
    if s.startswith(QUOTE, i):
        return _string(s, i)
    if i >= len(s):
        raise _Broken("they end where a value belongs")
    if s[i] in "{[":
        if depth >= MAX_DEPTH:
            raise _Broken("they are nested too deeply")
        return (_object if s[i] == "{" else _list)(s, i + 1, depth + 1)
    m = _BARE.match(s, i)
    word = m.group() if m else ""
    if word in ("true", "false"):
        return word == "true", m.end()
    if word in ("null", "None"):
        return None, m.end()
    if word and _NUMBER.fullmatch(word):
        value = json.loads(word)
        if isinstance(value, float) and not math.isfinite(value):
            raise _Broken(f"the number {short(word)} is too large")
        return value, m.end()
    raise _Broken(f"{short(word or s[i:])} is not a value (a <|\"|>string<|\"|>, number, true, false, null, "
                  "list or object)")


def _list(s: str, i: int, depth: int) -> tuple[list, int]:
    """The list whose `[` is right before i."""
    out = []
    i = _ws(s, i)
    if s.startswith("]", i):
        return out, i + 1
    while True:
        value, i = _value(s, i, depth)
        out.append(value)
        i = _ws(s, i)
        if s.startswith(",", i):
            i += 1
        elif s.startswith("]", i):
            return out, i + 1
        else:
            raise _Broken(f"a list has {short(s[i:]) if i < len(s) else 'its end'} where a , or ] belongs")


def _key(s: str, i: int) -> tuple[str, int]:
    """An object's key at i (after whitespace): a bare word up to its `:`, or a string; and where its
    `:` ends."""
    i = _ws(s, i)
    if s.startswith(QUOTE, i):
        key, i = _string(s, i)
        i = _ws(s, i)
        if not s.startswith(":", i):
            raise _Broken(f"the key {key!r} has no :")
        return key, i + 1
    j = s.find(":", i)
    key = s[i:j].rstrip() if j >= 0 else ""
    if not key or QUOTE in key or _BAD_KEY & set(key):
        raise _Broken(f"an object has {short(s[i:]) if i < len(s) else 'its end'} where a key and : belong")
    return key, j + 1


def _object(s: str, i: int, depth: int) -> tuple[dict, int]:
    """The object whose `{` is right before i."""
    out = {}
    i = _ws(s, i)
    if s.startswith("}", i):
        return out, i + 1
    while True:
        key, i = _key(s, i)
        if key in out:
            raise _Broken(f"the key {key!r} is given twice")
        out[key], i = _value(s, i, depth)
        i = _ws(s, i)
        if s.startswith(",", i):
            i += 1
        elif s.startswith("}", i):
            return out, i + 1
        else:
            raise _Broken(f"an object has {short(s[i:]) if i < len(s) else 'its end'} where a , or }} belongs")


def arguments(text: str) -> dict | str:
    """A call's arguments in Gemma's syntax (`{key:value,…}`, the whole text but edge whitespace) as a
    dict, or why they cannot be read."""
    s = text.strip()
    if not s.startswith("{"):
        return f"its arguments do not start with {{ (they start with {short(s)})"
    try:
        value, end = _object(s, 1, 1)
    except _Broken as e:
        return f"its arguments are broken: {e}"
    if s[end:].strip():
        return f"it goes on after its arguments ({short(s[end:])})"
    return value


def read_gemma_call(body: str) -> tuple[str, str | None]:
    """A call's body (between `<|tool_call>` and `<tool_call|>`): (its name, None) when it reads as
    `call:NAME{…}`, else (what it starts with, why it is malformed). The arguments are read apart."""
    s = body.strip()
    if not s.startswith(CALL_PREFIX):
        return "", f"it does not start with {CALL_PREFIX}NAME (it starts with {short(s)})"
    brace = s.find("{")
    raw = s[len(CALL_PREFIX):brace if brace >= 0 else len(s)]
    name = function_name(raw)
    if name is None:
        return "", f"its function's name is not one word ({short(raw.strip())})"
    if brace < 0:
        return "", f"it has no {{arguments}} (calling {name!r})"
    return name, None


@dataclass
class Gemma4Parser(StreamParser):
    thinking_open: bool = False  # the prompt ended inside the thought channel: the reply starts as reasoning

    needs_special_tokens = True

    _think_edge: bool = field(default=True, init=False, repr=False)  # no text of this block read yet
    _gap: str = field(default="", init=False, repr=False)  # whitespace before the open call

    def __post_init__(self):
        self._state = "think" if self.thinking_open else "content"

    def _end(self) -> None:
        """`<turn|>` or `<|tool_response>`: the reply is over; what follows is not read."""
        self._buf = ""
        self._state = "ended"

    def _on_ended(self, final: bool) -> bool:
        self._buf = ""
        return False

    def _on_content(self, final: bool) -> bool:
        buf = self._buf
        m = _IN_CONTENT.search(buf)
        if m:
            tag = m.group()
            if tag in ENDS:
                self._say_content(buf[:m.start()])
                self._end()
                return False
            text = buf[:m.start()].rstrip()
            self._say_content(text)
            self._buf = buf[m.end():]
            if tag == CALL:
                self._gap = buf[len(text):m.start()]
                self._state = "call"
            else:
                self._think_edge = True
                self._state = "channel"
            return True
        if final:
            self._say_content(buf)
            self._buf = ""
            return False
        j = len(buf) - held_tag(buf, _CONTENT_TAGS)
        while j and buf[j - 1].isspace():  # whitespace right before a call or a block is not content
            j -= 1
        self._say_content(buf[:j])
        self._buf = buf[j:]
        return False

    def _on_channel(self, final: bool) -> bool:
        """Right after `<|channel>`: the channel's name (`thought`), which is not reasoning."""
        buf = self._buf
        if not final and len(buf) <= len(THOUGHT) and THOUGHT.startswith(buf):
            return False  # perhaps the name, perhaps reasoning that starts so ("thoughtful")
        if buf.startswith(THOUGHT) and not (buf[len(THOUGHT):len(THOUGHT) + 1].isalnum()
                                            or buf[len(THOUGHT):len(THOUGHT) + 1] == "_"):
            self._buf = buf[len(THOUGHT):]
        self._state = "think"
        return True

    def _on_think(self, final: bool) -> bool:
        if self._think_edge:
            self._buf = self._buf.lstrip("\n")
            if not self._buf and not final:
                return False
            self._think_edge = False
        buf = self._buf
        m = _IN_THINK.search(buf)
        if m:
            self._say_reasoning(buf[:m.start()].rstrip("\n"))
            if m.group() in ENDS:
                self._end()
                return False
            self._buf = buf[m.end():]
            self._state = "after_block"
            return True
        if final:
            self._say_reasoning(buf.rstrip("\n"))
            self._buf = ""
            return False
        j = len(buf) - held_tag(buf, _THINK_TAGS)
        while j and buf[j - 1] == "\n":  # newlines right before `<channel|>` are not reasoning
            j -= 1
        self._say_reasoning(buf[:j])
        self._buf = buf[j:]
        return False

    def _on_after_block(self, final: bool) -> bool:
        return self._on_after_call(final)

    def _on_call(self, final: bool) -> bool:
        buf = self._buf
        m = _IN_CALL.search(buf)
        if m is None or m.group() in ENDS:
            if m is None and not final:
                return False
            cut = buf if m is None else buf[:m.start()]
            self._say_content(self._gap + CALL + cut)
            self._note(f"it ended before {END_CALL}")
            self._gap = ""
            if m is None:
                self._buf = ""
                self._state = "content"
            else:
                self._end()
            return False
        body = buf[:m.start()]
        self._buf = buf[m.end():]
        got = self._read(body)
        if isinstance(got, str):
            self._say_content(self._gap + CALL + body + END_CALL)
            self._note(got)
            self._state = "content"
        else:
            self._call(*got)
            self._state = "after_block"
        self._gap = ""
        return True

    def _read(self, body: str) -> tuple[str, dict] | str:
        """A call's body: its name and arguments, or why it is not a valid call."""
        name, why = read_gemma_call(body)
        if why:
            return why
        why = self._check_name(name)
        if why:
            return why
        args = arguments(body.strip()[body.strip().find("{"):])
        if isinstance(args, str):
            return f"{args} (calling {name!r})"
        return name, args
