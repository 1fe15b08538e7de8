"""Seeing the events a session's requests send to their own reply_to (the local server's, which the
session's listeners no longer see): the tests of the server watch its requests end this way."""


def watch_replies(session, kind) -> list:
    """From now on, every event of `kind` that a request submitted with a reply_to receives is also
    appended to the returned list. Undo with `del session.submit`."""
    seen, submit = [], session.submit

    def watched(cmd, reply_to=None):
        def reply(ev):
            if isinstance(ev, kind):
                seen.append(ev)
            reply_to(ev)
        return submit(cmd, reply if reply_to is not None else None)
    session.submit = watched
    return seen
