"""Shared by several test modules (moved out of tests/test_formats.py, which uses them too): call, check_invariants, merged, splits."""
from __future__ import annotations
import json
import random
import re
from engine.prompts.formats import Delta, Parser, ToolCall


def call(i: int, name: str, arguments: dict) -> ToolCall:
    return ToolCall(f"call_{i}", name, json.dumps(arguments, ensure_ascii=False))


TOKEN = re.compile(r"<\|[a-z_]+\|>|</?(?:think|tool_call)>|\[(?:TOOL_CALLS|ARGS|CALL_ID)\]| ?\w+| ?[^\w\s]+|\s+")


def tokens(text: str) -> list[str]:
    out = TOKEN.findall(text)
    assert "".join(out) == text
    return out


def splits(text: str):
    """Every way the tests cut a text into feeds."""
    yield "whole", [text]
    for i in range(len(text) + 1):
        yield f"cut {i}", [text[:i], text[i:]]
    for k in range(1, 8):
        for o in range(k):
            yield f"size {k} from {o}", [text[:o]] + [text[j:j + k] for j in range(o, len(text), k)]
    yield "tokens", tokens(text)
    yield "characters with empty feeds", [p for c in text for p in (c, "")]
    rng = random.Random(text)
    for n in range(8):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(2, 12))))
        yield f"random {n}", [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def merged(deltas: list[Delta]) -> list[tuple]:
    """The deltas with consecutive reasoning (content) pieces joined: what any split must give."""
    out: list[tuple] = []
    for d in deltas:
        if d.part in ("reasoning", "content") and out and out[-1][0] == d.part:
            out[-1] = (d.part, out[-1][1] + d.text, -1, "", "")
        else:
            out.append((d.part, d.text, d.index, d.id, d.name))
    return out


def check_invariants(p: Parser, deltas: list[Delta]) -> None:
    assert "".join(d.text for d in deltas if d.part == "reasoning") == p.reasoning
    assert "".join(d.text for d in deltas if d.part == "content") == p.content
    for d in deltas:
        assert d.part in ("reasoning", "content", "tool_call")
        if d.part != "tool_call":
            assert d.text and d.index == -1 and not d.id and not d.name
    calls = [d for d in deltas if d.part == "tool_call"]
    assert len(calls) == 2 * len(p.tool_calls)  # per call: index/id/name, then its arguments in one delta
    for i, call in enumerate(p.tool_calls):
        head, args = calls[2 * i], calls[2 * i + 1]
        assert (head.index, head.id, head.name, head.text) == (i, f"call_{i}", call.name, "")
        assert (args.index, args.id, args.name, args.text) == (i, "", "", call.arguments)
        assert call.id == f"call_{i}" and call.name
        obj = json.loads(call.arguments)
        assert isinstance(obj, dict) and call.arguments == json.dumps(obj, ensure_ascii=False)
    for note in p.notes:
        assert note.startswith("the model's tool call could not be read: ") and "\n" not in note

