"""The quiet line under a reply, in plain words: the model that wrote it, where its message keeps
the name (replies saved before that show none), then its stats ("Mixtral-8x7B · 12.3 tokens/s ·
240 tokens · stopped: end of answer"); and the technical detail (prefill tokens and seconds, the
engine's reason) for its tooltip."""
from __future__ import annotations

WHY = {  # Done.reason -> plain words
    "eos": "end of answer",
    "stop": "a stop word",
    "length": "reply length limit",
    "context": "the conversation filled the model's memory",
    "cancelled": "cancelled",
}


def line(stats: str, model: str = "") -> str:
    """The footer's text: the model's name (if known), then the stats."""
    return " · ".join(part for part in (model, stats) if part)


def footer(done, note: str = "") -> tuple[str, str]:
    """(text, tooltip) for a reply's Done; note: what else to say (a wait, as " · waited 3 s ...")."""
    n = len(done.token_ids)
    why = WHY.get(done.reason, done.reason)
    words = [f"{done.decode_tok_s:.1f} tokens/s"] if done.decode_tok_s > 0 else []
    words.append(f"{n:,} token" + ("" if n == 1 else "s"))
    words.append(f"stopped: {why}")
    text = " · ".join(words) + note
    prefill = done.prompt_tokens - done.reused_tokens
    tip = (f"decode: {max(n - 1, 0)} tokens in {done.decode_s:.2f} s ({done.decode_tok_s:.1f} tok/s)\n"
           f"prefill: {prefill} tokens in {done.prefill_s:.2f} s"
           + (f" ({done.prefill_tok_s:.0f} tok/s)" if done.prefill_s > 0 else "")
           + (f"; {done.reused_tokens} already read (reused from the conversation's cache)" if done.reused_tokens else "")
           + f"\nprompt: {done.prompt_tokens} tokens\nreason: {done.reason}")
    return text, tip
