"""The runtime folder: what `mixdesk runtime install|remove|status` and the window's Settings do.

    <user data>/mixdesk/runtime/active.json        {"folder": "torch-2.13.0+cu128-cpython-311"}
    <user data>/mixdesk/runtime/<folder>/site/     the unpacked wheels, put first on sys.path at start
    <user data>/mixdesk/runtime/<folder>/runtime.json   what was fetched, from where, and the probe's answer
    <user cache>/mixdesk/runtime-downloads/        wheels (and `.part` files to resume); emptied after an install

An install checks the free disk before it downloads anything, builds the new folder under a
temporary name, imports its torch in a child process, and only then renames it into place and
points active.json at it. An interrupted or failed install leaves the previous state as it was."""
from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from packaging.requirements import Requirement

from . import activate as act
from .download import Cancelled, ChecksumMismatch, fetch, free_bytes
from .gpu import NvidiaGpu, default_index, find_nvidia
from .index import Index, RuntimeProblem
from .resolve import Plan, resolve

HEADROOM = 1 << 30          # free bytes left on the disk after an install, for everything else
UNPACK_RATIO = 2.0          # unpacked bytes per downloaded byte, before the zips say exactly (torch: ~1.6)


def downloads_dir() -> Path:
    if os.environ.get("MIXDESK_RUNTIME_DIR"):
        return Path(os.environ["MIXDESK_RUNTIME_DIR"]) / ".downloads"
    import platformdirs

    return platformdirs.user_cache_path("mixdesk", appauthor=False) / "runtime-downloads"


def bundled_torch_version() -> str:
    """The torch version the app ships (its package metadata: torch itself is not imported)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return ""


def build_name(cuda: str | None) -> str:
    """How a torch build is named to people: "CUDA 12.8 build" or "CPU build"."""
    return f"CUDA {cuda} build" if cuda else "CPU build"


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


@dataclass
class Offer:
    """What an install would fetch: resolved against the index, sized, nothing downloaded yet."""
    plan: Plan
    gpu: NvidiaGpu | None
    already: int                # bytes already downloaded (verified files and .part files), resumed

    @property
    def download_bytes(self) -> int:
        return self.plan.download_bytes

    def describe(self) -> str:
        t = self.plan.torch
        left = self.download_bytes - self.already
        resume = f", {gb(self.already)} of it already here" if self.already else ""
        return (f"torch {t.version} and {len(self.plan.wheels) - 1} more wheels from {self.plan.index_url}: "
                f"{gb(self.download_bytes)} to download{resume}" + (f" ({gb(left)} left)" if self.already else ""))


def prepare(index_url: str | None = None, torch_version: str | None = None,
            cancel: threading.Event | None = None) -> Offer:
    """Resolve what to fetch (network: the index pages and metadata only)."""
    gpu, why = find_nvidia()
    if index_url is None:
        index_url, why2 = default_index(gpu)
        if index_url is None:
            raise RuntimeProblem(why2)
    version = torch_version or bundled_torch_version()
    root = Requirement(f"torch=={version}" if version else "torch")
    plan = resolve(Index(index_url), root, cancelled=lambda: bool(cancel and cancel.is_set()))
    return Offer(plan, gpu, _already(plan))


def _already(plan: Plan) -> int:
    d, n = downloads_dir(), 0
    for w in plan.wheels:
        for p in (d / w.filename, d / (w.filename + ".part")):
            if p.exists():
                n += min(p.stat().st_size, w.size or 0)
                break
    return n


def _same_disk(a: Path, b: Path) -> bool:
    def dev(p: Path) -> int:
        while not p.exists() and p != p.parent:
            p = p.parent
        return p.stat().st_dev
    return dev(a) == dev(b)


def check_disk(offer: Offer) -> None:
    """Refuse, before any download, an install that would leave less than HEADROOM free."""
    root, dl = act.runtime_root(), downloads_dir()
    download = offer.download_bytes - offer.already
    unpacked = int(offer.download_bytes * UNPACK_RATIO)
    if _same_disk(root, dl):
        checks = [(root, download + unpacked, f"{gb(download)} to download + {gb(unpacked)} unpacked")]
    else:
        checks = [(dl, download, f"{gb(download)} to download"), (root, unpacked, f"{gb(unpacked)} unpacked")]
    for path, need, what in checks:
        free = free_bytes(path)
        if free < need + HEADROOM:
            raise RuntimeProblem(f"not enough free disk for the GPU runtime: {path} has {gb(free)} free and the "
                                 f"install needs {gb(need + HEADROOM)} ({what} + {gb(HEADROOM)} left free); "
                                 "nothing was downloaded")


def _unpack(wheel: Path, site: Path, bin_dir: Path, cancel: threading.Event | None) -> None:
    """A wheel's files into site (its .data/purelib|platlib too, scripts into bin), modes kept."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled while unpacking; nothing was installed")
            name = PurePosixPath(info.filename)
            if name.is_absolute() or ".." in name.parts or ":" in info.filename or "\\" in info.filename:
                raise RuntimeProblem(f"{wheel.name}: refusing the unsafe path {info.filename!r}")
            parts = name.parts
            if len(parts) > 2 and parts[0].endswith(".data"):
                kind, rest = parts[1], parts[2:]
                dest = {"purelib": site, "platlib": site, "scripts": bin_dir}.get(kind)
                if dest is None:  # headers, data: nothing the runtime needs
                    continue
                target = dest.joinpath(*rest)
            else:
                target = site.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111 or target.parent == bin_dir:
                target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _unpacked_size(wheels: list[Path]) -> int:
    total = 0
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            total += sum(i.file_size for i in z.infolist())
    return total


ProgressFn = Callable[[int, int, str], None]   # (done, total, what)


def install(offer: Offer, progress: ProgressFn = lambda d, t, w: None, cancel: threading.Event | None = None,
            log: Callable[[str], None] = lambda s: None) -> dict:
    """Download, verify, unpack, probe and switch to the runtime `offer` describes; its manifest."""
    check_disk(offer)
    root, dl = act.runtime_root(), downloads_dir()
    total = offer.download_bytes
    done = 0

    def step(n: int, what: str) -> None:
        nonlocal done
        done += n
        progress(done, total, what)

    files = []
    try:
        for w in offer.plan.wheels:
            files.append(fetch(w, dl, lambda n, f=w.filename: step(n, f), cancel))
    except ChecksumMismatch:
        shutil.rmtree(dl, ignore_errors=True)  # an index that serves other bytes than it describes: keep none
        raise
    unpacked = _unpacked_size(files)
    free = free_bytes(root)
    if free < unpacked + HEADROOM:
        raise RuntimeProblem(f"not enough free disk to unpack the GPU runtime: {root} has {gb(free)} free and it "
                             f"needs {gb(unpacked + HEADROOM)}; the downloads are kept in {dl}")
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-{secrets.token_hex(4)}"
    try:
        site, bin_dir = staging / "site", staging / "bin"
        site.mkdir(parents=True)
        written = 0
        for f in files:
            log(f"unpacking {f.name}")
            _unpack(f, site, bin_dir, cancel)
            written += 1
            progress(written, len(files), f"unpacked {f.name}")
        log("checking that its torch imports (a child process)")
        found = act.run_probe(site)
        if found.get("error"):
            raise RuntimeProblem(f"the fetched torch does not import here ({found['error']}); nothing was installed")
        t = offer.plan.torch
        name = f"torch-{t.version}-{sys.implementation.cache_tag}"
        doc = {"python": sys.implementation.cache_tag, "torch": str(t.version), "index_url": offer.plan.index_url,
               "installed": time.strftime("%Y-%m-%dT%H:%M:%S"), "probe": found,
               "gpu": offer.gpu.describe() if offer.gpu else None, "unpacked_bytes": unpacked,
               "wheels": [{"file": w.filename, "sha256": w.sha256, "size": w.size} for w in offer.plan.wheels],
               "carried": offer.plan.carried}
        act.write_json(staging / act.MANIFEST, doc)
        final = root / name
        if final.exists():  # a reinstall of the same build: the old one goes only after the new one is in
            final = root / f"{name}-{secrets.token_hex(3)}"
        staging.rename(final)
        staging = None
        previous = act.active_folder(root)
        act.write_json(root / act.ACTIVE, {"folder": final.name})
        if previous is not None and previous != final:
            shutil.rmtree(previous, ignore_errors=True)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(dl, ignore_errors=True)  # the wheels are unpacked: give the GBs back
    doc["folder"] = str(final)
    return doc


def remove() -> str:
    """Delete every fetched runtime and any partial download; what was freed, in one line."""
    root, dl = act.runtime_root(), downloads_dir()
    freed = sum(_size(p) for p in (root, dl))
    if not root.exists() and not dl.exists():
        return "no GPU runtime installed; nothing to remove"
    shutil.rmtree(dl, ignore_errors=True)
    try:
        shutil.rmtree(root)
    except OSError:  # Windows: a running Mixdesk holds its DLLs. Unused from the next start, deleted then.
        (root / act.ACTIVE).unlink(missing_ok=True)
        (root / act.PENDING_REMOVE).touch()
        return f"the GPU runtime is switched off; its files ({gb(freed)}) are deleted at the next start"
    return f"removed the GPU runtime ({gb(freed)} freed); the next start uses the bundled torch"


def _size(p: Path) -> int:
    if not p.exists():
        return 0
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def status() -> dict:
    """What torch this process runs, where it came from, the installed runtime and the GPU found.
    Imports torch (the caller activated the runtime first, as every start does)."""
    import torch

    cur = act.CURRENT
    gpu, why = find_nvidia()
    folder = act.active_folder()
    where = Path(torch.__file__).parent
    source = "the GPU runtime" if cur.state == "active" else (
        "the app's bundle" if getattr(sys, "frozen", False) else "this Python environment")
    out = {"torch": torch.__version__, "torch_path": str(where), "source": source,
           "cuda_build": torch.version.cuda, "cuda_available": bool(torch.cuda.is_available()),
           "gpu": gpu.describe() if gpu else why, "has_gpu": gpu is not None, "nvidia": gpu, "activation": cur.message,
           "state": cur.state, "runtime": None}
    if folder is not None:
        m = act.manifest(folder)
        out["runtime"] = {"folder": str(folder), "torch": m.get("torch"), "index_url": m.get("index_url"),
                          "installed": m.get("installed"), "bytes": _size(folder)}
    if gpu is not None and not torch.version.cuda and cur.state != "active":
        out["advice"] = advice(gpu)
    return out


def advice(gpu: NvidiaGpu) -> str:
    """What a user with an NVIDIA GPU and a CPU torch should do, frozen app or source install."""
    if getattr(sys, "frozen", False):
        return (f"this torch is a CPU build but {gpu.describe()} is here: `mixdesk runtime install` "
                "(or Settings > GPU runtime in the window) downloads the CUDA build")
    url, why = default_index(gpu)
    pip = (f"`pip install --force-reinstall torch=={bundled_torch_version() or 'VERSION'} --index-url {url}`"
           if url else f"({why})")
    return (f"this torch is a CPU build but {gpu.describe()} is here: in this environment run {pip}, "
            "or `mixdesk runtime install` to fetch the CUDA build into the user data folder")
