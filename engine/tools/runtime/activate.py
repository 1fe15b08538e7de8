"""At start, before anything imports torch: put the fetched GPU runtime first on sys.path and
import its torch. If that fails, take it off again and let the bundled (CPU) torch load, and say
why; a start never fails because of the runtime.

A start that dies inside the runtime's native libraries (a crash, not an exception) leaves an
`importing-<pid>` marker behind; the next start finds it, sets the runtime aside in
`crashed.json`, and uses the bundled torch. Standard library only, plus platformdirs."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ACTIVE = "active.json"
MANIFEST = "runtime.json"
SET_ASIDE = "set-aside.json"  # why this runtime is not used at start (a crash, an engine that failed on it)
PENDING_REMOVE = "remove-pending"


def runtime_root() -> Path:
    """The folder that holds fetched runtimes: in the user data folder, never the install folder."""
    if os.environ.get("MIXDESK_RUNTIME_DIR"):
        return Path(os.environ["MIXDESK_RUNTIME_DIR"])
    import platformdirs

    return platformdirs.user_data_path("mixdesk", appauthor=False) / "runtime"


@dataclass
class Activation:
    state: str                  # "none" (no runtime), "active", "fallback" (it failed: bundled torch), "off"
    message: str = ""           # one line for the user
    folder: Path | None = None

    @property
    def site(self) -> Path | None:
        return self.folder / "site" if self.folder else None


CURRENT = Activation("none", "no GPU runtime installed")


def active_folder(root: Path | None = None) -> Path | None:
    """The installed runtime's folder (whether or not this process uses it), or None."""
    root = root or runtime_root()
    try:
        name = json.loads((root / ACTIVE).read_text())["folder"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    folder = root / str(name)
    return folder if name and "/" not in name and "\\" not in name and folder.is_dir() else None


def manifest(folder: Path) -> dict:
    try:
        m = json.loads((folder / MANIFEST).read_text())
        return m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        return {}


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:  # not os.kill(pid, 0): on Windows that terminates the process
        import psutil

        return psutil.pid_exists(pid)
    except ImportError:
        return True  # cannot tell: never blame the runtime for a start that may still be running


def _purge(site: Path) -> None:
    """Forget every module imported from site (and any half-imported torch), so the bundled one loads."""
    s = str(site)
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if name == "torch" or name.startswith("torch.") or (f and f.startswith(s)):
            del sys.modules[name]
    while s in sys.path:
        sys.path.remove(s)
    sys.path_importer_cache.pop(s, None)
    importlib.invalidate_caches()


def _fallback(folder: Path, why: str) -> Activation:
    return Activation("fallback", f"the GPU runtime in {folder} was not used: {why}; running on the bundled torch "
                      "(`mixdesk runtime status` says more, `mixdesk runtime install` fetches it anew)", folder)


def activate(root: Path | None = None) -> Activation:
    """Use the installed runtime if there is one and it imports. Sets and returns CURRENT."""
    global CURRENT
    CURRENT = _activate(root or runtime_root())
    return CURRENT


def _activate(root: Path) -> Activation:
    if (root / PENDING_REMOVE).exists():  # `remove` could not delete files a running app held (Windows)
        shutil.rmtree(root, ignore_errors=True)
    folder = active_folder(root)
    if folder is None:
        return Activation("none", "no GPU runtime installed")
    if os.environ.get("MIXDESK_RUNTIME_WHY"):  # a start that set it aside and started this process again
        why = os.environ.pop("MIXDESK_RUNTIME_WHY")
        os.environ.pop("MIXDESK_RUNTIME", None)  # for this start only: not for the processes it starts
        return _fallback(folder, why)
    if os.environ.get("MIXDESK_RUNTIME", "").lower() in ("off", "0", "no"):
        return Activation("off", f"MIXDESK_RUNTIME=off: the GPU runtime in {folder} is not used", folder)
    if "torch" in sys.modules:
        return Activation("off", "torch was imported before the GPU runtime could be put first", folder)
    m = manifest(folder)
    tag = sys.implementation.cache_tag
    if m.get("python") != tag:
        return _fallback(folder, f"it was fetched for {m.get('python') or 'another Python'} and this Mixdesk runs {tag}")
    if (folder / SET_ASIDE).exists():
        try:
            why = json.loads((folder / SET_ASIDE).read_text()).get("reason", "it crashed")
        except (OSError, ValueError, AttributeError):
            why = "it crashed"
        return _fallback(folder, why)
    for marker in folder.glob("importing-*"):
        try:
            pid = int(marker.name.split("-", 1)[1])
        except ValueError:
            continue
        if not _pid_alive(pid):
            why = (f"a start on {time.strftime('%Y-%m-%d %H:%M', time.localtime(marker.stat().st_mtime))} died "
                   "while importing its torch (a crash in its native libraries)")
            write_json(folder / SET_ASIDE, {"reason": why})
            marker.unlink(missing_ok=True)
            return _fallback(folder, why)
    site = folder / "site"
    mine = folder / f"importing-{os.getpid()}"
    try:
        mine.touch()
    except OSError:
        pass
    sys.path.insert(0, str(site))
    try:
        import torch
    except Exception as e:  # an ImportError from a missing library, an AttributeError from a half-written file...
        mine.unlink(missing_ok=True)
        _purge(site)
        return _fallback(folder, f"its torch failed to import ({_one_line(e)})")
    try:
        works = smoke(torch)
    except Exception as e:
        works = _one_line(e)
    finally:
        mine.unlink(missing_ok=True)
    if works is not True:
        _purge(site)
        return _fallback(folder, f"its torch imports but does not work ({works})")
    where = Path(getattr(torch, "__file__", "") or "")
    if not str(where).startswith(str(site)):
        return Activation("off", f"torch came from {where}, not from the GPU runtime in {folder}", folder)
    return Activation("active", f"the GPU runtime is in use: torch {torch.__version__} from {folder}", folder)


def _one_line(e: BaseException) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def smoke(torch) -> bool | str:
    """True if this torch has what Mixdesk uses at import and computes 1 + 1; else what is missing."""
    missing = [n for n in ("Tensor", "float16", "bfloat16", "float32", "nn", "ones") if not hasattr(torch, n)]
    if missing:
        return f"it has no torch.{missing[0]}"
    if float(torch.ones(2).sum()) != 2.0:
        return "torch.ones(2).sum() is not 2"
    return True


def set_aside(folder: Path, why: str) -> None:
    """Stop using this runtime at start (until it is installed again or removed), with the reason."""
    try:
        write_json(folder / SET_ASIDE, {"reason": why})
    except OSError:
        pass  # a read-only folder: the caller's MIXDESK_RUNTIME=off still keeps this start off it


def write_json(path: Path, doc: dict) -> None:
    """Write doc to path atomically (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def probe(site: str) -> int:
    """In a child process: import torch from site and print what it is, as one JSON line."""
    sys.path.insert(0, site)
    out: dict = {}
    try:
        import torch

        out = {"version": torch.__version__, "file": torch.__file__, "cuda_build": torch.version.cuda,
               "cuda_available": bool(torch.cuda.is_available())}
        works = smoke(torch)
        if works is not True:
            out["error"] = f"it imports but does not work: {works}"
        if out["cuda_available"]:
            out["device"] = torch.cuda.get_device_name(0)
        if not str(torch.__file__).startswith(site):
            out["error"] = f"torch came from {torch.__file__}, not from {site}"
    except BaseException as e:  # noqa: BLE001 - reported, never raised: this is the probe's whole job
        out["error"] = _one_line(e)
    print("MIXDESK-PROBE " + json.dumps(out), flush=True)
    return 0


def probe_command(site: Path) -> list[str]:
    """How to run probe(site) in a child: the frozen app takes a hidden flag, Python takes -c."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--runtime-probe", str(site)]
    return [sys.executable, "-c", "import sys; from engine.tools.runtime.activate import probe; "
            "sys.exit(probe(sys.argv[1]))", str(site)]


def run_probe(site: Path, timeout_s: float = 300) -> dict:
    """Import the runtime's torch in a child process; {"error": ...} if that fails or hangs."""
    env = dict(os.environ, MIXDESK_RUNTIME="off", PYTHONNOUSERSITE="1")
    if not getattr(sys, "frozen", False):  # a source checkout: the child finds engine/ where this one did
        here = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        r = subprocess.run(probe_command(site), capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"importing its torch took over {timeout_s:.0f} s"}
    except OSError as e:
        return {"error": f"could not start {sys.executable}: {e}"}
    for line in r.stdout.splitlines():
        if line.startswith("MIXDESK-PROBE "):
            return json.loads(line.split(" ", 1)[1])
    tail = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
    return {"error": f"the import crashed ({tail[:300]})"}
