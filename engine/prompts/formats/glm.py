"""GLM-4.5 / GLM-4.6 / GLM-4.7 (-Flash) replies: `<think>…</think>` reasoning, tool calls with a tag
pair per argument.

GLM-4.7-Flash's template ends the prompt with `<think>` (thinking; the parser is made with
`thinking_open`) or `</think>` (enable_thinking false); GLM-4.5's ends it with nothing, the reply
opening `<think>` itself, or with `<think></think>`. A past turn is rendered as
`<think>{reasoning}</think>{content}` (both stripped), then each call as

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>…</tool_call>

a value written as it is when it is a string, else as JSON; GLM-4.5's template, and the models, put
line breaks between the pieces (`<tool_call>get_weather\\n<arg_key>…`). How a call's body is read
(the rest of the reply as qwen3.py reads it; the values typed as tagged_calls.py says):
- the function's name is the text up to the first `<arg_key>` (all of it when there is none: a call
  without arguments), its edge whitespace dropped; it must be one word of letters, digits, `_`, `.`,
  `:` and `-` (not JSON, not a sentence).
- then any number of `<arg_key>KEY</arg_key>` `<arg_value>VALUE</arg_value>`, whitespace allowed
  around each tag; KEY's edge whitespace is dropped, VALUE is kept exactly (the template adds none).
- Anything else (a name that is not one word, say JSON; a key without its value; a tag not closed;
  text between the pairs) makes the call malformed: content plus a note.
"""
from __future__ import annotations

from dataclasses import dataclass

from .tagged_calls import TaggedCallParser, function_name, short, tag_word

KEY, END_KEY, VALUE, END_VALUE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


@dataclass
class GlmParser(TaggedCallParser):
    def _split(self, body: str) -> tuple[str, list[tuple[str, str]]] | str:
        p = body.find(KEY)
        head, rest = (body, "") if p < 0 else (body[:p], body[p:])
        name = function_name(head)
        if name is None:
            return f"it does not start with a function's name (it starts with {short(head.strip())})"
        pairs = []
        while rest.strip():
            rest = rest.lstrip()
            if not rest.startswith(KEY):
                return f"it has {short(rest)} where an {KEY} belongs (calling {name!r})"
            raw, sep, rest = rest[len(KEY):].partition(END_KEY)
            key = tag_word(raw) if sep else None
            if key is None:
                return f"its {KEY} is broken ({short(KEY + raw)}, calling {name!r})"
            rest = rest.lstrip()
            if not rest.startswith(VALUE):
                return f"its argument {key!r} has no {VALUE} (calling {name!r})"
            value, sep, rest = rest[len(VALUE):].partition(END_VALUE)
            if not sep:
                return f"its argument {key!r} has no {END_VALUE} (calling {name!r})"
            pairs.append((key, value))
        return name, pairs
