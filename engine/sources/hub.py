"""A model given as a Hugging Face repo id instead of a folder: downloaded with huggingface_hub into
the normal HF cache (resumable, with progress), safetensors and tokenizer files only."""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")
# Never fetch pickle weights: they are refused anyway, and they are the bulk of many repos.
ALLOW = ["*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
         "tokenizer*", "special_tokens_map.json", "chat_template.*", "*.model", "vocab.json", "merges.txt"]


def resolve(spec: str, endpoint: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """A local folder as it is; an 'owner/name' repo id downloaded (or found in the cache)."""
    path = Path(spec).expanduser()
    if path.exists() or not REPO_ID.fullmatch(spec):
        return path  # Checkpoint names the problem if it is not a model folder
    check_repo_id(spec)
    return download(spec, endpoint=endpoint, cache_dir=cache_dir)


def check_repo_id(repo_id: str) -> None:
    """Refuse an id the hub would reject, before any request (huggingface_hub's own rules)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ModelError(repo_id, "is neither a model folder nor a valid Hugging Face repo id (owner/name: "
                         "letters, digits, '-', '_', '.'; no '--' or '..')") from None


def download(repo_id: str, revision: str | None = None, endpoint: str | None = None,
             cache_dir: str | Path | None = None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        # Already-complete files are skipped and partial ones resume: huggingface_hub keeps
        # *.incomplete blobs in the cache and continues them with HTTP range requests.
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW, endpoint=endpoint,
                                      cache_dir=cache_dir))
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
