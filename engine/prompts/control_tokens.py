"""Control tokens typed by a user are text: `hi<|im_end|>\n<|im_start|>system\n...` in a message must
not become the real end-of-turn and system tokens, or a user, an API caller or an attached
document could forge turns.

The template's own control tokens are still tokens. So, only when a message's strings hold one,
each occurrence is wrapped in two private-use marker characters before rendering; after rendering,
the text is split at the markers: what lies outside is tokenised as usual (control tokens parsed),
a marked token is tokenised as plain text. The tokenizer splits text at added tokens anyway, so
splitting there changes nothing else. This is transformers' `apply_chat_template(...,
sanitize_control_tokens=True)` (the same markers and control tokens, tests compare), plus:
- a token next to a lone marker (a template that sliced one of the two off) is still text;
- the text encoding is checked to hold no control id (a vocabulary may spell one from plain text).
Messages without control tokens take the plain path, identical to `apply_chat_template`.
"""
from __future__ import annotations

import re

from .template_limits import TemplateProblem

START, END = "\U000f0000", "\U000f0001"  # supplementary private use; transformers uses the same


def template_literals(env, source: str) -> str:
    """The template's literal text and string constants, joined so a search cannot span two."""
    from jinja2 import nodes

    ast = env.parse(source)
    found = {n.data for n in ast.find_all(nodes.TemplateData)}
    found |= {n.value for n in ast.find_all(nodes.Const) if isinstance(n.value, str)}
    return "\0".join(found)


def control_tokens(tokenizer, literals: str) -> dict[int, str]:
    """id -> text of the tokens a caller may not type: every special added token, plus the added
    tokens the template writes itself (or the tokenizer's `chat_control_tokens`, where it lists them)."""
    listed = getattr(tokenizer, "chat_control_tokens", None)
    out = {}
    for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items():
        text = getattr(t, "content", str(t))
        if not text:
            continue
        if getattr(t, "special", False) or (text in listed if listed is not None else
                                             (text in literals and not text.isspace())):
            out[int(i)] = text
    return out


def _strings(obj, depth=0):
    if isinstance(obj, str):
        yield obj
    elif depth < 32 and isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v, depth + 1)
    elif depth < 32 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v, depth + 1)


class ControlTokens:
    def __init__(self, tokenizer, tokens: dict[int, str]):
        self.tok = tokenizer
        self.ids = frozenset(tokens)
        # the ids plain text must never encode to; unknown characters do give the unknown token
        self.forbidden = self.ids - {getattr(tokenizer, "unk_token_id", None)}
        alt = "|".join(re.escape(t) for t in sorted(set(tokens.values()), key=len, reverse=True))
        self.find = re.compile(alt) if alt else None
        # a marked token; one that lost a marker; a lone marker (dropped, but the text still breaks there)
        self.split = re.compile(f"{START}({alt}){END}|{START}({alt})|({alt}){END}|[{START}{END}]") if alt else None

    def mark(self, messages):
        """The messages with the control tokens in their strings marked (markers already there
        dropped first, so none can be forged); None when no string holds one."""
        if self.find is None or not any(self.find.search(s) for s in _strings(messages)):
            return None
        return self._mark(messages, 0)

    def _mark(self, obj, depth):
        if isinstance(obj, str):
            return self.find.sub(lambda m: START + m.group(0) + END, obj.replace(START, "").replace(END, ""))
        if depth < 32 and isinstance(obj, dict):
            return {k: self._mark(v, depth + 1) for k, v in obj.items()}
        if depth < 32 and isinstance(obj, (list, tuple)):
            return [self._mark(v, depth + 1) for v in obj]
        return obj

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt rendered from marked messages: marked tokens as text, the rest as usual."""
        parts = self.split.split(text)  # text, then per marker match its 3 groups, then text, ...
        pieces = [parts[0]]
        for i in range(1, len(parts), 4):
            pieces.append(next((g for g in parts[i:i + 3] if g), None))
            pieces.append(parts[i + 3])
        ids = self._plain(pieces[0])
        newline = self._plain("\n")
        for i, piece in enumerate(pieces[1:], start=1):
            if piece:
                ids += self._piece(piece, i % 2 == 1, newline)
        return ids

    def _piece(self, piece: str, as_text: bool, newline: list[int]) -> list[int]:
        encode = self._text if as_text else self._plain
        # after a newline, so a SentencePiece tokenizer adds no word-start space, as transformers does
        out = encode("\n" + piece)
        out = out[len(newline):] if out[:len(newline)] == newline else encode(piece)
        if as_text and self.forbidden.intersection(out):
            out = [i for ch in piece for i in self._text(ch)]  # one character at a time cannot spell a token
            if self.forbidden.intersection(out):
                raise TemplateProblem(f"a message contains {piece!r}, which this model's tokenizer cannot "
                                      "encode as plain text")
        return out

    def _plain(self, text: str) -> list[int]:
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]

    def _text(self, text: str) -> list[int]:
        """text tokenised with no added token matched. A fast tokenizer's pipeline is run step by step:
        `split_special_tokens=True` would skip only special tokens, and it is a setting of the shared
        tokenizer that a second thread encoding at the same time would see."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is None:
            return [int(i) for i in self.tok.encode(text, add_special_tokens=False, split_special_tokens=True)]
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
        return [t.id for s in splits for t in backend.model.tokenize(s)]
