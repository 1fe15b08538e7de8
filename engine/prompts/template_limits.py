"""The limits a chat template renders under, and the size estimates that enforce them.

A chat template is code that comes with the model. One Jinja expression can build a huge value in
a single step (`'x'|center(400000000)` is 400 MB, `tojson(x, indent=400000000)` 2.5 GB) and a loop
can double a string forty times, so a check on the output alone comes too late. Every operation
that can build a large string, list or number asks the render's Budget first:
- `check(n)`: a value about to be built must be at most `size_limit` characters (or items); where
  the size can be known before building (widths, counts, repeated joins), it is checked before;
- `charge(value)`: every value built counts towards `build_limit` bytes per render, so many values
  below the size limit cannot add up to gigabytes either;
- `tick()`: the clock, checked by every call, attribute lookup and loop step.
The budget is per thread (threading.local): two threads may render the same template at once.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from types import GeneratorType

from ..protocol.errors import MixdeskError

TIME_LIMIT_S = 2.0
RANGE_LIMIT = 1_000_000       # items all range() calls of one render may hand out
MIN_SIZE_LIMIT = 1 << 20      # a value or the output may be this long, or 4x the messages' text, whichever is more
MIN_BUILD_LIMIT = 128 << 20   # bytes all values one render builds may add up to, or 128 per character of the text
BUILD_BYTES_PER_CHAR = 128
INT_BITS_LIMIT = 1 << 14      # a template's numbers: Python prints ints up to 4300 digits (~14,300 bits)
SLOW_INPUT_LIMIT = 1 << 18    # wordwrap, urlize and pprint run in Python, ~1 s per million characters


class TemplateProblem(MixdeskError):
    pass


class Budget:
    def __init__(self, size_limit: int, build_limit: int):
        self.deadline = time.monotonic() + TIME_LIMIT_S
        self.size_limit = size_limit
        self.build_limit = build_limit
        self.built = 0
        self.items = 0  # range() items handed out

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateProblem(f"the chat template ran for more than {TIME_LIMIT_S:g} s (a loop that does not end?)")

    def check(self, n: int, what: str, unit: str = "characters", limit: int | None = None) -> None:
        limit = self.size_limit if limit is None else limit
        if n > limit:
            raise TemplateProblem(f"the chat template's {what} exceeds the size limit: it would build more than the "
                                  f"{limit:,} {unit} allowed (at least {n:,})")

    def check_int(self, bits: int, what: str) -> None:
        if bits > INT_BITS_LIMIT:
            raise TemplateProblem(f"the chat template's {what} exceeds the size limit: a number of about {bits:,} "
                                  f"bits, more than the {INT_BITS_LIMIT:,} allowed")

    def charge(self, nbytes: int, what: str) -> None:
        self.built += nbytes
        if self.built > self.build_limit:
            raise TemplateProblem(f"the chat template's {what} exceeds the memory limit: the values it builds add up "
                                  f"to more than {self.build_limit >> 20} MiB")

    def built_value(self, value, what: str, shallow: bool = False):
        """A value an operation just built: its size checked and charged; an iterator comes back
        wrapped, so that what it yields is checked as it is consumed. shallow: a container whose
        items all existed before (`+`, `*`, a slice), charged for itself only."""
        if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
            self.check(len(value), what, "characters" if isinstance(value, (str, bytes)) else "items")
            self.charge(sys.getsizeof(value) if shallow else cost(value), what)
        elif isinstance(value, int) and not isinstance(value, bool):
            self.check_int(value.bit_length(), what)
        elif isinstance(value, GeneratorType):
            return self.stream(value, what)
        return value

    def stream(self, it, what: str):
        n = 0
        for x in it:
            n += 1
            if not n & 255:
                self.tick()
            self.charge(sys.getsizeof(x) + 8, what)
            yield x

    def loop(self, iterable):
        """A for loop's iterable, stepped with the clock (a loop with an empty body calls nothing)."""
        n = 0
        for x in iterable:
            n += 1
            if not n & 255:
                self.tick()
            yield x


_local = threading.local()


def current() -> Budget | None:
    return getattr(_local, "budget", None)


@contextmanager
def active(budget: Budget):
    before = current()
    _local.budget = budget
    try:
        yield budget
    finally:
        _local.budget = before


def cost(value) -> int:
    """Bytes a new value holds: itself, and for a container its items one level down (the items a
    template puts in a new list are new strings as often as not)."""
    n = sys.getsizeof(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        n += sum(sys.getsizeof(x) for x in value)
    elif isinstance(value, dict):
        n += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in value.items())
    return n


# ---- how long str(x) would be, without building it ------------------------------------------------
def _int_digits(v: int) -> int:
    return v.bit_length() * 30103 // 100000 + 2


def _leaf_size(x) -> int | None:
    """len(str(x)) for a value that holds no other values, None for a container."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, bool) or x is None:
        return 5
    if isinstance(x, int):
        return _int_digits(x)
    if isinstance(x, float):
        return 24
    if isinstance(x, (bytes, bytearray)):
        return 4 * len(x) + 3
    if isinstance(x, (list, tuple, dict, set, frozenset)) or _namespace_attrs(x) is not None or _is_view(x):
        return None
    return 80  # Undefined (""), a macro, a loop, a generator: short reprs


def _namespace_attrs(x):
    from jinja2.utils import Namespace

    return x._Namespace__attrs if isinstance(x, Namespace) else None  # its repr shows every attribute


def _is_view(x) -> bool:
    return type(x).__name__ in ("dict_items", "dict_keys", "dict_values")


def walk_size(obj, limit: int, per_item=lambda depth: 2, nested_str=2) -> int:
    """An estimate of the text a value turns into (its str(), or its JSON with per_item extra
    characters per item at each depth), stopping as soon as it passes limit. Containers shared
    many times count each time, as their repr does."""
    top = _leaf_size(obj)
    if top is not None:
        return top
    total = 0
    stack = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        leaf = _leaf_size(x)
        if leaf is not None:
            total += leaf + (nested_str if isinstance(x, str) else 0)
        else:
            attrs = _namespace_attrs(x)
            if attrs is not None:
                total += 14
                x = attrs
            total += 2
            if isinstance(x, dict):
                for k, v in x.items():
                    stack.append((k, depth + 1))
                    stack.append((v, depth + 1))
                    total += 2 + per_item(depth + 1)
            else:
                for v in x:
                    stack.append((v, depth + 1))
                    total += per_item(depth + 1)
        if total > limit:
            break
    return total


def text_size(obj, limit: int) -> int:
    return walk_size(obj, limit)


def json_size(obj, limit: int, indent=None, separators=None) -> int:
    """An estimate of len(json.dumps(obj, indent=..., separators=...))."""
    if isinstance(indent, bool) or indent is None:
        width = None
    elif isinstance(indent, int):
        width = max(indent, 0)
    else:
        width = len(str(indent))
    if isinstance(separators, (list, tuple)) and len(separators) == 2:
        seps = sum(len(str(s)) for s in separators)
    else:
        seps = 3
    if width is None:
        return walk_size(obj, limit, lambda depth: seps)
    return walk_size(obj, limit, lambda depth: seps + 1 + width * depth)


# ---- formatting: widths and precisions are read before anything is built ----------------------------
def printf_size(fmt: str, args, limit: int) -> int:
    """An estimate of len(fmt % args), reading the format as CPython does (a `%(key)` may hold
    parentheses; `*` takes a width or precision from the arguments)."""
    seq = list(args) if isinstance(args, tuple) else [args]
    mapping = args if isinstance(args, dict) else None
    total, i, k, n = len(fmt), 0, 0, len(fmt)
    while True:
        i = fmt.find("%", i)
        if i < 0 or i + 1 >= n:
            return total
        i += 1
        key = None
        if fmt[i] == "(":
            depth, j = 1, i + 1
            while j < n and depth:
                depth += {"(": 1, ")": -1}.get(fmt[j], 0)
                j += 1
            key, i = fmt[i + 1:j - 1], j
        while i < n and fmt[i] in "-+ #0":
            i += 1
        numbers = []
        for lead in ("", "."):
            if lead:
                if i >= n or fmt[i] != ".":
                    break
                i += 1
            if i < n and fmt[i] == "*":
                numbers.append(as_int(seq[k]) if k < len(seq) else 0)
                k, i = k + 1, i + 1
            else:
                j = i
                while j < n and fmt[j].isdigit():
                    j += 1
                numbers.append(int(fmt[i:j]) if j > i else 0)
                i = j
        while i < n and fmt[i] in "hlL":
            i += 1
        if i >= n:
            return total
        conv = fmt[i]
        i += 1
        if conv == "%":
            continue
        if key is not None:
            arg = mapping.get(key) if mapping is not None else None
        else:
            arg = seq[k] if k < len(seq) else None
            k += 1
        width = max(numbers, default=0)
        if width > limit:
            return width
        size = 1 if conv == "c" else text_size(arg, limit)
        total += max(width, size + (sum(numbers) if conv in "eEfFgGdiouxX" else 0))
        if total > limit:
            return total


def format_spec_size(spec: str) -> int:
    """The largest number in a str.format field's spec: its width or precision (or a fill digit)."""
    best, run = 0, ""
    for ch in str(spec) + " ":
        if ch.isdigit():
            run += ch
        elif run:
            best, run = max(best, int(run)), ""
    return best


# ---- sizes of joins and replacements, shared by the sandbox's methods and its filters ----------
def as_int(x) -> int:
    return x if isinstance(x, int) else 0


def materialised(value):
    """An iterable the estimate can read and the real call still gets whole."""
    return value if isinstance(value, (str, bytes, list, tuple, dict)) else list(value)


def join_size(b, sep, items, what: str) -> int:
    n = len(items)
    sep_len = len(sep) if isinstance(sep, (str, bytes)) else text_size(sep, b.size_limit)
    b.check(sep_len * max(n - 1, 0), what)
    total = sep_len * max(n - 1, 0)
    for x in items:
        total += len(x) if isinstance(x, (str, bytes)) else text_size(x, b.size_limit)
        if total > b.size_limit:
            break
    return total


def replace_size(s, old, new, count) -> int:
    if not isinstance(s, (str, bytes)) or type(old) is not type(s) or type(new) is not type(s):
        return len(s) if isinstance(s, (str, bytes)) else 0
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)
