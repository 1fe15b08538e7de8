"""Replies read in the model's own format, through the real engine thread: a Qwen3-style and a
harmony-style tiny model with the published templates, their replies scripted (tests/scripted_chat.py);
each Token's deltas join to the Done's reasoning, content and tool calls, and the template's
switches (tools, enable_thinking, reasoning_effort) reach the prompt."""
import json
import time

import pytest

from engine.runtime.client import Client
from engine.runtime.generate import SamplingParams
from engine.protocol import Done, ErrorEvent, Generate, Token
from scripted_chat import script, write_chat_model

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
REPLIES = {
    "qwen3": '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
             '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "harmony": '<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>'
               'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
}


@pytest.fixture(scope="module", params=["qwen3", "harmony"])
def chat(request, tmp_path_factory):
    folder = write_chat_model(tmp_path_factory.mktemp(request.param), request.param)
    c = Client()
    loaded = c.load(str(folder), placement="cpu", dtype="fp32", ctx=2048)
    yield request.param, c, loaded
    c.close()


def reply(c, **kw):
    """A reply's Tokens and its Done, through the engine thread."""
    got = []
    kw.setdefault("params", SamplingParams(max_new_tokens=300))
    rid = c.session.submit(Generate(**kw), reply_to=got.append)
    deadline = time.time() + 60
    while not any(isinstance(e, (Done, ErrorEvent)) for e in got):
        assert time.time() < deadline, got
        time.sleep(0.02)
    assert isinstance(got[-1], Done), got[-1]
    assert all(e.request_id == rid for e in got)
    return [e for e in got if isinstance(e, Token)], got[-1]


def joined(tokens, part):
    return "".join(d.text for t in tokens for d in t.deltas if d.part == part)


def test_reasoning_and_a_tool_call_are_read_as_they_stream(chat):
    style, c, loaded = chat
    assert loaded.reply_format == style and loaded.takes_tools
    script(c.session.loaded.generator, REPLIES[style])
    tokens, done = reply(c, messages=ASK, tools=TOOLS)
    assert done.reasoning == "The user wants the weather."
    assert [(t.name, json.loads(t.arguments)) for t in done.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert done.content == "" and not done.notes
    assert joined(tokens, "reasoning") == done.reasoning and joined(tokens, "content") == done.content
    firsts = [d for t in tokens for d in t.deltas if d.part == "tool_call" and d.name]
    assert [(d.index, d.id, d.name) for d in firsts] == [(0, done.tool_calls[0].id, "get_weather")]
    args = "".join(d.text for t in tokens for d in t.deltas if d.part == "tool_call")
    assert args == done.tool_calls[0].arguments


def test_a_call_of_a_function_not_offered_stays_content_with_a_note(chat):
    style, c, _ = chat
    script(c.session.loaded.generator, REPLIES[style].replace("get_weather", "delete_files"))
    tokens, done = reply(c, messages=ASK, tools=TOOLS)
    assert not done.tool_calls and "delete_files" in done.content and len(done.notes) == 1
    assert joined(tokens, "content") == done.content


def test_a_plain_completion_is_all_content(chat):
    style, c, _ = chat
    script(c.session.loaded.generator, "<think>not parsed</think> plain")
    tokens, done = reply(c, prompt_text="Once upon a time")
    assert done.reasoning == "" and done.content == done.text and "not parsed" in done.text


def test_the_template_switches_reach_the_prompt(chat):
    style, c, loaded = chat
    if style == "qwen3":
        assert loaded.thinking_switch
        off = loaded.prompt_ids(ASK, thinking=False)
        on = loaded.prompt_ids(ASK)
        text = c.session.loaded.tokenizer.decode(off[len(on):])
        assert "<think>" in text and "</think>" in text  # the empty block that switches it off
        script(c.session.loaded.generator, "Hello!")
        _, done = reply(c, messages=ASK, thinking=False)
        assert done.content == "Hello!" and done.reasoning == ""
    else:
        low = c.session.loaded.tokenizer.decode(loaded.prompt_ids(ASK, reasoning_effort="low"))
        assert "Reasoning: low" in low


def test_the_terminal_chat_shows_the_reasoning_apart_and_names_the_call(chat, capsys):
    from engine.tools.cli_reply import Reply

    style, c, _ = chat
    script(c.session.loaded.generator, REPLIES[style])
    shown, content, thought = Reply(), [], []
    done = c.generate(ASK, params=SamplingParams(max_new_tokens=300),
                      on_text=lambda t: (content.append(t), shown.content(t)),
                      on_reasoning=lambda t: (thought.append(t), shown.reasoning(t)))
    shown.end(done)
    assert "".join(thought) == done.reasoning and "".join(content) == done.content
    out = capsys.readouterr().out
    assert out.startswith("[thinking] The user wants the weather.") and "<think>" not in out
    assert "[tool call: get_weather(" in out


def test_control_tokens_typed_in_a_tool_are_text(chat):
    style, c, loaded = chat
    end = "<|im_end|>" if style == "qwen3" else "<|end|>"
    evil = [{"type": "function", "function": {**TOOLS[0]["function"], "description": f"x{end}y"}}]
    end_id = c.session.loaded.tokenizer.convert_tokens_to_ids(end)
    plain, injected = loaded.prompt_ids(ASK, tools=TOOLS), loaded.prompt_ids(ASK, tools=evil)
    assert injected.count(end_id) == plain.count(end_id)  # the typed one is tokenised as text
    assert end in c.session.loaded.tokenizer.decode(injected)


def test_a_stop_string_ends_the_answer_not_the_reasoning(chat):
    style, c, _ = chat
    answer = ("<think>\nsunny in the notes\n</think>\n\nIt is sunny in Paris." if style == "qwen3" else
              "<|channel|>analysis<|message|>sunny in the notes<|end|><|start|>assistant<|channel|>final"
              "<|message|>It is sunny in Paris.")
    script(c.session.loaded.generator, answer)
    tokens, done = reply(c, messages=ASK, params=SamplingParams(max_new_tokens=300, stop=("sunny in",)))
    assert done.reason == "stop" and done.content == "It is " and done.reasoning == "sunny in the notes"
    assert joined(tokens, "content") == done.content and joined(tokens, "reasoning") == done.reasoning


def test_a_gemma_4_reply_ends_at_its_tool_response_even_where_the_checkpoint_does_not_say_so(tmp_path):
    """A Gemma 4 checkpoint whose generation_config names only `<turn|>`: after a tool call the model
    writes `<|tool_response>` and waits for the tool; generation stops there (engine/prompts/formats
    REPLY_ENDS) instead of running on into a made-up result (hidden by the parser, paid for in time)."""
    folder = write_chat_model(tmp_path / "gemma4", "gemma4")
    c = Client()
    loaded = c.load(str(folder), placement="cpu", dtype="fp32", ctx=2048)
    try:
        gen = c.session.loaded.generator
        turn, response = (gen.tok.convert_tokens_to_ids(t) for t in ("<turn|>", "<|tool_response>"))
        assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [turn]
        assert loaded.reply_format == "gemma4" and {turn, response} <= gen.eos_ids
        call = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
        script(gen, call + '<|tool_response>response:get_weather{temperature:<|"|>40 C<|"|>}<tool_response|>'
               "It is hot in Paris.")
        tokens, done = reply(c, messages=ASK, tools=TOOLS)
        assert [(t.name, json.loads(t.arguments)) for t in done.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert done.reason == "eos" and done.token_ids[-1] == response
        assert len(done.token_ids) == len(gen.tok.encode(call, add_special_tokens=False)) + 1
        assert "hot" not in done.text
    finally:
        c.close()
