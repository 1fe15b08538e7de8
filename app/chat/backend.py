"""Where the chat's replies come from, behind one interface: the local engine (LocalBackend, through
the window's engine bridge) or a served model elsewhere (app/chat/remote.py's RemoteChat). The chat
(app/chat/session.py) sends to whichever the window holds, with `generate` and `stop`, and reads
what differs from the backend's fields: its model's name, whether the chat's history is fitted to a
context here (`fitting`), and whether the model has a Think switch. No Qt here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass(frozen=True)
class Fitting:
    """What the chat's history is fitted to before it is sent: the context in tokens (0: the
    server's own, nothing fitted here), the tokenizer's count, and the chat template's
    messages -> ids (Loaded.prompt_ids), whose own tokens count too."""
    ctx: int = 0
    count_tokens: Callable[[str], int] | None = None
    prompt_ids: Callable[[list], list] | None = None


class Backend(Protocol):
    name: str  # the model's name, as each reply keeps it
    local: bool  # the local engine (its measurements and waits are the chat's)
    thinking_switch: bool  # the model's chat template can switch its reasoning off

    def generate(self, messages: list[dict], params, thinking: bool | None = None, cache_key: str = "") -> int:
        """Start a reply; its request id (its Token, Done and ErrorEvent events carry it). cache_key:
        the conversation it continues (the local engine keeps each one's KV cache under it)."""

    def stop(self, request_id: int) -> None:
        """End the reply (a Done with reason 'cancelled' follows)."""

    def fitting(self) -> Fitting: ...


class LocalBackend:
    """The engine thread of this process: send is the bridge's (a command -> its request id), info
    the model in use (its Loaded event; None while none is loaded)."""

    local = True

    def __init__(self, send: Callable[[object], int], info: Callable[[], object | None]):
        self.send, self.info = send, info

    @property
    def name(self) -> str:
        ev = self.info()
        return ev.name if ev is not None else ""

    @property
    def thinking_switch(self) -> bool:
        ev = self.info()
        return bool(ev is not None and ev.thinking_switch)

    def generate(self, messages: list[dict], params, thinking: bool | None = None, cache_key: str = "") -> int:
        from engine.protocol import Generate

        return self.send(Generate(messages=messages, params=params, thinking=thinking, cache_key=cache_key))

    def stop(self, request_id: int) -> None:
        from engine.protocol import Stop

        self.send(Stop(request_id=request_id))

    def fitting(self) -> Fitting:
        ev = self.info()
        if ev is None:
            return Fitting()
        return Fitting(ev.ctx, ev.count_tokens, ev.prompt_ids)
