"""One conversation as the window holds it, without Qt: the messages the store keeps, its settings
(app/chat/settings.py: sampling, context length, system prompt, and the history they let the model
see), the draft and the staged documents (each chat its own: switching chats keeps what was being written in each), an
edit of the last turn, and the versions of a reply that was regenerated.

- Edit last does not touch the store: the turn stays until the edited message is sent (then the old
  turn is replaced), and Cancel edit gives back the draft it replaced.
- Regenerate keeps the earlier answers: the reply's row holds every version in its meta
  ("versions": [{content, meta}, ...], "version": the one shown), the one shown is the row's own
  content (what later turns send the model), and `show_version` switches it (‹ 1/2 ›).

Whoever shows it watches it (`watch`): it says "messages" when its rows changed other than by the reply
streaming (a message sent, a reply taken back to regenerate, a version switched, a failed reply's end),
"edit" when an edit of the last turn began or ended, and "ended" when a reply ended; the window then hands
its widgets what they show (app/main_window.py: the chat view, the sidebar, the composer). Tests drive it
with a real SQLite store and no window (tests/test_chat_session.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import settings as chat_settings


@dataclass
class Draft:
    """What is being written in a chat: its text, the documents staged (parsed, app/chat/documents.py),
    and files to attach again (an edited message's, parsed anew by the composer)."""
    text: str = ""
    docs: list = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.text.strip() or self.docs or self.paths)


@dataclass(frozen=True)
class Edit:
    user_id: int  # the message being edited: it and its reply stay in the store until the new one is sent
    before: Draft  # the draft the edit replaced (Cancel edit gives it back)


def versions_of(message) -> list[dict]:
    """Every version of a reply, oldest first ({content, meta}); a reply never regenerated has one."""
    meta = message.meta or {}
    return list(meta.get("versions") or [{"content": message.content, "meta": plain(meta)}])


def shown_version(message) -> tuple[int, int]:
    """(index of the version shown, how many): (0, 1) for a reply never regenerated."""
    meta = message.meta or {}
    vs = meta.get("versions") or ()
    return (int(meta.get("version", len(vs) - 1)), len(vs)) if vs else (0, 1)


def plain(meta: dict) -> dict:
    """A reply's meta without its versions (what each version keeps of itself)."""
    return {k: v for k, v in (meta or {}).items() if k not in ("versions", "version")}


def with_versions(earlier: list[dict], content: str, meta: dict) -> dict:
    """The meta of a new reply that follows `earlier` versions (none: the meta as it is)."""
    if not earlier:
        return meta
    return {**meta, "versions": earlier + [{"content": content, "meta": plain(meta)}], "version": len(earlier)}


def typed_of(message) -> str:
    """What the user typed in a message (its content also holds its documents' text)."""
    return (message.meta or {}).get("typed", message.content)


SAVE_PARTIAL_S = 1.0  # a reply streaming is written to the store this often: a kill loses at most this much


class Reply:
    """The reply in progress, its one owner: the answer and reasoning so far (what the store keeps,
    every SAVE_PARTIAL_S, and at its end), how long the model thought, the versions it follows, and
    the request that makes it. The chat view only draws what it is handed."""

    def __init__(self, mid: int, earlier: list[dict], model: str, think: bool | None, now: float):
        self.mid, self.earlier, self.model, self.think = mid, earlier, model, think
        self.request: int | None = None
        self.content = self.reasoning = ""
        self.seconds = 0.0  # its steps' seconds so far
        self.thought_s: float | None = None  # of those, the seconds up to its last reasoning
        self.last_save = now

    def take(self, ev) -> list[tuple[str, object]]:
        """A Token's pieces, as what to draw: ("content", text), ("reasoning", text) and, when the answer
        (or a tool call) follows reasoning, ("thought", seconds)."""
        out: list[tuple[str, object]] = []
        self.seconds += ev.seconds
        for d in ev.deltas:
            if d.part == "reasoning":
                self.reasoning += d.text
                self.thought_s = self.seconds
                out.append(("reasoning", d.text))
                continue
            if d.part == "content":
                self.content += d.text
                out.append(("content", d.text))
            if self.thought_s is not None:
                out.append(("thought", self.thought_s))
        return out

    def meta(self, done=None, **meta) -> dict:
        """What the store keeps of it besides its answer (done: its Done), with its versions."""
        if self.model:
            meta["model"] = self.model
        if self.reasoning.strip():
            meta.update(reasoning=self.reasoning, thought_s=round(self.thought_s or 0.0, 2))
        if done is not None and done.tool_calls:
            meta["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in done.tool_calls]
        if done is not None and done.notes:
            meta["notes"] = list(done.notes)
        if self.think is not None:
            meta["think"] = self.think
        return with_versions(self.earlier, done.content if done is not None else self.content, meta)


class ChatSession:
    def __init__(self, store, cid: int | None):
        self.store, self.cid = store, cid
        self.draft = Draft()
        self.edit: Edit | None = None
        self.reply: Reply | None = None
        self._watchers: list[Callable[[ChatSession, str], None]] = []

    def watch(self, fn: Callable[["ChatSession", str], None]) -> None:
        """fn(session, what) after each change: "messages", "edit" or "ended" (the module's docstring)."""
        self._watchers.append(fn)

    def _said(self, what: str) -> None:
        for fn in list(self._watchers):
            fn(self, what)

    def messages(self) -> list:
        return self.store.messages(self.cid) if self.cid is not None else []

    # ---- its settings (app/chat/settings.py): the defaults given, its own over them ----
    def params(self, defaults):
        """The sampling parameters its replies use (a chat not yet made: the defaults)."""
        return chat_settings.params_for(self.store, self.cid, defaults)

    def context(self, model_ctx: int) -> int:
        """Its context length in tokens, never above the model's (model_ctx; 0: none known)."""
        return chat_settings.context_for(self.store, self.cid, model_ctx)

    def history(self, fitting, defaults) -> chat_settings.History:
        """What the model is sent: the system prompt, then the newest turns that fit its context
        length, counted with `fitting` (the backend's count_tokens, ctx and prompt_ids)."""
        if self.cid is None:
            return chat_settings.History()
        return chat_settings.messages_for(self.store, self.cid, fitting.count_tokens, fitting.ctx,
                                          fitting.prompt_ids, defaults)

    # ---- editing the last turn ----
    def begin_edit(self, draft: Draft) -> Draft | None:
        """The last user message's text and files as the new draft (None: nothing to edit); `draft`
        is what was being written, given back by cancel_edit. The store is untouched."""
        users = [m for m in self.messages() if m.role == "user"]
        if not users:
            return None
        last = users[-1]
        began = self.edit is None
        if began:
            self.edit = Edit(last.id, draft)
        paths = [f["path"] for f in (last.meta or {}).get("attachments") or () if f.get("path")]
        self.draft = Draft(typed_of(last), [], paths)
        if began:
            self._said("edit")
        return self.draft

    def cancel_edit(self) -> Draft:
        """The edit abandoned: the turn as it was, the draft from before the edit."""
        before = self.edit.before if self.edit is not None else Draft()
        was, self.edit = self.edit, None
        self.draft = before
        if was is not None:
            self._said("edit")
        return before

    def editing(self) -> list[int]:
        """The ids of the messages the edit will replace (shown dimmed), oldest first."""
        if self.edit is None:
            return []
        return [m.id for m in self.messages() if m.id >= self.edit.user_id]

    # ---- sending ----
    def add_user(self, content: str, meta: dict, title: str) -> int:
        """The message sent (replacing the edited turn, if one is being edited); the chat is made
        or named from it. Returns the chat's id."""
        if self.cid is None:
            self.cid = self.store.new_conversation(title=title[:40])
        elif self.store.conversation(self.cid).title == "New chat":
            self.store.rename(self.cid, title[:40])
        edited = self.edit is not None
        if edited:
            if any(m.id == self.edit.user_id for m in self.messages()):
                self.store.delete_messages_from(self.cid, self.edit.user_id)
            self.edit = None
        self.store.add_message(self.cid, "user", content, meta=meta)
        self.draft = Draft()
        if edited:
            self._said("edit")
        self._said("messages")
        return self.cid

    # ---- the reply ----
    @property
    def generating(self) -> bool:
        return self.reply is not None

    def start_reply(self, backend, history: list[dict], params, think: bool | None,
                    earlier: list[dict] | None = None, now: float = 0.0) -> Reply:
        """The reply to `history` starts: its row in the store (complete once it ends), and the
        backend asked for it. think: the Think switch (None: the model has none)."""
        earlier = earlier or []
        mid = self.store.add_message(self.cid, "assistant", "", complete=False,
                                     meta=with_versions(earlier, "", {}) or None)
        self.reply = r = Reply(mid, earlier, backend.name, think, now)
        r.request = backend.generate(list(history), params, False if think is False else None,
                                     cache_key=f"chat:{self.cid}")  # the engine keeps this chat's KV cache by it
        return r

    def reply_token(self, ev, now: float) -> list[tuple[str, object]]:
        """A Token of the reply: what to draw; what streamed is written every SAVE_PARTIAL_S."""
        r = self.reply
        out = r.take(ev)
        if now - r.last_save >= SAVE_PARTIAL_S:
            self.store.update_message(r.mid, r.content, complete=False, meta=r.meta() or None)
            r.last_save = now
        return out

    def reply_done(self, ev, **meta) -> dict:
        """The reply ended (its Done): its answer and meta written; returns the meta."""
        r, self.reply = self.reply, None
        r.content = ev.content
        meta = r.meta(ev, **meta)
        self.store.update_message(r.mid, ev.content, complete=True, meta=meta)
        self._said("ended")
        return meta

    def reply_failed(self, message: str) -> str | None:
        """The reply ended with an error: what streamed is kept and marked (its note returned), or,
        when nothing did, its row goes (the version shown before comes back, if it was regenerated)."""
        r, self.reply = self.reply, None
        if r is None:
            return None
        note = None
        if r.content or r.reasoning:
            note = f"stopped by an error: {message.splitlines()[0] if message else 'unknown'}"
            self.store.update_message(r.mid, r.content, complete=True, meta=r.meta(stats=note))
        elif r.earlier:
            last = r.earlier[-1]
            meta = {**last["meta"], "versions": r.earlier, "version": len(r.earlier) - 1}
            self.store.update_message(r.mid, last["content"], complete=True, meta=meta)
        else:
            self.store.delete_messages_from(self.cid, r.mid)
        self._said("messages")
        return note

    def save_partial(self) -> None:
        """At close: what streamed so far, kept as an interrupted reply."""
        r = self.reply
        if r is not None:
            self.store.update_message(r.mid, r.content, complete=False, meta=r.meta() or None)

    # ---- the Think switch ----
    def thinks(self) -> bool:
        """The chat's Think switch, as its newest message that recorded one says (else on)."""
        for m in reversed(self.messages()):
            if "think" in (m.meta or {}):
                return bool(m.meta["think"])
        return True

    def set_think(self, on: bool) -> None:
        """Remembered with the chat at once, in its newest message's meta (and in each new one's)."""
        msgs = self.messages() if self.reply is None else []
        if msgs:
            m = msgs[-1]
            self.store.update_message(m.id, m.content, m.complete, meta={**(m.meta or {}), "think": on})

    # ---- regenerating ----
    def take_last_reply(self) -> list[dict] | None:
        """Before a reply is generated again: the last reply's versions (carried into the new one)
        and its row removed; None when the chat does not end with a reply (nothing to carry)."""
        msgs = self.messages()
        if not msgs or msgs[-1].role != "assistant":
            return None
        last = msgs[-1]
        earlier = versions_of(last)
        i, _ = shown_version(last)
        earlier[min(i, len(earlier) - 1)] = {"content": last.content, "meta": plain(last.meta)}
        self.store.delete_messages_from(self.cid, last.id)
        self._said("messages")
        return earlier

    def show_version(self, mid: int, j: int) -> bool:
        """Reply mid shows (and later turns send) its version j; False when it has none such."""
        msg = next((m for m in self.messages() if m.id == mid), None)
        if msg is None:
            return False
        vs = versions_of(msg)
        if not 0 <= j < len(vs) or len(vs) < 2:
            return False
        i, _ = shown_version(msg)
        vs[i] = {"content": msg.content, "meta": plain(msg.meta)}  # the one shown, as it is now
        self.store.update_message(mid, vs[j]["content"], True, meta={**vs[j]["meta"], "versions": vs, "version": j})
        self._said("messages")
        return True


def missing(paths: list[str]) -> list[str]:
    """The files of an edited message that are no longer where they were."""
    return [p for p in paths if not Path(p).is_file()]
