"""GPT-OSS replies in OpenAI's harmony format: messages on channels.

A reply (generated after the prompt's trailing `<|start|>assistant`) is a run of messages, each a
header up to `<|message|>` and a body up to `<|end|>`, `<|call|>` or `<|return|>` (the last two end
generation: they may never arrive, and the end of the reply closes the open message):

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{…}<|call|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{…}

How a reply is read:
- A header starts with `<|start|>` (anywhere), or, at the reply's start and right after a message's
  end, with `<|channel|>`, `<|message|>`, `<|constrain|>` or ` to=` (the rest of the prompt's
  `<|start|>assistant` header). Its channel is the word after `<|channel|>`; its recipient the word
  after `to=` (before or after the channel). A header is at most 256 characters up to `<|message|>`:
  longer, or cut by `<|end|>`/`<|call|>`/`<|return|>`/`<|start|>`, or never finished, it is content as
  generated (with a note when it had a recipient).
- A message to a recipient (`to=functions.NAME`: the call's name is NAME; any other recipient but
  `assistant` is the name as written) is a tool call: its body is the arguments' JSON object, read
  when the message ends. A malformed one (broken JSON, not an object, a function the request did not
  offer) is content, exactly as generated (header, body, and its `<|end|>`/`<|call|>` if one came),
  plus a note.
- Otherwise the body of an `analysis` message is reasoning; of any other channel (`final`,
  `commentary` without a recipient), or of text before any header, content. Bodies are kept exactly
  (no whitespace is stripped); the bodies of several messages on one channel are joined as they are.
- `<|channel|>` or `<|start|>` inside a body ends the message without its `<|end|>` and starts the
  next header. The end tokens themselves are markup: they are not content.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .qwen3 import StreamParser, arguments_of, held_tag, load_json

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HEADER_STARTS = (START, CHANNEL, MESSAGE, CONSTRAIN, " to=")  # what can begin a header after an end
BODY_TAGS = ENDS + (START, CHANNEL)
MAX_HEADER = 256  # characters before `<|message|>`
_IN_HEADER = re.compile(r"<\|(?:message|end|call|return|start)\|>")  # what ends a header
_IN_BODY = re.compile(r"<\|(?:end|call|return|start|channel)\|>")  # what ends a body
_RECIPIENT = re.compile(r"(?:^|\s|\|>)to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")


@dataclass
class HarmonyParser(StreamParser):
    needs_special_tokens = True

    _channel: str = field(default="", init=False, repr=False)  # the open message's channel
    _header: str = field(default="", init=False, repr=False)  # a tool call's header, as generated
    _name: str | None = field(default=None, init=False, repr=False)  # the function it calls, or None
    _args: str = field(default="", init=False, repr=False)  # its body so far

    def __post_init__(self):
        self._state = "start"

    def _on_start(self, final: bool) -> bool:
        """At the reply's start, or after a message's end: a header, or content."""
        buf = self._buf
        if not buf:
            return False
        if buf.startswith(HEADER_STARTS):
            self._state = "header"
            return True
        if not final and any(h.startswith(buf) for h in HEADER_STARTS):
            return False
        self._open("", None, "")
        return True

    def _on_header(self, final: bool) -> bool:
        buf = self._buf
        m = _IN_HEADER.search(buf, len(START) if buf.startswith(START) else 0)
        if m and m.start() <= MAX_HEADER:
            if m.group() == MESSAGE:
                self._read_header(buf[:m.end()])
            else:  # cut before its `<|message|>`: the end or the next header is read as such
                self._broken_header(buf[:m.start()])
            self._buf = buf[m.end() if m.group() == MESSAGE else m.start():]
            return True
        if m or len(buf) >= MAX_HEADER + len(MESSAGE):  # too long for a header: its first token is text
            first = next(h for h in HEADER_STARTS if buf.startswith(h))
            self._say_content(first)
            self._buf = buf[len(first):]
            self._open("", None, "")
            return True
        if final:
            self._broken_header(buf)
            self._buf = ""
            self._state = "start"
        return False

    def _read_header(self, header: str) -> None:
        channel = _CHANNEL.search(header)
        to = _RECIPIENT.search(header)
        name = None
        if to and to.group(1) != "assistant":
            name = to.group(1).removeprefix("functions.")
        self._open(channel.group(1) if channel else "", name, header)

    def _broken_header(self, raw: str) -> None:
        self._say_content(raw)
        if _RECIPIENT.search(raw):
            self._note("its header ended before <|message|>")
        self._open("", None, "")

    def _open(self, channel: str, name: str | None, header: str) -> None:
        self._channel, self._name, self._header, self._args = channel, name, header, ""
        self._state = "body"

    def _on_body(self, final: bool) -> bool:
        buf = self._buf
        m = _IN_BODY.search(buf)
        if m:
            self._body(buf[:m.start()])
            end = m.group() in ENDS
            self._close(m.group() if end else "")
            self._buf = buf[m.end():] if end else buf[m.start():]
            self._state = "start" if end else "header"
            return True
        if final:
            self._body(buf)
            self._buf = ""
            self._close("")
            self._state = "start"
            return False
        j = len(buf) - held_tag(buf, BODY_TAGS)
        self._body(buf[:j])
        self._buf = buf[j:]
        return False

    def _body(self, text: str) -> None:
        if self._name is not None:
            self._args += text
        elif self._channel == "analysis":
            self._say_reasoning(text)
        else:
            self._say_content(text)

    def _close(self, end: str) -> None:
        """The open message ended (with `end`, or "" at the reply's end or a new header)."""
        if self._name is None:
            return
        name, args_text = self._name, self._args
        self._name, self._args = None, ""
        why = self._check_name(name)
        if not why:
            value, why = load_json(args_text) if args_text.strip() else (None, "it has no arguments")
            args = why or arguments_of(value)
            if isinstance(args, str):
                why = f"{args} (calling {name!r})"
        if why:
            self._say_content(self._header + args_text + end)
            self._note(why)
        else:
            self._call(name, args)
