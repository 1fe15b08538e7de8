"""Mistral replies: content, then tool calls after `[TOOL_CALLS]`; no reasoning.

Two forms of calls, as Mistral's tokenizers (v3 to v7, and v11 on) have the model write them:

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris"}}, {"name": ...}]
    [TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

How a reply is read:
- `[TOOL_CALLS]` anywhere in the content opens calls. After it (and any whitespace), a `[` or `{`
  starts the first form: one JSON value, a list of `{"name": str, "arguments": object}` objects (or one
  such object; an "id" is ignored; "arguments" may be a JSON string holding an object), read once its
  brackets close (strings and escapes are followed). A name (letters, digits, `_`, `.`, `-`) starts
  the second form: `name[ARGS]` (or `name[CALL_ID]id[ARGS]`, the id ignored), then one JSON object,
  read once its braces close. Each call is numbered in order, "call_0", "call_1", ...
- The whitespace right before `[TOOL_CALLS]` and right after a valid call (or list) is not content,
  except between two pieces of content (`A\\n[TOOL_CALLS]…\\nB`: "A\\nB"). The arguments are
  re-serialised (`json.dumps(obj, ensure_ascii=False)`).
- A malformed call is content, exactly as generated from the whitespace before its `[TOOL_CALLS]`,
  plus one note: broken JSON, arguments not an object, a function the request did not offer, a list
  with one bad call (the whole list: its calls are read together), JSON that has not closed at the
  end of the reply; `[TOOL_CALLS]` followed by neither form (the text read so far is content and the
  rest is read as content again).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .qwen3 import StreamParser, arguments_of, held_tag, load_json

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _name_end(buf: str, i: int) -> int:
    while i < len(buf) and (buf[i].isalnum() or buf[i] in "_.-"):
        i += 1
    return i


@dataclass
class MistralParser(StreamParser):
    needs_special_tokens = True

    _raw: str = field(default="", init=False, repr=False)  # the open call's text so far, as generated
    _name: str | None = field(default=None, init=False, repr=False)  # second form: the function's name
    # the JSON being read: where the scan is, how deep, inside a string, after a backslash
    _pos: int = field(default=0, init=False, repr=False)
    _depth: int = field(default=0, init=False, repr=False)
    _in_str: bool = field(default=False, init=False, repr=False)
    _esc: bool = field(default=False, init=False, repr=False)

    def __post_init__(self):
        self._state = "content"

    def _on_content(self, final: bool) -> bool:
        buf = self._buf
        p = buf.find(TOOL_CALLS)
        if p >= 0:
            text = buf[:p].rstrip()
            self._say_content(text)
            self._raw = buf[len(text):p + len(TOOL_CALLS)]
            self._buf = buf[p + len(TOOL_CALLS):]
            self._state = "calls"
            return True
        if final:
            self._say_content(buf)
            self._buf = ""
            return False
        j = len(buf) - held_tag(buf, (TOOL_CALLS,))
        while j and buf[j - 1].isspace():  # whitespace right before calls is not content
            j -= 1
        self._say_content(buf[:j])
        self._buf = buf[j:]
        return False

    def _bad(self, raw: str, why: str, rest: str) -> bool:
        """A malformed call: `raw` is content, `rest` is read as content again."""
        self._say_content(raw)
        self._note(why)
        self._raw, self._name, self._buf = "", None, rest
        self._state = "content"
        return True

    def _on_calls(self, final: bool) -> bool:
        """Right after `[TOOL_CALLS]`: which form."""
        buf = self._buf
        i = len(buf) - len(buf.lstrip())
        if i == len(buf):
            return final and self._bad(self._raw + buf, "nothing followed [TOOL_CALLS]", "")
        self._raw += buf[:i]
        self._buf = buf[i:]
        if buf[i] in "[{":
            self._json(None)
        elif _name_end(buf, i) > i:
            self._state = "name"
        else:
            return self._bad(self._raw, "[TOOL_CALLS] is followed by neither a JSON list nor a function name",
                             self._buf)
        return True

    def _on_name(self, final: bool) -> bool:
        buf = self._buf
        j = _name_end(buf, 0)
        rest = buf[j:]
        if rest.startswith(ARGS):
            end = j + len(ARGS)
        elif rest.startswith(CALL_ID):
            k = _name_end(buf, j + len(CALL_ID))
            if buf.startswith(ARGS, k):
                end = k + len(ARGS)
            elif not final and ARGS.startswith(buf[k:]):
                return False
            else:
                return self._bad(self._raw + buf[:k], f"no {ARGS} after {buf[:j]!r}'s call id", buf[k:])
        elif not final and (ARGS.startswith(rest) or CALL_ID.startswith(rest)):
            return False
        else:
            return self._bad(self._raw + buf[:j], f"no {ARGS} after the function name {buf[:j]!r}", rest)
        self._name = buf[:j]
        self._raw += buf[:end]
        self._buf = buf[end:]
        self._state = "args"
        return True

    def _on_args(self, final: bool) -> bool:
        """After `name[ARGS]`: the arguments' object."""
        buf = self._buf
        i = len(buf) - len(buf.lstrip())
        if i == len(buf):
            return final and self._bad(self._raw + buf, f"it ended before {self._name!r}'s arguments", "")
        if buf[i] not in "[{":
            return self._bad(self._raw, f"{self._name!r}'s arguments are not a JSON object", buf)
        self._raw += buf[:i]
        self._buf = buf[i:]
        self._json(self._name)
        return True

    def _json(self, name: str | None) -> None:
        self._name = name
        self._pos, self._depth, self._in_str, self._esc = 0, 0, False, False
        self._state = "json"

    def _scan(self) -> int | None:
        """Where the JSON value at the buffer's start ends (after its closing bracket), or None yet."""
        buf, k, depth, in_str, esc = self._buf, self._pos, self._depth, self._in_str, self._esc
        n = len(buf)
        while k < n:
            c = buf[k]
            k += 1
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
                if depth == 0:
                    return k
        self._pos, self._depth, self._in_str, self._esc = k, depth, in_str, esc
        return None

    def _on_json(self, final: bool) -> bool:
        end = self._scan()
        if end is None:
            return final and self._bad(self._raw + self._buf, "it ended before its JSON did", "")
        text, rest = self._buf[:end], self._buf[end:]
        raw = self._raw + text
        value, why = load_json(text)
        if why:
            return self._bad(raw, why, rest)
        calls = []
        if self._name is not None:  # name[ARGS]{...}
            items = [{"name": self._name, "arguments": value}]
        else:
            items = value if isinstance(value, list) else [value]
            if not items:
                return self._bad(raw, "its list of calls is empty", rest)
        for item in items:
            if not isinstance(item, dict):
                return self._bad(raw, f"a call is not a JSON object (a {type(item).__name__})", rest)
            name = item.get("name")
            why = self._check_name(name)
            if why:
                return self._bad(raw, why, rest)
            args = arguments_of(item.get("arguments", item.get("parameters", {})))
            if isinstance(args, str):
                return self._bad(raw, f"{args} (calling {name!r})", rest)
            calls.append((name, args))
        for call in calls:
            self._call(*call)
        self._raw, self._name, self._buf = "", None, rest
        self._state = "after_call"
        return True
