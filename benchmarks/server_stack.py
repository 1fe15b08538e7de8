"""Which ASGI stack serves Mixdesk's API: Starlette alone against FastAPI (both on uvicorn), in one run.

    pip install fastapi   # only for this comparison
    python benchmarks/server_stack.py [--smoke]

Each stack serves the two shapes the API has, with no model behind them, so only the stack is
timed: a small JSON answer (GET /v1/models-like) and a server-sent-event stream of 256 chunks
(a streamed reply of 256 tokens). A client on loopback (the standard library's, one connection at a
time) makes 400 JSON requests and 40 streams; printed are the median times and the peak RSS each
server process adds. One token of the demo model takes ~10 ms on this machine, so the stack's
cost per chunk is what matters against that. `--smoke`: 20 JSON requests and 3 streams a stack, on free
ports.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import record  # noqa: E402

SERVER = r"""
import sys, uvicorn
kind, port = sys.argv[1], int(sys.argv[2])
payload = {"object": "list", "data": [{"id": "demo", "object": "model", "created": 0, "owned_by": "mixdesk"}]}
async def chunks():
    for i in range(256):
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "tok"}}]}\n\n'
    yield b"data: [DONE]\n\n"
if kind == "starlette":
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route
    async def models(request): return JSONResponse(payload)
    async def stream(request): return StreamingResponse(chunks(), media_type="text/event-stream")
    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/stream", stream, methods=["POST"])])
else:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    app = FastAPI()
    @app.get("/v1/models")
    async def models(): return payload
    @app.post("/v1/stream")
    async def stream(): return StreamingResponse(chunks(), media_type="text/event-stream")
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(kind: str, port: int, requests: int = 400, streams: int = 40) -> dict:
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", SERVER, kind, str(port)])
    try:
        for _ in range(200):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/v1/models")
                c.getresponse().read()
                break
            except OSError:
                time.sleep(0.05)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        js = []
        for _ in range(requests):
            t = time.perf_counter()
            c.request("GET", "/v1/models")
            json.loads(c.getresponse().read())
            js.append(time.perf_counter() - t)
        ss = []
        for _ in range(streams):
            t = time.perf_counter()
            c.request("POST", "/v1/stream", body=b"{}")
            r = c.getresponse()
            n = sum(1 for line in r if line.startswith(b"data: "))
            ss.append(time.perf_counter() - t)
            assert n == 257
        rss = psutil.Process(proc.pid).memory_info().rss
        return {"json_ms": statistics.median(js) * 1e3, "stream_ms": statistics.median(ss) * 1e3,
                "per_chunk_us": statistics.median(ss) / 257 * 1e6, "rss_mib": rss / 2**20}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the smallest run through every stage (a test runs it)")
    a = ap.parse_args()
    kinds = ["starlette"]
    try:
        import fastapi  # noqa: F401

        kinds.append("fastapi")
    except ImportError:
        print("fastapi is not installed: timing Starlette alone (pip install fastapi to compare)")
    if a.smoke:
        res = {k: bench(k, free_port(), 20, 3) for k in kinds}
    else:
        res = {k: bench(k, 18700 + i) for i, k in enumerate(kinds)}
    rows = ["| stack | JSON request, median ms | 256-chunk stream, median ms | per chunk, us | server RSS MiB |",
            "|---|---|---|---|---|"]
    for k, r in res.items():
        rows.append(f"| {k} + uvicorn | {r['json_ms']:.2f} | {r['stream_ms']:.1f} | {r['per_chunk_us']:.0f} | "
                    f"{r['rss_mib']:.0f} |")
    table = "\n".join(rows)
    print(table)
    import uvicorn
    import starlette

    versions = f"uvicorn {uvicorn.__version__}, starlette {starlette.__version__}"
    if "fastapi" in kinds:
        import fastapi

        versions += f", fastapi {fastapi.__version__}"
    print(f"recorded {record('server_stack', {'results': res, 'versions': versions}, table + chr(10) + chr(10) + versions)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
