"""What the engine thread sends its clients: the events of engine/protocol/__init__.py. A leaf: plain values
(no torch, no model code), so a client imports them without the engine's weight. A request's own
events (its Tokens, its Done, its ErrorEvent, a QueryDone) go to the callable given with it; every
other event to every client."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..placement import Placement


@dataclass(frozen=True, kw_only=True)
class Token:
    """One new token of a request (an event: engine/protocol/__init__.py)."""

    request_id: int
    token_id: int  # -1: text held back by a stop-string check, released at the end
    text: str  # new text this token completes (may be "" while a character is incomplete)
    index: int  # 0-based index among new tokens
    seconds: float  # wall time of the step that produced it (prefill for index 0)
    # what the token adds to the reply's reasoning, content and tool calls (engine/prompts/formats.Delta)
    deltas: tuple = ()


@dataclass(frozen=True, kw_only=True)
class Done:
    """A request's end and its whole reply (an event: engine/protocol/__init__.py)."""

    request_id: int
    reason: str  # eos | stop | length | context | cancelled
    text: str
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose keys/values were cached (an earlier turn, a return to the chat, a file)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # the reply read in the model's format (engine/prompts/formats): for a plain reply, content is text
    reasoning: str = ""
    content: str = ""
    tool_calls: tuple = ()  # engine/prompts/formats.ToolCall, in order
    notes: tuple = ()  # one line for each tool call that could not be read (it is in content instead)

    @property
    def decode_tok_s(self) -> float:
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        n = self.prompt_tokens - self.reused_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class PromptProgress:
    """A long prompt is being read (a request's own event, one per chunk read): `read` of its `total`
    tokens are in its KV cache now (those reused from an earlier turn included), read this time at
    `tok_s` tokens a second so far (0: not measured yet)."""

    request_id: int
    read: int
    total: int
    tok_s: float = 0.0
    reused: int = 0  # of `read`, the tokens that were cached already

    @property
    def seconds_left(self) -> float | None:
        """The rest of the prompt at the rate measured so far (None: no rate yet)."""
        return (self.total - self.read) / self.tok_s if self.tok_s > 0 else None

    def describe(self, what: str = "the prompt") -> str:
        """"Reading the document: 4,096 of 18,512 tokens · about 1 min left" (what: the prompt, the document)."""
        text = f"Reading {what}: {self.read:,} of {self.total:,} tokens"
        left = self.seconds_left
        return text if left is None else f"{text} · {time_left(left)}"


def time_left(seconds: float) -> str:
    """A wait in round words: "about 40 s left", "about 3 min left", "about 1 h 20 min left"."""
    if seconds < 55:
        return f"about {max(5, 5 * round(seconds / 5)):.0f} s left"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min left"
    return f"about {minutes // 60} h {minutes % 60} min left"


@dataclass(frozen=True, kw_only=True)
class Progress:
    stage: str
    done: int
    total: int
    what: str = ""


@dataclass(frozen=True, kw_only=True)
class Loaded:
    """The model is ready to chat (sent again after a re-profile: the popularity may change; and after
    a SetContext, with the new ctx)."""

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
    weights_bits: str = ""  # the file's precision where its experts are above 4 bits ("8-bit"): what 4-bit tiers re-quantise
    reply_format: str = "plain"  # how its replies are read (engine/prompts/formats.FORMATS)
    takes_tools: bool = False  # its chat template renders `tools` (else a request with tools is refused)
    thinking_switch: bool = False  # its template can switch reasoning off (Generate.thinking=False)
    memory: str = ""  # where its weights are, in words, where some are read from the mapped file
    # the context it runs at (ctx), how it was chosen and what any other length would cost
    # (engine/planning/kv_reservation.ContextChoice: line(), bytes_at(n), fits, auto_ctx)
    context: Any = None


@dataclass(frozen=True, kw_only=True)
class QueryDone:
    """A Query's answer: a plain value (engine/runtime/queries.py says which, for each name)."""

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
    ram_held: int  # RAM the model holds that the process owns (anonymous memory)
    rss: int
    ram_budget: int
    ram_mapped: int = 0  # the model's bytes served from its mapped file (page cache, evictable)
    rss_file: int = 0  # of rss, the file-backed pages resident now (a mapped file's, read so far)
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
