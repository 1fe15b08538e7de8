"""Chatting with a served model elsewhere: any OpenAI-compatible endpoint (vLLM, SGLang, a llama.cpp
server, Ollama, another Mixdesk's `mixdesk serve`), for when one machine is not enough.

RemoteChat streams /v1/chat/completions in a worker thread with the standard library's HTTP client
(no extra dependency) and hands the window the same events the engine sends (Token, Done,
ErrorEvent, from engine/protocol), as a Qt signal on the GUI thread, so the chat view, the store
and the Stop button work unchanged. Like the engine, it hands out each reply's request id (negative
ones, unique in the process, so that they never meet the engine's, which count up from 1). A remote
server names no token ids, so a reply's Done carries its token count (from the usage the server
reports, else one per streamed piece) but not the ids. Every failure is one line: the URL and what
went wrong.
"""
from __future__ import annotations

import http.client
import itertools
import json
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from PySide6.QtCore import QObject, Signal

from engine.prompts.formats import Delta
from engine.runtime.generate import SamplingParams
from engine.protocol import Done, ErrorEvent, Token

from .. import gui_threads


_IDS = itertools.count(-1, -1)  # the replies' request ids, for every RemoteChat (see the docstring)


class RemoteError(Exception):
    pass


def _connect(base: str, timeout: float):
    u = urlsplit(base)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise RemoteError(f"{base} is not an http(s) URL")
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port or 443, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    return conn, u.path.rstrip("/")


def _request(base: str, key: str, method: str, path: str, body: dict | None = None, timeout: float = 30.0):
    conn, prefix = _connect(base, timeout)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, prefix + path, body=json.dumps(body).encode() if body is not None else None,
                     headers=headers)
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        raise RemoteError(f"{base}: {getattr(e, 'strerror', None) or e}") from None
    if resp.status >= 400:
        try:
            err = json.loads(resp.read() or b"{}").get("error", {})
            msg = err.get("message") if isinstance(err, dict) else str(err)
        except ValueError:
            msg = ""
        conn.close()
        raise RemoteError(f"{base}: HTTP {resp.status}" + (f": {msg}" if msg else ""))
    return conn, resp


def list_models(base: str, key: str = "") -> list[str]:
    """The model ids the endpoint serves (GET /models)."""
    conn, resp = _request(base, key, "GET", "/models")
    try:
        data = json.loads(resp.read())
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError):
        raise RemoteError(f"{base}: /models did not answer with a model list") from None
    finally:
        conn.close()


class RemoteChat(QObject):
    events = Signal(list)  # like EngineBridge.events: a batch of engine-protocol events

    def __init__(self, base: str, key: str, model: str, parent=None):
        super().__init__(parent)
        self.base, self.key, self.model = base.rstrip("/"), key, model
        self._stops: dict[int, threading.Event] = {}

    # a chat backend (app/chat/backend.py): the server fits the history to its own context, and the
    # Think switch is the local engine's
    local = False
    thinking_switch = False

    @property
    def name(self) -> str:
        return self.model

    @property
    def label(self) -> str:
        return f"{self.model} at {self.base}"

    def fitting(self):
        from .backend import Fitting

        return Fitting()

    def generate(self, messages: list[dict], params: SamplingParams, thinking: bool | None = None,
                 cache_key: str = "") -> int:
        """Start a reply; its request id (its events carry it; Stop it with stop(id)). The server keeps
        its caches by the prompt's prefix: cache_key is not sent."""
        request_id = next(_IDS)
        stop = self._stops[request_id] = threading.Event()
        gui_threads.start(lambda: self._run(request_id, messages, params, stop), "mixdesk-remote")
        return request_id

    def stop(self, request_id: int) -> None:
        if request_id in self._stops:
            self._stops[request_id].set()

    def _run(self, rid: int, messages: list[dict], p: SamplingParams, stop: threading.Event) -> None:
        body = {"model": self.model, "messages": messages, "stream": True, "max_tokens": p.max_new_tokens,
                "temperature": p.temperature, "top_p": p.top_p, "stream_options": {"include_usage": True}}
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop:
            body["stop"] = list(p.stop)
        t0 = time.perf_counter()
        pieces, thoughts, first, usage, reason = [], [], None, None, "eos"
        conn = None
        try:
            conn, resp = _request(self.base, self.key, "POST", "/chat/completions", body, timeout=300)
            for raw in resp:
                if stop.is_set():
                    reason = "cancelled"
                    break
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RemoteError(f"{self.base}: {chunk['error'].get('message', chunk['error'])}")
                usage = chunk.get("usage") or usage
                for ch in chunk.get("choices") or []:
                    delta = ch.get("delta") or {}
                    thought = delta.get("reasoning_content") or ""  # Mixdesk's, llama.cpp's and vLLM's field
                    text = delta.get("content") or ""
                    if thought or text:
                        if first is None:
                            first = time.perf_counter()
                        pieces.append(text)
                        thoughts.append(thought)
                        parts = tuple(Delta(part, t) for part, t in (("reasoning", thought), ("content", text)) if t)
                        self.events.emit([Token(request_id=rid, token_id=-1, text=text, index=len(pieces) - 1,
                                                seconds=0.0, deltas=parts)])
                    if ch.get("finish_reason"):
                        reason = {"stop": "eos", "length": "length"}.get(ch["finish_reason"], ch["finish_reason"])
        except (RemoteError, OSError, ValueError, http.client.HTTPException) as e:
            message = str(e) if isinstance(e, RemoteError) else f"{self.base}: {e}"
            self.events.emit([ErrorEvent(message=message, request_id=rid, kind="RemoteError")])
            return
        finally:
            self._stops.pop(rid, None)
            if conn is not None:
                conn.close()
        end = time.perf_counter()
        n = int(usage.get("completion_tokens", len(pieces))) if usage else len(pieces)
        prompt = int(usage.get("prompt_tokens", 0)) if usage else 0
        self.events.emit([Done(request_id=rid, reason=reason, text="".join(pieces), token_ids=[-1] * n,
                               prompt_tokens=prompt, reused_tokens=0, prefill_s=(first or end) - t0,
                               decode_s=end - (first or end), reasoning="".join(thoughts), content="".join(pieces))])


# ---- the window's side: File > Connect to a server, File > Use the local model ----
@dataclass(frozen=True)
class RemoteParts:
    """What connect, disconnect and show_mode use of the window: its widgets, and its state as small
    callables."""
    engine: object  # the engine controller (app/engine_controller.py): listen(source), remote_active
    bar: object  # the model bar (app/model_bar.py): remote, setText, show_model
    composer: object  # its send_btn
    slider: object  # the quality slider (it acts on the local engine)
    panel: object  # the live panel: placement_box, mode
    current: Callable[[], "RemoteChat | None"]  # the served model the chat goes to, if any
    use: Callable[["RemoteChat | None"], None]  # the chat goes there from now on (None: the local model)
    ask: Callable[[], "tuple[str, str, str] | None"]  # File > Connect to a server's dialog: its choice, or None
    generating: Callable[[], bool]  # a reply is in progress
    stop: Callable[[], None]  # stop it
    local_ready: Callable[[], bool]  # a local model is loaded and none is being opened
    say: Callable[[str], None]  # on the status line (8 s)
    log: Callable[[str], None]  # in the log
    owner: object = None  # the QObject parent of each RemoteChat


def connect(p: RemoteParts, choice: tuple[str, str, str] | None = None) -> bool:
    """Chat with a served model: `choice` (url, key, model), or the one the user gives in the
    Connect dialog. True when the chat now goes there."""
    if choice is None:
        choice = p.ask()
        if choice is None:
            return False
    if p.generating():
        p.stop()
    chat = RemoteChat(*choice, parent=p.owner)
    p.use(chat)
    p.engine.listen(chat)
    show_mode(p, True)
    p.say(f"the chat now goes to {chat.label}")
    p.log(f"chatting with {chat.label}")
    return True


def disconnect(p: RemoteParts) -> None:
    if p.current() is None:
        p.say("The chat already uses the local model")
        return
    if p.generating():
        p.stop()
    p.use(None)
    show_mode(p, False)
    p.say("the chat uses the local model again")


def show_mode(p: RemoteParts, on: bool) -> None:
    """Remote: the panel says where the chat goes, and the placement controls (which act on the
    local engine) are hidden; the local model stays loaded for when the chat comes back."""
    p.engine.remote_active = on  # the local engine's Stats are not the chat's meanwhile
    p.bar.remote = on
    p.slider.setVisible(not on)
    p.panel.placement_box.setVisible(not on)
    chat = p.current()
    p.panel.mode.setText(f"remote: {chat.label}" if on else "")
    if on:
        p.bar.setText(f"<b>{chat.model}</b> · remote, at {chat.base}")
        p.composer.send_btn.setEnabled(not p.generating())
    else:
        p.bar.show_model()
        p.composer.send_btn.setEnabled(not p.generating() and p.local_ready())
