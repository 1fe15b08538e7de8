"""Every file of a model folder is read from inside it.

A model folder is a download from strangers: a `tokenizer_config.json` that is a link to
`~/.ssh/id_rsa` or to another user's files would be read by the tokenizer (and parts of it shown
in an error message). So before anything reads the folder, each entry in it (and in the
`additional_chat_templates/` folder the tokenizer also reads) must resolve inside it. A Hugging
Face cache snapshot is the one exception: its files are links into the blob store of the same
repository (`models--org--name/snapshots/REV/x -> ../../blobs/HASH`), and that store is allowed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..protocol.errors import ModelError

SUBFOLDERS_READ = ("additional_chat_templates",)  # transformers' tokenizer lists and reads this one too


def _allowed(folder: Path) -> list[Path]:
    root = folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # a hub cache snapshot: its repository's blob store
        allowed.append(root.parents[1] / "blobs")
    return allowed


def check_inside(folder: Path, p: Path, listed_in: Path | None = None, allowed: list[Path] | None = None) -> Path:
    """p, if it resolves inside the model folder (or the hub blob store its snapshot links to)."""
    allowed = allowed or _allowed(folder)
    try:
        real = p.resolve()
    except (RuntimeError, OSError) as e:  # a loop of links (RuntimeError before Python 3.13)
        raise ModelError(p, f"is a link that cannot be followed ({e})") from None
    if any(real == a or a in real.parents for a in allowed):
        return p
    if listed_in is not None:
        raise ModelError(p, f"resolves outside the model folder (listed in {listed_in.name}); Mixdesk reads only "
                         "files inside it")
    raise ModelError(p, f"leads to {real}, outside the model folder; Mixdesk reads only files inside it (copy the "
                     "file into the folder instead of linking to it)")


def check_links(folder: Path) -> None:
    """Refuse the folder if any entry in it leads outside it (checked before any file is read)."""
    allowed = _allowed(folder)
    for p in sorted(folder.iterdir()):
        check_inside(folder, p, allowed=allowed)
        if p.name in SUBFOLDERS_READ and p.is_dir():
            for q in sorted(p.iterdir()):
                check_inside(folder, q, allowed=allowed)


def model_key(folder: Path) -> str:
    """Identifies a checkpoint by its path, config and weight files' sizes and times (a GGUF
    checkpoint's `folder` is its file: two quantisations of one model in one folder differ)."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    if folder.is_file():
        st = folder.stat()
        h.update(f"{folder.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]
    for f in sorted(folder.iterdir()):
        if f.suffix in (".json", ".safetensors"):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]
