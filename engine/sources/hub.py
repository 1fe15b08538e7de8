"""A model given as a Hugging Face repo id instead of a folder: downloaded with huggingface_hub into
the normal HF cache (resumable, with progress), safetensors and tokenizer files only."""
from __future__ import annotations

import re
from pathlib import Path

from ..protocol.errors import MixdeskError, ModelError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")
# One GGUF file of a repo, "owner/name/file.gguf" (the model browser's choice in a GGUF repo)
REPO_GGUF = re.compile(r"([A-Za-z0-9][\w.\-]*/[\w.\-]+)/([\w.\-/]+\.gguf)")
SPLIT = re.compile(r"(.+)-\d{5}-of-(\d{5})\.gguf")  # a split set's part: all its parts are fetched
# Never fetch pickle weights: they are refused anyway, and they are the bulk of many repos.
ALLOW = ["*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
         "tokenizer*", "special_tokens_map.json", "chat_template.*", "*.model", "vocab.json", "merges.txt"]


class DownloadCancelled(MixdeskError):
    pass


def resolve(spec: str, endpoint: str | None = None, cache_dir: str | Path | None = None, progress=None,
            cancel=None) -> Path:
    """A local folder as it is; an 'owner/name' repo id downloaded (or found in the cache).
    progress(done, total, what) follows the files fetched; cancel (a threading.Event) stops it."""
    path = Path(spec).expanduser()
    gguf = REPO_GGUF.fullmatch(spec)
    if not path.exists() and gguf:
        repo_id, name = gguf.groups()
        check_repo_id(repo_id)
        split = SPLIT.fullmatch(name)
        files = [f"{split.group(1)}-*-of-{split.group(2)}.gguf" if split else name]
        return download(repo_id, endpoint=endpoint, cache_dir=cache_dir, progress=progress, cancel=cancel,
                        allow=files) / name
    if path.exists() or not REPO_ID.fullmatch(spec):
        return path  # Checkpoint names the problem if it is not a model folder
    check_repo_id(spec)
    return download(spec, endpoint=endpoint, cache_dir=cache_dir, progress=progress, cancel=cancel)


def hub_endpoint() -> str | None:
    """The hub's address: HF_ENDPOINT when set (read now, not at huggingface_hub's import), else its default."""
    import os

    return os.environ.get("HF_ENDPOINT") or None


def _bar(repo_id: str, progress, cancel):
    """A tqdm class for huggingface_hub's file-count bar that reports to progress() and raises
    DownloadCancelled at its next update once cancel is set (the files in flight finish first;
    partial files resume next time)."""
    import io

    from tqdm.auto import tqdm

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["file"] = io.StringIO()  # the window and the terminal draw their own bar
            super().__init__(*args, **kwargs)
            self._report()

        def update(self, n=1):
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"{repo_id}: download cancelled; it resumes where it stopped next time")
            out = super().update(n)
            self._report()
            return out

        def _report(self):
            if progress is not None:
                progress(int(self.n), int(self.total or 0), f"{repo_id}: files")

    return Bar


def check_repo_id(repo_id: str) -> None:
    """Refuse an id the hub would reject, before any request (huggingface_hub's own rules)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ModelError(repo_id, "is neither a model folder nor a valid Hugging Face repo id (owner/name: "
                         "letters, digits, '-', '_', '.'; no '--' or '..')") from None


def download(repo_id: str, revision: str | None = None, endpoint: str | None = None,
             cache_dir: str | Path | None = None, progress=None, cancel=None, allow: list[str] | None = None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        # Already-complete files are skipped and partial ones resume: huggingface_hub keeps
        # *.incomplete blobs in the cache and continues them with HTTP range requests.
        kw = {"tqdm_class": _bar(repo_id, progress, cancel)} if progress is not None or cancel is not None else {}
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=allow or ALLOW,
                                      endpoint=endpoint or hub_endpoint(), cache_dir=cache_dir, **kw))
    except DownloadCancelled:
        raise
    except GatedRepoError:
        raise ModelError(repo_id, "is gated: accept its licence on the hub and log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ModelError(repo_id, "was not found on the Hugging Face hub (or needs a login)") from None
    except RevisionNotFoundError:
        raise ModelError(repo_id, f"has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        raise ModelError(repo_id, "could not be downloaded and is not in the local cache (offline?)") from None
    except (OSError, ValueError) as e:
        raise ModelError(repo_id, f"could not be downloaded: {e}") from None
