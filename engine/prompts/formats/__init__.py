"""What a reply is made of, in the model's own format: reasoning, content and tool calls.

Models of 2026 reason before they answer and call tools, each family in its own markup: Qwen3's
`<think>…</think>` and `<tool_call>{json}</tool_call>`, GPT-OSS's harmony channels (`analysis`,
`final`, `commentary to=functions.NAME`), Mistral's `[TOOL_CALLS][…]`, and calls written as tags
with one value per argument (TAGGED_FORMATS): Qwen3.5 / Qwen3-Coder's
`<tool_call><function=NAME><parameter=KEY>…</parameter></function></tool_call>` ("qwen_xml") and
GLM-4.5..4.7's `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>…</arg_value></tool_call>` ("glm"),
whose values are typed by the offered tools' JSON schemas (tagged_calls.py), and Gemma 4's special
tokens (GEMMA_FORMATS: a `<|channel>thought` block, `<|tool_call>call:NAME{key:value}<tool_call|>` in
Gemma's own argument syntax; gemma4.py). A `Parser` reads the text a
reply generates, as it arrives (any split of it: a token may end mid-tag), and says what each piece
is as a list of `Delta`s; it never loses a byte: text that turns out not to be markup is content, and
a malformed tool call (broken JSON, an unknown function) becomes content with a one-line note.

The invariants every parser keeps (tests/test_formats.py checks them on every split of every example):
- the `text` of the reasoning deltas, joined, is `reasoning`; of the content deltas, `content`;
- a tool call's deltas are emitted once it is complete and valid: first one with its index, id and
  name, then its arguments (`text`) in one or more fragments, which join to `ToolCall.arguments`;
- the result of feed(a); feed(b) equals feed(a + b) once finish() is called.
"""
from __future__ import annotations

from .base import Delta, Parser, ToolCall  # noqa: F401 - the interface, re-exported
from .tagged_calls import schemas_of  # noqa: F401 - for callers of parser_for


FORMATS = ("plain", "qwen3", "harmony", "mistral")  # tests/test_formats.py has example replies of each
TAGGED_FORMATS = ("qwen_xml", "glm")  # the formats with calls as tags (tests/test_formats_2026.py)
GEMMA_FORMATS = ("gemma4",)  # Gemma 4's channel and call tokens (tests/test_formats_gemma4.py); every format is
# one of FORMATS + TAGGED_FORMATS + GEMMA_FORMATS
THINKING_FORMATS = ("qwen3",) + TAGGED_FORMATS  # a prompt may end inside their `<think>` block


def format_of(template_source: str | None) -> str:
    """Which format a model replies in, from its chat template's text: what its past tool calls are
    written as (`<|tool_call>`: Gemma 4's, before the rest, whose `<tool_call>` it does not hold but
    might mention; `<arg_key>`: GLM's; `<function=` and `<parameter=` inside `<tool_call>`: Qwen3.5's,
    Qwen3-Coder's), else its tags."""
    src = template_source or ""
    if "<|tool_call>" in src:
        return "gemma4"
    if "<|channel|>" in src:
        return "harmony"
    if "<tool_call>" in src and "<arg_key>" in src:
        return "glm"
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return "qwen_xml"
    if "<tool_call>" in src or "<think>" in src:
        return "qwen3"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    return "plain"


# The tokens after which a format's reply holds nothing more to read (its parser stops there):
# generation ends on them too, whatever the checkpoint's end ids say. A Gemma 4 checkpoint whose
# generation_config names only `<turn|>` would otherwise run on past a tool call (`<|tool_response>`)
# into a made-up tool result, unseen but paid for, until the token limit.
REPLY_ENDS = {"gemma4": ("<turn|>", "<|tool_response>"), "harmony": ("<|call|>", "<|return|>")}


def reply_end_ids(fmt: str, tokenizer) -> set[int]:
    """The ids of REPLY_ENDS[fmt] that are single tokens of this tokenizer."""
    ids = set()
    for text in REPLY_ENDS.get(fmt, ()):
        i = tokenizer.convert_tokens_to_ids(text)
        if isinstance(i, int) and i != tokenizer.unk_token_id and tokenizer.convert_ids_to_tokens(i) == text:
            ids.add(i)
    return ids


def parser_for(fmt: str, tools: tuple[str, ...] | None = None, thinking_open: bool = False,
               schemas: dict[str, dict] | None = None) -> Parser:
    """A new parser for one reply. tools: the function names offered (None: no check). thinking_open:
    the prompt already opened a reasoning block (a template that ends its prompt with `<think>`; the
    formats of THINKING_FORMATS; Gemma 4's parser takes it too, though its template never ends a prompt
    inside its thought channel). schemas: function name -> its `parameters` JSON schema
    (`schemas_of(request tools)`), which types the argument values of TAGGED_FORMATS (without one
    they stay strings); the other formats' arguments are JSON already."""
    if fmt == "qwen3":
        from .qwen3 import Qwen3Parser

        return Qwen3Parser(tools=tools, thinking_open=thinking_open)
    if fmt == "qwen_xml":
        from .qwen_xml import QwenXmlParser

        return QwenXmlParser(tools=tools, thinking_open=thinking_open, schemas=schemas)
    if fmt == "glm":
        from .glm import GlmParser

        return GlmParser(tools=tools, thinking_open=thinking_open, schemas=schemas)
    if fmt == "gemma4":
        from .gemma4 import Gemma4Parser

        return Gemma4Parser(tools=tools, thinking_open=thinking_open)
    if fmt == "harmony":
        from .harmony import HarmonyParser

        return HarmonyParser(tools=tools)
    if fmt == "mistral":
        from .mistral import MistralParser

        return MistralParser(tools=tools)
    return Parser(tools=tools)
