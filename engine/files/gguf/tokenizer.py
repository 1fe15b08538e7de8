"""A GGUF file's tokenizer and chat template, from its metadata (tokenizer.ggml.*, tokenizer.chat_template),
through transformers' own GGUF conversion (what AutoTokenizer.from_pretrained(dir, gguf_file=...)
does inside: integrations/gguf get_gguf_tokenizer + convert_gguf_tokenizer).

That conversion takes seconds for a real vocabulary (tens of seconds on a busy 2-core machine), so
its result is kept in the user cache folder, keyed by a hash of the tokenizer's metadata, and later
opens load the saved tokenizer instead. An entry is written into a temporary folder and renamed into
place, so a reader never sees half of one; a broken entry is rebuilt.

The other direction is here too (write_vocab, for engine/files/gguf/writer.py): a folder's tokenizer as
the GGUF metadata llama.cpp's converter writes for it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ...protocol.errors import ModelError

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the conversion or what is saved changes, so old entries are not used
TYPES = ("gpt2", "llama", "t5", "gemma4")  # the tokenizer.ggml.model values transformers converts

# the special tokens' metadata keys (tokenizer.ggml.<key>), as transformers' GGUF loader reads them
SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "pad_token": "padding_token_id"}


def cache_root() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("mixdesk", appauthor=False) / "tokenizers"


def _fields(metadata) -> Mapping[str, Any]:
    """The raw key -> value mapping: engine/files/gguf/header.Header (its .metadata), gguf.GGUFReader, or a dict."""
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
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    grouped = {group: {name: md[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in md}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # as get_gguf_tokenizer: llama.cpp's default for sentencepiece
    elif tokenizer.get("tokenizer_type") == "gemma4":
        config["add_bos_token"] = False
    for name, key in SPECIAL_TOKENS.items():
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

    metadata: engine/files/gguf/header.Header (the first part's), a gguf.GGUFReader, or a dict of key -> value.
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


# --- writing: a tokenizer folder as GGUF metadata ------------------------------------------------------

# convert_hf_to_gguf's pre-tokenizer check (get_vocab_base_pre): the sha256 of the ids a tokenizer gives
# its test text -> llama.cpp's name for that pre-tokenizer. The entries for the families here; a hash
# not listed is written as "default" (GPT-2's split, what a plain ByteLevel BPE does) or given by `pre=`.
PRE_TOKENIZERS = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "olmo",
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4": "gpt-2",
    "a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2": "glm4",  # GLM-4-9B
    "9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902": "glm4",  # GLM-4.5-Air
    "cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267": "glm4",  # GLM-4.7-Flash
}
# TextModel._set_vocab_glm's special tokens (set where the tokenizer's own files do not say them)
GLM_SPECIALS = (("bos", "[gMASK]"), ("eot", "<|user|>"), ("unk", "<|endoftext|>"), ("eom", "<|observation|>"))
CHKTXT = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 '
          '33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ '
          '------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, '
          '\'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL')


def write_vocab(w, folder: Path, hp: dict, llama: bool, pre: str | None, glm: bool = False) -> None:
    """The other direction, for engine/files/gguf/writer.py: a folder's tokenizer as GGUF metadata, as
    TextModel._set_vocab_gpt2 writes it (with LlamaModel.set_vocab's additions when `llama`; as
    _set_vocab_glm when `glm`: GLM_SPECIALS, each where the tokenizer has it, where the converter
    would fail without it); byte-level BPE only."""
    import gguf
    from transformers import AutoTokenizer

    tok_json = folder / "tokenizer.json"
    if (folder / "tokenizer.model").is_file() or not tok_json.is_file() \
            or json.loads(tok_json.read_text())["model"].get("byte_fallback"):
        raise ModelError(folder, "only byte-level BPE tokenizers (tokenizer.json, no byte fallback) can be "
                                 "written as GGUF here")
    if llama and (folder / "tokenizer_config.json").is_file():
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        if cfg.get("add_prefix_space") is not None:
            w.add_add_space_prefix(cfg["add_prefix_space"])
    tok = AutoTokenizer.from_pretrained(str(folder))
    vocab_size = hp.get("vocab_size", len(tok.vocab))
    if max(tok.vocab.values()) >= vocab_size:
        raise ModelError(folder, f"the tokenizer has ids past the model's vocab_size {vocab_size}")
    chkhsh = hashlib.sha256(str(tok.encode(CHKTXT)).encode()).hexdigest()
    if pre is None:
        pre = PRE_TOKENIZERS.get(chkhsh, "default")
        if chkhsh not in PRE_TOKENIZERS:
            log.warning("%s: pre-tokenizer %s is not one llama.cpp's converter knows; writing 'default'", folder, chkhsh)
    reverse = {i: t for t, i in tok.vocab.items()}
    added, decoder = tok.get_added_vocab(), tok.added_tokens_decoder
    tokens, toktypes = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:  # get_vocab_base: llama.cpp assumes added tokens are pre-normalized
            if not decoder[i].normalized:
                t = tok.decode(tok.encode(t, add_special_tokens=False))
            if decoder[i].special or _looks_special(t):
                toktypes.append(gguf.TokenType.CONTROL)
            else:
                t = t.replace("\u2581", " ")
                toktypes.append(gguf.TokenType.USER_DEFINED)
        else:
            toktypes.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    special = gguf.SpecialVocab(folder, load_merges=True)
    for kind, text in GLM_SPECIALS if glm else ():
        if text in added:
            special._set_special_token(kind, added[text])
    special.add_to_gguf(w)
    if llama and hp.get("vocab_size", 32000) == 49152:
        w.add_add_bos_token(False)  # LlamaModel.set_vocab: "granite small models" (SmolLM's size too)


def _looks_special(t: str) -> bool:
    """TextModel.does_token_look_special."""
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))
