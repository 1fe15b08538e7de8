"""Where the engine writes the tracebacks of errors it did not expect: a log file in the user log
folder (platformdirs), kept small. The user sees one line that points here."""
from __future__ import annotations

import datetime
import traceback
from pathlib import Path

MAX_BYTES = 1 << 20  # past this the log starts over, keeping the previous one as engine.log.1


def log_path() -> Path:
    from platformdirs import user_log_path

    return user_log_path("mixdesk", appauthor=False) / "engine.log"


def record(exc: BaseException, context: str) -> str:
    """Append exc's traceback to the log; returns the log's path ("" if it could not be written)."""
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > MAX_BYTES:
            path.replace(path.with_suffix(".log.1"))
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"--- {stamp} {context}\n{text}\n")
        return str(path)
    except OSError:
        return ""


def one_line(exc: BaseException) -> str:
    """An unexpected error as one line: its type and the first line of its message."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}" if msg else type(exc).__name__


def error_event(e: Exception, what: str, request_id: int | None = None, log: str | None = None):
    """One ErrorEvent for e: an expected error (MixdeskError) says its own line; an unexpected one is
    logged (once: pass `log` when one error ends several requests) and said as "<what> failed: ...".
    The engine's error boundary (engine/runtime/session.py, engine/runtime/scheduler.py) turns every exception into one."""
    from ..protocol.errors import MixdeskError
    from ..protocol import ErrorEvent

    if isinstance(e, MixdeskError):
        return ErrorEvent(message=str(e), request_id=request_id, kind=type(e).__name__)
    log = record(e, what) if log is None else log
    where = f" (details in {log})" if log else ""
    return ErrorEvent(message=f"{what} failed: {one_line(e)}{where}", request_id=request_id, log=log,
                      kind=type(e).__name__)


DOING = {  # what a command was doing, for an error message
    "Load": "loading the model", "Generate": "starting the reply", "Query": "the query", "SetSlider": "re-planning",
    "SetBudgets": "re-planning", "Reading": "re-planning", "Reprofile": "re-measuring"}
