"""The one prompt pipeline (engine/prompts/prompt.py): a chat rendered once, through the model's template;
each length check before the costlier step (messages, characters, then tokens); the reply's parser;
a request prepared as ids for the scheduler, which renders nothing itself."""
import pytest

from engine.protocol.errors import ContextOverflow
from engine.prompts.prompt import Prepared, Prompts
from engine.protocol import Generate


class Template:
    """A chat template: one id to start, then one per character of the contents."""

    def __init__(self, fmt="plain"):
        self.format, self.calls = fmt, 0

    def ids(self, messages, tools=None, thinking=None, reasoning_effort=None):
        self.calls += 1
        return [1] + [2] * sum(len(m["content"]) for m in messages)


class Tok:
    def encode(self, text, add_special_tokens=True):
        return [1] * add_special_tokens + [3] * len(text)

    def decode(self, ids, **kw):
        return "x" * len(ids)


def prompts(ctx=32, per_token=2, fmt="plain"):
    return Prompts(Template(fmt), Tok(), ctx, per_token)


def user(text):
    return {"role": "user", "content": text}


def test_a_chat_is_rendered_through_the_template():
    p = prompts()
    assert p.chat([user("abc")]) == [1, 2, 2, 2] and p.template.calls == 1


def test_each_check_refuses_before_the_costlier_step():
    p = prompts(ctx=32, per_token=2)  # at most 64 characters
    with pytest.raises(ContextOverflow, match="32 messages cannot fit"):
        p.chat([user("")] * 32)
    with pytest.raises(ContextOverflow, match="65 characters"):
        p.chat([user("x" * 65)])
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 80}}
    with pytest.raises(ContextOverflow, match="characters"):  # the tools offered count too
        p.chat([user("a")], tools=[tool])
    assert p.template.calls == 0  # none of them was rendered
    with pytest.raises(ContextOverflow, match="the prompt is 32 tokens"):
        p.chat([user("x" * 31)])  # 31 characters could fit: rendered, then counted
    assert p.template.calls == 1
    with pytest.raises(ContextOverflow, match="65 characters"):
        p.text("y" * 65)
    with pytest.raises(ContextOverflow, match="the prompt is 32 tokens"):
        p.text("y" * 31)


def test_a_request_is_prepared_as_ids_with_its_parser_and_opening():
    p = prompts(fmt="qwen3")
    got = p.prepare(Generate(messages=[user("ab")], reply_prefix="<x>"))
    assert got.ids == [1, 2, 2, 3, 3, 3] and got.opening == "<x>"
    assert type(got.parser).__name__ == "Qwen3Parser"
    got = p.prepare(Generate(prompt_text="hi"))  # a completion: all of it is content
    assert got.ids == [1, 3, 3] and type(got.parser).__name__ == "Parser"
    assert p.prepare(Generate(prompt_ids=[5, 6], formatted=False)).ids == [5, 6]
    assert type(p.prepare(Generate(prompt_ids=[5, 6], formatted=False)).parser).__name__ == "Parser"
    with pytest.raises(ContextOverflow):
        p.prepare(Generate(prompt_ids=list(range(30)), reply_prefix="abc"))  # the opening counts
    with pytest.raises(ValueError, match="empty"):
        p.prepare(Generate(prompt_ids=[]))
    assert Prepared.of_ids((7, 8)).ids == [7, 8]
