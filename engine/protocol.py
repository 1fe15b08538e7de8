"""What the clients of the engine thread (the window, the terminal chat, bench, eval, plan, the
tests) send it, and what it sends back. Every message is built with keywords.

Commands go in through `Session.submit`, which returns the request id of a Load, Generate or Task
(the engine hands ids out; no client picks one). Events come out on the engine thread (a GUI
forwards them to its own thread): a request's own events (its Tokens, its Done, its ErrorEvent, a
TaskDone) go to the callable given with it (`submit(cmd, reply_to=...)`, by default the session's
`emit`); every other event goes to `emit` and to each of the session's listeners.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .generate import Done, SamplingParams, Token  # noqa: F401 - events defined where they are made
from .monitor import BudgetReading
from .placement import Placement

# ---- commands ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Load:
    """Open a model: a folder, a hub id, or "demo". placement: "auto" lets the planner place and
    re-place experts; anything else ("cpu", "gpu", "random:SEED", a JSON file) pins the placement."""

    path: str
    device: str | None = None
    dtype: str = "auto"
    ctx: int = 4096
    placement: str = "auto"


@dataclass(frozen=True, kw_only=True)
class Generate:
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = SamplingParams()
    fresh: bool = False  # ignore keys/values cached from the previous request (a cold prefill)
    prompt_text: str | None = None  # a plain-text prompt, tokenised as is (no chat template)
    # "chat": the conversation's own KV cache (one such request at a time, its prefix carried over
    # between turns); "pool": a cache of its own, running beside others (the local server)
    slot: str = "chat"
    # the chat template's options (for `messages`; a client that renders prompt_ids itself passes
    # them to Loaded.prompt_ids): tools in OpenAI's shape, {"type": "function", "function": {...}}, the
    # functions the reply may call (None: none offered, any call is read; []: a call stays content);
    # thinking False switches reasoning off where the template can (Qwen3's enable_thinking);
    # reasoning_effort "low" | "medium" | "high" (GPT-OSS)
    tools: list | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    # the reply is read in the model's own format (engine/formats: reasoning, content, tool calls);
    # False (and any prompt_text request): all of it is content
    formatted: bool = True
    # text the reply starts with: it ends the prompt and is read as the reply's first text (a tool
    # call forced by opening it: the server's tool_choice "required" or a named function)
    reply_prefix: str = ""


@dataclass(frozen=True, kw_only=True)
class Stop:
    request_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class SetSlider:
    value: float


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
class Task:
    """Run fn(engine) on the engine thread between requests, with the loaded model, its planner
    inputs and the current budgets (`engine.Engine`); the result comes back as TaskDone. Used by
    `mixdesk plan` and `mixdesk eval`, whose measurements need the model the engine holds."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True, kw_only=True)
class Shutdown:
    pass


@dataclass(frozen=True, kw_only=True)
class Reading:
    """From the memory monitor's thread: a new budget reading."""

    reading: BudgetReading


# ---- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Progress:
    stage: str
    done: int
    total: int
    what: str = ""


@dataclass(frozen=True, kw_only=True)
class Loaded:
    """The model is ready to chat (sent again after a re-profile: the popularity may change)."""

    name: str
    description: str
    cpu_only: bool
    layers: int
    experts: int
    ctx: int
    share: tuple = ()  # [L][E] routing share per expert (popularity), for the placement map
    params: int = 0  # parameters in all (experts and the dense part)
    count_tokens: Callable[[str], int] | None = None  # thread-safe (a Rust tokenizer underneath)
    # the chat template rendered and tokenised, callable from any thread (the server runs it off the
    # engine thread, so a long prompt does not stall other requests' decode steps)
    prompt_ids: Callable[[list], list] | None = None
    max_token_chars: int = 0  # the longest token's text: a prompt past ctx x this many characters cannot fit
    weights: str = ""  # what the file holds, for a GGUF file (e.g. "Q4_K_M GGUF, experts at 4.5 bits")
    weights_4bit: bool = False  # its experts are 4-bit already: the slider moves them, it cannot re-quantise them
    reply_format: str = "plain"  # how its replies are read (engine/formats.FORMATS)
    takes_tools: bool = False  # its chat template renders `tools` (else a request with tools is refused)
    thinking_switch: bool = False  # its template can switch reasoning off (Generate.thinking=False)


@dataclass(frozen=True, kw_only=True)
class TaskDone:
    request_id: int
    value: Any


@dataclass(frozen=True, kw_only=True)
class PlacementChanged:
    placement: Placement
    moves: int
    reason: str
    predicted_tok_s: float
    predicted_loss: float
    frontier: tuple = ()  # ((loss, tok_s), ...) best quality first
    slider_scale: Any = None  # what each slider position asks for (planner.SliderScale)
    limited_by_budget: bool = False  # the slider asks for more quality than the budget allows
    streams: int = 1  # requests decoding together that the plan is for; predicted_tok_s is all of theirs
    # the placement installed when the plan was made (None: not known), which the migration turns
    # into `placement` one MigrationProgress at a time
    current: Placement | None = None
    # moves of the migration in flight already made when a re-plan interrupts it: its progress goes
    # on from moved / (moved + moves), one total per migration as a user sees it (0: a new migration)
    moved: int = 0
    # the plan is the least loss memory allows while this model's calibration measures its 4-bit
    # sensitivity (the slider applies once it has: planner.choose)
    provisional: bool = False


@dataclass(frozen=True, kw_only=True)
class MigrationProgress:
    done: int
    total: int
    bytes_moved: int
    seconds: float
    last_tier: str = ""  # the tier the last moved expert went to
    last_bytes: int = 0
    last_seconds: float = 0.0
    layer: int = -1  # the last moved expert (-1: not said)
    expert: int = -1


@dataclass(frozen=True, kw_only=True)
class Stats:
    decode_tok_s: float
    prefill_tok_s: float
    vram_held: int
    vram_free: int
    vram_others: int
    vram_budget: int
    ram_held: int
    rss: int
    ram_budget: int
    tiers: dict = field(default_factory=dict)
    ctx_used: int = 0
    ctx_max: int = 0
    cpu_only: bool = True
    cpu_kernel: str = ""  # the CPU expert kernel in use (engine.native.status())
    generating: bool = False  # a reply is decoding now (idle: the speeds are the last reply's)


@dataclass(frozen=True, kw_only=True)
class ErrorEvent:
    """One line for the user. request_id: the request it ended (None: not tied to one). log: the
    file holding the traceback when the error was not one the engine expected."""

    message: str
    request_id: int | None = None
    log: str = ""
    kind: str = ""  # the error's class (ContextOverflow, ModelError, ...): what a client may react to


@dataclass(frozen=True, kw_only=True)
class EngineStopped:
    """The engine thread ended without being asked to (it should not; the client may restart it)."""

    message: str
    log: str = ""
