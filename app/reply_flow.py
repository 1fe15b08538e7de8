"""The chat's reply, on the window's side. The chat's session (app/chat_session.py) owns the reply in
progress: its answer and reasoning, how long the model thought, the versions it follows, and what
the store keeps of it (written every SAVE_PARTIAL_S, so a kill loses at most that much). This module
starts it on the window's backend (app/chat_backend.py: the local engine or a served model, one
interface), hands the backend's events to the session, and draws what the session says to draw:
Send (the typed text and its documents), Stop, Regenerate (the earlier answers kept as versions),
Edit last (the turn kept until the edited message is sent), and the reply's end: finished, stopped,
or failed (what streamed is kept, marked).

It follows the engine controller's reply signals (app/engine_controller.py)."""
from __future__ import annotations

import time

from . import chat_settings, documents, reply_footer


class ReplyFlow:
    def __init__(self, window):
        self.w = window
        self.session = None  # the ChatSession whose reply is in progress (None: none is)

    @property
    def generating(self) -> bool:
        return self.session is not None and self.session.generating

    @property
    def request(self) -> int | None:
        """The reply in progress: its id from the backend."""
        return self.session.reply.request if self.generating else None

    def follow(self, engine) -> None:
        engine.reply_token.connect(self.on_token)
        engine.reply_done.connect(self.on_done)
        engine.reply_failed.connect(self.failed)

    # ---- sending ----
    def history(self) -> chat_settings.History:
        """The chat's system prompt and the messages that fit in its context length (app/chat_settings.py),
        fitted to the backend's context (a served model fits its own)."""
        w = self.w
        f = w.backend.fitting()
        return chat_settings.messages_for(w.store, w.cid, f.count_tokens, f.ctx, f.prompt_ids, w.params)

    def think(self) -> bool | None:
        """The Think switch as the composer shows it (None: the model has none)."""
        w = self.w
        return w.composer.think_btn.isChecked() if w.backend.thinking_switch else None

    def send(self) -> None:
        w = self.w
        text = w.input.toPlainText().strip()
        if self.generating or (not text and not w.docs) or not w.send_btn.isEnabled():
            return
        content = documents.prompt_with_documents(text, w.docs)
        meta = {"attachments": documents.attachment_meta(w.docs), "typed": text} if w.docs else {}
        if self.think() is not None:
            meta["think"] = self.think()
        # content: what the model reads; an edited turn is replaced only now (app/chat_session.py)
        session = w.chat_session
        w.cid = session.add_user(content, meta, title=text or w.docs[0].name)
        w.sessions.pop(None, None)
        w.sessions[w.cid] = session
        w.input.clear()
        w.attachments.clear()
        w.show_editing()
        w.refresh_conversations()
        w.chat.show_messages(w.store.messages(w.cid))
        self.start()

    def start(self, earlier: list[dict] | None = None) -> None:
        """The reply to the chat's history as the store holds it (earlier: the versions it follows)."""
        w = self.w
        history, params = self.history(), chat_settings.params_for(w.store, w.cid, w.params)
        if history.note:  # the chat is longer than its context length: said, and logged
            w.statusBar().showMessage(history.note, 15000)
            w.log_line(history.note)
        if w.backend.local:
            w.wait.reply_started()  # says so if a calibration step holds it back
        self.session = w.chat_session
        reply = self.session.start_reply(w.backend, history, params, self.think(), earlier, now=time.monotonic())
        w.composer.set_generating(True)
        w.chat.begin_stream(key=reply.mid)
        w.engine.reply_request = reply.request

    def stop(self) -> None:
        if self.generating:
            self.w.backend.stop(self.request)

    def regenerate(self) -> None:
        w = self.w
        if self.generating or w.cid is None:
            return
        if w.chat_session.edit is not None:
            w.cancel_edit()
        earlier = w.chat_session.take_last_reply()  # the answers so far stay, as versions (‹ 1/2 ›)
        if w.store.messages(w.cid):
            w.chat.show_messages(w.store.messages(w.cid))
            self.start(earlier)

    def edit_last(self) -> None:
        """Edit last: the last message back in the composer (its files attached again), the turn kept
        in the store until the edited one is sent; clicked again while editing, the edit is cancelled."""
        w = self.w
        if self.generating or w.cid is None:
            return
        if w.chat_session.edit is not None:
            w.cancel_edit()
            return
        draft = w.chat_session.begin_edit(w.composer.draft())
        if draft is not None:
            w.composer.show_draft(draft)
            w.show_editing()

    # ---- the reply streaming ----
    def on_token(self, ev) -> None:
        if not self.generating:
            return
        w = self.w
        w.wait.reply_streaming()
        for kind, x in self.session.reply_token(ev, time.monotonic()):
            if kind == "content":
                w.chat.add_text(x)
            elif kind == "reasoning":
                w.chat.add_reasoning(x)
            else:  # the answer (or a tool call) began: the reasoning's header says how long
                w.chat.thought_done(x)

    def on_done(self, ev) -> None:
        if not self.generating:
            return
        w = self.w
        w.wait.reply_streaming()
        stats, detail = reply_footer.footer(ev, w.wait.stats_note() if w.backend.local else "")
        used = ev.prompt_tokens + len(ev.token_ids)
        meta = self.session.reply_done(ev, stats=stats, stats_detail=detail, context=used,  # the chat's context
                                       context_model=w.backend.name)  # indicator, reopened with the same model
        w.chat.end_stream(stats, ev.content, meta)
        self._ended()
        w.composer.show_context(used, w.ctx, limit=chat_settings.context_for(w.store, w.cid, w.ctx))

    def model_name(self) -> str:
        """The model the chat talks to ("": none known yet)."""
        return self.w.backend.name

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
        w = self.w
        if not self.generating:
            return
        w.wait.reply_streaming()
        note = self.session.reply_failed(message)
        if note:
            w.chat.end_stream(note)
        w.chat.show_messages(w.store.messages(w.cid))
        self._ended()

    def _ended(self) -> None:
        self.session = None
        w = self.w
        w.engine.reply_request = None
        w.composer.set_generating(False)
        w.redraw_chat()  # the theme changed while it streamed
        w.models.reply_ended()  # a model checked while the reply ran loads now (Send waits for it)

    def save_partial(self) -> None:
        """At close: what streamed so far, kept as an interrupted reply."""
        if self.generating:
            self.session.save_partial()
