"""Jinja's filters, each sized against the render's budget (template_limits.py) before it runs.

Every filter is wrapped: its result is size-checked and charged, an iterator it returns is charged
as it is consumed, and the filters whose result can be much larger than their input have an
estimate read from their arguments first: `center(width)`, `indent(width)`, `replace` (hits x
growth), `format` (printf widths), `join` (item lengths + separator x count), `sum` of lists,
`batch`/`slice` counts, `tojson(indent=...)` (items x depth x indent), `wordwrap`, `urlize`,
`pprint`. Filters that turn their input into text (`string`, `upper`, `escape`, ...) first size
str() of a list or dict argument, whose repr may hold the same long string many times over.
"""
from __future__ import annotations

import functools

from .template_limits import (SLOW_INPUT_LIMIT, as_int, current, join_size, json_size, materialised, printf_size,
                              replace_size, text_size, walk_size)

# Filters that never turn a list or dict argument into text: their arguments need no text estimate.
STRUCTURAL = frozenset(["abs", "attr", "count", "d", "default", "dictsort", "first", "float", "groupby", "int",
                        "items", "last", "length", "list", "map", "max", "min", "random", "reject", "rejectattr",
                        "reverse", "round", "select", "selectattr", "sort", "unique"])
SUM_WORK_LIMIT = 1 << 25  # list items copied by sum(start=[]), which re-copies the total for every item


def _getter(environment, attribute):
    from jinja2.filters import make_attrgetter

    return make_attrgetter(environment, attribute)


def _center(b, head, what, value=None, width=80):
    b.check(max(text_size(value, b.size_limit), as_int(width)), what)


def _indent(b, head, what, s="", width=4, first=False, blank=False):
    w = len(width) if isinstance(width, str) else as_int(width)
    b.check(w, what)
    n = text_size(s, b.size_limit)
    lines = (s.count("\n") if isinstance(s, str) else n) + 2
    b.check(n + lines * w, what)


def _replace(b, head, what, s="", old="", new="", count=None):
    for x in (s, old, new):
        b.check(text_size(x, b.size_limit), what)
    b.check(replace_size(str(s), str(old), str(new), -1 if count is None else count), what)


def _format(b, head, what, value="", *args, **kwargs):
    b.check(text_size(value, b.size_limit), what)
    b.check(printf_size(str(value), kwargs or args, b.size_limit), what)


def _join(b, head, what, value=(), d="", attribute=None):
    items = materialised(value)
    values = items
    if attribute is not None:
        get = _getter(head[0].environment, attribute)
        values = [get(x) for x in items]
    b.check(join_size(b, d, values, what), what)
    return items


def _sum(b, head, what, iterable=(), attribute=None, start=0):
    items = list(iterable)
    values = items if attribute is None else [_getter(head[0], attribute)(x) for x in items]
    seqs = [len(v) for v in (start, *values) if isinstance(v, (list, tuple))]
    if seqs:
        total = sum(seqs)
        b.check(total, what, "items")
        b.check(total * len(values) // 2, what, "item copies", SUM_WORK_LIMIT)
    return items


def _batch(b, head, what, value=(), linecount=1, fill_with=None):
    if fill_with is not None:
        b.check(as_int(linecount), what, "items")


def _slice(b, head, what, value=(), slices=1, fill_with=None):
    b.check(as_int(slices), what, "slices")


def _tojson(b, head, what, x=None, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    b.check(json_size(x, b.size_limit, indent, separators), what)


def _pprint(b, head, what, value=None):
    b.check(walk_size(value, SLOW_INPUT_LIMIT, lambda depth: 2 + depth), what, limit=SLOW_INPUT_LIMIT)


def _wordwrap(b, head, what, s="", width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    n = text_size(s, SLOW_INPUT_LIMIT)
    b.check(n, what, limit=SLOW_INPUT_LIMIT)
    wrap = len(wrapstring) if isinstance(wrapstring, str) else text_size(wrapstring, b.size_limit)
    newlines = s.count("\n") if isinstance(s, str) else n
    lines = min(n + 1, 2 * n // max(as_int(width), 1) + newlines + 2)
    b.check(n + lines * max(wrap, 1), what)


def _urlize(b, head, what, value="", trim_url_limit=None, nofollow=False, target=None, rel=None,
            extra_schemes=None):
    n = text_size(value, SLOW_INPUT_LIMIT)
    b.check(n, what, limit=SLOW_INPUT_LIMIT)
    text = value if isinstance(value, str) else ""
    words = (text.count(" ") + text.count("\n") + 1) if text else n + 1
    extra = text_size(target or "", b.size_limit) + text_size(rel or "", b.size_limit) + 64
    b.check(3 * n + words * extra, what)


ESTIMATES = {"center": _center, "indent": _indent, "replace": _replace, "format": _format, "join": _join,
             "sum": _sum, "batch": _batch, "slice": _slice, "tojson": _tojson, "pprint": _pprint,
             "wordwrap": _wordwrap, "urlize": _urlize}


def _guard(name: str, f):
    lead = 0 if getattr(f, "jinja_pass_arg", None) is None else 1  # the context, eval context or environment
    estimate = ESTIMATES.get(name)
    structural = name in STRUCTURAL
    what = f"{name} filter"

    @functools.wraps(f)
    def guarded(*args, **kwargs):
        b = current()
        if b is None:
            return f(*args, **kwargs)
        b.tick()
        head, rest = args[:lead], args[lead:]
        if estimate is not None:
            value = estimate(b, head, what, *rest, **kwargs)  # an iterator it had to read, as a list
            if value is not None:
                rest = (value,) + rest[1:]
        elif not structural:
            for a in (*rest, *kwargs.values()):
                b.check(text_size(a, b.size_limit), what)
        return b.built_value(f(*head, *rest, **kwargs), what)

    return guarded


def guarded_filters(filters: dict) -> dict:
    return {name: _guard(name, f) for name, f in filters.items()}
