"""app/chat/session.py without a window (no Qt imported): drafts, an edit of the last turn that
keeps it until the new message is sent, and a regenerated reply's versions, on a real SQLite store."""
import sys

from app.chat.session import ChatSession, Draft, shown_version, with_versions
from app.store.chat_store import Store


def chat(tmp_path):
    store = Store(tmp_path / "chats.sqlite3")
    s = ChatSession(store, None)
    cid = s.add_user("What is the capital of France?", {}, title="What is the capital of France?")
    store.add_message(cid, "assistant", "Paris.", meta={"stats": "12 tokens"})
    return store, s


def test_no_qt_is_imported():
    import subprocess

    code = "import sys, app.chat.session, app.chat.settings, app.store.chat_store; print(any(m.startswith('PySide6') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_first_message_makes_and_names_the_chat(tmp_path):
    store, s = chat(tmp_path)
    assert store.conversation(s.cid).title == "What is the capital of France?"
    assert [m.role for m in s.messages()] == ["user", "assistant"] and s.draft.empty


def test_an_edit_keeps_the_turn_until_the_new_message_is_sent(tmp_path):
    store, s = chat(tmp_path)
    draft = s.begin_edit(Draft("half a thought"))
    assert draft.text == "What is the capital of France?"
    assert [m.content for m in s.messages()] == ["What is the capital of France?", "Paris."]  # untouched
    assert s.editing() == [m.id for m in s.messages()]
    s.add_user("What is the capital of Italy?", {}, title="x")
    assert [m.content for m in s.messages()] == ["What is the capital of Italy?"] and s.edit is None
    assert store.conversation(s.cid).title == "What is the capital of France?"  # a named chat keeps its name


def test_a_cancelled_edit_gives_back_the_draft_and_the_turn(tmp_path):
    store, s = chat(tmp_path)
    s.begin_edit(Draft("half a thought"))
    assert s.cancel_edit() == Draft("half a thought") and s.edit is None
    assert [m.content for m in s.messages()] == ["What is the capital of France?", "Paris."]


def test_an_edited_message_with_documents_attaches_its_files_again(tmp_path):
    store = Store(tmp_path / "chats.sqlite3")
    s = ChatSession(store, None)
    meta = {"typed": "summarise", "attachments": [{"name": "a.txt", "path": str(tmp_path / "a.txt"), "size": 3}]}
    s.add_user("Document 1: a.txt\n\nabc\n\nEnd of document 1: a.txt\n\nsummarise", meta, title="summarise")
    draft = s.begin_edit(Draft())
    assert draft.text == "summarise" and draft.paths == [str(tmp_path / "a.txt")]


def test_regenerating_keeps_every_version_and_switching_sends_the_one_shown(tmp_path):
    store, s = chat(tmp_path)
    earlier = s.take_last_reply()
    assert earlier == [{"content": "Paris.", "meta": {"stats": "12 tokens"}}]
    assert [m.role for m in s.messages()] == ["user"]  # the new reply streams into a new row
    store.add_message(s.cid, "assistant", "It is Paris.", meta=with_versions(earlier, "It is Paris.", {"stats": "9"}))
    reply = s.messages()[-1]
    assert shown_version(reply) == (1, 2)
    assert s.show_version(reply.id, 0)
    reply = s.messages()[-1]
    assert reply.content == "Paris." and reply.meta["stats"] == "12 tokens" and shown_version(reply) == (0, 2)
    # a third version keeps both earlier ones, whichever was shown
    third = s.take_last_reply()
    assert [v["content"] for v in third] == ["Paris.", "It is Paris."]
    assert not s.show_version(reply.id, 5)


# ---- the reply in progress, against the real engine thread on the tiny model ----------------------
def engine_backend(tiny, events):
    from app.chat.backend import LocalBackend
    from engine.protocol import Load, Loaded
    from engine.runtime.session import Session

    session = Session(events.put).start()
    session.submit(Load(path=str(tiny), device="cpu", dtype="fp32", placement="cpu", ctx=256))
    while True:
        ev = events.get(timeout=120)
        if isinstance(ev, Loaded):
            break
    session.loaded.generator.eos_ids.clear()
    return session, LocalBackend(session.submit, lambda: ev)


def run_reply(chat, backend, events, history, **kw):
    from engine.runtime.generate import SamplingParams
    from engine.protocol import Done, ErrorEvent, Token

    reply = chat.start_reply(backend, history, SamplingParams(max_new_tokens=8), None, now=0.0, **kw)
    drawn = []
    while True:
        ev = events.get(timeout=120)
        if getattr(ev, "request_id", None) != reply.request:
            continue
        if isinstance(ev, Token):
            drawn += chat.reply_token(ev, now=0.5)
        elif isinstance(ev, Done):
            return ev, chat.reply_done(ev, stats="8 tokens"), drawn
        elif isinstance(ev, ErrorEvent):
            return ev, chat.reply_failed(ev.message), drawn


def test_a_reply_is_owned_by_the_chat_session_from_start_to_end(tiny, tmp_path, window_cache):
    import queue

    from engine.runtime.client import end_session

    events = queue.Queue()
    session, backend = engine_backend(tiny, events)
    try:
        store = Store(tmp_path / "chats.sqlite3")
        chat = ChatSession(store, None)
        chat.add_user("hello", {}, title="hello")
        done, meta, drawn = run_reply(chat, backend, events, [{"role": "user", "content": "hello"}])
        assert not chat.generating and len(done.token_ids) == 8
        text = "".join(t for kind, t in drawn if kind == "content")
        last = chat.messages()[-1]
        assert last.role == "assistant" and last.complete and last.content == done.content == text
        assert meta["model"] == tiny.name and meta["stats"] == "8 tokens"
        # again, as Regenerate does: the first answer kept as a version
        earlier = chat.take_last_reply()
        done2, meta2, _ = run_reply(chat, backend, events, [{"role": "user", "content": "hello"}], earlier=earlier)
        last = chat.messages()[-1]
        assert [v["content"] for v in last.meta["versions"]] == [done.content, done2.content]
        assert shown_version(last) == (1, 2)
    finally:
        end_session(session)


def test_the_chat_holds_its_settings_and_fits_its_history_to_them(tmp_path):
    """Its settings are the chat's own over the defaults given; the history sent keeps the system
    prompt and the newest turns that fit its context length, whole turns, oldest left out first."""
    from app.chat.backend import Fitting
    from app.chat.settings import DEFAULTS

    store, s = chat(tmp_path)
    assert s.params(DEFAULTS) == DEFAULTS and s.context(4096) == 4096  # nobody set it up: the defaults
    store.set_settings(s.cid, {"temperature": 0.7, "context": 120, "max_new_tokens": 20})
    store.set_system_prompt(s.cid, "Answer in one word.")
    assert s.params(DEFAULTS).temperature == 0.7 and s.params(DEFAULTS).repetition_penalty == DEFAULTS.repetition_penalty
    assert s.context(4096) == 120 and s.context(100) == 100  # never above the model's
    for i in range(6):  # a long chat: 30 words a turn
        s.add_user(" ".join(["word"] * 15) + f" question {i}", {}, title="x")
        store.add_message(s.cid, "assistant", " ".join(["word"] * 15), meta={})
    s.add_user("and the capital of Italy?", {}, title="x")
    words = Fitting(ctx=4096, count_tokens=lambda text: len(text.split()), prompt_ids=None)
    h = s.history(words, DEFAULTS)
    assert h[0] == {"role": "system", "content": "Answer in one word."}
    assert h[-1] == {"role": "user", "content": "and the capital of Italy?"}
    assert h.dropped > 0 and h.limit == 120 and [m["role"] for m in h[1:]][0] == "user"  # whole turns
    assert ChatSession(store, None).history(words, DEFAULTS) == []  # a chat not made yet sends nothing


def test_whoever_shows_the_chat_is_told_what_changed(tmp_path):
    """The window watches each chat's session: it is told after a message is sent, an edit begins or
    ends, a reply is taken back to regenerate, a version is switched, and a reply ends or fails; the
    store already holds the change when it is told."""
    from types import SimpleNamespace

    store, s = chat(tmp_path)
    told = []
    s.watch(lambda session, what: told.append((what, [m.content for m in session.messages()])))

    s.begin_edit(Draft("half-written"))
    s.cancel_edit()
    assert [w for w, _ in told] == ["edit", "edit"]
    s.begin_edit(Draft())
    told.clear()
    s.add_user("And of Spain?", {}, title="x")
    assert told == [("edit", ["And of Spain?"]), ("messages", ["And of Spain?"])]  # the turn replaced, then told
    told.clear()

    class Backend:
        name = "tiny"

        def generate(self, history, params, think, cache_key=""):
            return 7

    s.start_reply(Backend(), [], None, None)
    s.reply_done(SimpleNamespace(content="Madrid.", tool_calls=(), notes=()))
    assert told == [("ended", ["And of Spain?", "Madrid."])]
    told.clear()
    earlier = s.take_last_reply()
    assert told == [("messages", ["And of Spain?"])]
    s.start_reply(Backend(), [], None, None, earlier)
    s.reply_failed("out of memory")  # nothing streamed: the version before comes back
    assert told[-1] == ("messages", ["And of Spain?", "Madrid."])
