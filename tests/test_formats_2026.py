"""engine/prompts/formats, the formats that write tool calls as tags (TAGGED_FORMATS): Qwen3.5 / Qwen3-Coder's
`<function=NAME><parameter=KEY>` ("qwen_xml") and GLM-4.5..4.7's `NAME<arg_key>K</arg_key><arg_value>V`
("glm"). Each example reply is read whole and under every split (tests/test_formats.py's splits and
invariants); the argument values are typed by the offered tools' schemas; and a conversation rendered
by the published template (resources/templates/, through the engine's sandboxed ChatTemplate) reads
back as the reasoning, content and calls it was made from. No model: it runs in seconds.
"""
from __future__ import annotations

import functools
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.prompts.formats import (FORMATS, TAGGED_FORMATS, THINKING_FORMATS, Parser, format_of, parser_for,
                            schemas_of)
from engine.prompts.formats.tagged_calls import typed, types_of
from format_checks import call, check_invariants, merged, splits

TEMPLATES = Path(__file__).resolve().parents[1] / "resources" / "templates"
QWEN35, GLM47 = "qwen3.5-chat_template.jinja", "glm-4.7-flash-chat_template.jinja"
WEATHER = ("get_weather", "get_time")
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "zip": {"type": "string"}, "note": {"type": "string"},
            "days": {"type": "integer"}, "metric": {"type": "boolean"}, "scale": {"type": "number"},
            "options": {"type": "object"}, "hours": {"type": "array", "items": {"type": "integer"}},
            "limit": {"type": ["integer", "null"]}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                      "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = schemas_of(TOOLS)


def ex(fmt, text, reasoning="", content="", calls=(), notes=(), tools=WEATHER, thinking_open=False,
       schemas=SCHEMAS, id=None):
    """One example: `notes` are substrings, one per note, in order."""
    return pytest.param(fmt, text, reasoning, content, list(calls), list(notes), tools, thinking_open, schemas,
                        id=id)


def read(fmt, pieces, tools=None, thinking_open=False, schemas=None):
    p = parser_for(fmt, tools=tools, thinking_open=thinking_open, schemas=schemas)
    deltas = []
    for piece in pieces:
        deltas += p.feed(piece)
    deltas += p.finish()
    assert p.finish() == []
    return p, deltas


# ---- Qwen3.5 / Qwen3-Coder ------------------------------------------------------------------------
def qc(name, *params):
    """A call as the Qwen3.5 template writes it: (key, value text) pairs."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


FULL_Q = qc("get_weather", ("city", "Paris"), ("note", "Line one.\n  Line two, indented.\n"), ("days", "3"),
            ("metric", "True"), ("scale", "1.5"), ("options", '{"wind": true, "sources": ["a", "b"]}'),
            ("hours", "[9, 12]"), ("limit", "None"), ("zip", "02139"))
FULL_ARGS = {"city": "Paris", "note": "Line one.\n  Line two, indented.\n", "days": 3, "metric": True,
             "scale": 1.5, "options": {"wind": True, "sources": ["a", "b"]}, "hours": [9, 12], "limit": None,
             "zip": "02139"}
AS_TEXT = {"city": "Paris", "note": "Line one.\n  Line two, indented.\n", "days": "3", "metric": "True",
           "scale": "1.5", "options": '{"wind": true, "sources": ["a", "b"]}', "hours": "[9, 12]",
           "limit": "None", "zip": "02139"}

QWEN_XML = [
    ex("qwen_xml", "The user greets me. I should greet back.\n</think>\n\nHello! How can I help?",
       "The user greets me. I should greet back.", "Hello! How can I help?", thinking_open=True,
       id="qwen_xml-thinking-open"),
    ex("qwen_xml", "<think>\nPlan: answer.\n</think>\n\nParis is the capital of France.\n\nIt is large.",
       "Plan: answer.", "Paris is the capital of France.\n\nIt is large.", id="qwen_xml-reasoning-answer"),
    ex("qwen_xml", "Just the answer, no thinking.", "", "Just the answer, no thinking.",
       id="qwen_xml-thinking-off"),
    ex("qwen_xml", "The user wants the weather.\n</think>\n\n" + FULL_Q, "The user wants the weather.", "",
       [call(0, "get_weather", FULL_ARGS)], thinking_open=True, id="qwen_xml-typed-parameters"),
    ex("qwen_xml", FULL_Q, "", "", [call(0, "get_weather", AS_TEXT)], schemas=None, id="qwen_xml-no-schema-strings"),
    ex("qwen_xml", "Two cities.\n</think>\n\nI'll check both cities.\n\n" + qc("get_weather", ("city", "Paris"))
       + "\n" + qc("get_weather", ("city", "Tokyo"), ("days", "2")), "Two cities.", "I'll check both cities.",
       [call(0, "get_weather", {"city": "Paris"}), call(1, "get_weather", {"city": "Tokyo", "days": 2})],
       thinking_open=True, id="qwen_xml-two-calls"),
    ex("qwen_xml", qc("get_time") + "\nThen I will summarise.\n" + qc("get_weather", ("city", "Oslo")) + "\n\nDone.",
       "", "Then I will summarise.\n\nDone.", [call(0, "get_time", {}), call(1, "get_weather", {"city": "Oslo"})],
       id="qwen_xml-content-between-calls"),
    ex("qwen_xml", "Deleting.\n" + qc("delete_files", ("path", "/")), "",
       "Deleting.\n" + qc("delete_files", ("path", "/")), notes=["'delete_files', which the request did not offer"],
       id="qwen_xml-unknown-function"),
    ex("qwen_xml", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
       "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", notes=["ended before </tool_call>"],
       id="qwen_xml-unclosed-call"),
    ex("qwen_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>", "",
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
       notes=["'city' has no </parameter>"], id="qwen_xml-parameter-not-closed"),
    ex("qwen_xml", "<tool_call>\n<function=get_weather>\ncity: Paris\n</function>\n</tool_call>", "",
       "<tool_call>\n<function=get_weather>\ncity: Paris\n</function>\n</tool_call>",
       notes=["where a <parameter=...> or </function> belongs"], id="qwen_xml-text-between-tags"),
    ex("qwen_xml", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "",
       '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', notes=["does not start with <function="],
       id="qwen_xml-json-call"),
    ex("qwen_xml", "<tool_call>\n<function=get weather>\n</function>\n</tool_call>", "",
       "<tool_call>\n<function=get weather>\n</function>\n</tool_call>", notes=["tag is broken"],
       id="qwen_xml-name-not-a-word"),
    ex("qwen_xml", qc("get_weather", ("city", "Paris"), ("city", "Lyon")), "",
       qc("get_weather", ("city", "Paris"), ("city", "Lyon")), notes=["'city' twice"], id="qwen_xml-key-twice"),
    ex("qwen_xml", qc("get_weather", ("city", "Rome"), ("days", "three"), ("metric", "maybe")), "", "",
       [call(0, "get_weather", {"city": "Rome", "days": "three", "metric": "maybe"})],
       id="qwen_xml-value-not-of-its-type"),
    ex("qwen_xml", "Use <function=f> or <parameter=x>, a <tool_callback> and </tool_call>, 1 < 2 <tool_call", "",
       "Use <function=f> or <parameter=x>, a <tool_callback> and </tool_call>, 1 < 2 <tool_call",
       id="qwen_xml-tag-like-content"),
    ex("qwen_xml", qc("get_weather", ("city", "Zürich 🇨🇭"), ("note", "<parameter=x> and </function> inside")),
       "", "", [call(0, "get_weather", {"city": "Zürich 🇨🇭", "note": "<parameter=x> and </function> inside"})],
       id="qwen_xml-tags-inside-a-value"),
    ex("qwen_xml", "<think>\nI could write <tool_call>\n<function=get_time>\n</function>\n</tool_call> now.\n"
       "</think>\n\nNo need.", "I could write <tool_call>\n<function=get_time>\n</function>\n</tool_call> now.",
       "No need.", id="qwen_xml-call-inside-reasoning"),
    ex("qwen_xml", "<tool_call><function=get_time></function></tool_call>", "", "", [call(0, "get_time", {})],
       tools=None, id="qwen_xml-compact-any-function"),
    ex("qwen_xml", "Still thinking...\n\n", "Still thinking...", thinking_open=True, id="qwen_xml-unclosed-think"),
    ex("qwen_xml", "", id="qwen_xml-empty"),
]

# ---- GLM-4.5 .. 4.7 -------------------------------------------------------------------------------
def gc(name, *args, sep=""):
    """A call as GLM-4.7's template writes it (sep="\\n": GLM-4.5's line breaks between the pieces)."""
    body = "".join(f"{sep}<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>" for k, v in args)
    return f"<tool_call>{name}{body}{sep}</tool_call>"


FULL_G = (("city", "Paris"), ("note", "Line one.\n  Line two, indented.\n"), ("days", "3"), ("metric", "true"),
          ("scale", "1.5"), ("options", '{"wind": true, "sources": ["a", "b"]}'), ("hours", "[9, 12]"),
          ("limit", "null"), ("zip", "02139"))

GLM = [
    ex("glm", "The user greets me.</think>Hello! How can I help?", "The user greets me.", "Hello! How can I help?",
       thinking_open=True, id="glm-thinking-open"),
    ex("glm", "\n<think>Plan: answer.</think>\nParis is the capital of France.", "Plan: answer.",
       "Paris is the capital of France.", id="glm45-reasoning-answer"),
    ex("glm", "Just the answer.", "", "Just the answer.", id="glm-thinking-off"),
    ex("glm", "The user wants the weather.</think>" + gc("get_weather", *FULL_G), "The user wants the weather.", "",
       [call(0, "get_weather", {**FULL_ARGS, "metric": True, "limit": None})], thinking_open=True,
       id="glm-typed-arguments"),
    ex("glm", gc("get_weather", *FULL_G, sep="\n"), "", "",
       [call(0, "get_weather", {**AS_TEXT, "metric": "true", "limit": "null"})], schemas=None,
       id="glm45-line-breaks-no-schema-strings"),
    ex("glm", "Two cities.</think>I'll check both cities.\n" + gc("get_weather", ("city", "Paris")) + "\n"
       + gc("get_weather", ("city", "Tokyo"), ("days", "2"), sep="\n"), "Two cities.", "I'll check both cities.",
       [call(0, "get_weather", {"city": "Paris"}), call(1, "get_weather", {"city": "Tokyo", "days": 2})],
       thinking_open=True, id="glm-two-calls"),
    ex("glm", "First:" + gc("get_time") + "then" + gc("get_weather", ("city", "Oslo")) + "\ndone.", "",
       "First:then\ndone.", [call(0, "get_time", {}), call(1, "get_weather", {"city": "Oslo"})],
       id="glm-content-between-calls"),
    ex("glm", "Deleting." + gc("delete_files", ("path", "/")), "", "Deleting." + gc("delete_files", ("path", "/")),
       notes=["'delete_files', which the request did not offer"], id="glm-unknown-function"),
    ex("glm", "Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", "",
       "Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", notes=["ended before </tool_call>"],
       id="glm-unclosed-call"),
    ex("glm", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</tool_call>", "",
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</tool_call>",
       notes=["'city' has no </arg_value>"], id="glm-value-not-closed"),
    ex("glm", "<tool_call>get_weather<arg_key>city</arg_key>Paris</tool_call>", "",
       "<tool_call>get_weather<arg_key>city</arg_key>Paris</tool_call>", notes=["'city' has no <arg_value>"],
       id="glm-key-without-value"),
    ex("glm", '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', "",
       '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', notes=["does not start with a function's name"],
       id="glm-json-call"),
    ex("glm", '<tool_call>{"name":"get_time"}</tool_call>', "", '<tool_call>{"name":"get_time"}</tool_call>',
       notes=["does not start with a function's name"], tools=None, id="glm-json-call-any-function"),
    ex("glm", gc("get_weather", ("city", "Paris"), ("city", "Lyon")), "",
       gc("get_weather", ("city", "Paris"), ("city", "Lyon")), notes=["'city' twice"], id="glm-key-twice"),
    ex("glm", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value> and more</tool_call>", "",
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value> and more</tool_call>",
       notes=["where an <arg_key> belongs"], id="glm-text-after-a-pair"),
    ex("glm", "Write <arg_key>x</arg_key> or <arg_value>, a <tool_callback>, </tool_call> and 1 < 2 <tool_ca", "",
       "Write <arg_key>x</arg_key> or <arg_value>, a <tool_callback>, </tool_call> and 1 < 2 <tool_ca",
       id="glm-tag-like-content"),
    ex("glm", gc("get_weather", ("city", "  Zürich 🇨🇭 "), ("unit", "celsius")), "", "",
       [call(0, "get_weather", {"city": "  Zürich 🇨🇭 ", "unit": "celsius"})], id="glm-value-kept-exactly"),
    ex("glm", "<think>Maybe <tool_call>get_time</tool_call>.</think>No need.", "Maybe <tool_call>get_time</tool_call>.",
       "No need.", id="glm-call-inside-reasoning"),
    ex("glm", "<tool_call>\nget_time\n</tool_call>", "", "", [call(0, "get_time", {})], id="glm-no-arguments"),
    ex("glm", "", id="glm-empty"),
]

EXAMPLES = QWEN_XML + GLM

# a plausible tokenisation for these formats: tags whole, words with their leading space, punctuation
# runs, whitespace runs
TOKEN = re.compile(r"</?(?:think|tool_call|arg_key|arg_value)>|<function=|<parameter=|</parameter>|</function>"
                   r"| ?\w+| ?[^\w\s]+|\s+")


def all_splits(text: str):
    yield from splits(text)
    pieces = TOKEN.findall(text)
    assert "".join(pieces) == text
    yield "tagged tokens", pieces


@pytest.mark.parametrize("fmt,text,reasoning,content,calls,notes,tools,thinking_open,schemas", EXAMPLES)
def test_example_under_every_split(fmt, text, reasoning, content, calls, notes, tools, thinking_open, schemas):
    p, deltas = read(fmt, [text], tools, thinking_open, schemas)
    check_invariants(p, deltas)
    assert (p.reasoning, p.content, p.tool_calls) == (reasoning, content, calls)
    assert len(p.notes) == len(notes) and all(want in got for want, got in zip(notes, p.notes)), p.notes
    whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
    for how, pieces in all_splits(text):
        assert "".join(pieces) == text
        q, ds = read(fmt, pieces, tools, thinking_open, schemas)
        check_invariants(q, ds)
        assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, how


def test_every_tagged_format_has_examples_and_parsers():
    assert {e.values[0] for e in EXAMPLES} == set(TAGGED_FORMATS)
    assert not set(TAGGED_FORMATS) & set(FORMATS) and set(THINKING_FORMATS) <= set(FORMATS + TAGGED_FORMATS)
    for fmt in TAGGED_FORMATS:
        p = parser_for(fmt, tools=("f",), thinking_open=True, schemas={"f": {}})
        assert isinstance(p, Parser) and p.tools == ("f",) and p.needs_special_tokens
        assert p.thinking_open and p.schemas == {"f": {}}


def _out(deltas, part):
    return "".join(d.text for d in deltas if d.part == part)


@pytest.mark.parametrize("fmt,call_text", [("qwen_xml", qc("get_time")), ("glm", gc("get_time"))])
def test_holds_back_only_what_could_be_a_tag(fmt, call_text):
    p = parser_for(fmt, thinking_open=True)
    assert _out(p.feed("Plan it.\n</th"), "reasoning") == "Plan it."
    assert _out(p.feed("ink>\n\nHello <tool_"), "content") == "Hello"  # the space could come before a call
    assert _out(p.feed("tips> and more"), "content") == " <tool_tips> and more"
    head, tail = call_text[:-3], call_text[-3:]
    assert p.feed(" " + head) == []
    ds = p.feed(tail)
    assert [d.part for d in ds] == ["tool_call", "tool_call"]  # complete: out at once, not at finish()
    assert ds[0].name == "get_time" and ds[1].text == "{}"
    assert p.finish() == []


# ---- value typing ------------------------------------------------------------------------------------
def test_types_of_schemas():
    assert types_of({"type": "integer"}) == {"integer"}
    assert types_of({"type": ["string", "null"]}) == {"string", "null"}
    assert types_of({"anyOf": [{"type": "number"}, {"oneOf": [{"type": "array"}]}]}) == {"number", "array"}
    assert types_of({"enum": ["a", 1, None]}) == {"string", "integer", "null"}
    assert types_of({"const": True}) == {"boolean"}
    assert types_of({"type": "int"}) == {"integer"} and types_of({"type": "Bool"}) == {"boolean"}
    assert types_of({}) == types_of(None) == types_of({"type": 3}) == types_of("string") == set()
    deep = {"type": "integer"}
    for _ in range(50):
        deep = {"anyOf": [deep]}
    assert types_of(deep) == set()  # followed 8 deep, no further


@pytest.mark.parametrize("text,schema,want", [
    ("42", None, "42"), ("42", {}, "42"), ("42", {"type": "string"}, "42"), (" 42 ", {"type": "integer"}, 42),
    ("3.0", {"type": "integer"}, 3), ("3.5", {"type": "integer"}, "3.5"), ("three", {"type": "integer"}, "three"),
    ("true", {"type": "integer"}, "true"), ("-1e3", {"type": "number"}, -1000.0), ("7", {"type": "number"}, 7),
    ("NaN", {"type": "number"}, "NaN"), ("Infinity", {"type": "number"}, "Infinity"),
    ("1e999", {"type": "number"}, "1e999"),
    ("True", {"type": "boolean"}, True), ("FALSE", {"type": "boolean"}, False), ("yes", {"type": "boolean"}, "yes"),
    ("None", {"type": "null"}, None), ("null", {"type": ["string", "null"]}, None), ("nil", {"type": "null"}, "nil"),
    ('{"a": 1}', {"type": "object"}, {"a": 1}), ("[1]", {"type": "object"}, "[1]"),
    ("[1, 2]", {"type": "array"}, [1, 2]),
    ("{'a': 1}", {"type": "object"}, "{'a': 1}"), ("[" * 5000 + "]" * 5000, {"type": "array"}, "[" * 5000 + "]" * 5000),
    ("5", {"type": ["string", "integer"]}, 5), ("five", {"type": ["integer", "string"]}, "five"),
    ("1", {"enum": [1, 2]}, 1), ("\nline\n", {"type": "string"}, "\nline\n"),
])
def test_typed_values(text, schema, want):
    got = typed(text, schema)
    assert got == want and type(got) is type(want)


def test_schemas_of_reads_what_it_can():
    assert schemas_of(None) == schemas_of("x") == schemas_of([1, {"function": 2}, {"function": {"name": 3}}]) == {}
    assert schemas_of([{"type": "function", "function": {"name": "f"}}]) == {}  # no parameters: values stay text
    assert schemas_of(TOOLS)["get_time"] == {"type": "object", "properties": {}}


def test_garbage_never_raises_and_splits_agree():
    """Random replies made of the formats' tags and fragments: any split reads as the whole text."""
    bits = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "get_time", ">", "</function>",
            "<parameter=", "days", "</parameter>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "3",
            "true", "{", "}", '"', "\n", " ", "<", "é", "x y", "<tool", "</param", "<arg_"]
    schemas = schemas_of(TOOLS) | {"get_time": {"properties": {"days": {"type": ["integer", "boolean"]}}}}
    rng = random.Random(2026)
    for fmt in TAGGED_FORMATS:
        for n in range(150):
            text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 16)))
            for tools, thinking_open, sch in ((None, False, None), (WEATHER, n % 2 == 0, schemas)):
                p, deltas = read(fmt, [text], tools, thinking_open, sch)
                check_invariants(p, deltas)
                whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
                for pieces in ([text[:i], text[i:]] for i in range(0, len(text) + 1, 3)):
                    q, ds = read(fmt, pieces, tools, thinking_open, sch)
                    check_invariants(q, ds)
                    assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, (fmt, text)
                q, ds = read(fmt, list(text), tools, thinking_open, sch)
                assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, (fmt, text)


# ---- the published templates -----------------------------------------------------------------------
@pytest.mark.parametrize("name,fmt", [(QWEN35, "qwen_xml"), (GLM47, "glm"), ("qwen3-chat_template.jinja", "qwen3"),
                                      ("gpt-oss-chat_template.jinja", "harmony")])
def test_format_of_published_templates(name, fmt):
    assert format_of((TEMPLATES / name).read_text(encoding="utf-8")) == fmt


def test_format_of_the_families_template_lines():
    """The lines of Qwen3-Coder's and GLM-4.5's templates that write a past call."""
    coder = ("{%- for tool_call in message.tool_calls %}"
             "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
             "{%- for args_name, args_value in tool_call.arguments|items %}"
             "{{- '<parameter=' + args_name + '>\\n' }}"
             "{{- args_value }}{{- '\\n</parameter>\\n' }}{%- endfor %}"
             "{{- '</function>\\n</tool_call>' }}{%- endfor %}")
    glm45 = ("{{ '\\n<tool_call>' + tc.name }}{% for k, v in _args.items() %}\\n<arg_key>{{ k }}</arg_key>\\n"
             "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}"
             "\\n</tool_call>{%- if enable_thinking is defined and not enable_thinking -%}<think></think>{% endif %}")
    assert format_of(coder) == "qwen_xml" and format_of(glm45) == "glm"
    assert format_of("Call <function=f> like Llama 3.1 does, with <parameter=x>") == "plain"  # no <tool_call>


def render(name: str, messages: list[dict], **options) -> str:
    """The template's text for a conversation, through the engine's sandboxed ChatTemplate (the
    tokenizer is only asked for its special tokens: none of these templates writes them as variables)."""
    return template(name).render(messages, tools=TOOLS, **options)


@functools.lru_cache(maxsize=None)
def template(name: str):
    """The template compiled once (~0.3 s each) for all the tests that render it."""
    from engine.prompts.chat_template import ChatTemplate

    tok = SimpleNamespace(special_tokens_map={}, added_tokens_decoder={})
    return ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"), tok, Path(name))


ASK = {"role": "user", "content": "Weather in Paris and Tokyo, and the time?"}
TURNS = [  # (reasoning, content, [(name, arguments)])
    ("The user wants two cities' weather.\nThen the time.", "I'll check both cities.",
     [("get_weather", {"city": "Paris", "note": "Line one.\n  Line two, indented.\n", "days": 3, "metric": True,
                       "scale": 1.5, "options": {"wind": True, "sources": ["a", "é"]}, "hours": [9, 12],
                       "limit": None, "zip": "02139", "unit": "celsius"}),
      ("get_weather", {"city": "Tokyo", "limit": 5}), ("get_time", {})]),
    ("Only a call.", "", [("get_time", {})]),
    ("Greeting.", "Hello!\n\nHow can I help?", []),
    ("", "No reasoning, a call.", [("get_weather", {"city": "Zürich 🇨🇭", "days": 1})]),
]
# where the assistant's turn starts, and the prompt's opening of a reply when thinking
OPENINGS = {QWEN35: ("<|im_start|>assistant\n", "<think>\n"), GLM47: ("<|assistant|>", "<think>")}


@pytest.mark.parametrize("name,fmt", [(QWEN35, "qwen_xml"), (GLM47, "glm")])
@pytest.mark.parametrize("turn", range(len(TURNS)))
def test_a_rendered_turn_reads_back(name, fmt, turn):
    reasoning, content, calls = TURNS[turn]
    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning,
           "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
    text = render(name, [ASK, msg], add_generation_prompt=False)
    start, opening = OPENINGS[name]
    reply = text[text.rindex(start) + len(start):].removesuffix("<|im_end|>\n")
    want = (reasoning, content, [call(i, n, a) for i, (n, a) in enumerate(calls)])
    # the reply whole, and as generated after the prompt's `<think>` (thinking_open), under every split;
    # GLM's template writes a turn without reasoning as `</think>…`: a reply after the prompt's `<think>`
    if reply.startswith(opening):
        readings = ((reply, False), (reply[len(opening):], True))
    else:
        assert name == GLM47 and not reasoning and reply.startswith("</think>"), reply
        readings = ((reply, True),)
    for text_read, thinking_open in readings:
        p, deltas = read(fmt, [text_read], WEATHER, thinking_open, SCHEMAS)
        check_invariants(p, deltas)
        assert (p.reasoning, p.content, p.tool_calls, p.notes) == want + ([],), reply
        whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
        for how, pieces in all_splits(text_read):
            q, ds = read(fmt, pieces, WEATHER, thinking_open, SCHEMAS)
            assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, how


@pytest.mark.parametrize("name,fmt", [(QWEN35, "qwen_xml"), (GLM47, "glm")])
def test_the_generation_prompt_says_whether_thinking_is_open(name, fmt):
    """What the engine reads to set thinking_open (a prompt ending with `<think>`), with thinking on
    and off; with it off the reply is content from its first byte."""
    on = render(name, [ASK], add_generation_prompt=True)
    off = render(name, [ASK], add_generation_prompt=True, enable_thinking=False)
    assert on.rstrip().endswith("<think>") and not off.rstrip().endswith("<think>")
    p, _ = read(fmt, ["Paris: sunny."], WEATHER, False, SCHEMAS)
    assert (p.reasoning, p.content) == ("", "Paris: sunny.")
