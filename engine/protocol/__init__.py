"""What the clients of the engine thread (the window, the terminal chat, bench, eval, plan, the
tests) send it, and what it sends back. Every message is built with keywords.

Commands go in through `Session.submit`, which returns the request id of a Load, Generate or Query
(the engine hands ids out; no client picks one), and of a SetContext. Events come out on the engine thread (a GUI
forwards them to its own thread): a request's own events (its Tokens, its Done, its ErrorEvent, a
QueryDone) go to the callable given with it (`submit(cmd, reply_to=...)`, by default the session's
`emit`); every other event goes to `emit` and to each of the session's listeners.

The messages themselves live in two leaf modules, commands.py and events.py (SamplingParams in
sampling.py), which import nothing heavy: a client (the window, the server, a test) imports this
module without torch or any model code (tests/test_layering.py checks it in a fresh interpreter).
"""
from __future__ import annotations

from .commands import (Generate, Load, Query, Reading, Reprofile, SetBudgets, SetContext, SetSlider,  # noqa: F401
                       Shutdown, Stop)
from .events import (Done, EngineStopped, ErrorEvent, Loaded, MigrationProgress, PlacementChanged,  # noqa: F401
                     Progress, PromptProgress, QueryDone, Stats, Token)
from .sampling import SamplingParams  # noqa: F401

COMMANDS = (Load, Generate, Stop, SetSlider, SetBudgets, SetContext, Reprofile, Query, Shutdown, Reading)
EVENTS = (Progress, PromptProgress, Loaded, Token, Done, QueryDone, PlacementChanged, MigrationProgress, Stats,
          ErrorEvent, EngineStopped)
