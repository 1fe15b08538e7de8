"""Tool calls written as tags, one tag pair per argument and each value as text: what the Qwen3.5 /
Qwen3-Coder format (qwen_xml.py) and the GLM-4.5 to 4.7 format (glm.py) share.

Both read a reply as Qwen3's parser does (qwen3.py): `<think>` reasoning (and `thinking_open`), calls
anywhere in the content between `<tool_call>` and `</tool_call>` (the first `</tool_call>` ends the
call), the whitespace around calls, a malformed call as content exactly as generated plus one note.
Only a call's body differs: each format splits it into the function's name and its (key, value text)
pairs (`_split`); here the name is checked, a key given twice makes the call malformed, and each
value's text becomes a JSON value. The arguments are re-serialised (`json.dumps(obj, ensure_ascii=False)`).

A value's type comes from the offered tool's JSON schema (`schemas`: function name -> its
`parameters` object, as `schemas_of` reads them from a request's tools), as vLLM's parsers of these
formats do; the templates write a string as it is and any other value as JSON (GLM's) or, for a
scalar, with Jinja's `string` filter (Qwen3.5's: `True`, `None`, `3`):
- type "string", or none known (no schema, a function or parameter it does not list, a schema
  without a type): the text as it is, nothing guessed (a "42" may well be a string);
- "null": `null` or `None`; "boolean": `true`/`false` in any case; "integer": a JSON number that is
  whole; "number": a finite JSON number; "object" / "array": JSON text of that kind (the text's edge
  whitespace is ignored for all of these);
- several types (a list of types, anyOf/oneOf, the values of an enum or const): the first of null,
  boolean, integer, number, object, array that the text reads as, else the text;
- a value that is not of its type stays text (as vLLM and llama.cpp keep it): the call is not lost.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .qwen3 import Qwen3Parser, load_json

_ALIASES = {"str": "string", "text": "string", "int": "integer", "float": "number", "bool": "boolean",
            "dict": "object", "list": "array"}  # loose type names some tool definitions use
_ORDER = ("null", "boolean", "integer", "number", "object", "array")
_NO = object()  # the text is not of the type
MAX_SCHEMA_DEPTH = 8  # anyOf/oneOf nesting followed
_FUNCTION_NAME = re.compile(r"[\w.:-]+")  # letters, digits, `_`, `.`, `:`, `-` (not JSON, not a sentence)


def schemas_of(tools) -> dict[str, dict]:
    """Function name -> its `parameters` schema, from a request's tools in OpenAI's shape
    (`[{"type": "function", "function": {"name": ..., "parameters": {...}}}]`); what cannot be read
    is left out (its values stay text)."""
    out = {}
    for t in tools if isinstance(tools, (list, tuple)) else ():
        f = t.get("function") if isinstance(t, dict) else None
        if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("parameters"), dict):
            out[f["name"]] = f["parameters"]
    return out


def parameter_schema(schemas: dict | None, name: str, key: str):
    """The schema of function `name`'s parameter `key`, or None."""
    fn = schemas.get(name) if isinstance(schemas, dict) else None
    props = fn.get("properties") if isinstance(fn, dict) else None
    return props.get(key) if isinstance(props, dict) else None


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", dict: "object", list: "array"}.get(type(value), "")


def types_of(schema, depth: int = 0) -> set[str]:
    """The JSON types a parameter's schema allows (empty: none known)."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return set()
    t = schema.get("type")
    names = [t] if isinstance(t, str) else t if isinstance(t, list) else []
    out = {_ALIASES.get(n.strip().lower(), n.strip().lower()) for n in names if isinstance(n, str)}
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        for sub in subs if isinstance(subs, list) else ():
            out |= types_of(sub, depth + 1)
    if not out:
        values = schema.get("enum") if isinstance(schema.get("enum"), list) else \
            [schema["const"]] if "const" in schema else []
        out = {_json_type(v) for v in values} - {""}
    return out


def _number(text: str):
    value, why = load_json(text)
    if why or isinstance(value, bool) or not isinstance(value, (int, float)):
        return _NO
    if isinstance(value, float) and not math.isfinite(value):
        return _NO
    return value


def _integer(text: str):
    value = _number(text)
    if isinstance(value, float):
        return int(value) if value.is_integer() else _NO
    return value


def _of_kind(kind: type):
    def read(text: str):
        value, why = load_json(text)
        return value if not why and isinstance(value, kind) else _NO
    return read


_READERS = {
    "null": lambda text: None if text in ("null", "None") else _NO,
    "boolean": lambda text: text.lower() == "true" if text.lower() in ("true", "false") else _NO,
    "integer": _integer,
    "number": _number,
    "object": _of_kind(dict),
    "array": _of_kind(list),
}


def typed(text: str, schema) -> object:
    """A value's text as the JSON value its schema's type says (the module's docstring)."""
    types = types_of(schema)
    if not types - {"string"}:
        return text
    bare = text.strip()
    for t in _ORDER:
        if t in types:
            value = _READERS[t](bare)
            if value is not _NO:
                return value
    return text


def tag_word(text: str) -> str | None:
    """A name written inside a tag (`<function=NAME>`, `<arg_key>KEY</arg_key>`), its edges' whitespace
    dropped; None when it is empty or holds a `<`, `>` or line break (the tag is broken)."""
    word = text.strip()
    if not word or any(c in word for c in "<>\n\r"):
        return None
    return word


def function_name(text: str) -> str | None:
    """A function's name as a call writes it, its edges' whitespace dropped; None when it is not one
    (empty, or holding anything but letters, digits, `_`, `.`, `:` and `-`)."""
    name = text.strip()
    return name if _FUNCTION_NAME.fullmatch(name) else None


def short(text: str, n: int = 40) -> str:
    """A piece of generated text, quoted and cut short, for a note."""
    return repr(text if len(text) <= n else text[:n] + "...")


@dataclass
class TaggedCallParser(Qwen3Parser):
    """Qwen3's reading of a reply with a call's body read by `_split` and its values typed."""

    schemas: dict | None = None  # function name -> its parameters' JSON schema (None: values stay text)

    def _split(self, body: str) -> tuple[str, list[tuple[str, str]]] | str:
        """A call's body: the function's name and its (key, value text) pairs, or why it is malformed."""
        raise NotImplementedError

    def _read(self, body: str) -> tuple[str, dict] | str:
        got = self._split(body)
        if isinstance(got, str):
            return got
        name, pairs = got
        why = self._check_name(name)
        if why:
            return why
        args = {}
        for key, text in pairs:
            if key in args:
                return f"it gives the argument {key!r} twice (calling {name!r})"
            args[key] = typed(text, parameter_schema(self.schemas, name, key))
        return name, args
