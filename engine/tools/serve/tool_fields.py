"""A chat request's tool and reasoning fields, checked: `tools`, `tool_choice`,
`parallel_tool_calls`, `reasoning_effort`, `chat_template_kwargs.enable_thinking`, and the fields this
server refuses rather than ignores
(`response_format` other than text, `logprobs`, `top_logprobs`, the legacy `functions`).

What the engine is given (`ToolRequest`):
- `rendered`: the tools the chat template renders (transformers' `tools=` convention: OpenAI's
  {"type": "function", "function": {name, description, parameters}} objects), None for none;
- `offered`: what Generate.tools gets, from which the engine's parser learns which functions may be
  called. A call of any other function stays content (with a note), so a request without tools, or
  with `tool_choice: "none"`, offers none (`[]`): any markup the model writes anyway stays content.

`tool_choice` "required" and a named function force a call by opening it: the reply starts with
the format's call markup (`reply_prefix`, with the function's name for a named one), which ends the
prompt and is read as the reply's first text, so the model writes the rest of a call (for a named
function: its arguments). Without constrained decoding the model may still write arguments that
are not JSON: then the reply has no tool_calls and its content says so (a note), as with "auto".
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .openai_api import ApiError

MAX_TOOLS = 128  # OpenAI's own limit
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule; harmony writes `to=functions.NAME`, so no dots
EFFORTS = ("low", "medium", "high")
# how each format's reply opens a call: (any function, the named function NAME)
OPENINGS = {
    "qwen3": ("<tool_call>\n", '<tool_call>\n{"name": "NAME", "arguments": '),
    "harmony": ("<|channel|>commentary to=functions.", "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>"),
    "mistral": ("[TOOL_CALLS]", '[TOOL_CALLS][{"name": "NAME", "arguments": '),
    "qwen_xml": ("<tool_call>\n<function=", "<tool_call>\n<function=NAME>\n"),  # Qwen3.5, Qwen3-Coder
    "glm": ("<tool_call>", "<tool_call>NAME"),  # GLM-4.5 to 4.7
    "gemma4": ("<|tool_call>call:", "<|tool_call>call:NAME{"),  # Gemma 4
}


@dataclass(frozen=True)
class ToolRequest:
    rendered: list | None  # the tools the template renders (None: none)
    offered: list  # Generate.tools: the functions the reply may call ([]: none)
    parallel: bool  # False: only the reply's first call is kept
    reasoning_effort: str | None  # for templates that take it (GPT-OSS)
    prefix: str = ""  # Generate.reply_prefix: a call opened (tool_choice "required" or a named function)
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking (Qwen3's switch; None: the template's default)


def _say(v) -> str:
    return json.dumps(v)[:80]


def _function(t, i: int, names: set) -> dict:
    """tools[i], checked; the copy the template renders (only the fields OpenAI defines)."""
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type", "function") != "function":
        raise ApiError(400, f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}: Mixdesk "
                       f"serves function tools only, not {_say(t)}", param=f"{where}.type")
    f = t.get("function")
    if not isinstance(f, dict):
        raise ApiError(400, f"'{where}.function' must be an object with a 'name'", param=f"{where}.function")
    name = f.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ApiError(400, f"'{where}.function.name' must be 1 to 64 letters, digits, '_' or '-', not "
                       f"{_say(name)}", param=f"{where}.function.name")
    if name in names:
        raise ApiError(400, f"'{where}.function.name': two tools are named {name!r}",
                       param=f"{where}.function.name")
    names.add(name)
    out = {"name": name}
    desc = f.get("description")
    if desc is not None:
        if not isinstance(desc, str):
            raise ApiError(400, f"'{where}.function.description' must be a string",
                           param=f"{where}.function.description")
        out["description"] = desc
    params = f.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise ApiError(400, f"'{where}.function.parameters' must be a JSON Schema object, not {_say(params)}",
                           param=f"{where}.function.parameters")
        out["parameters"] = params
    strict = f.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, f"'{where}.function.strict' must be true or false", param=f"{where}.function.strict")
    return {"type": "function", "function": out}


def tools_of(body: dict) -> list | None:
    """`tools`, checked (None when absent or empty)."""
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of {\"type\": \"function\", \"function\": {...}} objects",
                       param="tools")
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"'tools' may hold at most {MAX_TOOLS} functions, not {len(tools)}", param="tools")
    names: set = set()
    return [_function(t, i, names) for i, t in enumerate(tools)] or None


def choice_of(body: dict, tools: list | None) -> str:
    """`tool_choice`: "auto", "none", "required", or the name of the function it names."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if choice in ("auto", "none"):
        return choice
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
    if choice == "required" or named:
        what = "'required'" if choice == "required" else f"the function {choice['function'].get('name')!r}"
        if tools is None:
            raise ApiError(400, f"'tool_choice' asks for {what}, but the request has no 'tools'", param="tool_choice")
        if choice == "required":
            return "required"
        name = choice["function"].get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise ApiError(400, f"'tool_choice' names the function {_say(name)}, which is not in 'tools'",
                           param="tool_choice.function.name")
        return "function:" + name
    raise ApiError(400, "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                   f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, not {_say(choice)}",
                   param="tool_choice")


def refuse_unsupported(body: dict, kind: str) -> None:
    """400 for the fields Mixdesk does not implement, rather than an answer that ignores them."""
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        shown = rf.get("type") if isinstance(rf, dict) else rf
        raise ApiError(400, f"'response_format' {_say(shown)} is not supported: this server has no constrained "
                       "decoding (JSON mode, JSON schemas); only {\"type\": \"text\"} is", param="response_format",
                       code="unsupported_value")
    lp = body.get("logprobs")
    if lp is not None and lp is not False:
        raise ApiError(400, "'logprobs' is not supported by this server", param="logprobs",
                       code="unsupported_parameter")
    tlp = body.get("top_logprobs")
    if tlp is not None and not (type(tlp) is int and tlp == 0):
        raise ApiError(400, "'top_logprobs' is not supported by this server", param="top_logprobs",
                       code="unsupported_parameter")
    if kind == "chat":
        for legacy in ("functions", "function_call"):
            if body.get(legacy) is not None:
                raise ApiError(400, f"'{legacy}' is OpenAI's retired form of tools: send 'tools' (and "
                               "'tool_choice') instead", param=legacy)


def tool_request(body: dict, loaded) -> ToolRequest:
    """The tool and reasoning fields of a chat request for the loaded model (a Loaded event)."""
    tools = tools_of(body)
    choice = choice_of(body, tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, f"'parallel_tool_calls' must be true or false, not {_say(parallel)}",
                       param="parallel_tool_calls")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise ApiError(400, f"'reasoning_effort' must be \"low\", \"medium\" or \"high\", not {_say(effort)}",
                       param="reasoning_effort")
    if choice == "none":
        tools = None
    if tools is not None and (not loaded.takes_tools or loaded.reply_format == "plain"):
        why = ("its chat template does not render tools" if not loaded.takes_tools
               else "this server cannot read tool calls in its reply format")
        raise ApiError(400, f"the model {loaded.name!r} cannot be given tools: {why}. Send the request without "
                       "'tools'", param="tools", code="unsupported_parameter")
    if tools is not None and loaded.reply_format == "harmony":
        # GPT-OSS's template writes `"// " + tool.description`, which fails without one (OpenAI's is optional)
        tools = [t if "description" in t["function"] else {**t, "function": {**t["function"], "description": ""}}
                 for t in tools]
    offered, prefix = (tools if tools is not None else []), ""
    if choice == "required" or choice.startswith("function:"):
        anyone, named = OPENINGS[loaded.reply_format]
        if choice == "required":
            prefix = anyone
        else:
            name = choice.removeprefix("function:")
            offered, prefix = [t for t in tools if t["function"]["name"] == name], named.replace("NAME", name)
    return ToolRequest(rendered=tools, offered=offered, parallel=parallel is not False, reasoning_effort=effort,
                       prefix=prefix, thinking=thinking_of(body, loaded))


def thinking_of(body: dict, loaded) -> bool | None:
    """`chat_template_kwargs` (vLLM's and llama.cpp's field): only `enable_thinking` is taken, for a
    template that has the switch (Loaded.thinking_switch); anything else is refused."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return None
    if not isinstance(kw, dict) or set(kw) - {"enable_thinking"}:
        raise ApiError(400, "'chat_template_kwargs' may only hold 'enable_thinking' (true or false) here, not "
                       f"{_say(kw)}", param="chat_template_kwargs", code="unsupported_parameter")
    on = kw.get("enable_thinking")
    if on is None:
        return None
    if not isinstance(on, bool):
        raise ApiError(400, f"'chat_template_kwargs.enable_thinking' must be true or false, not {_say(on)}",
                       param="chat_template_kwargs.enable_thinking")
    if not loaded.thinking_switch:
        raise ApiError(400, f"the model {loaded.name!r} cannot switch its reasoning off or on: its chat template "
                       "has no enable_thinking", param="chat_template_kwargs.enable_thinking",
                       code="unsupported_parameter")
    return on
