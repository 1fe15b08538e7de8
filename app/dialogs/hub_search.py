"""The model browser's work, without Qt (run on worker threads): search the Hugging Face hub,
read one candidate's files with their sizes and its config.json (that one file, never weights),
and say what the planner predicts for it on this machine (engine/measures/fit.py); the same for
the recent models on disk. Every failure comes back as one line (MixdeskError), never a traceback.

The hub's address is engine/sources/hub.py's (HF_ENDPOINT, read when called), so the browser and
the download it leads to speak to the same hub (the tests' loopback one)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.protocol.errors import MixdeskError, ModelError
from engine.measures import fit as fitting

TIMEOUT_S = 10.0  # per request (model info, config.json); the search itself is bounded by the browser
LIMIT = 20  # candidates per search, most downloaded first
PICKLE = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int | None  # bytes, when the hub says

    @property
    def weights(self) -> bool:
        return self.name.endswith((".safetensors", ".gguf"))


@dataclass
class Candidate:
    repo_id: str
    files: list[RepoFile] = field(default_factory=list)
    line: str = ""  # what Mixdesk predicts for it here, or why it cannot open it, in plain words
    details: str = ""  # the technical terms (a tooltip)
    fit: fitting.Fit | None = None
    ggufs: list[tuple[RepoFile, str]] = field(default_factory=list)  # each .gguf file and its line
    openable: bool = True  # as a repo id (safetensors); a GGUF repo opens one of its files

    @property
    def weight_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files if f.name.endswith(".safetensors"))


size_text = fitting.size_text


def _api(endpoint: str | None):
    from huggingface_hub import HfApi

    from engine.sources.hub import hub_endpoint

    return HfApi(endpoint=endpoint or hub_endpoint())


def where(endpoint: str | None = None) -> str:
    return _api(endpoint).endpoint


def _say(e: Exception, what: str) -> MixdeskError:
    """A hub failure as one line."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(e, MixdeskError):
        return e
    if isinstance(e, GatedRepoError):
        return MixdeskError(f"{what}: gated; accept its licence on the hub and log in (`hf auth login`)")
    if isinstance(e, RepositoryNotFoundError):
        return MixdeskError(f"{what}: not found on the hub")
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "an error")
        return MixdeskError(f"{what}: the hub answered {status}")
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return MixdeskError(f"{what}: could not reach the hub ({first})")


def search(query: str, endpoint: str | None = None, limit: int = LIMIT) -> list[str]:
    """Repo ids on the hub whose name contains the query, most downloaded first."""
    api = _api(endpoint)
    try:
        return [m.id for m in api.list_models(search=query, limit=limit, sort="downloads")]
    except Exception as e:  # noqa: BLE001 - one line for the dialog
        raise _say(e, f"searching {api.endpoint} for {query!r}") from None


def candidate(repo_id: str, hw, budgets, endpoint: str | None = None) -> Candidate:
    """One repo's files with their sizes, and the planner's prediction from its config.json."""
    from huggingface_hub import hf_hub_download

    api = _api(endpoint)
    try:
        info = api.model_info(repo_id, files_metadata=True, timeout=TIMEOUT_S)
    except Exception as e:  # noqa: BLE001
        raise _say(e, repo_id) from None
    files = sorted((RepoFile(s.rfilename, s.size) for s in info.siblings or []),
                   key=lambda f: (not f.weights, f.name))
    c = Candidate(repo_id, files)
    names = {f.name for f in files}
    safetensors = [f for f in files if f.name.endswith(".safetensors")]
    ggufs = [f for f in files if f.name.endswith(".gguf")]
    if ggufs:
        c.ggufs = [(f, fitting.by_size(f.size, budgets) if f.size and budgets else "") for f in ggufs]
    if safetensors and "config.json" in names and hw is None:
        c.line = "no prediction: this machine could not be measured"
    elif safetensors and "config.json" in names:
        try:
            path = hf_hub_download(repo_id, "config.json", revision=info.sha, endpoint=api.endpoint,
                                   etag_timeout=TIMEOUT_S)
        except Exception as e:  # noqa: BLE001
            c.line = _say(e, "its config.json could not be read").args[0]
            return c
        try:
            c.fit = fitting.predict(path, hw, budgets)
            c.line, c.details = c.fit.line(), c.fit.details()
        except ModelError as e:
            c.line, c.openable = f"Mixdesk cannot run it: {e.problem}", False
    elif safetensors:
        c.line, c.openable = "no config.json: Mixdesk cannot plan or open it", False
    elif ggufs:
        c.openable = False
        c.line = f"{len(ggufs)} GGUF file{'s' * (len(ggufs) > 1)}: open one of them (below)"
        c.details = "A GGUF file is planned from its header once on disk; here, by its size."
    elif any(n.endswith(PICKLE) for n in names):
        c.line, c.openable = "only pickle weights (.bin/.pt): Mixdesk reads safetensors and GGUF", False
    else:
        c.line, c.openable = "no weights Mixdesk can read", False
    return c


# ---- the recent models, on disk ----
def local_path(spec: str) -> Path | None:
    """Where a recent model lies on disk, if it does: a folder, a GGUF file, the built demo, or a
    hub id (or one GGUF file of a repo) in the Hugging Face cache."""
    if spec == "demo":
        from engine.sources import demo

        d = demo.demo_dir()
        return d if (d / "config.json").is_file() else None
    p = Path(spec).expanduser()
    if p.exists():
        return p
    from engine.sources.hub import REPO_GGUF, REPO_ID

    m = REPO_GGUF.fullmatch(spec)
    repo, name = (m.group(1), m.group(2)) if m else (spec, "config.json")
    if not (m or REPO_ID.fullmatch(spec)):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo, name)
    except Exception:  # noqa: BLE001 - an invalid id: not in the cache
        return None
    if not isinstance(hit, str):
        return None
    return Path(hit) if m else Path(hit).parent


def disk_bytes(path: Path) -> int:
    """Bytes of a model on disk: the file, or the folder's files (links followed: the HF cache)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def recent_line(spec: str, hw, budgets) -> tuple[str, str]:
    """(one line: size on disk and the fit where known, tooltip) for a recent model."""
    from engine.files.gguf import is_gguf

    path = local_path(spec)
    if path is None:
        return "not on this computer yet" if "/" in spec and not spec.startswith(("/", "~", ".")) else "", ""
    try:
        size = f"{size_text(disk_bytes(path))} on disk"
    except OSError:
        size = ""
    try:
        if is_gguf(path):
            f = fitting.predict_gguf(path, hw, budgets)
        elif path.is_dir() and (path / "config.json").is_file():
            f = fitting.predict(path / "config.json", hw, budgets)
        else:
            return size, ""
    except MixdeskError as e:
        return " · ".join(x for x in (size, f"cannot plan it: {getattr(e, 'problem', e)}") if x), ""
    except Exception:  # noqa: BLE001 - a damaged file says so when opened; here, just no fit line
        return size, ""
    return " · ".join(x for x in (size, f.line()) if x), f.details()
