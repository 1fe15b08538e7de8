"""A chat written out for people (Markdown) or programs (JSON): File > Export chat. The JSON keeps
the chat's own settings (app/chat/settings.py) beside its system prompt, so an export says what
the replies were made with.

No Qt here.
"""
from __future__ import annotations

import json

from .overlay import Conversation, Message


def markdown(c: Conversation, messages: list[Message]) -> str:
    out = [f"# {c.title}\n"]
    if c.system_prompt:
        out.append(f"_System:_ {c.system_prompt}\n")
    for m in messages:
        out.append(f"**{m.role}**\n\n{m.content}\n")
    return "\n".join(out)


def as_json(c: Conversation, messages: list[Message]) -> str:
    return json.dumps({"title": c.title, "system_prompt": c.system_prompt, "settings": c.settings,
                       "messages": [{"role": m.role, "content": m.content, "complete": m.complete, **m.meta}
                                    for m in messages]}, indent=2, ensure_ascii=False)
