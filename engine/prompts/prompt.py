"""The one prompt pipeline: a conversation (or a plain text) to the token ids the model reads, with
its length checks, and how the reply will be read. Every client goes through it:
- the local server renders each chat off the engine thread with `Loaded.prompt_ids`, which is
  `Prompts.chat` (so a long prompt does not stall the other requests' decode steps);
- the terminal chat (engine/runtime/client.py) renders before it submits, with the same callable;
- a Generate that still carries `messages` or a `prompt_text` (the window, tests) is prepared by the
  session as it takes the request, on the engine thread, with the same function.
The scheduler receives ids only (a `Prepared`): it renders nothing.

The checks, each before the costlier step (engine/prompts/prompt_limit.py):
1. the messages (each takes a token at least) and the characters (a prompt longer than ctx x the
   longest token's characters cannot fit), before anything is rendered or tokenised;
2. the model's chat template renders the conversation (in its sandbox: engine/prompts/chat_template.py) and
   the text is tokenised;
3. the token count against the context (the reply needs a position at least).
`Prompts.chat` is thread-safe: it holds the chat template and the tokenizer, never the model.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import formats
from .prompt_limit import check_chars, check_messages, check_tokens, conversation_chars


@dataclass
class Prepared:
    """A request's prompt as the scheduler takes it."""

    ids: list[int]  # what the model reads, the reply's opening included
    parser: formats.Parser  # reads the reply in the model's format (engine/prompts/formats), as it streams
    opening: str = ""  # text the prompt ends with that is the reply's own start (Generate.reply_prefix)

    @classmethod
    def of_ids(cls, ids) -> "Prepared":
        """Ids given as they are, the reply read as plain content (a scheduler driven directly)."""
        return cls(list(ids), formats.Parser())


class Prompts:
    """One model's prompts: its chat template and tokenizer, its context (ctx tokens) and the most
    characters one of its tokens stands for (0: no bound known)."""

    def __init__(self, template, tokenizer, ctx: int, max_token_chars: int = 0):
        self.template, self.tok, self.ctx, self.max_token_chars = template, tokenizer, ctx, max_token_chars

    def chat(self, messages: list[dict], tools: list | None = None, thinking: bool | None = None,
             reasoning_effort: str | None = None) -> list[int]:
        """The conversation's prompt ids: the one place a chat is rendered. tools (OpenAI's function
        shape), thinking (False: reasoning off, where the template can) and reasoning_effort are the
        template's options (Generate's fields of those names). Raises ContextOverflow when it cannot
        fit, TemplateProblem when the template refuses it."""
        check_messages(len(messages), self.ctx)
        check_chars(conversation_chars(messages, tools), self.ctx, self.max_token_chars)
        ids = self.template.ids(messages, tools=tools, thinking=thinking, reasoning_effort=reasoning_effort)
        check_tokens(len(ids), self.ctx)
        return ids

    def text(self, text: str) -> list[int]:
        """A plain-text prompt (a completion), tokenised as it is, with the same checks."""
        check_chars(len(text), self.ctx, self.max_token_chars)
        ids = self.tok.encode(text, add_special_tokens=True)
        check_tokens(len(ids), self.ctx)
        return ids

    def parser(self, ids: list[int], tools: list | None = None, formatted: bool = True) -> formats.Parser:
        """How the reply to ids is read: in the model's format (engine/prompts/formats), or all of it as
        content (formatted False). tools: those offered (None: none, any call is read; []: a call
        stays content)."""
        if not formatted:
            return formats.Parser()
        fmt = self.template.format
        names = None if tools is None else tuple(t.get("function", {}).get("name", "") for t in tools)
        tail = self.tok.decode(ids[-16:], skip_special_tokens=False) if fmt in formats.THINKING_FORMATS else ""
        return formats.parser_for(fmt, tools=names, thinking_open=tail.rstrip().endswith("<think>"),
                                  schemas=formats.schemas_of(tools))

    def prepare(self, cmd) -> Prepared:
        """A Generate's prompt for the scheduler: its prompt_ids as given, else its prompt_text or
        its messages through `text` or `chat`; the reply's parser; its reply_prefix appended."""
        if cmd.prompt_ids is not None:
            ids = list(cmd.prompt_ids)
        elif cmd.prompt_text is not None:
            ids = self.text(cmd.prompt_text)
        else:
            ids = self.chat(cmd.messages or [], tools=cmd.tools, thinking=cmd.thinking,
                            reasoning_effort=cmd.reasoning_effort)
        if not ids:
            raise ValueError("empty prompt")
        parser = self.parser(ids, cmd.tools, cmd.formatted and cmd.prompt_text is None)
        if cmd.reply_prefix:
            ids = ids + self.tok.encode(cmd.reply_prefix, add_special_tokens=False)
        check_tokens(len(ids), self.ctx)
        return Prepared(ids, parser, cmd.reply_prefix)
