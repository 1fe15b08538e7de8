"""The chat's reply, on the window's side. The chat's session (app/chat/session.py) owns the reply in
progress: its answer and reasoning, how long the model thought, the versions it follows, and what
the store keeps of it (written every SAVE_PARTIAL_S, so a kill loses at most that much). This module
starts it on the window's backend (app/chat/backend.py: the local engine or a served model, one
interface), hands the backend's events to the session, and draws what the session says to draw:
Send (the typed text and its documents), Stop, Regenerate (the earlier answers kept as versions),
Edit last (the turn kept until the edited message is sent), and the reply's end: finished, stopped,
or failed (what streamed is kept, marked).

It follows the engine controller's reply signals (app/engine_controller.py). It is handed what it
uses (the chat view, the composer, the store, the engine controller, the reply's wait) and, for what
belongs to the window, the hooks of ReplyHooks: it never holds the window."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from . import settings as chat_settings, documents, reply_footer


@dataclass(frozen=True)
class ReplyHooks:
    """What the reply reads of the window, and what it tells it."""
    session: Callable[[], object]  # the ChatSession of the chat shown (app/chat/session.py)
    cid: Callable[[], int | None]  # the chat shown (None: none yet)
    chat_sent: Callable[[int, object], None]  # Send wrote to chat cid (maybe just created): it is the one shown
    backend: Callable[[], object]  # where replies come from (app/chat/backend.py)
    params: Callable[[], object]  # the sampling defaults new chats start from
    ctx: Callable[[], int]  # the local model's context
    status: Callable[[str, int], None]  # a note on the status bar, for so many ms
    log: Callable[[str], None]  # a line of the window's log
    ended: Callable[[], None]  # the reply ended: the chat redrawn, a model waiting for it loads


class ReplyFlow:
    def __init__(self, chat, composer, store, engine, wait, hooks: ReplyHooks):
        self.chat, self.composer, self.store, self.engine, self.wait = chat, composer, store, engine, wait
        self.hooks = hooks
        self.session = None  # the ChatSession whose reply is in progress (None: none is)
        self.read = None  # the reply's prompt's reading, as last said (PromptProgress; None: not said)
        self.reads_document = False  # its chat carries a document (the reading line says "the document")

    @property
    def generating(self) -> bool:
        return self.session is not None and self.session.generating

    @property
    def request(self) -> int | None:
        """The reply in progress: its id from the backend."""
        return self.session.reply.request if self.generating else None

    def follow(self, engine) -> None:
        engine.reply_token.connect(self.on_token)
        engine.reply_reading.connect(self.on_reading)
        engine.reply_done.connect(self.on_done)
        engine.reply_failed.connect(self.failed)

    # ---- sending ----
    def history(self) -> chat_settings.History:
        """The chat's system prompt and the messages that fit in its context length (app/chat/settings.py),
        fitted to the backend's context (a served model fits its own)."""
        h = self.hooks
        return h.session().history(h.backend().fitting(), h.params())

    def think(self) -> bool | None:
        """The Think switch as the composer shows it (None: the model has none)."""
        return self.composer.think_btn.isChecked() if self.hooks.backend().thinking_switch else None

    def send(self) -> None:
        c, h = self.composer, self.hooks
        docs = c.attachments.docs
        text = c.input.toPlainText().strip()
        if self.generating or (not text and not docs) or not c.send_btn.isEnabled():
            return
        content = documents.prompt_with_documents(text, docs)
        meta = {"attachments": documents.attachment_meta(docs), "typed": text} if docs else {}
        if self.think() is not None:
            meta["think"] = self.think()
        # content: what the model reads; an edited turn is replaced only now (app/chat/session.py)
        session = h.session()
        cid = session.add_user(content, meta, title=text or docs[0].name)  # the window, watching, shows it
        h.chat_sent(cid, session)
        c.input.clear()
        c.attachments.clear()
        self.start()

    def start(self, earlier: list[dict] | None = None) -> None:
        """The reply to the chat's history as the store holds it (earlier: the versions it follows)."""
        h = self.hooks
        history = self.history()  # the chat's settings read with it (one read of the chat's row)
        params = history.params if history.params is not None else h.session().params(h.params())
        if history.note:  # the chat is longer than its context length: said, and logged
            h.status(history.note, 15000)
            h.log(history.note)
        backend = h.backend()
        if backend.local:
            self.wait.reply_started()  # says so if a calibration step holds it back
        self.session = h.session()
        self.read = None  # its prompt's reading, as last said (a long prompt's)
        self.reads_document = any((m.meta or {}).get("attachments") for m in self.session.messages())
        reply = self.session.start_reply(backend, history, params, self.think(), earlier, now=time.monotonic())
        self.composer.set_generating(True)
        self.chat.begin_stream(key=reply.mid)
        self.engine.reply_request = reply.request

    def stop(self) -> None:
        if self.generating:
            self.hooks.backend().stop(self.request)

    def regenerate(self) -> None:
        h = self.hooks
        cid = h.cid()
        if self.generating or cid is None:
            return
        if h.session().edit is not None:
            self.cancel_edit()
        earlier = h.session().take_last_reply()  # the answers so far stay, as versions (‹ 1/2 ›)
        if self.store.messages(cid):
            self.start(earlier)

    def edit_last(self) -> None:
        """Edit last: the last message back in the composer (its files attached again), the turn kept
        in the store until the edited one is sent; clicked again while editing, the edit is cancelled."""
        h = self.hooks
        if self.generating or h.cid() is None:
            return
        if h.session().edit is not None:
            self.cancel_edit()
            return
        draft = h.session().begin_edit(self.composer.draft())  # the window, watching, shows the editing
        if draft is not None:
            self.composer.show_draft(draft)

    def show_editing(self) -> None:
        """The composer shows whether the last message is being edited (and the status bar says so)."""
        editing = self.hooks.session().edit is not None
        self.composer.set_editing(editing)
        if editing:
            self.hooks.status("Editing your last message: it and its reply are replaced when you send "
                              "(Cancel edit keeps them)", 15000)

    def cancel_edit(self) -> None:
        self.composer.show_draft(self.hooks.session().cancel_edit())
        self.hooks.status("Edit cancelled: the message and its reply are as they were", 8000)

    # ---- the reply streaming ----
    def on_reading(self, ev) -> None:
        """A long prompt being read (PromptProgress): said where the reply will appear, with the time
        left at the rate measured."""
        if not self.generating:
            return
        self.wait.reply_streaming()  # the reply is under way: no calibration step holds it any more
        self.read = ev
        self.chat.show_reading(ev.describe("the document" if self.reads_document else "the prompt"))

    def on_token(self, ev) -> None:
        if not self.generating:
            return
        self.wait.reply_streaming()
        chat = self.chat
        for kind, x in self.session.reply_token(ev, time.monotonic()):
            if kind == "content":
                chat.add_text(x)
            elif kind == "reasoning":
                chat.add_reasoning(x)
            else:  # the answer (or a tool call) began: the reasoning's header says how long
                chat.thought_done(x)

    def on_done(self, ev) -> None:
        if not self.generating:
            return
        h = self.hooks
        self.wait.reply_streaming()
        backend = h.backend()
        note = self.wait.stats_note() if backend.local else ""
        if ev.reason == "cancelled" and not ev.token_ids and self.read is not None:  # Stop while the prompt was read
            note += (f" · stopped while reading the prompt: {self.read.read:,} of {self.read.total:,} tokens read, "
                     "kept for the next reply")
        stats, detail = reply_footer.footer(ev, note)
        used = ev.prompt_tokens + len(ev.token_ids)
        meta = self.session.reply_done(ev, stats=stats, stats_detail=detail, context=used,  # the chat's context
                                       context_model=backend.name)  # indicator, reopened with the same model
        self.chat.end_stream(stats, ev.content, meta)
        self._ended()
        ctx = h.ctx()
        self.composer.show_context(used, ctx, limit=h.session().context(ctx))

    def model_name(self) -> str:
        """The model the chat talks to ("": none known yet)."""
        return self.hooks.backend().name

    def context_of(self, messages) -> int | None:
        """The context the chat's last reply used, as its message keeps it (None: not known, or
        counted by another model than the one in use)."""
        for m in reversed(messages):
            if m.role == "assistant" and "context" in (m.meta or {}):
                counted_by, now = m.meta.get("context_model"), self.model_name()
                return m.meta["context"] if counted_by is None or not now or counted_by == now else None
        return None

    def failed(self, message: str) -> None:
        """The reply in progress ended with an error: what streamed is kept (marked), or the empty row
        goes; "generating" ends."""
        if not self.generating:
            return
        self.wait.reply_streaming()
        self.session.reply_failed(message)  # the window, watching, draws the chat again from the store
        self._ended()

    def _ended(self) -> None:
        self.session = None
        self.engine.reply_request = None
        self.composer.set_generating(False)
        self.hooks.ended()  # the chat redrawn (the theme changed while it streamed); a model checked while
        # the reply ran loads now (Send waits for it)

    def save_partial(self) -> None:
        """At close: what streamed so far, kept as an interrupted reply."""
        if self.generating:
            self.session.save_partial()
