"""A chat reply in OpenAI's shape, from what the engine read of it in the model's format
(engine/prompts/formats: each Token's deltas, the Done's reasoning, content and tool calls):

- the whole message: `content` (null when there are tool calls and no content),
  `reasoning_content` (when there is reasoning: llama.cpp's and vLLM's field), `tool_calls`
  [{"id", "type": "function", "function": {"name", "arguments"}}];
- the streamed deltas: {"reasoning_content": text}, {"content": text}, a call's first delta
  {"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments": ""}}]} and
  then its arguments {"tool_calls": [{"index", "function": {"arguments": fragment}}]}. Joined, they
  are the whole message, exactly.
- `finish_reason` "tool_calls" when the reply holds a call (unless it was cut at max_tokens or
  the context: "length", which tells the client the rest is missing).
- parallel_tool_calls false: only the reply's first call is kept (the later ones' deltas are
  dropped).
- A malformed call is in the content already, as the model wrote it (the engine's notes about it
  go nowhere else).

The engine numbers a reply's calls call_0, call_1, ...; clients match results to calls by id over
a whole conversation, so each id here is made from the prompt and the call's place in the reply:
unique within a conversation, the same for the same prompt and reply (streamed or not, or a rerun
with a seed).
"""
from __future__ import annotations

import hashlib

from .openai_api import FINISH


class ChatReply:
    def __init__(self, prompt_key: str, parallel: bool = True):
        self.key, self.parallel = prompt_key, parallel

    def call_id(self, index: int, name: str) -> str:
        digest = hashlib.sha256(f"{self.key}\0{index}\0{name}".encode()).hexdigest()
        return f"call_{digest[:24]}"

    def kept(self, index: int) -> bool:
        return self.parallel or index == 0

    def deltas(self, token) -> list[dict]:
        """The OpenAI deltas of one Token (adjacent pieces of one part are joined)."""
        out: list[dict] = []
        for d in token.deltas:
            if d.part in ("reasoning", "content"):
                if not d.text:
                    continue
                key = "reasoning_content" if d.part == "reasoning" else "content"
                if out and set(out[-1]) == {key}:
                    out[-1][key] += d.text
                else:
                    out.append({key: d.text})
            elif d.part == "tool_call" and self.kept(d.index):
                if d.name:
                    call = {"index": d.index, "id": self.call_id(d.index, d.name), "type": "function",
                            "function": {"name": d.name, "arguments": ""}}
                    out.append({"tool_calls": [call]})
                if d.text:
                    out.append({"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]})
        return out

    def calls(self, done) -> list[dict]:
        return [{"id": self.call_id(i, c.name), "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(done.tool_calls) if self.kept(i)]

    def message(self, done) -> dict:
        calls = self.calls(done)
        msg = {"role": "assistant", "content": done.content if done.content or not calls else None}
        if done.reasoning:
            msg["reasoning_content"] = done.reasoning
        if calls:
            msg["tool_calls"] = calls
        return msg

    def finish_reason(self, done) -> str:
        reason = FINISH.get(done.reason, "stop")
        return "tool_calls" if done.tool_calls and reason != "length" else reason
