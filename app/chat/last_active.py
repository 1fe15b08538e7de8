"""When a chat was last active, in the chat list's short form: "14:02" today, "Yesterday", the
weekday within the week ("Mon"), the day and month this year ("30 Nov"), with the year before it
("30 Nov 2025"). Local time; English names (the app's words are English), whatever the C locale.
No Qt here."""
from __future__ import annotations

import datetime

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def short_when(ts: float, now: float) -> str:
    """ts (seconds since the epoch) as the chat list shows it, seen at `now`."""
    t, n = datetime.datetime.fromtimestamp(ts), datetime.datetime.fromtimestamp(now)
    days = (n.date() - t.date()).days
    if days == 0:
        return f"{t:%H:%M}"
    if days == 1:
        return "Yesterday"
    if 1 < days < 7:
        return DAYS[t.weekday()]
    day = f"{t.day} {MONTHS[t.month - 1]}"
    return day if t.year == n.year else f"{day} {t.year}"  # a later date (a clock set back) too
