"""Qwen3.5 / Qwen3.6 / Qwen3-Coder (and Qwen3-Next with these tools) replies: `<think>…</think>`
reasoning as Qwen3's, tool calls with one tag per parameter.

The published Qwen3.5 template ends the prompt with `<think>\\n` (thinking; the parser is made with
`thinking_open`) or `<think>\\n\\n</think>\\n\\n` (enable_thinking false), and renders a past call as

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

each value between a line break after `<parameter=KEY>` and one before `</parameter>`: a string as
it is (it may span lines), a mapping or list as JSON, any other value with Jinja's `string` filter.
How a call's body is read (the rest of the reply as qwen3.py reads it; the values typed as
tagged_calls.py says):
- whitespace, `<function=NAME>`, then any number of `<parameter=KEY>VALUE</parameter>` (whitespace
  around each), then `</function>` and whitespace only. NAME and KEY are the tag's text up to `>`,
  their edge whitespace dropped; NAME is one word of letters, digits, `_`, `.`, `:` and `-`, KEY
  anything but empty or holding `<` or a line break (else the tag is broken).
- VALUE is the text up to the first `</parameter>`, less one line break at each edge (the template's;
  any others are the value's own).
- Anything else (no `<function=`, a parameter without `</parameter>`, text between the tags or after
  `</function>`, a second function in one call) makes the call malformed: content plus a note.
"""
from __future__ import annotations

from dataclasses import dataclass

from .tagged_calls import TaggedCallParser, function_name, short, tag_word

FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"


def _value(text: str) -> str:
    """A parameter's text less the line break the template writes at each of its edges."""
    text = text.removeprefix("\n")
    return text.removesuffix("\n")


@dataclass
class QwenXmlParser(TaggedCallParser):
    def _split(self, body: str) -> tuple[str, list[tuple[str, str]]] | str:
        rest = body.lstrip()
        if not rest.startswith(FUNCTION):
            return f"it does not start with {FUNCTION}NAME> (it starts with {short(rest)})"
        raw, sep, rest = rest[len(FUNCTION):].partition(">")
        name = function_name(raw) if sep else None
        if name is None:
            return f"its {FUNCTION}...> tag is broken ({short(FUNCTION + raw)})"
        pairs = []
        while True:
            rest = rest.lstrip()
            if rest.startswith(PARAMETER):
                raw, sep, rest = rest[len(PARAMETER):].partition(">")
                key = tag_word(raw) if sep else None
                if key is None:
                    return f"its {PARAMETER}...> tag is broken ({short(PARAMETER + raw)}, calling {name!r})"
                value, sep, rest = rest.partition(END_PARAMETER)
                if not sep:
                    return f"its parameter {key!r} has no {END_PARAMETER} (calling {name!r})"
                pairs.append((key, _value(value)))
            elif rest.startswith(END_FUNCTION):
                after = rest[len(END_FUNCTION):].strip()
                if after:
                    return f"it goes on after {END_FUNCTION} ({short(after)}, calling {name!r})"
                return name, pairs
            elif not rest:
                return f"it has no {END_FUNCTION} (calling {name!r})"
            else:
                return f"it has {short(rest)} where a {PARAMETER}...> or {END_FUNCTION} belongs (calling {name!r})"
