"""A benchmark run on this tree and on an earlier commit, interleaved, with the ratios printed:
the check that a change kept every measured figure (a refactor must be within noise).

    python benchmarks/versus_parent.py --base REF [--rounds 2] decode_step concurrent_streams migration

The earlier commit is checked out once as a git worktree (under /tmp) and its native library built
there with this venv's compiler settings (`setup.py build_ext --inplace`). Each benchmark then runs
as its own process in each tree, in the order base, this, this, base, ... (so a drift of the shared
machine's bandwidth over the minutes weighs on both alike); each figure's median over the rounds
is compared. Both runs read the same model files (MIXDESK_BENCH_CACHE); the read bandwidth each
benchmark measures itself is printed beside. Results: results/versus_parent-<benchmarks>-<date>.md/.json.

--smoke: one round of frontier_from_config (resources/mixtral-8x7b-config.json, arguments both trees' versions
take) against --base HEAD unless given; the base's native library is copied from this tree when their
native sources are the same, else not built (the build takes minutes; the planner benchmark runs without it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import CACHE, record  # noqa: E402

HEAD = Path(__file__).resolve().parents[1]


def figures(bench: str, d: dict) -> dict[str, tuple[float, bool]]:
    """The figures a benchmark's JSON holds: name -> (value, higher is better)."""
    out = {}
    if bench == "decode_step":
        for tier in ("cpu-4", "cpu-16"):
            for variant in ("torch", "native experts", "native step"):
                r = d.get(f"{tier} {variant}")
                if r:
                    out[f"{tier} {variant} ms/token"] = (1e3 * r["step_s"], False)
                    out[f"{tier} {variant} bandwidth GB/s"] = (r["bandwidth"] / 1e9, True)
    elif bench == "concurrent_streams":
        for n, r in d["results"].items():
            out[f"{n} streams aggregate tok/s"] = (r["aggregate_tok_s"], True)
            out[f"{n} streams per-stream gap ms"] = (r["per_stream_gap_ms"], False)
        out["bandwidth GB/s"] = (d["bandwidth"] / 1e9, True)
    elif bench in ("frontier_from_config", "mixtral_frontier"):
        out["frontier ms (median)"] = (d["ms"], False)
        if "first_ms" in d:
            out["frontier first call ms"] = (d["first_ms"], False)
        out["frontier points"] = (d["points"], True)
    elif bench == "migration":
        out["longest gap / median step"] = (d["stall_s"] / d["median_step_s"], False)
        out["no-move longest gap / median step"] = (d["quiet_stall_s"] / d["quiet_median_step_s"], False)
        out["median step ms"] = (1e3 * d["median_step_s"], False)
        out["GB built"] = (d["bytes"] / 1e9, True)
        out["build rate MB/s"] = (d["bytes"] / d["busy_s"] / 1e6, True)
    return out


def worktree(ref: str, smoke: bool = False) -> Path:
    sha = subprocess.run(["git", "rev-parse", ref], cwd=HEAD, capture_output=True, text=True, check=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"mixdesk-base-{sha[:10]}"
    if not (path / ".git").exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=HEAD, check=True)
    if smoke and not list((path / "engine" / "native").glob("_mdk*.so")):
        import shutil

        same = subprocess.run(["git", "diff", "--quiet", sha, "--", "engine/native", "setup.py"], cwd=HEAD).returncode == 0
        built = list((HEAD / "engine" / "native").glob("_mdk*.so"))
        if same and built:
            print(f"the native sources of {sha[:10]} are this tree's: its library copied", flush=True)
            for so in built:
                shutil.copy2(so, path / "engine" / "native" / so.name)
        else:
            print(f"smoke: the native library of {sha[:10]} not built (its engine runs the torch kernels)", flush=True)
        return path
    if not list((path / "engine" / "native").glob("_mdk*.so")):
        print(f"building the native library of {sha[:10]} ...", flush=True)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True,
                       stdout=subprocess.DEVNULL)
    return path


def run_once(tree: Path, bench: str, args: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"vp-{bench}-"))
    env = {**os.environ, "PYTHONPATH": str(tree), "MIXDESK_BENCH_CACHE": str(CACHE), "MIXDESK_BENCH_RESULTS": str(out)}
    subprocess.run([sys.executable, f"benchmarks/{bench}.py", *args], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    # a record named otherwise (frontier_from_config writes frontier_<model_type>) is still the only one in `out`
    found = (sorted(out.glob(f"{bench}*.json")) or sorted(out.glob("*.json"))
             or sorted((tree / "benchmarks" / "results").glob(f"{bench}-*.json"), key=lambda p: p.stat().st_mtime))
    return json.loads(found[-1].read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("benchmarks", nargs="*")
    ap.add_argument("--base", default=None, help="the earlier commit (e.g. the parent of the change); required but "
                    "with --smoke (HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree per benchmark")
    ap.add_argument("--args", default=None, help="arguments passed to every benchmark")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.benchmarks = a.benchmarks or ["frontier_from_config"]
        a.base = a.base or "HEAD"
        a.rounds = 1
        if a.args is None:
            a.args = "resources/mixtral-8x7b-config.json" if a.benchmarks == ["frontier_from_config"] else ""
    missing = [n for n, v in (("benchmarks", a.benchmarks), ("--base", a.base)) if not v]
    if missing:
        ap.error(f"the following arguments are required: {', '.join(missing)}")
    a.args = a.args or ""
    base = worktree(a.base, a.smoke)
    trees = {"base": base, "this": HEAD}
    order = [("base", "this"), ("this", "base")]
    payload, lines = {"base": a.base, "rounds": a.rounds}, []
    for bench in a.benchmarks:
        got = {"base": [], "this": []}
        for r in range(a.rounds):
            for who in order[r % 2]:
                print(f"{bench}: round {r + 1}, {who} ...", flush=True)
                got[who].append(figures(bench, run_once(trees[who], bench, a.args.split())))
        rows = []
        lines += [f"## {bench}", "", f"| figure | {a.base} | this tree | this / base | runs (base; this) |",
                  "|---|---|---|---|---|"]
        for name, (_, higher) in got["this"][0].items():
            b = [g[name][0] for g in got["base"] if name in g]
            t = [g[name][0] for g in got["this"]]
            if not b:
                continue
            mb, mt = statistics.median(b), statistics.median(t)
            ratio = mt / mb if mb else float("nan")
            rows.append({"figure": name, "base": b, "this": t, "ratio": ratio, "higher_is_better": higher})
            runs = f"{', '.join(f'{x:.3g}' for x in b)}; {', '.join(f'{x:.3g}' for x in t)}"
            lines.append(f"| {name} | {mb:.4g} | {mt:.4g} | {ratio:.3f} | {runs} |")
            print(f"  {name:40s} base {mb:10.4g}  this {mt:10.4g}  ratio {ratio:.3f}", flush=True)
        payload[bench] = rows
        lines.append("")
    print(record("versus_parent-" + "-".join(a.benchmarks), payload, "\n".join(lines)))


if __name__ == "__main__":
    main()
