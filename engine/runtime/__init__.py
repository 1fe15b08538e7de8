"""The engine thread and what it runs: commands in, events out.

session.py (the loop: commands -> the controller's safe point -> one scheduler round -> publish),
scheduler.py (requests: admission, chunked prompts, batched decode, stops, KV caches), generate.py
(prefill past a cached prefix, sampling, streaming text), load.py (a folder to a model ready to chat),
queries.py (what a client may ask), telemetry.py (speed and memory said), client.py (a blocking client
for the command line), errorlog.py (tracebacks of unexpected errors, to a log file).

May import everything below it (control, planning, model, kv, experts, files, prompts, sources, ...);
nothing imports it but tools/.
"""
