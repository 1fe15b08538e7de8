"""A prompt too long for the context: told from its messages and characters before any rendering or
tokenisation, and from its tokens after (engine/prompts/prompt.py runs these checks, in that order).

Tokenising is linear but not free: ten million characters took 12-26 s on the engine thread and
2.7 GB of RAM before the context check refused them. A token covers at most as many characters
as the longest token in the vocabulary (its text in the vocabulary's own alphabet: one character
per byte for byte-level BPE, so never fewer than the characters it decodes to), so a prompt longer
than ctx x that many characters cannot fit, whatever its tokens would be.
"""
from __future__ import annotations

import json

from ..protocol.errors import ContextOverflow


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of this tokenizer stands for (at least 1)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing: no bound
        return 0
    return max((len(t) for t in vocab), default=1) or 1


def message_chars(messages) -> int:
    """The characters of a conversation's contents (the template adds a few tokens more)."""
    n = 0
    for m in messages or ():
        if isinstance(m, dict):
            c = m.get("content")
            n += len(c) if isinstance(c, str) else sum(len(str(p)) for p in c) if isinstance(c, list) else 0
    return n


def conversation_chars(messages, tools: list | None = None) -> int:
    """The characters of a conversation in the chat templates' shape: its contents, reasoning and
    tool calls (their arguments as JSON), and the tools offered (the template adds a few tokens more)."""
    n = message_chars(messages) + (len(json.dumps(tools, ensure_ascii=False, default=str)) if tools else 0)
    for m in messages or ():
        if not isinstance(m, dict):
            continue
        for c in m.get("tool_calls") or ():
            f = c.get("function") if isinstance(c, dict) else None
            if isinstance(f, dict):
                args = json.dumps(f.get("arguments", ""), ensure_ascii=False, default=str)
                n += len(str(f.get("name", ""))) + len(args)
        n += sum(len(v) for v in (m.get("thinking"), m.get("reasoning_content")) if isinstance(v, str))
    return n


def check_messages(count: int, ctx: int) -> None:
    """Raise ContextOverflow when `count` messages cannot fit in ctx tokens (each takes one at least)."""
    if count >= ctx:
        raise ContextOverflow.of_messages(count, ctx)


def check_tokens(count: int, ctx: int) -> None:
    """Raise ContextOverflow when a prompt of `count` tokens leaves no room in ctx for a reply."""
    if count >= ctx:
        raise ContextOverflow(count, ctx)


def check_chars(chars: int, ctx: int, max_token_chars: int) -> None:
    """Raise ContextOverflow when `chars` characters cannot fit in ctx tokens."""
    if max_token_chars > 0 and chars > ctx * max_token_chars:
        raise ContextOverflow.of_chars(chars, ctx, max_token_chars)
