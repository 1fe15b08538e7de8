"""The chat's reply in progress: what Send sends (the chat's history, the typed text and its
documents), the reply streaming into the view and into the store (saved every SAVE_PARTIAL_S, so a
kill loses at most that much), and its end: finished, stopped, or failed (what streamed is kept,
marked). Regenerate and Edit last start from the store.

It follows the engine controller's reply signals (app/engine_controller.py) and reaches the engine
through the bridge, or the served model through app/remote.py."""
from __future__ import annotations

import time

from engine.protocol import Generate, Stop

from . import chat_settings, documents, reply_footer

SAVE_PARTIAL_S = 1.0


class ReplyFlow:
    def __init__(self, window):
        self.w = window
        self.generating = False
        self.request: int | None = None  # the reply in progress: its id from the engine (or the remote)
        self.mid: int | None = None  # its message in the store
        self.last_save = 0.0

    def follow(self, engine) -> None:
        engine.reply_token.connect(self.on_token)
        engine.reply_done.connect(self.on_done)
        engine.reply_failed.connect(self.failed)

    # ---- sending ----
    def history(self) -> chat_settings.History:
        """The chat's system prompt and the messages that fit in its context length (app/chat_settings.py)."""
        w = self.w
        local = w.remote is None and w.model_info is not None
        return chat_settings.messages_for(w.store, w.cid, w.count_tokens, w.ctx if local else 0,
                                          w.model_info.prompt_ids if local else None, w.params)

    def send(self) -> None:
        w = self.w
        text = w.input.toPlainText().strip()
        if self.generating or (not text and not w.docs) or not w.send_btn.isEnabled():
            return
        if w.cid is None:
            w.cid = w.store.new_conversation(title=(text or w.docs[0].name)[:40])
        elif w.store.conversation(w.cid).title == "New chat":
            w.store.rename(w.cid, (text or w.docs[0].name)[:40])
        content = documents.prompt_with_documents(text, w.docs)
        meta = {"attachments": documents.attachment_meta(w.docs), "typed": text} if w.docs else {}
        w.store.add_message(w.cid, "user", content, meta=w.parts.with_switch(meta))  # content: what the model reads
        w.input.clear()
        w.attachments.clear()
        w.refresh_conversations()
        w.chat.show_messages(w.store.messages(w.cid))
        self.start()

    def start(self) -> None:
        """The reply to the chat's history as the store holds it."""
        w = self.w
        self.mid = w.store.add_message(w.cid, "assistant", "", complete=False)
        self.generating = True
        self.last_save = time.monotonic()
        w.composer.set_generating(True)
        w.chat.begin_stream(key=self.mid)
        w.parts.begin()
        history, params = self.history(), chat_settings.params_for(w.store, w.cid, w.params)
        if history.note:  # the chat is longer than its context length: said, and logged
            w.statusBar().showMessage(history.note, 15000)
            w.log_line(history.note)
        if w.remote is not None:
            self.request = w.remote.generate(list(history), params)
        else:
            w.wait.reply_started()  # says so if a calibration step holds it back
            self.request = w.bridge.send(Generate(messages=list(history), params=params,
                                                  thinking=w.parts.thinking))
        w.engine.reply_request = self.request

    def stop(self) -> None:
        w = self.w
        if self.generating and w.remote is not None:
            w.remote.stop(self.request)
        elif self.generating:
            w.bridge.send(Stop(request_id=self.request))

    def regenerate(self) -> None:
        w = self.w
        if self.generating or w.cid is None:
            return
        msgs = w.store.messages(w.cid)
        if msgs and msgs[-1].role == "assistant":
            w.store.delete_messages_from(w.cid, msgs[-1].id)
        if w.store.messages(w.cid):
            w.chat.show_messages(w.store.messages(w.cid))
            self.start()

    def edit_last(self) -> None:
        w = self.w
        if self.generating or w.cid is None:
            return
        users = [m for m in w.store.messages(w.cid) if m.role == "user"]
        if users:
            w.input.setPlainText((users[-1].meta or {}).get("typed", users[-1].content))
            w.store.delete_messages_from(w.cid, users[-1].id)
            w.chat.show_messages(w.store.messages(w.cid))

    # ---- the reply streaming ----
    def on_token(self, ev) -> None:
        w = self.w
        w.wait.reply_streaming()
        w.parts.take(ev)
        now = time.monotonic()
        if now - self.last_save >= SAVE_PARTIAL_S:  # a kill loses at most this much of a reply
            meta = w.parts.meta()
            w.store.update_message(self.mid, w.chat.streamed, complete=False, meta=meta or None)
            self.last_save = now

    def on_done(self, ev) -> None:
        w = self.w
        w.wait.reply_streaming()
        stats, detail = reply_footer.footer(ev, w.wait.stats_note() if w.remote is None else "")
        used = ev.prompt_tokens + len(ev.token_ids)
        meta = w.parts.meta(ev, stats=stats, stats_detail=detail, context=used)  # the chat's context indicator, when it is opened again
        w.store.update_message(self.mid, ev.content, complete=True, meta=meta)
        w.chat.end_stream(stats, ev.content, meta)
        self._ended()
        w.composer.show_context(used, w.ctx, limit=chat_settings.context_for(w.store, w.cid, w.ctx))

    def context_of(self, messages) -> int | None:
        """The context the chat's last reply used, as its message keeps it (None: not known)."""
        for m in reversed(messages):
            if m.role == "assistant" and "context" in (m.meta or {}):
                return m.meta["context"]
        return None

    def failed(self, message: str) -> None:
        """The reply in progress ended with an error: keep what streamed (marked), or drop the empty
        row, and leave "generating"."""
        w = self.w
        if not self.generating:
            return
        w.wait.reply_streaming()
        if w.chat.streamed or w.chat.streamed_reasoning:
            note = f"stopped by an error: {message.splitlines()[0]}"
            w.store.update_message(self.mid, w.chat.streamed, complete=True, meta=w.parts.meta(stats=note))
            w.chat.end_stream(note)
        else:
            w.store.delete_messages_from(w.cid, self.mid)
        w.chat.show_messages(w.store.messages(w.cid))
        self._ended()

    def _ended(self) -> None:
        self.generating = False
        self.request = None
        self.w.engine.reply_request = None
        self.w.composer.set_generating(False)
        self.w.redraw_chat()  # the theme changed while it streamed

    def save_partial(self) -> None:
        """At close: what streamed so far, kept as an interrupted reply."""
        w = self.w
        if self.generating and self.mid is not None:
            w.store.update_message(self.mid, w.chat.streamed, complete=False, meta=w.parts.meta() or None)
