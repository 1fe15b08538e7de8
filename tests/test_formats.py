"""engine/prompts/formats: each reply format's streaming parser, on realistic replies, under every split.

Each example is a reply's generated text and what it must read as (reasoning, content, tool calls,
notes); then the same text is fed in every two pieces, in pieces of 1..7 characters (every offset),
token by token, at random cuts and with empty feeds between characters: the joined deltas and the
final fields must be the whole-text result, and the invariants of engine/prompts/formats/__init__.py hold.
No model: it runs in seconds.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from engine.prompts.formats import FORMATS, Delta, Parser, ToolCall, format_of, parser_for

TEMPLATES = Path(__file__).resolve().parents[1] / "resources" / "templates"  # the published Qwen3 and gpt-oss templates
WEATHER = ("get_weather", "get_time")
from format_checks import TOKEN, call, check_invariants, merged, splits, tokens  # noqa: E402,F401 (shared: tests/format_checks.py)


def ex(fmt, text, reasoning="", content="", calls=(), notes=(), tools=None, thinking_open=False, id=None):
    """One example: `notes` are substrings, one per note, in order."""
    return pytest.param(fmt, text, reasoning, content, list(calls), list(notes), tools, thinking_open, id=id)


def tc(name, args):
    """A Qwen3 call as the template writes it."""
    body = '{"name": "' + name + '", "arguments": ' + json.dumps(args, ensure_ascii=False) + "}"
    return "<tool_call>\n" + body + "\n</tool_call>"


QWEN3 = [
    ex("qwen3", "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?",
       "The user greets me. I should greet back.", "Hello! How can I help?", id="qwen3-reasoning-answer"),
    ex("qwen3", "<think>\nThe user wants the weather in Paris; I have get_weather.\n</think>\n\n"
       + tc("get_weather", {"location": "Paris", "unit": "celsius"}),
       "The user wants the weather in Paris; I have get_weather.", "",
       [call(0, "get_weather", {"location": "Paris", "unit": "celsius"})], tools=WEATHER, id="qwen3-reasoning-call"),
    ex("qwen3", "<think>\nTwo cities.\n</think>\n\nI'll check both cities.\n"
       + tc("get_weather", {"location": "Paris"}) + "\n" + tc("get_weather", {"location": "Tokyo"}),
       "Two cities.", "I'll check both cities.",
       [call(0, "get_weather", {"location": "Paris"}), call(1, "get_weather", {"location": "Tokyo"})],
       tools=WEATHER, id="qwen3-two-calls"),
    ex("qwen3", "Paris is the capital of France.\n\nIt has about 2.1 million inhabitants.\n",
       "", "Paris is the capital of France.\n\nIt has about 2.1 million inhabitants.\n", id="qwen3-content-only"),
    ex("qwen3", "<think>\n\n</think>\n\nJust the answer.", "", "Just the answer.", id="qwen3-empty-think"),
    ex("qwen3", "<think>\nok\n</think>\n\nLet me look.\n<tool_call>\n"
       '{"name": "get_weather", "arguments": {"location": "Paris"}\n</tool_call>', "ok",
       'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}\n</tool_call>',
       notes=["could not be read: its JSON is broken"], tools=WEATHER, id="qwen3-broken-json"),
    ex("qwen3", "Sending it.\n" + tc("send_email", {"to": "a@example.com"}),
       "", "Sending it.\n" + tc("send_email", {"to": "a@example.com"}),
       notes=["'send_email', which the request did not offer"], tools=WEATHER, id="qwen3-unknown-function"),
    ex("qwen3", "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"loc",
       "", "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"loc",
       notes=["ended before </tool_call>"], tools=WEATHER, id="qwen3-unterminated-call"),
    ex("qwen3", tc("get_weather", ["Paris"]), "", tc("get_weather", ["Paris"]),
       notes=["arguments are not a JSON object"], id="qwen3-arguments-not-object"),
    ex("qwen3", "Use a <b> c, or <tool> and <thinking>; x < y, </think> and <tool_call", "",
       "Use a <b> c, or <tool> and <thinking>; x < y, </think> and <tool_call", id="qwen3-tag-like-content"),
    ex("qwen3", "a <b> c <think", "", "a <b> c <think", id="qwen3-think-at-end"),
    ex("qwen3", "<think", "", "<think", id="qwen3-only-think-start"),
    ex("qwen3", "The user wants 2+2.\nThat is 4.\n</think>\n\n4", "The user wants 2+2.\nThat is 4.", "4",
       thinking_open=True, id="qwen3-thinking-open"),
    ex("qwen3", "<think>\nL'utilisateur écrit en français 🇫🇷.\n</think>\n\nBonjour ! 你好\n"
       + tc("translate", {"text": "héllo 🌍", "to": "日本語"}),
       "L'utilisateur écrit en français 🇫🇷.", "Bonjour ! 你好",
       [call(0, "translate", {"text": "héllo 🌍", "to": "日本語"})],
       id="qwen3-unicode"),
    ex("qwen3", "<think>\nStill thinking...\n\n", "Still thinking...", id="qwen3-unclosed-think"),
    ex("qwen3", "<think>\nStep 1.\n\nStep 2 mentions <tool_call> and <think>.\n\n\n</think>\n\n\nAnswer.",
       "Step 1.\n\nStep 2 mentions <tool_call> and <think>.", "Answer.", id="qwen3-tags-inside-think"),
    ex("qwen3", '<tool_call>\n{"name":"get_weather","arguments":{"location":"Paris","days":3}}\n</tool_call>'
       '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}</tool_call>', "", "",
       [call(0, "get_weather", {"location": "Paris", "days": 3}), call(1, "get_time", {"zone": "CET"})],
       tools=WEATHER, id="qwen3-reserialised-and-string-arguments"),
    ex("qwen3", tc("get_weather", {"location": "Paris"}) + "\nThen I will summarise.\n"
       + tc("get_time", {}) + "\n\nDone.", "", "Then I will summarise.\n\nDone.",
       [call(0, "get_weather", {"location": "Paris"}), call(1, "get_time", {})], tools=WEATHER,
       id="qwen3-content-between-calls"),
    ex("qwen3", "Now:\n" + tc("get_weather", {"location": "Oslo"}) + "\n" + tc("nope", {}) + "\n",
       "", "Now:\n" + tc("nope", {}) + "\n", [call(0, "get_weather", {"location": "Oslo"})],
       notes=["'nope'"], tools=WEATHER, id="qwen3-valid-then-unknown"),
    ex("qwen3", "\n<think>\nx\n</think>\n\ny", "x", "y", id="qwen3-newline-before-think"),
    ex("qwen3", "a </think> b\n\n", "", "a </think> b\n\n", id="qwen3-stray-end-think"),
    ex("qwen3", "", id="qwen3-empty"),
    ex("qwen3", "  \n", "", "  \n", id="qwen3-whitespace-only"),
    ex("qwen3", "<tool_call>\n[1, 2]\n</tool_call>", "", "<tool_call>\n[1, 2]\n</tool_call>",
       notes=["not a JSON object"], id="qwen3-call-not-object"),
]

HEADER = "<|start|>assistant"
AN = "<|channel|>analysis<|message|>"
FIN = HEADER + "<|channel|>final<|message|>"
GW = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"

HARMONY = [
    ex("harmony", AN + "User says hi. Respond politely.<|end|>" + FIN + "Hello! How can I help you today?",
       "User says hi. Respond politely.", "Hello! How can I help you today?", id="harmony-reasoning-answer"),
    ex("harmony", AN + "Short.<|end|>" + FIN + "Hi.<|return|>", "Short.", "Hi.", id="harmony-return-arrives"),
    ex("harmony", AN + "Need weather for Paris.<|end|>" + HEADER + GW + '{"location":"Paris"}<|call|>',
       "Need weather for Paris.", "", [call(0, "get_weather", {"location": "Paris"})], tools=WEATHER,
       id="harmony-reasoning-call"),
    ex("harmony", AN + "Weather.<|end|>" + HEADER + " to=functions.get_weather<|channel|>commentary json<|message|>"
       '{"location": "Tokyo", "unit": "celsius"}', "Weather.", "",
       [call(0, "get_weather", {"location": "Tokyo", "unit": "celsius"})], tools=WEATHER,
       id="harmony-recipient-before-channel-no-call-token"),
    ex("harmony", " to=functions.get_time<|channel|>commentary json<|message|>{}", "", "",
       [call(0, "get_time", {})], tools=WEATHER, id="harmony-reply-starts-with-recipient"),
    ex("harmony", GW + '{"location":"Paris"}<|call|>' + HEADER + GW + '{"location":"Tokyo"}<|call|>', "", "",
       [call(0, "get_weather", {"location": "Paris"}), call(1, "get_weather", {"location": "Tokyo"})],
       tools=WEATHER, id="harmony-two-calls"),
    ex("harmony", AN + "Check.<|end|>" + HEADER + "<|channel|>commentary<|message|>Let me check the weather.<|end|>"
       + HEADER + "<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{\"location\": \"Rome\"}",
       "Check.", "Let me check the weather.", [call(0, "get_weather", {"location": "Rome"})],
       id="harmony-preamble-then-call"),
    ex("harmony", "Hello there, a <b> c and 1 <| 2 |> 3 <|end", "", "Hello there, a <b> c and 1 <| 2 |> 3 <|end",
       id="harmony-no-header-tag-like"),
    ex("harmony", "<|channel|>final<|message|>Just the answer: a <b> c.", "", "Just the answer: a <b> c.",
       id="harmony-final-only"),
    ex("harmony", GW + '{"location": Paris}<|call|>', "", GW + '{"location": Paris}<|call|>',
       notes=["its JSON is broken"], tools=WEATHER, id="harmony-broken-json"),
    ex("harmony", AN + "Search.<|end|>" + HEADER + "<|channel|>commentary to=functions.search <|constrain|>json"
       '<|message|>{"q": "x"}<|call|>', "Search.",
       HEADER + "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"q\": \"x\"}<|call|>",
       notes=["'search', which the request did not offer"], tools=WEATHER, id="harmony-unknown-function"),
    ex("harmony", GW + '{"location": "Par', "", GW + '{"location": "Par', notes=["cut short"], tools=WEATHER,
       id="harmony-unterminated-call"),
    ex("harmony", AN + "hmm<|end|>" + HEADER + "<|channel|>commentary to=functions.get_weather", "hmm",
       HEADER + "<|channel|>commentary to=functions.get_weather", notes=["header ended before <|message|>"],
       id="harmony-unterminated-header"),
    ex("harmony", AN + "Der Nutzer fragt nach München 🌦<|end|>" + FIN + "Es sind 12 °C in München. 日本",
       "Der Nutzer fragt nach München 🌦", "Es sind 12 °C in München. 日本", id="harmony-unicode"),
    ex("harmony", GW + '{"location": "Zürich", "note": "<|end|> ends the message"}', "",
       GW + '{"location": "Zürich", "note": "<|end|> ends the message"}', notes=["cut short"],
       id="harmony-end-token-in-arguments"),
    ex("harmony", GW + '{"location": "Zürich 🇨🇭"}', "", "",
       [call(0, "get_weather", {"location": "Zürich 🇨🇭"})],
       id="harmony-unicode-call"),
    ex("harmony", "Sure<|end|>" + FIN + "Done", "", "SureDone", id="harmony-text-before-header"),
    ex("harmony", AN + "think<|end|><|channel|>final<|message|>answer", "think", "answer",
       id="harmony-no-start-between"),
    ex("harmony", AN + "one<|channel|>final<|message|>two", "one", "two", id="harmony-no-end-between"),
    ex("harmony", "<|start|>" + "x" * 300 + "<|message|>hi", "", "<|start|>" + "x" * 300 + "<|message|>hi",
       id="harmony-header-too-long"),
    ex("harmony", "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"MoE\"}", "", "",
       [call(0, "browser.search", {"query": "MoE"})], id="harmony-other-recipient"),
    ex("harmony", GW + "[1, 2]<|call|>", "", GW + "[1, 2]<|call|>", notes=["not a JSON object"],
       id="harmony-arguments-not-object"),
    ex("harmony", "<|message|>no channel", "", "no channel", id="harmony-message-without-channel"),
    ex("harmony", AN + "a\n\n<|end|>" + FIN + "\n b \n", "a\n\n", "\n b \n", id="harmony-whitespace-kept"),
    ex("harmony", "", id="harmony-empty"),
]

MISTRAL = [
    ex("mistral", "The capital of France is Paris. Arrays look like [1, 2], tags like [INST] or [TOOL_CALL].",
       "", "The capital of France is Paris. Arrays look like [1, 2], tags like [INST] or [TOOL_CALL].",
       id="mistral-content-only"),
    ex("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris"}}]', "", "",
       [call(0, "get_weather", {"location": "Paris"})], tools=WEATHER, id="mistral-one-call"),
    ex("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris"}, "id": "a1b2c3d4e"}, '
       '{"name": "get_weather", "arguments": {"location": "Tokyo"}, "id": "f5g6h7i8j"}]', "", "",
       [call(0, "get_weather", {"location": "Paris"}), call(1, "get_weather", {"location": "Tokyo"})],
       tools=WEATHER, id="mistral-two-calls"),
    ex("mistral",
       '[TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "Europe/Paris"}',
       "", "", [call(0, "get_weather", {"location": "Paris"}), call(1, "get_time", {"zone": "Europe/Paris"})],
       tools=WEATHER, id="mistral-v11-two-calls"),
    ex("mistral", 'Let me check.\n\n[TOOL_CALLS]get_weather[ARGS]{"location": "Paris", "note": "a } and \\" ]"}',
       "", "Let me check.", [call(0, "get_weather", {"location": "Paris", "note": 'a } and " ]'})],
       id="mistral-content-then-call"),
    ex("mistral", '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"location": "Oslo"}', "", "",
       [call(0, "get_weather", {"location": "Oslo"})], id="mistral-call-id"),
    ex("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris"]}]', "",
       '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Paris"]}]',
       notes=["its JSON is broken"], id="mistral-broken-json"),
    ex("mistral", "Deleting.\n[TOOL_CALLS]delete_all[ARGS]{}", "", "Deleting.\n[TOOL_CALLS]delete_all[ARGS]{}",
       notes=["'delete_all', which the request did not offer"], tools=WEATHER, id="mistral-unknown-function"),
    ex("mistral", '[TOOL_CALLS]get_weather[ARGS]{"location": "Par', "",
       '[TOOL_CALLS]get_weather[ARGS]{"location": "Par',
       notes=["ended before its JSON did"], id="mistral-unterminated"),
    ex("mistral",
       'Voilà 🙂 [TOOL_CALLS] [{"name": "translate", "arguments": {"text": "naïve café", "to": "中文"}}]',
       "", "Voilà 🙂", [call(0, "translate", {"text": "naïve café", "to": "中文"})], id="mistral-unicode"),
    ex("mistral", "A partial tag at the end [TOOL_CALLS", "", "A partial tag at the end [TOOL_CALLS",
       id="mistral-tag-at-end"),
    ex("mistral", "[TOOL_CALLS] hello world", "", "[TOOL_CALLS] hello world", notes=["no [ARGS]"],
       id="mistral-no-args-tag"),
    ex("mistral", "[TOOL_CALLS] !?", "", "[TOOL_CALLS] !?", notes=["neither"], id="mistral-neither-form"),
    ex("mistral", "[TOOL_CALLS]", "", "[TOOL_CALLS]", notes=["nothing followed"], id="mistral-nothing-after"),
    ex("mistral", '[TOOL_CALLS] [{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}]', "", "",
       [call(0, "get_time", {"zone": "UTC"})], id="mistral-string-arguments"),
    ex("mistral", '[TOOL_CALLS]get_weather[ARGS]["Paris"]', "", '[TOOL_CALLS]get_weather[ARGS]["Paris"]',
       notes=["not a JSON object"], id="mistral-arguments-not-object"),
    ex("mistral", '[TOOL_CALLS]get_weather[ARGS] "Paris"', "", '[TOOL_CALLS]get_weather[ARGS] "Paris"',
       notes=["not a JSON object"], id="mistral-arguments-not-json-object"),
    ex("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {}}, {"name": "rm", "arguments": {}}]\n',
       "", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {}}, {"name": "rm", "arguments": {}}]\n',
       notes=["'rm'"], tools=WEATHER, id="mistral-list-with-a-bad-call"),
    ex("mistral", 'Here:\n[TOOL_CALLS]get_time[ARGS]{}\nDone.', "", "Here:\nDone.", [call(0, "get_time", {})],
       id="mistral-content-after-call"),
    ex("mistral", '[TOOL_CALLS] {"name": "get_time", "arguments": {}}', "", "", [call(0, "get_time", {})],
       id="mistral-single-object"),
]

EXAMPLES = QWEN3 + HARMONY + MISTRAL

# a plausible tokenisation: special tokens and tags whole, words with their leading space, punctuation
# runs, whitespace runs (how the engine feeds a reply: a token's text at a time)


def read(fmt, pieces, tools=None, thinking_open=False):
    p = parser_for(fmt, tools=tools, thinking_open=thinking_open)
    deltas = []
    for piece in pieces:
        deltas += p.feed(piece)
    deltas += p.finish()
    assert p.finish() == []  # finish() twice: nothing more
    return p, deltas


@pytest.mark.parametrize("fmt,text,reasoning,content,calls,notes,tools,thinking_open", EXAMPLES)
def test_example_under_every_split(fmt, text, reasoning, content, calls, notes, tools, thinking_open):
    p, deltas = read(fmt, [text], tools, thinking_open)
    check_invariants(p, deltas)
    assert (p.reasoning, p.content, p.tool_calls) == (reasoning, content, calls)
    assert len(p.notes) == len(notes) and all(want in got for want, got in zip(notes, p.notes)), p.notes
    whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
    for how, pieces in splits(text):
        assert "".join(pieces) == text
        q, ds = read(fmt, pieces, tools, thinking_open)
        check_invariants(q, ds)
        assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, how


def test_every_format_has_examples_and_parsers():
    assert {e.values[0] for e in EXAMPLES} == set(FORMATS) - {"plain"}
    for fmt in FORMATS:
        p = parser_for(fmt, tools=("f",))
        assert isinstance(p, Parser) and p.tools == ("f",)
        assert p.needs_special_tokens == (fmt != "plain")


def test_plain_is_all_content():
    text = "<think>a</think> <tool_call>{}</tool_call> [TOOL_CALLS] <|channel|>"
    for _, pieces in splits(text):
        p, deltas = read("plain", pieces)
        check_invariants(p, deltas)
        assert (p.reasoning, p.content, p.tool_calls, p.notes) == ("", text, [], [])


def _out(deltas, part):
    return "".join(d.text for d in deltas if d.part == part)


def test_qwen3_holds_back_only_what_could_be_a_tag():
    p = parser_for("qwen3")
    assert p.feed("<thi") == []
    assert _out(p.feed("nk>\nPlan"), "reasoning") == "Plan"
    assert _out(p.feed(" it.\n</th"), "reasoning") == " it."  # the newline could be the block's last
    assert _out(p.feed("ink>\n\nHello <tool_"), "content") == "Hello"  # the space could come before a call
    assert _out(p.feed("tips> and more"), "content") == " <tool_tips> and more"
    ds = p.feed(' <tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert [d.part for d in ds] == ["tool_call", "tool_call"]  # complete: out at once, not at finish()
    assert p.finish() == []
    assert (p.reasoning, p.content) == ("Plan it.", "Hello <tool_tips> and more")


def test_harmony_holds_back_only_what_could_be_a_tag():
    p = parser_for("harmony")
    assert p.feed("<|chan") == []
    assert _out(p.feed("nel|>analysis<|message|>Think <"), "reasoning") == "Think "
    assert _out(p.feed("b> <|e"), "reasoning") == "<b> "
    assert p.feed("nd|><|start|>assistant<|channel|>final<|mess") == []
    assert _out(p.feed("age|>Hi"), "content") == "Hi"
    ds = p.feed("<|end|><|start|>assistant" + GW + '{"location": "Paris"}')
    assert ds == []  # a call without <|call|> (an end of sequence) is read at the end of the reply
    ds = p.finish()
    assert [d.part for d in ds] == ["tool_call", "tool_call"] and ds[0].name == "get_weather"
    q = parser_for("harmony")
    assert [d.part for d in q.feed(GW + "{}<|call|>")] == ["tool_call", "tool_call"]


def test_mistral_holds_back_only_what_could_be_a_tag():
    p = parser_for("mistral")
    assert _out(p.feed("Hi [TOOL"), "content") == "Hi"
    assert _out(p.feed("S] x"), "content") == " [TOOLS] x"
    assert p.feed(' [TOOL_CALLS]f[ARGS]{"a": "}"') == []
    assert [d.part for d in p.feed("}")] == ["tool_call", "tool_call"]  # read once its braces close
    assert p.finish() == []


def test_garbage_never_raises_and_splits_agree():
    """Random replies made of the formats' tags and fragments: any split reads as the whole text."""
    bits = ["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "f", "arguments": {}}', '{"name": ',
            "<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " to=functions.f",
            "<|constrain|>json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "[TOOL_CALLS]", "[ARGS]",
            "[CALL_ID]", "f", "[", "]", "{", "}", '"', "\\", "\n", " ", "<", "|", "é", "x y", "<th", "[TOOL"]
    rng = random.Random(28)
    for fmt in ("qwen3", "harmony", "mistral"):
        for n in range(120):
            text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 14)))
            for tools, thinking_open in ((None, False), (("f",), n % 2 == 0)):
                p, deltas = read(fmt, [text], tools, thinking_open)
                check_invariants(p, deltas)
                whole = (merged(deltas), p.reasoning, p.content, p.tool_calls, p.notes)
                for pieces in ([text[:i], text[i:]] for i in range(0, len(text) + 1, 3)):
                    q, ds = read(fmt, pieces, tools, thinking_open)
                    check_invariants(q, ds)
                    assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, (fmt, text)
                q, ds = read(fmt, list(text), tools, thinking_open)
                assert (merged(ds), q.reasoning, q.content, q.tool_calls, q.notes) == whole, (fmt, text)


def test_json_nested_too_deeply_is_a_note_not_an_exception():
    deep = "[" * 5000 + "]" * 5000
    texts = {"qwen3": "<tool_call>" + '{"name": "f", "arguments": ' + deep + "}</tool_call>",
             "harmony": "<|channel|>commentary to=functions.f<|message|>" + deep,
             "mistral": "[TOOL_CALLS]" + deep}
    for fmt, text in texts.items():
        for pieces in ([text], [text[i:i + 7] for i in range(0, len(text), 7)]):
            p, deltas = read(fmt, pieces, ("f",))
            check_invariants(p, deltas)
            assert (p.content, p.tool_calls, len(p.notes)) == (text, [], 1), p.notes
            assert "JSON is broken" in p.notes[0]


@pytest.mark.parametrize("name,fmt", [("qwen3-chat_template.jinja", "qwen3"),
                                      ("gpt-oss-chat_template.jinja", "harmony")])
def test_format_of_published_templates(name, fmt):
    assert format_of((TEMPLATES / name).read_text(encoding="utf-8")) == fmt


def test_format_of_other_templates():
    plain = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert format_of(plain) == "plain"
    assert format_of(None) == format_of("") == "plain"
    mistral = ("{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
               "{%- elif m.tool_calls %}[TOOL_CALLS][{{ m.tool_calls | tojson }}]{%- endif %}{%- endfor %}")
    assert format_of(mistral) == "mistral"
