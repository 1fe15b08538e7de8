"""Tools and reasoning through the local server (engine/tools/serve), on loopback with the official
`openai` client, on a Qwen3-style and a harmony-style tiny model whose replies are scripted
(tests/scripted_chat.py): a two-turn tool conversation streamed and not (the streamed deltas join to
exactly the whole message; turn 2's prompt, tool messages included, is what transformers renders),
parallel_tool_calls, tool_choice, reasoning_effort, and the requests refused with OpenAI's 400."""
import json

import pytest

openai = pytest.importorskip("openai")

from engine.runtime.client import Client  # noqa: E402
from engine.tools.serve import Server  # noqa: E402
from rawhttp import is_openai_error, send  # noqa: E402
from scripted_chat import script, write_chat_model  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Its name"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
RESULT = '{"temperature": 21, "sky": "sunny"}'
ANSWER = "It is sunny in Paris, 21 °C."
TURN1 = {  # reasoning, then a call of get_weather
    "qwen3": '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
             '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "harmony": '<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>'
               'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
}
TURN2 = {  # reasoning, then the answer
    "qwen3": f"<think>\nThe tool says sunny.\n</think>\n\n{ANSWER}",
    "harmony": f"<|channel|>analysis<|message|>The tool says sunny.<|end|><|start|>assistant<|channel|>final"
               f"<|message|>{ANSWER}<|return|>",
}
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
JSON = {"Content-Type": "application/json"}


class Served:
    """A scripted chat model behind a server; `prompts` records each prompt its template renders."""

    def __init__(self, style, folder):
        self.style, self.folder = style, folder
        self.client = Client()
        self.loaded = self.client.load(str(folder), placement="cpu", dtype="fp32", ctx=2048)
        self.server = Server(self.client.session, "127.0.0.1", 0).start()
        self.api = openai.OpenAI(base_url=self.server.url, api_key="unused", max_retries=0, timeout=60)
        self.prompts = []
        template = self.client.session.loaded.prompts.template
        render = template.render

        def recorded(*a, **kw):
            text = render(*a, **kw)
            self.prompts.append(text)
            return text
        template.render = recorded

    def script(self, *replies):
        script(self.client.session.loaded.generator, *replies)  # between requests: nothing reads it now

    def chat(self, **kw):
        return self.api.chat.completions.create(model=self.loaded.name, temperature=0, max_tokens=200, **kw)

    def close(self):
        self.server.stop()
        self.client.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    made = {}

    def get(style):
        if style not in made:
            made[style] = Served(style, write_chat_model(tmp_path_factory.mktemp(style), style))
        return made[style]
    yield get
    for m in made.values():
        m.close()


@pytest.fixture(scope="module")
def plain(tiny):
    client = Client()
    loaded = client.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", ctx=256)
    server = Server(client.session, "127.0.0.1", 0).start()
    yield server, loaded
    server.stop()
    client.close()


def whole(r) -> dict:
    """The parts of a non-streamed reply's message that a stream must rebuild."""
    m = r.choices[0].message
    calls = [(i, c.id, c.type, c.function.name, c.function.arguments) for i, c in enumerate(m.tool_calls or [])]
    return {"content": m.content, "reasoning_content": (m.model_extra or {}).get("reasoning_content"),
            "tool_calls": calls, "finish_reason": r.choices[0].finish_reason}


def joined(chunks) -> dict:
    """A stream's deltas joined as a client joins them."""
    content, reasoning, calls, finish = "", "", {}, None
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        finish = c.finish_reason or finish
        d = c.delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            got = calls.setdefault(tc.index, {"id": None, "type": None, "name": "", "arguments": ""})
            if tc.id:
                assert got["id"] is None, "a call's id comes once"
                got["id"], got["type"], got["name"] = tc.id, tc.type, tc.function.name
            got["arguments"] += tc.function.arguments or ""
    tool_calls = [(i, c["id"], c["type"], c["name"], c["arguments"]) for i, c in sorted(calls.items())]
    return {"content": content or (None if tool_calls else ""), "reasoning_content": reasoning or None,
            "tool_calls": tool_calls, "finish_reason": finish}


def hf_render(folder, messages, **kw) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, **kw)


@pytest.mark.parametrize("style", ["qwen3", "harmony"])
def test_a_two_turn_tool_conversation_streamed_and_not(models, style):
    m = models(style)
    m.script(TURN1[style], TURN1[style], TURN2[style], TURN2[style])
    r1 = m.chat(messages=ASK, tools=TOOLS)
    msg = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.model_extra["reasoning_content"] == "The user wants the weather."
    [call] = msg.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert joined(m.chat(messages=ASK, tools=TOOLS, stream=True)) == whole(r1)
    assert "get_weather" in m.prompts[-1]  # the tools were rendered

    # turn 2: the assistant's message as the client got it, and the tool's result
    convo = ASK + [msg, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    r2 = m.chat(messages=convo, tools=TOOLS)
    assert r2.choices[0].message.content == ANSWER and r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.model_extra["reasoning_content"] == "The tool says sunny."
    assert not r2.choices[0].message.tool_calls
    rendered = m.prompts[-1]
    assert joined(m.chat(messages=convo, tools=TOOLS, stream=True)) == whole(r2)
    assert m.prompts[-1] == rendered

    # the same conversation in transformers' convention: arguments as an object, reasoning where the
    # template reads it
    past = {"role": "assistant", "content": "",
            "tool_calls": [{"id": call.id, "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    past["thinking" if style == "harmony" else "reasoning_content"] = "The user wants the weather."
    hf = ASK + [past, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    expected = hf_render(m.folder, hf)
    assert rendered == expected
    assert RESULT in rendered or json.dumps(RESULT) in rendered
    assert r2.usage.prompt_tokens == len(m.client.session.loaded.tokenizer(expected, add_special_tokens=False)["input_ids"])


def test_parallel_tool_calls_false_keeps_the_first_call(models):
    m = models("qwen3")
    m.script(TWO_CALLS, TWO_CALLS, TWO_CALLS)
    both = m.chat(messages=ASK, tools=TOOLS).choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in both] == ["Paris", "Rome"]
    assert len({c.id for c in both}) == 2
    one = m.chat(messages=ASK, tools=TOOLS, parallel_tool_calls=False)
    assert [c.function.arguments for c in one.choices[0].message.tool_calls] == [both[0].function.arguments]
    assert one.choices[0].finish_reason == "tool_calls"
    streamed = joined(m.chat(messages=ASK, tools=TOOLS, parallel_tool_calls=False, stream=True))
    assert streamed == whole(one) and len(streamed["tool_calls"]) == 1


@pytest.mark.parametrize("style", ["qwen3", "harmony"])
def test_tool_choice_none_renders_no_tools_and_any_markup_stays_content(models, style):
    m = models(style)
    m.script(TURN1[style], TURN1[style])
    r = m.chat(messages=ASK, tools=TOOLS, tool_choice="none")
    msg = r.choices[0].message
    assert not msg.tool_calls and r.choices[0].finish_reason == "stop"
    assert "get_weather" in msg.content and "Paris" in msg.content
    assert "get_weather" not in m.prompts[-1]  # the model was given no tools
    assert joined(m.chat(messages=ASK, tools=TOOLS, tool_choice="none", stream=True)) == whole(r)


def test_a_call_of_a_function_not_offered_stays_content_as_written(models):
    m = models("qwen3")
    call = TURN1["qwen3"].split("</think>\n\n")[1]
    m.script(TURN1["qwen3"], TURN1["qwen3"].replace("get_weather", "delete_files"))
    r = m.chat(messages=ASK)  # no tools at all
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content == call
    r = m.chat(messages=ASK, tools=TOOLS)
    assert r.choices[0].message.content == call.replace("get_weather", "delete_files")
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"


def test_a_tool_without_a_description_is_served_to_gpt_oss(models):
    m = models("harmony")  # its template writes "// " + description, and OpenAI's description is optional
    m.script(TURN1["harmony"])
    bare = [{"type": "function", "function": {"name": "get_weather"}}]
    [call] = m.chat(messages=ASK, tools=bare).choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "type get_weather = () => any;" in m.prompts[-1]


def test_reasoning_effort_reaches_a_template_that_takes_it(models):
    m = models("harmony")
    m.script(TURN2["harmony"])
    r = m.chat(messages=ASK, reasoning_effort="low")
    assert r.choices[0].message.content == ANSWER and "Reasoning: low" in m.prompts[-1]


def test_a_completion_stays_plain(models):
    m = models("qwen3")
    m.script(TURN1["qwen3"])
    r = m.api.completions.create(model=m.loaded.name, prompt="Weather?", max_tokens=200, temperature=0)
    assert r.choices[0].text == TURN1["qwen3"]


def test_tools_for_a_model_that_cannot_take_them_are_refused(plain):
    server, loaded = plain
    assert not loaded.takes_tools
    api = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=loaded.name, messages=ASK, tools=TOOLS, max_tokens=2)
    assert e.value.body["param"] == "tools" and "cannot be given tools" in e.value.body["message"]
    r = api.chat.completions.create(model=loaded.name, messages=ASK, max_tokens=3)  # without: answered
    assert r.choices[0].finish_reason in ("length", "stop")


def fn(**f):
    return [{"type": "function", "function": {"name": "f", **f}}]


BAD = [
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": ["f"]}, "tools[0].type"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": fn(name="a b")}, "tools[0].function.name"),
    ({"tools": fn(name="x" * 65)}, "tools[0].function.name"),
    ({"tools": fn() + fn()}, "tools[1].function.name"),
    ({"tools": fn(description=3)}, "tools[0].function.description"),
    ({"tools": fn(parameters="{}")}, "tools[0].function.parameters"),
    ({"tools": fn() * 129}, "tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"reasoning_effort": "maximal"}, "reasoning_effort"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{broken"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": {"id": "c"}}]}, "messages[1].tool_calls"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]},
     "messages[1].tool_calls[0].function.name"),
    ({"messages": ASK + [{"role": "tool", "tool_call_id": 7, "content": "x"}]}, "messages[1].tool_call_id"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=[p for _, p in BAD])
def test_bad_tool_fields_get_openai_shaped_400s_naming_the_field(models, fields, param, capfd):
    m = models("qwen3")
    body = {"model": m.loaded.name, "messages": ASK, "max_tokens": 2, **fields}
    status, _, answer = send(m.server.url, "POST", "/chat/completions", json.dumps(body).encode(), JSON)
    assert status == 400 and is_openai_error(answer), (status, answer)
    assert answer["error"]["param"] == param, answer
    assert "Traceback" not in capfd.readouterr().err


def test_refusals_through_the_official_client(models):
    m = models("qwen3")
    kw = {"model": m.loaded.name, "messages": ASK, "max_tokens": 2}
    for extra, param in [({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {}}}},
                          "response_format"), ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
                         ({"tool_choice": "required"}, "tool_choice")]:
        with pytest.raises(openai.BadRequestError) as e:
            m.api.chat.completions.create(**kw, **extra)
        assert e.value.status_code == 400 and e.value.body["param"] == param
    m.script("fine")
    ok = m.api.chat.completions.create(**kw, response_format={"type": "text"}, logprobs=False, tool_choice="auto")
    assert ok.choices[0].message.content  # the supported values are answered


# what the model writes after the server opened the call for it
FORCED = {
    "qwen3": ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
              '{"city": "Paris"}}\n</tool_call>'),
    "harmony": ('get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>', '{"city": "Paris"}<|call|>'),
}


@pytest.mark.parametrize("style", ["qwen3", "harmony"])
def test_tool_choice_required_and_named_open_the_call_for_the_model(models, style):
    m = models(style)
    anyone, named = FORCED[style]
    for choice, reply in (("required", anyone), ({"type": "function", "function": {"name": "get_weather"}}, named)):
        m.script(reply, reply)
        r = m.chat(messages=ASK, tools=TOOLS, tool_choice=choice)
        calls = r.choices[0].message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
        assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
        assert joined(m.chat(messages=ASK, tools=TOOLS, tool_choice=choice, stream=True)) == whole(r)


def test_enable_thinking_switches_qwen3s_reasoning_off(models):
    m = models("qwen3")
    m.script("Hi!")
    r = m.chat(messages=ASK, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Hi!"
    assert m.prompts[-1].endswith("<think>\n\n</think>\n\n")  # the template's empty block: no reasoning
    for bad in ({"enable_thinking": "no"}, {"tokenize": True}, [1]):
        body = {"model": m.loaded.name, "messages": ASK, "max_tokens": 2, "chat_template_kwargs": bad}
        status, _, answer = send(m.server.url, "POST", "/chat/completions", json.dumps(body).encode(), JSON)
        assert status == 400 and answer["error"]["param"].startswith("chat_template_kwargs"), answer
    h = models("harmony")
    body = {"model": h.loaded.name, "messages": ASK, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}}
    status, _, answer = send(h.server.url, "POST", "/chat/completions", json.dumps(body).encode(), JSON)
    assert status == 400 and answer["error"]["param"] == "chat_template_kwargs.enable_thinking"
