"""Mixdesk and llama.cpp side by side on a full-size GGUF file: can an 18.6 GB Qwen3-30B-A3B Q4_K_M
(or a 28 GB Mixtral, more than this machine's RAM) run here, how fast, in how much memory.

    python benchmarks/real_scale.py [--model qwen3|mixtral|PATH.gguf] [--tiny] [--only llama|mixdesk]
        [--placement cpu[,auto]] [--rounds 2] [--ballast-gb 5] [--timeout 1800]
        [--prompt-tokens 128] [--new-tokens 32] [--threads 2] [--ctx 1024]

The files are benchmarks/real_scale_files.py's (random blocks, the real shapes and Q4_K_M types;
written once under .bench/). `--tiny`: its 4-layer, 16-expert Qwen3 (0.66 GB), to rehearse.
`--smoke`: its toy-sized Qwen3 (real_scale_files.SMOKE, ~10 MB), one round of two requests of 16 prompt
and 4 new tokens, a 120 s timeout.

Each contender runs in a subprocess of its own, so each one's memory is its own: load (open to
ready), then a first request (time to first token and prefill of the prompt, cold: the file's pages
fault in) and `--new-tokens` greedy tokens after it (decode, cold too), then more such requests
(`--decode-rounds` in all, each with a fresh prefill): the reported prefill and decode are the best
of the later (warm) ones. Contenders alternate
(llama, mixdesk, llama, mixdesk ...) for `--rounds` rounds, each started anew. The parent samples
the child's /proc/PID/status every 0.2 s (peak RssAnon, RssFile, VmHWM), its /proc/PID/io
read_bytes and major faults, and the machine's MemAvailable; it measures read bandwidth
(benchmarks/common.read_bandwidth) before each child. A child the kernel kills (the OOM killer
sends SIGKILL) or that outlives --timeout is reported with how long it ran and its peak anon memory,
and the run goes on.

Fraction of the bandwidth bound: decode tok/s x the bytes one token reads (top-k of E of each
expert tensor, every other tensor, one embedding row) / read bandwidth.

`--ballast-gb N`: a separate process holds N GB of anonymous memory, every page touched, for the
whole run: other programs on a 24 GB machine.

Mixdesk side: the engine's Python API (engine/runtime/client.Client, as `mixdesk bench` drives it) with
`--placement cpu` (every expert on the CPU, in the file's own blocks) and/or `auto`. llama.cpp side:
llama-cpp-python (benchmarks/llama_peer.py), mmap on (its default), the same threads and context;
`--llama repack` is llama.cpp as users run it: on an AVX2/AVX-512 CPU its CPU_REPACK buffer copies
every Q4_K weight into an interleaved layout in anonymous memory at load (14.3 GB of the Qwen3
file), only the other types stay in the mapping; `--llama norepack` turns that off
(use_extra_bufts = false), every weight read in place from the mapping. Both sides are fed the same
prompt token ids; greedy decoding.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HERE = Path(__file__).resolve()
GB = 1e9


# --- the children ------------------------------------------------------------------------------------

def _phase(name: str, **kw) -> None:
    """A line the parent reads: the phase the child is entering (its memory peaks are kept per phase)."""
    print("@" + json.dumps({"phase": name, "t": time.time(), **kw}), flush=True)


def child_llama(a, prompt: list[int]) -> dict:
    import llama_cpp
    import numpy as np

    if a.placement == "norepack":  # weights used in place from the mapping, none copied into repacked buffers
        import llama_cpp.llama_cpp as low

        defaults = low.llama_model_default_params

        def no_extra_bufts():
            p = defaults()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = no_extra_bufts
    _phase("load")
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.ctx,
                          n_batch=512, use_mmap=True, verbose=False)
    load_s = time.perf_counter() - t0

    n_vocab = llm.n_vocab()

    def last_argmax() -> int:  # the last evaluated token's logits (Llama.eval keeps no scores without logits_all)
        return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))

    out = {"load_s": load_s}
    rounds, prefill = [], []
    for r in range(a.decode_rounds):  # as Mixdesk's side: each round a fresh prefill, then the decode
        _phase(f"request {r + 1}")
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        tok = last_argmax()
        dt = time.perf_counter() - t
        if r == 0:
            out.update(ttft_s=dt, prefill_cold_tok_s=len(prompt) / dt)
        else:
            prefill.append(len(prompt) / dt)
        t = time.perf_counter()
        for _ in range(a.new_tokens - 1):
            llm.eval([tok])
            tok = last_argmax()
        rounds.append((a.new_tokens - 1) / (time.perf_counter() - t))
    out.update(decode_rounds_tok_s=rounds, decode_cold_tok_s=rounds[0], decode_tok_s=max(rounds[1:] or rounds),
               decode_worst_tok_s=min(rounds[1:] or rounds),
               prefill_tok_s=max(prefill or [out["prefill_cold_tok_s"]]), tokens=a.new_tokens)
    return out


def child_mixdesk(a, prompt: list[int]) -> dict:
    from engine.runtime.client import Client
    from engine.protocol.events import Token
    from engine.protocol.sampling import SamplingParams

    first = {}

    def on_event(ev) -> None:
        if isinstance(ev, Token) and ev.index == 0 and "t" not in first:
            first["t"] = time.perf_counter()

    _phase("load")
    t0 = time.perf_counter()
    client = Client(on_event=on_event)
    try:
        loaded = client.load(a.model, a.placement, "cpu", "auto", a.ctx)
        load_s = time.perf_counter() - t0
        out = {"load_s": load_s, "description": loaded.description, "weights": loaded.weights}
        params = SamplingParams(max_new_tokens=a.new_tokens)
        rounds, prefill = [], []
        for r in range(a.decode_rounds):
            _phase(f"request {r + 1}")
            first.clear()
            t = time.perf_counter()
            done = client.generate(prompt_ids=prompt, params=params, fresh=True)  # a cold prefill every time
            if r == 0:
                out.update(ttft_s=first.get("t", time.perf_counter()) - t,
                           prefill_cold_tok_s=done.prefill_tok_s)
            else:
                prefill.append(done.prefill_tok_s)
            rounds.append(done.decode_tok_s)
            out.setdefault("tokens", len(done.token_ids))
            out["reason"] = done.reason
        out.update(decode_rounds_tok_s=rounds, decode_cold_tok_s=rounds[0], decode_tok_s=max(rounds[1:] or rounds),
                   decode_worst_tok_s=min(rounds[1:] or rounds),
                   prefill_tok_s=max(prefill or [out["prefill_cold_tok_s"]]))
        try:
            out["peak_vram"] = client.query("peak_vram")
        except Exception:
            pass
        return out
    finally:
        _phase("close")
        client.close()


def child_main(a) -> None:
    prompt = json.loads(a.prompt_ids)
    try:
        out = (child_llama if a.child == "llama" else child_mixdesk)(a, prompt)
        print("=" + json.dumps(out), flush=True)
    except Exception as e:  # the parent reports it as the run's status
        import traceback

        traceback.print_exc()
        print("=" + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)


# --- the parent --------------------------------------------------------------------------------------

def _status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "VmSwap"):
                out[k] = int(v.split()[0]) * 1024
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == "read_bytes":
                    out["read_bytes"] = int(v)
    except OSError:
        pass
    with open(f"/proc/{pid}/stat") as f:
        out["majflt"] = int(f.read().rsplit(")", 1)[1].split()[9])
    return out


def _oom_kills() -> int:
    """The kernel's count of OOM kills since boot (/proc/vmstat oom_kill)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    """Samples a process's memory every `every` seconds until it ends: the peak of each field, overall
    and per phase (the child's @phase lines)."""

    def __init__(self, pid: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.phase = "start"
        self.by_phase: dict[str, dict[str, int]] = {}
        self.min_available = _mem_available()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                s = _status(self.pid)
            except (OSError, ValueError, IndexError):
                break
            self.last = s
            ph = self.by_phase.setdefault(self.phase, {})
            for k, v in s.items():
                self.peak[k] = max(self.peak.get(k, 0), v)
                ph[k] = max(ph.get(k, 0), v)
            self.min_available = min(self.min_available, _mem_available())
            self.stop.wait(self.every)


def run_child(a, side: str, placement: str, prompt: list[int], log, cmd: list[str] | None = None) -> dict:
    """One contender in a subprocess; its results, memory peaks and how it ended. `cmd`: another
    benchmark's child (benchmarks/prefill.py), sampled the same way."""
    cmd = cmd or [sys.executable, str(HERE), "--child", side, "--model", str(a.model_path), "--placement", placement,
                  "--threads", str(a.threads), "--ctx", str(a.ctx), "--new-tokens", str(a.new_tokens),
                  "--decode-rounds", str(a.decode_rounds), "--prompt-ids", json.dumps(prompt)]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    t0, ooms = time.perf_counter(), _oom_kills()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    sampler = Sampler(p.pid)
    sampler.start()
    result: dict = {}
    phases: list[tuple[str, float]] = []
    err_tail: list[str] = []

    def read_err() -> None:
        for line in p.stderr:
            err_tail.append(line.rstrip())
            del err_tail[:-40]

    threading.Thread(target=read_err, daemon=True).start()

    def read_out() -> None:
        for line in p.stdout:
            if line.startswith("@"):
                ph = json.loads(line[1:])
                sampler.phase = ph["phase"]
                phases.append((ph["phase"], time.perf_counter() - t0))
                now = sampler.last
                log(f"    {side}: {ph['phase']} at {time.perf_counter() - t0:.1f} s (anon "
                    f"{now.get('RssAnon', 0) / GB:.2f} GB, file {now.get('RssFile', 0) / GB:.2f} GB)")
            elif line.startswith("="):
                result.update(json.loads(line[1:]))

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        rc = p.wait(timeout=a.timeout)
        status = "ok" if rc == 0 else None
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        rc = p.wait()
        status = f"timed out after {a.timeout:.0f} s"
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    reader.join(timeout=5)
    peak = sampler.peak
    if status is None:
        if rc == -signal.SIGKILL:
            who = "OOM-killed" if _oom_kills() > ooms >= 0 else "killed (SIGKILL)"
            status = f"{who} after {wall:.0f} s, in '{sampler.phase}'"
        elif rc < 0:
            status = f"killed by signal {-rc} after {wall:.0f} s, in '{sampler.phase}'"
        else:
            status = f"failed (exit {rc}): {result.get('error') or (err_tail[-1] if err_tail else '')}"
    if status == "ok" and result.get("tokens", a.new_tokens) < a.new_tokens:
        status = f"ok ({result.get('reason', 'stopped')} after {result['tokens']} tokens)"
    if not status.startswith("ok"):
        status += f"; peak anon {peak.get('RssAnon', 0) / GB:.2f} GB"
        if err_tail and rc != 0:
            log("    stderr: " + " | ".join(err_tail[-6:]))
    return {**result, "status": status, "wall_s": wall, "peak": peak, "by_phase": sampler.by_phase,
            "phases": phases, "min_mem_available": sampler.min_available}


def start_ballast(gb: float):
    """A process holding `gb` GB of anonymous memory, every page written."""
    code = ("import sys,time\nn=int(float(sys.argv[1])*1e9)\nb=bytearray(n)\nb[::4096]=b'\\x01'*len(range(0,n,4096))\n"
            "print('ready',flush=True)\ntime.sleep(10**9)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(gb)], stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        raise SystemExit("the ballast process did not start")
    return p


def step_bytes_of(path: Path) -> tuple[int, int, int]:
    """(bytes one decode token reads, file bytes, vocab): top-k/E of each expert tensor, every other
    tensor, one row of the embedding when the lm_head is its own tensor."""
    from engine.files.gguf.reader import GGUFFile

    f = GGUFFile(path)
    arch = f.get("general.architecture")
    E, K = f.get(f"{arch}.expert_count"), f.get(f"{arch}.expert_used_count")
    t = f.tensors
    total = 0
    for name, ti in t.items():
        if "_exps" in name:
            total += ti.nbytes * K // E
        elif name != "token_embd.weight" or "output.weight" not in t:
            total += ti.nbytes
    return total, sum(p.stat().st_size for p in f.parts), t["token_embd.weight"].shape[0]


def _gb(x) -> str:
    return f"{x / GB:.2f}" if x else "-"


def _num(x, fmt="{:.2f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def parent_main(a) -> None:
    import torch

    from benchmarks.common import cpu_tag, machine, read_bandwidth, record
    from benchmarks import real_scale_files as files

    torch.set_num_threads(a.threads)
    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    if a.smoke:
        a.model_path = files.write(files.SMOKE, log=lambda m: print(m, flush=True))
    elif a.model in files.SHAPES or a.tiny:
        a.model_path = files.ensure("qwen3-tiny" if a.tiny else a.model, log=lambda m: print(m, flush=True))
    else:
        a.model_path = Path(a.model).expanduser().resolve()
    step, file_bytes, vocab = step_bytes_of(a.model_path)
    g = torch.Generator().manual_seed(0)
    hi = min(vocab, 32000) - 300  # regular tokens of either synthetic vocabulary (past the byte tokens)
    prompt = torch.randint(300, hi, (a.prompt_tokens,), generator=g).tolist()

    sides = []
    if a.only in (None, "llama"):
        try:
            import llama_cpp  # noqa: F401

            sides += [("llama.cpp" + ("" if v == "repack" else " (no repack)"), "llama", v) for v in a.llama.split(",")]
        except ImportError:
            out("llama-cpp-python is not installed: no llama.cpp side (see benchmarks/llama_peer.py)")
    if a.only in (None, "mixdesk"):
        sides += [(f"Mixdesk {pl}", "mixdesk", pl) for pl in a.placement.split(",")]

    ballast = start_ballast(a.ballast_gb) if a.ballast_gb else None
    print(f"{a.model_path} ({file_bytes / GB:.2f} GB); a decode token reads {step / GB:.2f} GB; "
          f"MemAvailable {_mem_available() / GB:.1f} GB" + (f" with {a.ballast_gb} GB of ballast" if ballast else ""),
          flush=True)
    runs = []
    try:
        for r in range(a.rounds):
            for label, side, placement in sides:
                load = os.getloadavg()[0]  # other programs' work on the machine: it skews everything
                bw0 = read_bandwidth(512)
                print(f"round {r + 1}: {label} (read bandwidth {bw0 / GB:.1f} GB/s)", flush=True)
                res = run_child(a, side, placement, prompt, lambda m: print(m, flush=True))
                bw1 = read_bandwidth(512)
                bw = (bw0 + bw1) / 2  # the reading drifts: the mean of one just before and one just after
                res.update(label=label, round=r + 1, bandwidth=bw, bandwidth_before_after=[bw0, bw1], loadavg=load)
                if res.get("decode_tok_s"):
                    res["fraction_of_bound"] = res["decode_tok_s"] * step / bw
                runs.append(res)
                pk = res["peak"]
                print(f"  -> {res['status']}: load {_num(res.get('load_s'))} s, decode "
                      f"{_num(res.get('decode_tok_s'))} tok/s, peak anon {_gb(pk.get('RssAnon'))} GB, file "
                      f"{_gb(pk.get('RssFile'))} GB", flush=True)
    finally:
        if ballast is not None:
            ballast.kill()
            ballast.wait()

    bws = [b for r in runs for b in r["bandwidth_before_after"]]
    loads = [r["loadavg"] for r in runs]
    out(f"### {a.model_path.name}: {file_bytes / GB:.2f} GB file, {step / GB:.2f} GB read per decode token")
    out()
    out(f"{a.prompt_tokens}-token prompt, {a.new_tokens} greedy new tokens, {a.threads} threads, ctx {a.ctx}; "
        f"read bandwidth {min(bws, default=0) / GB:.1f}-{max(bws, default=0) / GB:.1f} GB/s across the rounds; "
        f"RAM {machine_ram() / GB:.1f} GB" + (f", {a.ballast_gb:g} GB of it held by a ballast process"
                                               if a.ballast_gb else "")
        + f"; load average {min(loads, default=0):.1f}-{max(loads, default=0):.1f} as each child started")
    out()
    out("| run | round | status | load s | TTFT s | prefill tok/s (cold / warm) | decode tok/s: first / best later "
        "(worst later) | "
        "of bound | peak RssAnon GB | peak RssFile GB | VmHWM GB | disk read GB | major faults | min MemAvailable GB |")
    out("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        pk = r["peak"]
        status = r["status"] if len(r["status"]) < 200 else r["status"][:197] + "..."
        out(f"| {r['label']} | {r['round']} | {status} | {_num(r.get('load_s'))} | {_num(r.get('ttft_s'))} | "
            f"{_num(r.get('prefill_cold_tok_s'), '{:.1f}')} / {_num(r.get('prefill_tok_s'), '{:.1f}')} | "
            f"{_num(r.get('decode_cold_tok_s'))} / {_num(r.get('decode_tok_s'))} "
            f"({_num(r.get('decode_worst_tok_s'))}) | "
            f"{_num(r.get('fraction_of_bound'), '{:.0%}')} | {_gb(pk.get('RssAnon'))} | {_gb(pk.get('RssFile'))} | "
            f"{_gb(pk.get('VmHWM'))} | {_gb(pk.get('read_bytes'))} | {pk.get('majflt', '-')} | "
            f"{_gb(r['min_mem_available'])} |")

    def best(label: str) -> dict | None:
        ok = [r for r in runs if r["label"] == label and r["status"].startswith("ok") and r.get("decode_tok_s")]
        return max(ok, key=lambda r: r["decode_tok_s"]) if ok else None

    ratios = {}
    for plabel, pside, _ in sides:
        peer = best(plabel) if pside == "llama" else None
        for label, side, _ in sides:
            m = best(label) if side == "mixdesk" else None
            if m is None or peer is None:
                continue
            r = {k: m[k] / peer[k] for k in ("decode_tok_s", "prefill_tok_s", "prefill_cold_tok_s", "load_s", "ttft_s")
                 if m.get(k) and peer.get(k)}
            r["peak_anon"] = m["peak"].get("RssAnon", 0) / max(peer["peak"].get("RssAnon", 1), 1)
            ratios[f"{label} / {plabel}"] = r
    if ratios:
        out()
        out("Mixdesk / llama.cpp, best round of each:")
        out()
        for lab, rs in ratios.items():
            out(f"- {lab}: " + ", ".join(f"{k} **{v:.2f}x**" for k, v in rs.items()))
    out()
    out(f"machine: {machine()}")
    name = "real_scale-" + a.model_path.stem + (f"-ballast{a.ballast_gb:g}" if a.ballast_gb else "") + \
        (f"-{a.only}" if a.only else "") + f"-{cpu_tag()}"  # the CPU kind varies between sessions
    payload = {"file": str(a.model_path), "file_bytes": file_bytes, "step_bytes": step,
               "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens, "threads": a.threads, "ctx": a.ctx,
               "ballast_gb": a.ballast_gb, "runs": runs, "ratios": ratios}
    if not a.no_record:
        print(f"recorded {record(name, payload, chr(10).join(lines))}")


def machine_ram() -> int:
    import psutil

    return psutil.virtual_memory().total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3", help="qwen3 | mixtral | a GGUF file (default: qwen3)")
    ap.add_argument("--tiny", action="store_true", help="the 4-layer, 16-expert Qwen3 (0.66 GB), to rehearse")
    ap.add_argument("--only", choices=["llama", "mixdesk"])
    ap.add_argument("--placement", default="cpu", help="Mixdesk's placements, comma-separated: cpu and/or auto")
    ap.add_argument("--llama", default="repack", help="llama.cpp's variants, comma-separated: repack (its default: "
                    "weights of types it repacks, Q4_K here, copied into anonymous memory at load) and/or norepack "
                    "(use_extra_bufts off: every weight used in place from the mapping)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decode-rounds", type=int, default=3, help="decode rounds per child; the first is cold")
    ap.add_argument("--ballast-gb", type=float, default=0)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a child may run")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--no-record", action="store_true", help="print the table only (no results file)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    ap.add_argument("--child", choices=["llama", "mixdesk"], help=argparse.SUPPRESS)
    ap.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke and not a.child:
        a.rounds, a.decode_rounds, a.prompt_tokens, a.new_tokens, a.ctx, a.timeout = 1, 2, 16, 4, 256, 120
    if a.child:
        child_main(a)
    else:
        parent_main(a)


if __name__ == "__main__":
    main()
