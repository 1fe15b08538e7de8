"""Which wheels a runtime needs: torch at the wanted version, then its requirements (markers and
extras evaluated for this interpreter), recursively, minus those the app already carries at a
version that satisfies them. No backtracking: the newest fitting wheel of each project is taken,
and a later requirement it does not satisfy is an error that names both, as pip would say."""
from __future__ import annotations

import importlib.metadata
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .index import Dist, Index, RuntimeProblem

# the runtime's own copy is the point for these, whatever the app carries
ALWAYS_FETCH = frozenset({"torch"})


def installed_version(name: str) -> Version | None:
    """The version of `name` the running app carries (its package metadata), or None."""
    try:
        return Version(importlib.metadata.version(name))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion, ValueError):
        return None


@dataclass
class Plan:
    """What a runtime install downloads, in a stable order (torch first)."""
    wheels: list[Dist]
    carried: list[str] = field(default_factory=list)    # "sympy 1.14.0": requirements the app satisfies
    index_url: str = ""

    @property
    def torch(self) -> Dist:
        return next(d for d in self.wheels if d.name == "torch")

    @property
    def download_bytes(self) -> int:
        return sum(d.size or 0 for d in self.wheels)


def _applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": e}) for e in (extras | {""}))


def resolve(index: Index, root: Requirement, have: Callable[[str], Version | None] = installed_version,
            cancelled: Callable[[], bool] = lambda: False) -> Plan:
    chosen: dict[str, Dist] = {}
    extras_done: dict[str, set[str]] = {}
    wanted_by: dict[str, list[str]] = {}
    carried: dict[str, str] = {}
    queue: deque[tuple[Requirement, str]] = deque([(root, "you")])
    while queue:
        if cancelled():
            raise RuntimeProblem("cancelled")
        req, parent = queue.popleft()
        name = canonicalize_name(req.name)
        wanted_by.setdefault(name, []).append(f"{parent} wants {req}")
        if name in chosen:
            if not req.specifier.contains(chosen[name].version, prereleases=True):
                raise RuntimeProblem(f"conflicting requirements: {'; '.join(wanted_by[name])} — the index "
                                     f"offers {name} {chosen[name].version} for the first")
            new = set(req.extras) - extras_done[name]
            if not new:
                continue
        elif name not in ALWAYS_FETCH and (v := have(name)) is not None and req.specifier.contains(v, prereleases=True):
            carried[name] = f"{name} {v}"
            continue
        else:
            chosen[name] = index.best(name, req.specifier)
            extras_done[name] = set()
            new = set(req.extras)
        d = chosen[name]
        meta = index.metadata(d)
        extras_done[name] |= new
        for line in meta.get_all("Requires-Dist") or []:
            try:
                sub = Requirement(line)
            except InvalidRequirement as e:
                raise RuntimeProblem(f"{d.filename}: unreadable requirement {line!r} ({e})") from None
            if _applies(sub, extras_done[name]):
                queue.append((sub, f"{name} {d.version}"))
    order = sorted(chosen.values(), key=lambda d: (d.name != "torch", d.name))
    for d in order:
        if cancelled():
            raise RuntimeProblem("cancelled")
        index.size(d)
        if not d.sha256:
            raise RuntimeProblem(f"the index {index.url} gives no sha256 for {d.filename}; refusing to install "
                                 "code that cannot be checked")
    return Plan(order, sorted(carried.values()), index.url)
