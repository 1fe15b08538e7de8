"""`mixdesk runtime status|install|remove`: the GPU runtime (a CUDA torch fetched into the user data
folder, used from the next start). Errors are one line; a failed install leaves things as they were."""
from __future__ import annotations

import sys
import time

from .runtime import activate as act
from .runtime.install import build_name, gb


def add_parser(sub) -> None:
    r = sub.add_parser("runtime", help="the GPU runtime: a CUDA build of torch fetched on first run "
                       "(status | install | remove)")
    rs = r.add_subparsers(dest="runtime_cmd", metavar="ACTION", required=True)
    for name, text in (("status", "the torch in use, its path, the GPU found and the installed runtime; "
                        "with --index-url, also what an install would fetch"),
                       ("install", "download the CUDA torch that fits the driver, verify, unpack; used from "
                        "the next start (resumes an interrupted download)"),
                       ("remove", "delete the fetched runtime and any partial download")):
        p = rs.add_parser(name, help=text)
        p.add_argument("--index-url", default=None, metavar="URL",
                       help="package index to fetch from (default: torch's CUDA index for the driver)"
                       + ("; accepted for symmetry, removal is local" if name == "remove" else ""))
        if name != "remove":
            p.add_argument("--torch-version", default=None, metavar="V",
                           help="torch version to fetch (default: the version the app ships)")
        p.set_defaults(fn={"status": cmd_status, "install": cmd_install, "remove": cmd_remove}[name])


def cmd_status(a) -> int:
    from .runtime.install import status

    s = status()
    cuda = build_name(s["cuda_build"]) + (
        (", a GPU is usable" if s["cuda_available"] else ", no usable GPU") if s["cuda_build"] else "")
    print(f"torch {s['torch']} ({cuda}) from {s['source']}: {s['torch_path']}")
    print(f"GPU: {s['gpu']}")
    rt = s["runtime"]
    if rt:
        print(f"GPU runtime: torch {rt['torch']} in {rt['folder']} ({gb(rt['bytes'])}, from {rt['index_url']}, "
              f"installed {rt['installed']})")
    else:
        print("GPU runtime: none installed")
    if s["state"] in ("fallback", "off"):
        print(f"note: {s['activation']}")
    if s.get("advice"):
        print(f"tip: {s['advice']}")
    if a.index_url or (s["has_gpu"] and not rt):
        from .runtime.index import RuntimeProblem
        from .runtime.install import prepare

        try:
            print(f"an install would fetch {prepare(a.index_url, a.torch_version).describe()}")
        except RuntimeProblem as e:
            print(f"an install cannot be planned now: {e}")
    return 0


def _bar(quiet: bool = False):
    t0, last = time.monotonic(), [0.0]

    def show(done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if quiet or (now - last[0] < 0.2 and done < total):
            return
        last[0] = now
        rate = done / max(now - t0, 1e-3)
        fill = int(30 * min(done, total) / max(total, 1))
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (30 - fill)}] {gb(done)} / {gb(total)}  {rate / 1e6:6.1f} MB/s  "
                         f"{what[:40]:<40}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def cmd_install(a) -> int:
    from .runtime.install import install, prepare

    print("asking the index what to fetch…", file=sys.stderr)
    offer = prepare(a.index_url, a.torch_version)
    print(f"fetching {offer.describe()}", file=sys.stderr)
    if offer.gpu is None:
        print("note: no NVIDIA GPU found here; the runtime is installed anyway, as asked", file=sys.stderr)
    bar = _bar()
    phase = ["download"]

    def progress(done, total, what):
        if what.startswith("unpacked "):
            if phase[0] == "download":
                phase[0] = "unpack"
                sys.stderr.write("\n")
            sys.stderr.write(f"\runpacking {done}/{total} {what.removeprefix('unpacked ')[:50]:<50}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        else:
            bar(done, total, what)
    try:
        doc = install(offer, progress, log=lambda s: print(s, file=sys.stderr) if s.startswith("checking") else None)
    except KeyboardInterrupt:
        print("\nmixdesk: cancelled; what was downloaded is kept: `mixdesk runtime install` resumes, "
              "`mixdesk runtime remove` deletes it", file=sys.stderr)
        return 130
    p = doc["probe"]
    where = f"CUDA {p['cuda_build']}" if p.get("cuda_build") else "a CPU build"
    gpu = (f"; it sees {p['device']}" if p.get("cuda_available") else
           "; CUDA is not available to it on this machine" if p.get("cuda_build") else "")
    print(f"installed torch {p['version']} ({where}{gpu}) in {doc['folder']}")
    print("the next start of Mixdesk uses it (`mixdesk --self-test` shows it)")
    return 0


def cmd_remove(a) -> int:
    from .runtime.install import remove

    print(remove())
    if act.CURRENT.state == "active":
        print("this process still runs on it until it exits")
    return 0
