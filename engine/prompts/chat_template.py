"""Chat templates rendered in Jinja's sandbox, with time and size limits, and tokenised with the
control tokens a user typed kept as text.

A chat template is code that comes with the model. transformers renders it in an immutable
sandbox (no attribute escapes), but a template may still raise, fail to parse, render nothing, loop
for ever, or build gigabytes in one expression. Every way a template can run long or grow large
passes a check (template_limits.py, template_sandbox.py, template_filters.py), and the output is
produced chunk by chunk (`Template.generate`) with its size checked as it grows.
Rendering matches `tokenizer.apply_chat_template(..., tokenize=True)`: the same globals and filters
(`raise_exception`, `strftime_now`, `tojson` without HTML escaping, `loopcontrols`), the special
tokens as variables, then the text tokenised without adding special tokens (tests compare both).
Control tokens inside the messages are tokenised as text (control_tokens.py).
`render` and `ids` may be called from several threads at once: each render's budget is its own.
"""
from __future__ import annotations

from pathlib import Path

from .control_tokens import ControlTokens, control_tokens, template_literals
from ..protocol.errors import ModelError
from .template_limits import (BUILD_BYTES_PER_CHAR, MIN_BUILD_LIMIT, MIN_SIZE_LIMIT, RANGE_LIMIT,  # noqa: F401
                              TIME_LIMIT_S, Budget, TemplateProblem, active)
from .template_sandbox import compile_template, environment

MAX_ERROR_CHARS = 300  # a template's own error message, as shown (raise_exception may be given anything)


def _short(e) -> str:
    s = str(e)
    return s if len(s) <= MAX_ERROR_CHARS else s[:MAX_ERROR_CHARS] + "..."


def _budget(chars: int) -> Budget:
    return Budget(max(MIN_SIZE_LIMIT, 4 * chars), max(MIN_BUILD_LIMIT, BUILD_BYTES_PER_CHAR * chars))


class ChatTemplate:
    """One model's chat template, compiled once; `render` and `ids` are thread-safe."""

    def __init__(self, source: str, tokenizer, where: Path):
        import jinja2

        from .formats import format_of

        self.where = where
        self.tok = tokenizer
        self.format = format_of(source)  # how replies are read (engine/prompts/formats)
        self.takes_tools = "tools" in source  # it renders a `tools` list (OpenAI's function shape)
        self.thinking_switch = "enable_thinking" in source  # it can switch reasoning off
        self.env = environment()
        try:
            with active(_budget(0)):  # compiling evaluates `{% autoescape expr %}`: under the same limits
                self.template = compile_template(self.env, source)
            literals = template_literals(self.env, source)
        except jinja2.TemplateSyntaxError as e:
            raise ModelError(where, f"its chat template does not parse (line {e.lineno}: {e.message})") from None
        except TemplateProblem as e:
            raise ModelError(where, str(e)) from None
        except (jinja2.TemplateError, RecursionError, MemoryError) as e:
            raise ModelError(where, f"its chat template cannot be compiled: {_short(e)}") from None
        self.control = ControlTokens(tokenizer, control_tokens(tokenizer, literals))
        self.variables = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}

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

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
               **options) -> str:
        """The prompt text; tools and options (enable_thinking, reasoning_effort) as transformers'
        apply_chat_template passes them: variables of the template."""
        import jinja2

        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        chars += len(str(tools or ""))
        variables = dict(self.variables, messages=messages, add_generation_prompt=add_generation_prompt,
                         tools=tools or None, documents=None, **options)
        out, n = [], 0
        try:
            with active(_budget(chars)) as budget:
                for chunk in self.template.generate(**variables):
                    n += len(chunk)
                    budget.check(n, "output")
                    budget.tick()
                    out.append(chunk)
        except TemplateProblem:
            raise
        except jinja2.TemplateError as e:
            raise TemplateProblem(f"the chat template refused this conversation: {_short(e)}") from None
        except RecursionError:
            raise TemplateProblem("the chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateProblem("the chat template ran out of memory") from None
        except Exception as e:  # noqa: BLE001 - template code: any error is the template's
            raise TemplateProblem(f"the chat template failed: {type(e).__name__}: {_short(e)}") from None
        return "".join(out)

    def ids(self, messages: list[dict], tools: list | None = None, thinking: bool | None = None,
            reasoning_effort: str | None = None) -> list[int]:
        """The prompt's token ids, as apply_chat_template(..., add_generation_prompt=True) gives them,
        except that control tokens typed inside the messages are tokenised as text. thinking False:
        enable_thinking=False (templates that have the switch)."""
        options = {}
        if thinking is not None:
            options["enable_thinking"] = bool(thinking)
        if reasoning_effort is not None:
            options["reasoning_effort"] = reasoning_effort
        marked = self.control.mark({"messages": messages, "tools": tools})  # typed in a tool's description too
        if marked is not None:
            messages, tools = marked["messages"], marked["tools"]
        text = self.render(messages, tools=tools, **options)
        if not text:
            raise TemplateProblem("the chat template rendered an empty prompt for this conversation")
        if marked is None:
            return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]
        return self.control.encode(text)
