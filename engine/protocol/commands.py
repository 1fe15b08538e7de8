"""What clients send the engine thread: the commands of engine/protocol/__init__.py, every one built with
keywords. A leaf: plain values (no torch, no model code)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .sampling import SamplingParams

if TYPE_CHECKING:
    from ..machine.monitor import BudgetReading


@dataclass(frozen=True, kw_only=True)
class Load:
    """Open a model: a folder, a hub id, or "demo". placement: "auto" lets the planner place and
    re-place experts; anything else ("cpu", "gpu", "random:SEED", a JSON file) pins the placement.
    ctx: "auto" (the model's own context length as far as memory allows its keys and values beside
    the weights: engine/control/context_fit.py) or a length in tokens (refused with the figures where memory
    cannot hold it; a length past the model's own is cut to it). Loaded.context says what it took.
    kv_bits: keys and values stored at 16 bits (the model's dtype) or 8 (int8 with a scale per 32
    values, engine/kv/int8.py: about half the memory a token, so auto opens about twice the context where
    memory bounds it; its measured quality change is in the README's "8-bit keys and values")."""

    path: str
    device: str | None = None
    dtype: str = "auto"
    ctx: int | str = "auto"
    placement: str = "auto"
    kv_bits: int = 16


@dataclass(frozen=True, kw_only=True)
class Generate:
    """One reply. Its prompt, in the order preferred: prompt_ids rendered by the client with
    Loaded.prompt_ids (engine/prompts/prompt.py: the template, the tokenizer and the length checks, off the
    engine thread); prompt_text; or messages, rendered by the session with that same function as it
    takes the request (a compatibility path: the engine thread renders them before the scheduler)."""

    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = SamplingParams()
    fresh: bool = False  # ignore keys/values cached from the previous request (a cold prefill)
    prompt_text: str | None = None  # a plain-text prompt, tokenised as is (no chat template)
    # "chat": the conversation's own KV cache (one such request at a time, its prefix carried over
    # between turns); "pool": a cache of its own, running beside others (the local server)
    slot: str = "chat"
    # the conversation a "chat" request continues: its KV cache is kept under this key, beside other
    # conversations' (engine/kv/cache.py; "": the one conversation of a client that has one, the
    # terminal chat's); the window passes its chat's id
    cache_key: str = ""
    # the chat template's options (for `messages`; a client that renders prompt_ids itself passes
    # them to Loaded.prompt_ids, and `tools` here only to say what may be called): tools in OpenAI's
    # shape, {"type": "function", "function": {...}}, the functions the reply may call (None: none
    # offered, any call is read; []: a call stays content);
    # thinking False switches reasoning off where the template can (Qwen3's enable_thinking);
    # reasoning_effort "low" | "medium" | "high" (GPT-OSS)
    tools: list | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    # the reply is read in the model's own format (engine/prompts/formats: reasoning, content, tool calls);
    # False (and any prompt_text request): all of it is content
    formatted: bool = True
    # text the reply starts with: it ends the prompt and is read as the reply's first text (a tool
    # call forced by opening it: the server's tool_choice "required" or a named function)
    reply_prefix: str = ""


@dataclass(frozen=True, kw_only=True)
class SetContext:
    """Run the loaded model at another context ("auto" or a length in tokens, as Load.ctx) without
    reading its weights again: its KV caches are made anew at that length (what they held is read
    again), its experts re-planned beside the new reservation, and a Loaded says the new context.
    Answered between requests, as a query (a QueryDone: {"ctx", "bytes", "line"}; a length memory
    cannot hold: an ErrorEvent with the figures, the context as it was)."""

    tokens: int | str = "auto"


@dataclass(frozen=True, kw_only=True)
class Stop:
    request_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class SetSlider:
    """Where the quality-speed slider sits (0: fastest, 1: best quality), and, when given, the user's
    lowest precision for experts: the fastest end may place them down to 4, 3 or 2 bits on the CPU
    (tiers cpu-4, cpu-3, cpu-2; engine/placement). None keeps it as it was (default 2)."""

    value: float
    lowest_bits: int | None = None


@dataclass(frozen=True, kw_only=True)
class SetBudgets:
    """A user cap on what the model may use (None: follow the monitor)."""

    vram: int | None = None
    ram: int | None = None


@dataclass(frozen=True, kw_only=True)
class Reprofile:
    """Measure this machine and calibrate the loaded model anew (profiles go stale: a driver or
    BIOS change, or a profile measured while the machine was busy), then re-plan."""


@dataclass(frozen=True, kw_only=True)
class Query:
    """A question for the engine thread about what it holds, by name, with plain arguments
    (Query(name="vocab"), Query(name="check_model", args={"spec": "owner/name"})). It is answered
    between requests (it waits for every running request to end) by the handler of that name
    (engine/runtime/queries.py, where every name is listed), with a plain value in a QueryDone; a failure is
    an ErrorEvent. A Stop with the query's id (or with none) stops a long one (a download)."""

    name: str
    args: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Shutdown:
    pass


@dataclass(frozen=True, kw_only=True)
class Reading:
    """From the memory monitor's thread: a new budget reading."""

    reading: BudgetReading
