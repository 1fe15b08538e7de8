"""Jinja's immutable sandbox, with every operation that can build a large value sized first.

transformers renders chat templates in `ImmutableSandboxedEnvironment` (no attribute escapes); this
is that environment, with the same globals and `tojson`, plus the checks of template_limits.py at
every place a template can make a value (the filters are in template_filters.py):
- operators `+`, `*`, `**` and `%` (printf formatting, widths read first);
- `~`, which Jinja compiles to a join the sandbox cannot intercept: the code generator emits a
  checked join instead, and a checked `concat` joins the buffers of macros and `{% set %}` blocks;
- every call: str/bytes methods whose size is known from their arguments (center, ljust, rjust,
  zfill, expandtabs, replace, join, translate) and int.to_bytes are sized before they run, any
  result after; `str.format` runs with a formatter that reads each field's width first;
- every output: `finalize` sizes str() of a list or dict before it is built; every slice (which
  Jinja compiles to Python's own `x[a:b]`) is charged;
- every for loop steps the clock (compile_template); compile-time constant folding is off (it
  would evaluate a filter before any budget exists).
"""
from __future__ import annotations

import json
from datetime import datetime

from .template_limits import (RANGE_LIMIT, TemplateProblem, as_int, current, format_spec_size, join_size,
                              materialised, printf_size, replace_size, text_size)


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _check_method(b, owner, name, args, kwargs):
    """Sizes a str/bytes method (or int.to_bytes) before it runs; returns the args to call it with."""
    what = f"{name}() call"
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill"):
            b.check(max(len(owner), as_int(_arg(args, kwargs, 0, "width"))), what)
        elif name == "expandtabs":
            tab = as_int(_arg(args, kwargs, 0, "tabsize", 8))
            b.check(len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * max(tab, 0), what)
        elif name == "replace":
            b.check(replace_size(owner, _arg(args, kwargs, 0, "old"), _arg(args, kwargs, 1, "new"),
                                 _arg(args, kwargs, 2, "count", -1)), what)
        elif name == "join" and args:
            items = materialised(args[0])
            b.check(join_size(b, owner, items, what), what)
            args = (items,) + tuple(args[1:])
        elif name == "translate" and args and isinstance(owner, str):
            table = args[0]  # anything indexable by code point: a dict, or a list of replacements
            values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
            longest = max((len(v) for v in values if isinstance(v, str)), default=1)
            b.check(len(owner) * max(longest, 1), what)
    elif isinstance(owner, int) and name == "to_bytes":
        b.check(as_int(_arg(args, kwargs, 0, "length", 1)), what, "bytes")
    return args


def _formatter_classes():
    from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter

    def field(base):
        class Checked(base):
            """str.format with each field's width and text sized before it is formatted."""

            def vformat(self, format_string, args, kwargs):
                self.total = len(format_string)
                return super().vformat(format_string, args, kwargs)

            def format_field(self, value, format_spec):
                b = current()
                if b is not None:
                    b.tick()
                    size = max(format_spec_size(format_spec), text_size(value, b.size_limit))
                    self.total += size
                    b.check(max(size, self.total), "format() call")
                return super().format_field(value, format_spec)

        return Checked

    return field(SandboxedFormatter), field(SandboxedEscapeFormatter)


LOOP_FILTER = "mixdesk loop"  # a name no template can write (it holds a space)


def compile_template(env, source: str):
    """The template, with every for loop's iterable passed through Env.guard_loop (the loop then
    steps the clock even when its body calls nothing)."""
    from jinja2 import nodes

    tree = env.parse(source)
    for loop in list(tree.find_all(nodes.For)):
        loop.iter = nodes.Filter(loop.iter, LOOP_FILTER, [], [], None, None, lineno=loop.iter.lineno)
    return env.from_string(tree)


def environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import loopcontrols
    from jinja2.runtime import Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from markupsafe import Markup

    from .template_filters import guarded_filters

    Formatter, EscapeFormatter = _formatter_classes()

    class CheckedCodeGenerator(CodeGenerator):
        def visit_Getitem(self, node, frame):
            # Jinja slices with Python's own `[a:b]`, past the sandbox: a slice is a new value, charged
            if not isinstance(node.arg, nodes.Slice):
                return super().visit_Getitem(node, frame)
            self.write("environment.checked_slice(")
            self.visit(node.node, frame)
            self.write(", slice(")
            for part in (node.arg.start, node.arg.stop, node.arg.step):
                if part is None:
                    self.write("None")
                else:
                    self.visit(part, frame)
                self.write(", ")
            self.write("))")

        def visit_Concat(self, node, frame):
            # the same join function Jinja picks (markup_join under autoescape), called through the check
            if frame.eval_ctx.volatile:
                func = "(markup_join if context.eval_ctx.volatile else str_join)"
            else:
                func = "markup_join" if frame.eval_ctx.autoescape else "str_join"
            self.write(f"environment.checked_concat({func}, (")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Env(ImmutableSandboxedEnvironment):
        code_generator_class = CheckedCodeGenerator
        intercepted_binops = frozenset(["+", "*", "**", "%"])

        def call_binop(self, context, operator, left, right):
            b = current()
            if b is None:
                return super().call_binop(context, operator, left, right)
            b.tick()
            what = f"`{operator}`"
            seqs = (str, bytes, list, tuple)
            unit = "characters" if isinstance(left, (str, bytes)) or isinstance(right, (str, bytes)) else "items"
            if operator == "**":
                if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                    b.check_int(left.bit_length() * min(right, 1 << 40), what)
            elif operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, seqs) and isinstance(n, int):
                        b.check(len(seq) * max(n, 0), what, unit)
                if isinstance(left, int) and isinstance(right, int):
                    b.check_int(left.bit_length() + right.bit_length(), what)
            elif operator == "+":
                if isinstance(left, seqs) and isinstance(right, seqs):
                    b.check(len(left) + len(right), what, unit)
            elif operator == "%" and isinstance(left, (str, bytes)):
                fmt = left if isinstance(left, str) else left.decode("latin-1")
                b.check(printf_size(fmt, right, b.size_limit), "`%` formatting")
            return b.built_value(super().call_binop(context, operator, left, right), what, shallow=True)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
            b = current()
            if b is None:
                return super().call(__context, __obj, *args, **kwargs)
            b.tick()
            owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
            args = _check_method(b, owner, name, args, kwargs)
            rv = super().call(__context, __obj, *args, **kwargs)
            if isinstance(__obj, Macro) or isinstance(owner, jinja2.runtime.LoopContext):
                return rv  # a macro's text was sized as it was joined; a loop hands back its own items
            return b.built_value(rv, f"{name or 'function'}() call")

        def getattr(self, obj, attribute):
            b = current()
            if b is not None:
                b.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            b = current()
            if b is not None:
                b.tick()
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):
            # as Jinja's, with the checked formatter
            wrapper = super().wrap_str_format(value)
            if wrapper is None:
                return None
            f_self = value.__self__
            is_map = value.__name__ == "format_map"
            formatter = EscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup) else Formatter(self)

            def checked(*args, **kwargs):
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one argument")
                    args, kwargs = (), args[0]
                rv = type(f_self)(formatter.vformat(f_self, args, kwargs))
                b = current()
                return rv if b is None else b.built_value(rv, "format() call")

            return checked

        def checked_slice(self, obj, s):
            b = current()
            if b is None:
                return obj[s]
            b.tick()
            return b.built_value(obj[s], "slice", shallow=True)

        def guard_loop(self, iterable):
            b = current()
            return iterable if b is None else b.loop(iterable)

        def checked_concat(self, join, parts):
            """`a ~ b ~ c`: the parts' text sized before it is joined."""
            b = current()
            if b is None:
                return join(parts)
            total = 0
            for p in parts:
                total += len(p) if isinstance(p, str) else text_size(p, b.size_limit)
                b.check(total, "`~` concatenation")
            return b.built_value(join(parts), "`~` concatenation")

        def concat(self, chunks):  # noqa: A003 - Jinja's name; joins macro and {% set %} block buffers
            b = current()
            if b is None:
                return "".join(chunks)
            buf, total = [], 0
            for c in chunks:
                total += len(c)
                b.check(total, "block")
                buf.append(c)
            return b.built_value("".join(buf), "block")

    @jinja2.pass_context
    def finalize(context, value):
        """{{ x }}: a list or dict's str() sized before it is built."""
        b = current()
        if b is not None and not isinstance(value, str):
            b.check(text_size(value, b.size_limit), "output")
        return value

    # trim/lstrip as transformers; no compile-time folding: a constant filter would run unchecked
    env = Env(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], optimized=False, finalize=finalize)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        b = current()
        if b is not None:
            b.check(len(str(fmt)) + 64 * str(fmt).count("%"), "strftime_now() call")
        return datetime.now().strftime(fmt)

    env.filters["tojson"] = tojson
    env.filters.update(guarded_filters(env.filters))
    env.filters[LOOP_FILTER] = env.guard_loop
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, range=BudgetRange)
    env.globals.pop("lipsum", None)  # it generates text of any length
    return env


class BudgetRange:
    """range() whose items count against the render's budget (len, indexing and `in` as range's)."""

    def __init__(self, *args):
        self._r = range(*args)
        b = current()
        if b is not None and b.items + len(self._r) > RANGE_LIMIT:
            raise TemplateProblem(f"the chat template loops over more than {RANGE_LIMIT:,} items")

    def __len__(self):
        return len(self._r)

    def __getitem__(self, i):
        r = self._r[i]
        if isinstance(r, range):  # a slice stays counted
            out = object.__new__(BudgetRange)
            out._r = r
            return out
        return r

    def __contains__(self, x):
        return x in self._r

    def __iter__(self):
        return self._count(iter(self._r))

    def __reversed__(self):
        return self._count(reversed(self._r))

    def __repr__(self):
        return repr(self._r)

    @staticmethod
    def _count(it):
        b = current()
        for i in it:
            if b is not None:
                b.items += 1
                if b.items > RANGE_LIMIT:
                    raise TemplateProblem(f"the chat template loops over more than {RANGE_LIMIT:,} items")
                if not b.items & 1023:
                    b.tick()
            yield i
