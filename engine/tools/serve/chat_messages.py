"""A chat request's `messages`, checked and turned from OpenAI's shape into the one chat templates
read (transformers' convention), so the model's own template renders the conversation:

- `developer` is `system`; content given as a list of text parts is their text; null content is "".
- An assistant message's `tool_calls` keep their id and type, and their `function.arguments`, a JSON
  string as OpenAI sends it, become the object it holds: the templates want a mapping (GPT-OSS's
  writes `arguments|tojson`, which would quote a string; Qwen3's writes a string as is and a mapping
  as `tojson`, the same text for the arguments this server returns). Arguments that are not a JSON
  object are a 400. No `tool_calls` (absent, null or []): the key is left out, since GPT-OSS's
  template asks whether it is there.
- An assistant message's `reasoning_content` (llama.cpp's and vLLM's field; `reasoning` too) goes
  where the template reads past reasoning: `thinking` for GPT-OSS (harmony), `reasoning_content`
  for the others (Qwen3's template reads it).
- A `tool` message keeps its `tool_call_id` (and `name`, when given).
"""
from __future__ import annotations

import json

from .openai_api import ApiError, text_of

ROLES = ("system", "developer", "user", "assistant", "tool")
SHAPE = '{"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}'


def _content(m: dict, i: int) -> str:
    content = m.get("content", "")
    if isinstance(content, list):  # content parts: the text ones are read
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(400, f"messages[{i}].content: Mixdesk reads text parts only", param="messages")
            parts.append(p["text"])
        content = "".join(parts)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")
    return text_of(content)


def _strings(obj, depth: int = 0):
    """obj with every string's lone surrogates replaced (arguments are the client's JSON)."""
    if isinstance(obj, str):
        return text_of(obj)
    if depth < 64 and isinstance(obj, dict):
        return {text_of(k): _strings(v, depth + 1) for k, v in obj.items()}
    if depth < 64 and isinstance(obj, list):
        return [_strings(v, depth + 1) for v in obj]
    return obj


def _arguments(value, where: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except (ValueError, RecursionError):
            raise ApiError(400, f"'{where}' must be a JSON object (as text), not {json.dumps(value)[:80]}",
                           param=where) from None
    if not isinstance(value, dict):
        raise ApiError(400, f"'{where}' must be a JSON object, not {json.dumps(value)[:80]}", param=where)
    return _strings(value)


def _tool_calls(calls, i: int) -> list[dict]:
    if not isinstance(calls, list):
        raise ApiError(400, f"'messages[{i}].tool_calls' must be a list", param=f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or c.get("type", "function") != "function":
            raise ApiError(400, f"'{where}' must be {SHAPE}", param=where)
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise ApiError(400, f"'{where}.function.name' must be a function's name", param=f"{where}.function.name")
        cid = c.get("id")
        if cid is not None and not isinstance(cid, str):
            raise ApiError(400, f"'{where}.id' must be a string", param=f"{where}.id")
        call = {"type": "function",
                "function": {"name": text_of(f["name"]),
                             "arguments": _arguments(f.get("arguments", "{}"), f"{where}.function.arguments")}}
        if cid is not None:
            call = {"id": text_of(cid), **call}
        out.append(call)
    return out


def messages_of(body: dict, reply_format: str = "plain") -> list[dict]:
    """`messages` in the chat templates' shape (the module's docstring); 400 on anything wrong."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    reasoning_key = "thinking" if reply_format == "harmony" else "reasoning_content"
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"messages[{i}] needs a role: system, user, assistant or tool", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role, "content": _content(m, i)}
        if role == "assistant":
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise ApiError(400, f"'messages[{i}].reasoning_content' must be a string",
                                   param=f"messages[{i}].reasoning_content")
                msg[reasoning_key] = text_of(reasoning)
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        elif role == "tool":
            for key in ("tool_call_id", "name"):
                v = m.get(key)
                if v is not None:
                    if not isinstance(v, str):
                        raise ApiError(400, f"'messages[{i}].{key}' must be a string", param=f"messages[{i}].{key}")
                    msg[key] = text_of(v)
        out.append(msg)
    return out

