"""The reply in progress besides its answer, as the window streams and keeps it: its reasoning
(and how long the model thought), its tool calls and notes, and the chat's Think switch (a model
whose chat template can switch its reasoning off). What the store keeps of them is the message's
meta; later turns send the answer alone (MainWindow.history)."""
from __future__ import annotations


class ReplyParts:
    def __init__(self, window):
        self.w = window
        self.reply_s = 0.0  # the reply's steps' seconds so far
        self.thought_s: float | None = None  # of those, the seconds up to its last reasoning

    # ---- the Think switch ----
    @property
    def think_switch(self) -> bool:
        w = self.w
        return w.remote is None and w.model_info is not None and w.model_info.thinking_switch

    @property
    def thinking(self) -> bool | None:
        """Generate.thinking: False where the switch is there and off, else the template's default."""
        return False if self.think_switch and not self.w.composer.think_btn.isChecked() else None

    def chat_thinks(self) -> bool:
        """The chat's Think switch: as its newest message that recorded one says (else on)."""
        w = self.w
        for m in reversed(w.store.messages(w.cid) if w.cid is not None else []):
            if "think" in m.meta:
                return bool(m.meta["think"])
        return True

    def think_toggled(self, on: bool) -> None:
        """Remembered with the chat at once, in its newest message's meta (and in each new one's)."""
        w = self.w
        msgs = w.store.messages(w.cid) if w.cid is not None and not w.generating else []
        if msgs:
            m = msgs[-1]
            w.store.update_message(m.id, m.content, m.complete, meta={**m.meta, "think": on})

    def with_switch(self, meta: dict) -> dict:
        """A message's meta with the Think switch as it is now (where the model has one)."""
        if self.think_switch:
            meta["think"] = self.w.composer.think_btn.isChecked()
        return meta

    # ---- the reply ----
    def begin(self) -> None:
        self.reply_s, self.thought_s = 0.0, None

    def take(self, ev) -> None:
        """A token's pieces: content to the answer, reasoning to its block (a served model's come
        from its server's reasoning_content and content: app/remote.py)."""
        chat = self.w.chat
        self.reply_s += ev.seconds
        for d in ev.deltas:
            if d.part == "reasoning":
                chat.add_reasoning(d.text)
                self.thought_s = self.reply_s
                continue
            if d.part == "content":
                chat.add_text(d.text)
            if self.thought_s is not None:  # the answer (or a tool call) began: the reasoning's header says how long
                chat.thought_done(self.thought_s)

    def meta(self, done=None, **meta) -> dict:
        """What the store keeps of the reply in progress besides its answer (done: its Done event)."""
        reasoning = self.w.chat.streamed_reasoning
        if reasoning.strip():
            meta.update(reasoning=reasoning, thought_s=round(self.thought_s or 0.0, 2))
        if done is not None and done.tool_calls:
            meta["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in done.tool_calls]
        if done is not None and done.notes:
            meta["notes"] = list(done.notes)
        return self.with_switch(meta)
