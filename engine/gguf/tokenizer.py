"""A GGUF file's tokenizer and chat template, from its metadata (tokenizer.ggml.*, tokenizer.chat_template),
through transformers' own GGUF conversion (what AutoTokenizer.from_pretrained(dir, gguf_file=...)
does inside: integrations/gguf get_gguf_tokenizer + convert_gguf_tokenizer).

That conversion takes seconds for a real vocabulary (tens of seconds on a busy 2-core machine), so
its result is kept in the user cache folder, keyed by a hash of the tokenizer's metadata, and later
opens load the saved tokenizer instead. An entry is written into a temporary folder and renamed into
place, so a reader never sees half of one; a broken entry is rebuilt.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..errors import ModelError

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the conversion or what is saved changes, so old entries are not used
TYPES = ("gpt2", "llama", "t5", "gemma4")  # the tokenizer.ggml.model values transformers converts


def cache_root() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("mixdesk", appauthor=False) / "tokenizers"


def _fields(metadata) -> Mapping[str, Any]:
    """The raw key -> value mapping: engine/gguf/header.Header (its .metadata), gguf.GGUFReader, or a dict."""
    if hasattr(metadata, "fields") and hasattr(metadata, "tensors"):  # gguf.GGUFReader
        return {k: f.contents() for k, f in metadata.fields.items()
                if k.startswith("tokenizer.") or k == "general.architecture"}
    return getattr(metadata, "metadata", metadata)


def _value(v):
    return v.decode() if hasattr(v, "decode") and hasattr(v, "blob") else v  # header.Strings: decoded on use


def cache_key(metadata) -> str:
    """sha256 over the tokenizer's metadata (and the architecture, which picks the builder). Arrays of
    strings are hashed as the file's bytes where the reader kept them (header.Strings), not decoded."""
    fields = _fields(metadata)
    h = hashlib.sha256(f"mixdesk-tokenizer-{FORMAT}".encode())
    for k in sorted(k for k in fields if k.startswith("tokenizer.") or k == "general.architecture"):
        v = fields[k]
        h.update(k.encode() + b"\0")
        h.update(v.blob if hasattr(v, "blob") else repr(v).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _check(path, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The tokenizer fields, each checked: malformed metadata is a ModelError naming the key."""
    def bad(key: str, what: str):
        return ModelError(path, f"has malformed tokenizer metadata: '{key}' {what}")

    md = {k: _value(v) for k, v in fields.items() if k.startswith("tokenizer.") or k == "general.architecture"}
    model = md.get("tokenizer.ggml.model")
    if model is None:
        raise ModelError(path, "has no tokenizer in its metadata (tokenizer.ggml.model)")
    if model not in TYPES:
        raise ModelError(path, f"has a tokenizer of type {model!r}, which cannot be read (only {', '.join(TYPES)})")
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise bad("tokenizer.ggml.tokens", "is not a list of strings")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        v = md.get(key)
        if v is not None and (not isinstance(v, list) or len(v) != len(tokens)):
            raise bad(key, f"does not have one entry per token ({len(tokens)})")
    merges = md.get("tokenizer.ggml.merges")
    if merges is not None and (not isinstance(merges, list)
                               or not all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges)):
        raise bad("tokenizer.ggml.merges", "is not a list of 'left right' pairs")
    if model == "gpt2" and merges is None:
        raise bad("tokenizer.ggml.merges", "is missing (a BPE tokenizer needs its merges)")
    for key in ("bos", "eos", "unknown", "padding", "eot", "eom"):
        v = md.get(f"tokenizer.ggml.{key}_token_id")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(tokens)):
            raise bad(f"tokenizer.ggml.{key}_token_id", f"is {v!r}, not a token id below {len(tokens)}")
    template = md.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise bad("tokenizer.chat_template", "is not a string")
    return md


def _convert(path, md: dict[str, Any]):
    """transformers' get_gguf_tokenizer (on metadata already read) and convert_gguf_tokenizer."""
    from transformers import TokenizersBackend
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        _SPECIAL_TOKENS, GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)

    grouped = {group: {name: md[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in md}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # as get_gguf_tokenizer: llama.cpp's default for sentencepiece
    elif tokenizer.get("tokenizer_type") == "gemma4":
        config["add_bos_token"] = False
    for name, key in _SPECIAL_TOKENS.items():
        i = md.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][i] if i is not None else None
    try:
        backend, extra = convert_gguf_tokenizer(md.get("general.architecture", ""), tokenizer)
        return TokenizersBackend(tokenizer_object=backend, **{**config, **extra})
    except Exception as e:  # transformers' message names the problem; the traceback is not for the user
        raise ModelError(path, f"has a tokenizer that transformers cannot build: {e}") from None


def _load(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def tokenizer_from_metadata(metadata, path: str | Path, cache_dir: str | Path | None = None):
    """The transformers tokenizer a GGUF's metadata describes, with its chat template set.

    metadata: engine/gguf/header.Header (the first part's), a gguf.GGUFReader, or a dict of key -> value.
    cache_dir: where converted tokenizers are kept (default: the user cache folder)."""
    fields = _fields(metadata)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    entry = root / cache_key(fields)
    tok = None
    if entry.is_dir():
        try:
            tok = _load(entry)
        except Exception as e:  # a damaged entry: rebuild it
            log.warning("tokenizer cache %s unreadable (%s); rebuilding", entry, e)
            shutil.rmtree(entry, ignore_errors=True)
    if tok is None:
        md = _check(path, fields)
        tok = _convert(path, md)
        tok.chat_template = md.get("tokenizer.chat_template")
        _store(tok, entry)
    # the template as the file says it, also when a cached entry has none
    template = _value(fields.get("tokenizer.chat_template"))
    tok.chat_template = template if isinstance(template, str) else None
    return tok


def _store(tok, entry: Path) -> None:
    """save_pretrained into a temporary folder beside the entry, renamed into place; a failure to cache
    costs the next open a conversion, never this one its tokenizer."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=entry.parent))
        try:
            tok.save_pretrained(str(tmp))
            tmp.rename(entry)
        except OSError:
            if not entry.is_dir():  # another process renamed its copy in first: keep that one
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        log.warning("tokenizer not cached in %s: %s", entry.parent, e)
