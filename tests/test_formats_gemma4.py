"""engine/prompts/formats/gemma4.py: Gemma 4's replies, a `<|channel>thought` block for reasoning and
`<|tool_call>call:NAME{key:value}<tool_call|>` calls in Gemma's own argument syntax. Each example reply is
read whole and under every split (tests/test_formats.py's splits and invariants); a turn rendered by the
published template (resources/templates/gemma-4-chat_template.jinja, as llama.cpp carries it; through the engine's sandboxed
ChatTemplate) reads back as the reasoning, content and calls it was made from. No model: it runs in seconds.
"""
from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.prompts.formats import (FORMATS, GEMMA_FORMATS, TAGGED_FORMATS, THINKING_FORMATS, Parser, format_of,
                            parser_for)
from engine.prompts.formats.gemma4 import Gemma4Parser, arguments
from engine.tools.serve.tool_fields import OPENINGS
from format_checks import call, check_invariants, merged, splits

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "resources" / "templates"
GEMMA = TEMPLATES / "gemma-4-chat_template.jinja"
WEATHER = ("get_weather", "get_time")
Q = '<|"|>'  # Gemma's string quote token


def s(text: str) -> str:
    """A string argument as Gemma writes it."""
    return Q + text + Q


def gc(name: str, args: str = "") -> str:
    """A call as Gemma's template writes it (args: the text between the braces)."""
    return "<|tool_call>call:" + name + "{" + args + "}<tool_call|>"


def ex(text, reasoning="", content="", calls=(), notes=(), tools=WEATHER, thinking_open=False, id=None):
    """One example: `notes` are substrings, one per note, in order."""
    return pytest.param(text, reasoning, content, list(calls), list(notes), tools, thinking_open, id=id)


def read(pieces, tools=None, thinking_open=False):
    p = parser_for("gemma4", tools=tools, thinking_open=thinking_open)
    deltas = []
    for piece in pieces:
        deltas += p.feed(piece)
    deltas += p.finish()
    assert p.finish() == []
    return p, deltas


TRICKY = ("city:" + s('Paris, "France" {1}: [x],\nline two') + ",days:-3,deep:{x:[[],{}],y:[[1,[2,[3]]]]},"
          "empty:" + s("") + ",hours:[9,12],limit:null,metric:false,none:None,opt:{sources:[" + s("a") + ","
          + s("é 🇨🇭") + "],wind:true},scale:1.5e-3,tiny:-0.25,zero:0")
TRICKY_ARGS = {"city": 'Paris, "France" {1}: [x],\nline two', "days": -3, "deep": {"x": [[], {}], "y": [[1, [2, [3]]]]},
               "empty": "", "hours": [9, 12], "limit": None, "metric": False, "none": None,
               "opt": {"sources": ["a", "é 🇨🇭"], "wind": True}, "scale": 1.5e-3, "tiny": -0.25, "zero": 0}

EXAMPLES = [
    ex("Paris is the capital of France.\n\nIt is large.", "", "Paris is the capital of France.\n\nIt is large.",
       id="plain-answer"),
    ex("<|channel>thought\nThe user greets me.\nI should greet back.\n<channel|>Hello! How can I help?<turn|>",
       "The user greets me.\nI should greet back.", "Hello! How can I help?", id="reasoning-then-answer"),
    ex("<|channel>thought\n<channel|>Just the answer.", "", "Just the answer.", id="empty-thought"),
    ex("\n<|channel>thought\nPlan.\n<channel|>\n\nAnswer.\n", "Plan.", "Answer.\n", id="whitespace-around-thought"),
    ex("The user wants 2+2.\nThat is 4.\n<channel|>4", "The user wants 2+2.\nThat is 4.", "4", thinking_open=True,
       id="thinking-open"),
    ex("<|channel>thought\nThe user wants the weather.\n<channel|>" + gc("get_weather", "city:" + s("Paris"))
       + "<|tool_response>", "The user wants the weather.", "", [call(0, "get_weather", {"city": "Paris"})],
       id="one-call"),
    ex("I'll check both cities.\n" + gc("get_weather", "city:" + s("Paris")) + "\n"
       + gc("get_weather", "city:" + s("Tokyo") + ",days:2") + "<|tool_response>", "", "I'll check both cities.",
       [call(0, "get_weather", {"city": "Paris"}), call(1, "get_weather", {"city": "Tokyo", "days": 2})],
       id="two-calls"),
    ex(gc("get_time") + "\nThen I will summarise.\n" + gc("get_weather", "city:" + s("Oslo")) + "\n\nDone.", "",
       "Then I will summarise.\n\nDone.", [call(0, "get_time", {}), call(1, "get_weather", {"city": "Oslo"})],
       id="content-between-calls"),
    ex(gc("get_weather", TRICKY), "", "", [call(0, "get_weather", TRICKY_ARGS)], id="nested-and-tricky-arguments"),
    ex("<|tool_call> call:get_weather { city : " + s("Rome") + " , hours : [ 1 , 2 ] ,\n opt : { "
       + s("quoted key") + " : true } } <tool_call|>", "", "",
       [call(0, "get_weather", {"city": "Rome", "hours": [1, 2], "opt": {"quoted key": True}})],
       id="whitespace-and-quoted-key"),
    ex(gc("get_weather", "city:" + s("<tool_call> {a:b} <|channel> " + Q[:3])), "", "",
       [call(0, "get_weather", {"city": "<tool_call> {a:b} <|channel> <|\""})], id="markup-inside-a-string"),
    ex("Deleting.\n" + gc("delete_files", "path:" + s("/")), "", "Deleting.\n" + gc("delete_files", "path:" + s("/")),
       notes=["'delete_files', which the request did not offer"], id="function-not-offered"),
    ex(gc("anything", "x:1"), "", "", [call(0, "anything", {"x": 1})], tools=None, id="any-function-without-tools"),
    ex(gc("get_weather", "city:" + s("Paris")), "", gc("get_weather", "city:" + s("Paris")), tools=(),
       notes=["'get_weather', which the request did not offer"], id="no-function-offered"),
    ex(gc("get_weather", "city:" + Q + "Paris"), "", gc("get_weather", "city:" + Q + "Paris"),
       notes=["a string is not closed"], id="broken-unclosed-string"),
    ex(gc("get_weather", "city:" + s("Paris") + " days:3"), "", gc("get_weather", "city:" + s("Paris") + " days:3"),
       notes=["where a , or } belongs"], id="broken-missing-comma"),
    ex(gc("get_weather", "city:Paris"), "", gc("get_weather", "city:Paris"), notes=["'Paris' is not a value"],
       id="broken-bare-word"),
    ex(gc("get_weather", '"city": "Paris"'), "", gc("get_weather", '"city": "Paris"'),
       notes=["where a key and : belong"], id="broken-json-arguments"),
    ex(gc("get_weather", "city:" + s("a") + ","), "", gc("get_weather", "city:" + s("a") + ","),
       notes=["where a key and : belong"], id="broken-trailing-comma"),
    ex(gc("get_weather", "hours:[1,2"), "", gc("get_weather", "hours:[1,2"), notes=["where a , or ] belongs"],
       id="broken-unclosed-list"),
    ex(gc("get_weather", "city:" + s("a") + ",city:" + s("b")), "", gc("get_weather", "city:" + s("a") + ",city:"
       + s("b")), notes=["'city' is given twice"], id="broken-key-twice"),
    ex(gc("get_weather", "zip:02139"), "", gc("get_weather", "zip:02139"), notes=["'02139' is not a value"],
       id="broken-leading-zero"),
    ex(gc("get_weather", "scale:1e999"), "", gc("get_weather", "scale:1e999"), notes=["too large"],
       id="broken-infinite-number"),
    ex(gc("get_weather", "a:" + "[" * 80 + "]" * 80), "", gc("get_weather", "a:" + "[" * 80 + "]" * 80),
       notes=["nested too deeply"], id="broken-too-deep"),
    ex("<|tool_call>call:get_time{}}<tool_call|>", "", "<|tool_call>call:get_time{}}<tool_call|>",
       notes=["goes on after its arguments"], id="broken-text-after-arguments"),
    ex("<|tool_call>get_time{}<tool_call|>", "", "<|tool_call>get_time{}<tool_call|>",
       notes=["does not start with call:"], id="broken-no-call-prefix"),
    ex("<|tool_call>call:get time{}<tool_call|>", "", "<|tool_call>call:get time{}<tool_call|>",
       notes=["name is not one word"], id="broken-name"),
    ex("<|tool_call>call:get_time<tool_call|>", "", "<|tool_call>call:get_time<tool_call|>",
       notes=["no {arguments}"], id="broken-no-braces"),
    ex("OK. " + gc("get_time") + " " + gc("get_weather", "city:Oslo") + " then.", "",
       "OK." + " " + gc("get_weather", "city:Oslo") + " then.", [call(0, "get_time", {})],
       notes=["'Oslo' is not a value"], id="a-good-call-and-a-bad-one"),
    ex("Checking.\n<|tool_call>call:get_weather{city:" + Q + "Par", "",
       "Checking.\n<|tool_call>call:get_weather{city:" + Q + "Par", notes=["ended before <tool_call|>"],
       id="cut-mid-call"),
    ex("Checking.<|tool_call>call:get_weather{city:" + Q + "Par<turn|>\n<|turn>user\nmore", "",
       "Checking.<|tool_call>call:get_weather{city:" + Q + "Par", notes=["ended before <tool_call|>"],
       id="call-cut-by-end-of-turn"),
    ex("<|tool_call>call:get_wea", "", "<|tool_call>call:get_wea", notes=["ended before <tool_call|>"],
       id="cut-in-the-name"),
    ex("<|channel>thought\nStill thinking...\n\n", "Still thinking...", id="cut-mid-reasoning"),
    ex("<|channel>thought\nHmm.<turn|>ignored", "Hmm.", id="reasoning-cut-by-end-of-turn"),
    ex("<|chan", "", "<|chan", id="cut-mid-token"),
    ex("<|channel>", "", id="cut-after-channel"),
    ex("<|channel>thoughtful words<channel|>A", "thoughtful words", "A", id="no-channel-name"),
    ex("<|channel>thought\nI could write " + gc("get_time") + " now.\n<channel|>No need.",
       "I could write " + gc("get_time") + " now.", "No need.", id="call-inside-reasoning"),
    ex("Done.<turn|>\n<|turn>user\n" + gc("get_time"), "", "Done.", id="nothing-read-after-end-of-turn"),
    ex(gc("get_time") + "<|tool_response>response:get_time{value:" + s("12:00") + "}<tool_response|>", "", "",
       [call(0, "get_time", {})], id="nothing-read-after-tool-response"),
    ex("Use <tool_call> or <|tool_call or <channel|> or <|\"|> or </think>, 1 < 2 <|tool", "",
       "Use <tool_call> or <|tool_call or <channel|> or <|\"|> or </think>, 1 < 2 <|tool", id="tag-like-content"),
    ex("", id="empty"),
]

# a plausible tokenisation: Gemma's special tokens whole, words with their leading space, punctuation runs,
# whitespace runs
TOKEN = re.compile(r"<\|channel>|<channel\|>|<\|tool_call>|<tool_call\|>|<\|\"\|>|<turn\|>|<\|tool_response>"
                   r"|<tool_response\|>|<\|turn>| ?\w+| ?[^\w\s]+|\s+")


def all_splits(text: str):
    yield from splits(text)
    pieces = TOKEN.findall(text)
    assert "".join(pieces) == text
    yield "gemma tokens", pieces


def same_under_every_split(text, tools, thinking_open):
    p, deltas = read([text], tools, thinking_open)
    check_invariants(p, deltas)
    whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
    for how, pieces in all_splits(text):
        assert "".join(pieces) == text
        q, ds = read(pieces, tools, thinking_open)
        check_invariants(q, ds)
        assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, how
    return p


@pytest.mark.parametrize("text,reasoning,content,calls,notes,tools,thinking_open", EXAMPLES)
def test_example_under_every_split(text, reasoning, content, calls, notes, tools, thinking_open):
    p = same_under_every_split(text, tools, thinking_open)
    assert (p.reasoning, p.content, p.tool_calls) == (reasoning, content, calls)
    assert len(p.notes) == len(notes) and all(want in got for want, got in zip(notes, p.notes)), p.notes


def test_streaming_holds_only_a_possible_tag():
    p = parser_for("gemma4", tools=WEATHER)
    assert [d.text for d in p.feed("Hello <|tool")] == ["Hello"]  # the space could come before a call
    assert "".join(d.text for d in p.feed("_response")) == ""  # `<|tool_response>` is still possible
    assert "".join(d.text for d in p.feed("s> and more")) == " <|tool_responses> and more"
    ds = p.feed(" " + gc("get_time")[:-3])
    assert ds == []
    ds = p.feed(gc("get_time")[-3:])
    assert [d.part for d in ds] == ["tool_call", "tool_call"]  # complete: out at once, not at finish()
    assert ds[0].name == "get_time" and ds[1].text == "{}"
    assert p.finish() == []


@pytest.mark.parametrize("text,want", [
    ("{}", {}), ("{a:1}", {"a": 1}), ("{a:" + s("x,y}") + "}", {"a": "x,y}"}), ("{a:[]}", {"a": []}),
    ("{a:-0.5e+2,b:true,c:null}", {"a": -50.0, "b": True, "c": None}), ("{k:{j:{i:[" + s("") + "]}}}",
                                                                          {"k": {"j": {"i": [""]}}}),
    ("{a:" + s("line\nbreak") + "}", {"a": "line\nbreak"}), ("{a:1 2}", None), ("{a:+1}", None), ("{a:.5}", None),
    ("{a:NaN}", None), ("{a:True}", None), ("[1]", None), ("{a:1", None), ("{:1}", None), ("{a b:1}", {"a b": 1}),
    ("{a:[1,]}", None), ("{a:{b:1},}", None), ("{a:" + Q + "}", None),
])
def test_argument_syntax(text, want):
    got = arguments(text)
    if want is None:
        assert isinstance(got, str), got
    else:
        assert got == want and json.loads(json.dumps(got)) == want


def test_garbage_never_raises_and_splits_agree():
    """Random replies made of the format's tokens and fragments: any split reads as the whole text."""
    bits = ["<|channel>", "<channel|>", "thought", "\n", "<|tool_call>", "<tool_call|>", "call:", "get_time",
            "get_weather", "{", "}", "[", "]", ":", ",", Q, "city", "3", "-1.5", "true", "None", " ", "<turn|>",
            "<|tool_response>", "<|", "<tool_", "é", "x y", "<|\""]
    rng = random.Random(2026)
    for n in range(200):
        text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 16)))
        for tools, thinking_open in ((None, False), (WEATHER, n % 2 == 0)):
            p, deltas = read([text], tools, thinking_open)
            check_invariants(p, deltas)
            whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
            for pieces in [[text[:i], text[i:]] for i in range(0, len(text) + 1, 3)] + [list(text)]:
                q, ds = read(pieces, tools, thinking_open)
                check_invariants(q, ds)
                assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, text


# ---- the wiring ----------------------------------------------------------------------------------
def test_the_format_is_registered():
    assert GEMMA_FORMATS == ("gemma4",)
    assert not set(GEMMA_FORMATS) & set(FORMATS + TAGGED_FORMATS) and "gemma4" not in THINKING_FORMATS
    p = parser_for("gemma4", tools=("f",), thinking_open=True, schemas={"f": {}})
    assert isinstance(p, Gemma4Parser) and isinstance(p, Parser)
    assert p.tools == ("f",) and p.thinking_open and p.needs_special_tokens


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_call_opening_reads_as_the_call(choice):
    """tool_choice: the opening (engine/tools/serve/tool_fields.py OPENINGS) ends the prompt and is the
    reply's first text; the model writes the rest of the call."""
    anyone, named = OPENINGS["gemma4"]
    opening, rest = ((anyone, "get_weather{city:" + s("Oslo") + "}<tool_call|>") if choice == "required" else
                     (named.replace("NAME", "get_weather"), "city:" + s("Oslo") + "}<tool_call|>"))
    for pieces in ([opening, rest], [opening] + list(rest)):
        p, deltas = read(pieces, WEATHER)
        check_invariants(p, deltas)
        assert (p.content, p.tool_calls, p.notes) == ("", [call(0, "get_weather", {"city": "Oslo"})], [])


# ---- the published template ------------------------------------------------------------------------

# what format_of gave each published template before Gemma 4's format
FORMAT_BEFORE = {"qwen3-chat_template.jinja": "qwen3", "gpt-oss-chat_template.jinja": "harmony",
                 "qwen3.5-chat_template.jinja": "qwen_xml", "glm-4.7-flash-chat_template.jinja": "glm"}


def test_format_of_gemma_template():
    src = GEMMA.read_text(encoding="utf-8")
    assert format_of(src) == "gemma4"
    assert format_of(src.replace("<|tool_call>", "")) == "plain"  # what it was read as before


@pytest.mark.parametrize("name,fmt", sorted(FORMAT_BEFORE.items()))
def test_format_of_the_other_templates_is_unchanged(name, fmt):
    path = TEMPLATES / name
    assert format_of(path.read_text(encoding="utf-8")) == fmt, path
    assert format_of("<|tool_call>call:f{}<tool_call|> and <tool_call> and <think> and <|channel|>") == "gemma4"


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "scale": {"type": "number"}, "options": {"type": "object"},
            "hours": {"type": "array", "items": {"type": "integer"}}, "limit": {"type": ["integer", "null"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def render(messages: list[dict], **options) -> str:
    """The template's text for a conversation, through the engine's sandboxed ChatTemplate (the
    tokenizer is only asked for its special tokens: the template writes none as variables but bos_token)."""
    return template().render(messages, tools=TOOLS, **options)


@functools.lru_cache(maxsize=None)
def template():
    """The template compiled once (~0.3 s) for all the tests that render it."""
    from engine.prompts.chat_template import ChatTemplate

    tok = SimpleNamespace(special_tokens_map={}, added_tokens_decoder={})
    return ChatTemplate(GEMMA.read_text(encoding="utf-8"), tok, GEMMA)


ASK = {"role": "user", "content": "Weather in Paris and Tokyo, and the time?"}
TURNS = [  # (reasoning, content, [(name, arguments)])
    ("The user wants two cities' weather.\nThen the time.", "I'll check both cities.",
     [("get_weather", {"city": 'Paris, "Île-de-France" {centre}: [1er], a:b', "note": "Line one.\n  Line two.\n",
                       "days": 3, "metric": True, "scale": -1.5, "tiny": 1e-07, "big": 12345678901234567890,
                       "options": {"wind": True, "sources": ["a", "é, {x}"], "nested": {"deep": [[], {}, [None]]},
                                   "off": False},
                       "hours": [9, 12], "limit": None, "zip": "02139", "empty": "", "list": []}),
      ("get_weather", {"city": "Tokyo", "limit": 5}), ("get_time", {})]),
    ("Only a call.", "", [("get_time", {})]),
    ("Greeting.", "Hello!\n\nHow can I help?", []),
    ("", "No reasoning, a call.", [("get_weather", {"city": "Zürich 🇨🇭", "days": 1})]),
]


@pytest.mark.parametrize("turn", range(len(TURNS)))
def test_a_rendered_turn_reads_back(turn):
    reasoning, content, calls = TURNS[turn]
    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning,
           "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
    text = render([ASK, msg], add_generation_prompt=False)
    start = "<|turn>model\n"
    reply = text[text.rindex(start) + len(start):]
    assert reply.endswith("<|tool_response>" if calls else "<turn|>\n"), reply
    # the template writes the reasoning of a turn with calls only
    want_reasoning = reasoning if calls else ""
    for text_read in (reply, reply.removesuffix("<|tool_response>").removesuffix("<turn|>\n")):
        p = same_under_every_split(text_read, WEATHER, False)
        assert (p.reasoning, p.content, p.notes) == (want_reasoning, content, []), reply
        assert [(c.id, c.name, json.loads(c.arguments)) for c in p.tool_calls] == \
            [(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)], reply


def test_the_written_calls_read_back_alone():
    """The text the template wrote for the calls (and nothing else) is exactly the calls."""
    _, _, calls = TURNS[0]
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
    text = render([ASK, msg], add_generation_prompt=False)
    written = text[text.index("<|tool_call>"):text.rindex("<tool_call|>") + len("<tool_call|>")]
    assert written.count("<|tool_call>") == len(calls)
    p, deltas = read([written], WEATHER)
    check_invariants(p, deltas)
    assert (p.reasoning, p.content, p.notes) == ("", "", [])
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == calls


def test_the_generation_prompt_and_thinking():
    """Thinking off: the prompt ends with an empty thought and the reply is content; on: it ends with the
    model's turn and the reply may open the thought channel itself. Neither ends inside a block."""
    on = render([ASK], add_generation_prompt=True, enable_thinking=True)
    off = render([ASK], add_generation_prompt=True, enable_thinking=False)
    assert on.endswith("<|turn>model\n") and "<|think|>" in on
    assert off.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    p, _ = read(["Paris: sunny."], WEATHER)
    assert (p.reasoning, p.content) == ("", "Paris: sunny.")
    p, _ = read(["<|channel>thought\nSunny, I think.\n<channel|>Paris: sunny.<turn|>"], WEATHER)
    assert (p.reasoning, p.content) == ("Sunny, I think.", "Paris: sunny.")
