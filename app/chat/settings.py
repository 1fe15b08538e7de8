"""Per-chat settings (Chat > Chat settings…): how long a reply may run, how freely words are
picked (temperature, top-p, top-k), how strongly repeating is avoided, how much of the chat the
model sees (context length), and the chat's system prompt, with named presets.

Stored with the chat (the store's `settings` column, JSON) as the values that differ from the
defaults: a chat nobody set up holds {} and follows the defaults it is given (app/chat/defaults.py). New
chats start from the defaults, not from the last chat's settings: a chat's settings belong to what
it is for (a story at 0.9, code at 0), and a system prompt carried over unseen into a new topic
would change its answers without the user knowing why.

Context length: what is sent is the system prompt, then as many of the newest turns as fit, then
the newest user message; a turn (a user message and the replies after it) that does not fit is
left out whole, oldest first, so the roles still alternate as chat templates require. The system
prompt and the newest user message are never left out. What fits is the chat's context length
(the model's own when 0, never more than it), less room for the reply: its longest reply, at most a
quarter of the context length. Tokens are counted with the model's tokenizer; the chat template's
own tokens are measured from the template (two small renders), or estimated for a served model.

Without Qt: the chat's session (app/chat/session.py) reads them from here, tested with no window
(tests/test_chat_session.py). The dialog that edits them, and the system prompt presets it keeps across
starts, are app/dialogs/chat_settings.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.protocol.sampling import SamplingParams

# new chats' built-in defaults (the user's own: app/chat/defaults.py saved()); a mild
# repetition penalty, as llama.cpp and LM Studio use
DEFAULTS = SamplingParams(max_new_tokens=1024, repetition_penalty=1.1)
REPLY_SHARE = 4  # room kept for the reply: its longest reply, at most 1/REPLY_SHARE of the context length
# A served model's template is not known here: its own tokens are estimated (measured on the
# templates at hand: ChatML adds 5-9 tokens a message, gpt-oss's preamble ~200 in a byte-level vocabulary)
EST_FIXED, EST_PER_MESSAGE = 64, 10
MAX_CTX = 1 << 20  # the context length's upper bound when no model says its own


@dataclass(frozen=True)
class Setting:
    key: str
    label: str
    tip: str
    lo: float
    hi: float
    step: float
    decimals: int = 0
    at_lo: str = ""  # what the lowest value means, shown in its place ("" : the number)
    suffix: str = ""
    hint: str = ""  # a few plain words beside the field


SETTINGS = (
    Setting("max_new_tokens", "Longest reply", "max_new_tokens: the reply stops after this many tokens (a token "
            "is about three quarters of an English word).", 1, MAX_CTX, 64, suffix=" tokens",
            hint="the reply stops there"),
    Setting("temperature", "Randomness", "temperature: 0 always picks the likeliest next token, so the same "
            "question gets the same answer; higher values vary more (0.7 is common, above 1.2 rambles).",
            0, 2, 0.05, 2, at_lo="none", hint="0 = the same answer each time"),
    Setting("top_p", "Word pool (share)", "top-p (nucleus sampling): pick only among the likeliest tokens that "
            "together make up this share of the probability. 1 = all of them. No effect at randomness 0.",
            0.01, 1, 0.05, 2, hint="1 = every word may be picked"),
    Setting("top_k", "Word pool (count)", "top-k: pick only among this many likeliest tokens. 0 = no limit. No "
            "effect at randomness 0.", 0, 1000, 1, at_lo="no limit", hint="fewer = safer word choices"),
    Setting("repetition_penalty", "Avoid repeating", "repetition penalty: makes tokens already in the chat or "
            "the reply less likely (1 = off; 1.1-1.3 tames a model that loops).", 1, 2, 0.05, 2, at_lo="off",
            hint="1.1-1.3 stops a reply that loops"),
    Setting("context", "Chat memory", "context length: how many tokens of the chat the model sees. When the chat "
            "is longer, its oldest turns are left out (never the system prompt or your newest message). "
            "0 = the model's whole context.", 0, MAX_CTX, 256, suffix=" tokens",
            hint="older turns beyond it are left out"),
)
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty")


def default_values(defaults: SamplingParams = DEFAULTS) -> dict:
    return {**{k: getattr(defaults, k) for k in SAMPLING_KEYS}, "context": 0}


def read(raw) -> dict:
    """The stored settings, checked: a value of the wrong type or out of range (a database edited by
    hand, a newer version's key) is left out, so its default applies."""
    out = {}
    for s in SETTINGS:
        v = raw.get(s.key) if isinstance(raw, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not s.lo <= v <= s.hi:
            continue
        if s.decimals == 0:
            if v != int(v):
                continue
            v = int(v)
        out[s.key] = float(v) if s.decimals else v
    return out


def overrides(values: dict, defaults: SamplingParams = DEFAULTS) -> dict:
    """What a chat stores: the values that differ from the defaults."""
    base = default_values(defaults)
    return {k: v for k, v in read(values).items() if v != base[k]}


def params_for(store, cid: int | None, defaults: SamplingParams = DEFAULTS) -> SamplingParams:
    """The chat's sampling parameters: the defaults with its own settings over them."""
    return params_of(read(store.conversation(cid).settings) if cid is not None else {}, defaults)


def params_of(own: dict, defaults: SamplingParams = DEFAULTS) -> SamplingParams:
    return replace(defaults, **{k: v for k, v in own.items() if k in SAMPLING_KEYS})


def context_for(store, cid: int | None, model_ctx: int) -> int:
    """The chat's context length in tokens: its own, never above the model's (0: no limit known)."""
    return context_of(read(store.conversation(cid).settings) if cid is not None else {}, model_ctx)


def context_of(own: dict, model_ctx: int) -> int:
    ctx = own.get("context", 0)
    if model_ctx > 0:
        return min(ctx, model_ctx) if ctx else model_ctx
    return ctx


class History(list):
    """The messages to send (a list of {"role", "content"}), and what was left out to fit."""

    dropped = 0  # messages left out
    limit = 0  # the context length it was fitted to (0: none)
    params: SamplingParams | None = None  # the chat's sampling parameters, read with it

    @property
    def note(self) -> str:
        if not self.dropped:
            return ""
        return (f"{self.dropped} older message{'s' if self.dropped != 1 else ''} left out of what the model sees: "
                f"this chat is longer than its memory ({self.limit:,} tokens; Chat > Chat settings…).")


def template_cost(prompt_ids, count_tokens) -> tuple[int, int]:
    """The chat template's own tokens: (once per prompt, per message), from two small renders."""
    try:
        one = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
        three = one + [{"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]
        n1, n3 = len(prompt_ids(one)), len(prompt_ids(three))
        fixed_and_two = n1 - count_tokens("a") - count_tokens("b")
        per = max(0, (n3 - n1 - count_tokens("c") - count_tokens("d") + 1) // 2)
        return max(0, fixed_and_two - 2 * per), per + 2  # +2: tokens that merge across a content's edges
    except Exception:  # noqa: BLE001 - a template that cannot render these: the estimate
        return EST_FIXED, EST_PER_MESSAGE


def fit(system: str, messages: list[dict], count_tokens, budget: int, cost: tuple[int, int]) -> tuple[list, int]:
    """(the messages that fit in `budget` tokens, how many were left out): whole turns, oldest first;
    the system prompt and the newest user message always stay."""
    fixed, per = cost
    turns: list[list[dict]] = []
    for m in messages:
        if m["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(m)
    if not turns:
        return list(messages), 0
    used = fixed + (count_tokens(system) + per if system else 0)
    used += sum(count_tokens(m["content"]) + per for m in turns[-1])
    kept = [turns[-1]]
    for turn in reversed(turns[:-1]):
        size = sum(count_tokens(m["content"]) + per for m in turn)
        if used + size > budget:
            break
        used += size
        kept.append(turn)
    out = [m for turn in reversed(kept) for m in turn]
    return out, len(messages) - len(out)


def messages_for(store, cid: int, count_tokens, model_ctx: int, prompt_ids=None,
                 defaults: SamplingParams = DEFAULTS) -> History:
    """The history to send for chat `cid`: its system prompt, then the messages that fit in its context
    length (see the module's docstring). count_tokens(text) -> int: the model's tokenizer (None: nothing
    is left out); prompt_ids(messages) -> ids: its chat template (Loaded.prompt_ids), whose own tokens
    are then measured (None: estimated)."""
    c = store.conversation(cid)  # read once: its settings and system prompt
    own = read(c.settings)
    msgs = [{"role": m.role, "content": m.content} for m in store.messages(cid) if m.complete or m.role == "user"]
    out = History([{"role": "system", "content": c.system_prompt}] if c.system_prompt else [])
    limit = context_of(own, model_ctx)
    if limit and count_tokens is not None:
        room = min(params_of(own, defaults).max_new_tokens, limit // REPLY_SHARE)
        chars = len(c.system_prompt) + sum(len(m["content"]) for m in msgs)
        cost = (EST_FIXED, EST_PER_MESSAGE) if prompt_ids is None else template_cost(prompt_ids, count_tokens)
        if 4 * chars + cost[0] + cost[1] * (len(msgs) + 1) > limit - room:  # else it fits whatever the tokens
            msgs, out.dropped = fit(c.system_prompt, msgs, count_tokens, limit - room, cost)
    out.limit, out.params = limit, params_of(own, defaults)
    out.extend(msgs)
    return out
