"""Chat templates rendered in Jinja's sandbox, with a time and a size limit.

A chat template is code that comes with the model. transformers renders it in an immutable
sandbox (no attribute escapes), but a template may still raise, fail to parse, render nothing, or
loop for ever: a template with two nested `range(100000)` loops grew past 5.9 GB before anything
stopped it. Here every way a template can run long or grow large passes a check:
- `range` counts every item it hands out (a total per render) and watches the clock;
- `*` and `**` refuse results past the size limit;
- the output is produced chunk by chunk (`Template.generate`) and its size is checked as it grows;
- every function call, attribute and item lookup in the template checks the clock.
Rendering matches `tokenizer.apply_chat_template(..., tokenize=True)`: the same globals and filters
(`raise_exception`, `strftime_now`, `tojson` without HTML escaping, `loopcontrols`), the special
tokens as variables, then the text tokenised without adding special tokens (tests compare both).
"""
from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from .errors import MixdeskError, ModelError

TIME_LIMIT_S = 2.0
RANGE_LIMIT = 1_000_000  # items all range() calls of one render may hand out
MIN_SIZE_LIMIT = 1 << 20  # the output may be this long, or 4x the messages' text, whichever is more


class TemplateProblem(MixdeskError):
    pass


class _Budget:
    def __init__(self, size_limit: int):
        self.deadline = time.monotonic() + TIME_LIMIT_S
        self.size_limit = size_limit
        self.items = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateProblem(f"the chat template ran for more than {TIME_LIMIT_S:g} s (a loop that does not end?)")

    def size(self, n: int) -> None:
        if n > self.size_limit:
            raise TemplateProblem(f"the chat template produced more than {self.size_limit:,} characters")


def _environment():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])
        budget: _Budget | None = None

        def call_binop(self, context, operator, left, right):
            b = self.budget
            if operator == "**":
                if isinstance(right, (int, float)) and abs(right) > 4096 and isinstance(left, (int, float)) \
                        and abs(left) > 1:
                    raise TemplateProblem("the chat template computes a power too large to hold")
                return left ** right
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and b is not None:
                    b.size(len(seq) * max(n, 0))
            return left * right

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
            if __self.budget is not None:
                __self.budget.tick()
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj, attribute):
            if self.budget is not None:
                self.budget.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            if self.budget is not None:
                self.budget.tick()
            return super().getitem(obj, argument)

    env = Env(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class BudgetRange:
        """range() whose items count against the render's budget (len, indexing and `in` as range's)."""

        def __init__(self, *args):
            self.r = range(*args)
            b = env.budget
            if b is not None and b.items + len(self.r) > RANGE_LIMIT:
                raise TemplateProblem(f"the chat template loops over more than {RANGE_LIMIT:,} items")

        def __len__(self):
            return len(self.r)

        def __getitem__(self, i):
            return self.r[i]

        def __contains__(self, x):
            return x in self.r

        def __iter__(self):
            return self._count(iter(self.r))

        def __reversed__(self):
            return self._count(reversed(self.r))

        @staticmethod
        def _count(it):
            b = env.budget
            for i in it:
                if b is not None:
                    b.items += 1
                    if b.items > RANGE_LIMIT:
                        raise TemplateProblem(f"the chat template loops over more than {RANGE_LIMIT:,} items")
                    if not b.items & 1023:
                        b.tick()
                yield i

    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       range=BudgetRange)
    env.globals.pop("lipsum", None)
    return env


class ChatTemplate:
    """One model's chat template, compiled once; `render` is thread-compatible (one render at a time)."""

    def __init__(self, source: str, tokenizer, where: Path):
        import jinja2

        self.where = where
        self.tok = tokenizer
        self.env = _environment()
        try:
            self.template = self.env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ModelError(where, f"its chat template does not parse (line {e.lineno}: {e.message})") from None
        except (jinja2.TemplateError, RecursionError, MemoryError) as e:
            raise ModelError(where, f"its chat template cannot be compiled: {e}") from None

    @classmethod
    def of(cls, tokenizer, folder: Path) -> "ChatTemplate":
        """The tokenizer's template, checked now: it must parse and render a one-message chat."""
        src = getattr(tokenizer, "chat_template", None)
        if isinstance(src, dict):
            src = src.get("default") or next(iter(src.values()), None)
        jinja_file = folder / "chat_template.jinja"
        where = jinja_file if jinja_file.exists() else folder / "tokenizer_config.json"
        if not isinstance(src, str) or not src.strip():
            raise ModelError(where, "has no chat template; add one (tokenizer_config.json 'chat_template' "
                             "or chat_template.jinja)")
        t = cls(src, tokenizer, where)
        try:
            text = t.render([{"role": "user", "content": "Hello"}])
        except TemplateProblem as e:
            raise ModelError(where, str(e)) from None
        if not text.strip():
            raise ModelError(where, "its chat template renders an empty prompt for a one-message chat")
        return t

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        import jinja2

        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        budget = _Budget(max(MIN_SIZE_LIMIT, 4 * chars))
        variables = {k: v for k, v in self.tok.special_tokens_map.items() if isinstance(v, str)}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt, tools=None, documents=None)
        self.env.budget = budget
        out, n = [], 0
        try:
            for chunk in self.template.generate(**variables):
                n += len(chunk)
                budget.size(n)
                budget.tick()
                out.append(chunk)
        except TemplateProblem:
            raise
        except jinja2.TemplateError as e:
            raise TemplateProblem(f"the chat template refused this conversation: {e}") from None
        except RecursionError:
            raise TemplateProblem("the chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateProblem("the chat template ran out of memory") from None
        except Exception as e:  # noqa: BLE001 - template code: any error is the template's
            raise TemplateProblem(f"the chat template failed: {type(e).__name__}: {e}") from None
        finally:
            self.env.budget = None
        return "".join(out)

    def ids(self, messages: list[dict]) -> list[int]:
        """The prompt's token ids, as apply_chat_template(..., add_generation_prompt=True) gives them."""
        text = self.render(messages)
        if not text:
            raise TemplateProblem("the chat template rendered an empty prompt for this conversation")
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]
