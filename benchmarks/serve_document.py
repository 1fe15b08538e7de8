"""A document served at the real scale (issue 45, must-show 1): `mixdesk serve --model FILE` with no
--ctx beside a ballast process holding other programs' memory, then one chat request holding a
document of about `--tokens` tokens. Prints the context the server opened with (its own line, with the
bytes of its keys and values), the request's prompt tokens, time and reading rate, the answer, and
the server's peak anonymous (RssAnon) and file-backed (RssFile) memory, sampled every 0.2 s.

    python benchmarks/serve_document.py [--model .bench/qwen3-30b-a3b-q4_k_m.gguf] [--ballast-gb 5]
        [--tokens 16384] [--max-tokens 16] [--no-record] [--smoke]

`--smoke`: benchmarks/real_scale_files.py's toy-sized Qwen3 (~10 MB), a 0.05 GB ballast, a 256-token document,
2 reply tokens, a 120 s timeout.

The document is English prose (resources/corpus/eval.txt, paragraphs repeated in a shuffled order
so no two stretches are alike), cut to the token count with the file's own tokenizer.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

GB = 1e9
QUESTION = "\n\nIn one sentence: what is the document above about?"


def document(path: Path, tokens: int) -> tuple[str, int]:
    """About `tokens` tokens of prose, counted by the GGUF file's tokenizer (with the question)."""
    from engine.files.gguf.header import Header
    from engine.files.gguf.tokenizer import tokenizer_from_metadata

    tok = tokenizer_from_metadata(Header(path), path)
    paras = [p.strip() for p in (ROOT / "resources/corpus/eval.txt").read_text().split("\n\n") if p.strip()]
    rng, text, ids = random.Random(0), "", []
    while len(ids) < tokens:
        rng.shuffle(paras)
        text += "\n\n".join(paras) + "\n\n"
        ids = tok.encode(text, add_special_tokens=False)
    cut = tok.decode(ids[: tokens - len(tok.encode(QUESTION, add_special_tokens=False)) - 40])
    return cut + QUESTION, len(tok.encode(cut + QUESTION, add_special_tokens=False))


def main() -> None:
    from benchmarks import real_scale as rs
    from benchmarks.common import machine, record

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / ".bench/qwen3-30b-a3b-q4_k_m.gguf"))
    ap.add_argument("--ballast-gb", type=float, default=5)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    if a.smoke:
        from benchmarks import real_scale_files as files

        a.model = str(files.write(files.SMOKE, log=lambda m: print(m, flush=True)))
        a.ballast_gb, a.tokens, a.max_tokens, a.timeout = 0.05, 256, 2, 120
    model = Path(a.model).resolve()
    text, counted = document(model, a.tokens)
    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    ballast = rs.start_ballast(a.ballast_gb) if a.ballast_gb else None
    avail0 = rs._mem_available()
    cmd = [str(ROOT / ".venv/bin/mixdesk"), "serve", "--model", str(model), "--port", "0", "--quiet"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = rs.Sampler(server.pid)
    sampler.start()
    said: list[str] = []
    url: dict = {}
    ready = threading.Event()

    def read() -> None:
        for line in server.stdout:
            said.append(line.rstrip())
            m = re.search(r"at (http://[\d.:]+)", line)
            if m:
                url["base"] = m.group(1)
            if url and "tokens" in line and "keys and values" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        t0 = time.perf_counter()
        if not ready.wait(a.timeout) or server.poll() is not None:
            raise SystemExit("the server did not start: " + " | ".join(said[-8:]))
        load_s = time.perf_counter() - t0
        with urllib.request.urlopen(url["base"] + "/v1/models", timeout=60) as r:
            name = json.loads(r.read())["data"][0]["id"]  # the server answers for the model it runs alone
        sampler.phase = "request"
        body = json.dumps({"model": name, "messages": [{"role": "user", "content": text}],
                           "max_tokens": a.max_tokens, "temperature": 0}).encode()
        req = urllib.request.Request(url["base"] + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=a.timeout) as r:
            reply = json.loads(r.read())
        took = time.perf_counter() - t
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        sampler.stop.set()
        sampler.join()
        if ballast is not None:
            ballast.kill()
            ballast.wait()
    usage = reply.get("usage", {})
    answer = reply["choices"][0]["message"].get("content", "")
    pk, req_pk = sampler.peak, sampler.by_phase.get("request", {})
    out(f"### `mixdesk serve --model {model.name}` (no --ctx), {a.ballast_gb:g} GB held by a ballast process")
    out()
    out(f"MemAvailable with the ballast, before the server: {avail0 / GB:.1f} GB; the server's lines:")
    out()
    for s in said[:6]:
        out(f"    {s}")
    out()
    out(f"- ready in {load_s:.1f} s")
    out(f"- the request: {usage.get('prompt_tokens')} prompt tokens (the document counted {counted:,} by the "
        f"file's tokenizer), {usage.get('completion_tokens')} reply tokens in {took:.1f} s: "
        f"{usage.get('prompt_tokens', 0) / took:.1f} prompt tokens a second, reply included")
    out(f"- the answer (random weights: words, not sense): {answer[:200]!r}")
    out(f"- the server's peak RssAnon {pk.get('RssAnon', 0) / GB:.2f} GB (during the request "
        f"{req_pk.get('RssAnon', 0) / GB:.2f} GB), peak RssFile {pk.get('RssFile', 0) / GB:.2f} GB; "
        f"lowest MemAvailable {sampler.min_available / GB:.1f} GB")
    out()
    out(f"machine: {machine()}")
    out(f"command: python benchmarks/{HERE.name} " + " ".join(sys.argv[1:]))
    if not a.no_record:
        print("recorded", record("serve_document-" + model.stem, {"said": said, "usage": usage, "took_s": took,
                                                                   "peak": pk, "request_peak": req_pk,
                                                                   "answer": answer}, "\n".join(lines)))


if __name__ == "__main__":
    main()
