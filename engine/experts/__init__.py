"""One expert in one tier: its forms, how each is built from the file, what each costs.

expert.py (an expert materialised in a tier from the checkpoint: Expert16, QuantExpert, build_steps),
quant.py (the 4-bit formats per device and the 3- and 2-bit CPU tiers), gguf_tiers.py (a GGUF file's
own blocks as its CPU tiers; re-quantised forms below them), dense_forms.py (a GGUF file's dense
matrices in its own blocks), offload.py (whether a CPU expert computes there or is copied over, by
measured cost), tier_bytes.py (an expert's bytes in each tier, before any is built).

May import: files, machine, placement, native, protocol. Never: model, kv, planning or above.
"""
