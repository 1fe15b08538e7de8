"""Issue 37 item 1 on the real demo: a fresh cache, `mixdesk serve`, the question at temperature 0
every ~8 s through the first minute+, against `--placement cpu` on another fresh cache.
Run: .venv/bin/python scripts/first_minute.py (the built-in demo must be built: mixdesk demo-model)."""
import json, os, subprocess, sys, tempfile, time, http.client
Q = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 48}
MD = os.path.join(os.path.dirname(sys.executable), "mixdesk")

def ask(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(Q, model="demo-smollm2-135m-8x")), headers={"Content-Type": "application/json"})
    r = c.getresponse(); b = json.loads(r.read()); c.close()
    if "choices" not in b: return "ERROR " + json.dumps(b)[:300]
    return b["choices"][0]["message"]["content"]

def up(port):
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/v1/models"); c.getresponse().read(); return
        except OSError:
            time.sleep(0.5)

def run(placement, port, asks, gap):
    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="fm-cache-"))
    t0 = time.monotonic()
    p = subprocess.Popen([MD, "serve", "--port", str(port), "--placement", placement], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up(port); print(f"[{placement}] up at {time.monotonic()-t0:.1f}s", flush=True)
        out = []
        for i in range(asks):
            t = time.monotonic() - t0
            a = ask(port); out.append(a)
            print(f"[{placement}] t={t:5.1f}s -> {a!r}", flush=True)
            time.sleep(gap)
        return out
    finally:
        p.terminate(); p.wait(30)

ref = run("cpu", 8093, 2, 0)
got = run("auto", 8094, 9, 6)
print("reference:", ref[0])
print("equal to --placement cpu:", sum(a == ref[0] for a in got), "of", len(got))
