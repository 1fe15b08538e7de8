"""User-facing errors: one clear message naming the file and the problem, never a traceback."""
from __future__ import annotations

from pathlib import Path


class MixdeskError(Exception):
    """Base of every error the engine shows to a user as one line."""


class ModelError(MixdeskError):
    """A model folder or file that cannot be used, and why."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ContextOverflow(MixdeskError):
    """The prompt does not fit in the model's context window."""

    def __init__(self, prompt_tokens: int, context: int):
        self.prompt_tokens = prompt_tokens
        self.context = context
        full = ", and the reply needs room too" if prompt_tokens <= context else ""
        super().__init__(f"the prompt is {prompt_tokens:,} tokens; the context holds {context:,}{full}: "
                         "shorten it or remove attached documents")

    @classmethod
    def of_chars(cls, chars: int, context: int, per_token: int) -> "ContextOverflow":
        """Refused from its length in characters, before tokenising (engine/prompts/prompt_limit.py)."""
        e = cls.__new__(cls)
        e.prompt_tokens, e.context = chars // per_token, context
        MixdeskError.__init__(e, f"the prompt is {chars:,} characters, more than a context of {context:,} tokens "
                              f"can hold (a token is at most {per_token} characters here); shorten it or "
                              "remove attached documents")
        return e

    @classmethod
    def of_messages(cls, count: int, context: int) -> "ContextOverflow":
        """Refused from its number of messages (each takes a token at least), before rendering."""
        e = cls.__new__(cls)
        e.prompt_tokens, e.context = count, context
        MixdeskError.__init__(e, f"{count:,} messages cannot fit in a context of {context:,} tokens; "
                              "start a new conversation or remove messages")
        return e


class ForwardStopped(Exception):
    """A prompt chunk's forward stopped between two layers because its request's Stop was set (never shown
    to a user: the request ends as "cancelled", the chunk not added to its cache: engine/runtime/scheduler.py)."""


class InputError(MixdeskError):
    """A value given by the user (a command-line option, a sampling setting) that cannot be used."""

    def __init__(self, what: str, problem: str):
        self.what = what
        self.problem = problem
        super().__init__(f"{what}: {problem}")
