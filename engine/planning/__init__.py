"""The planner: which tier every expert takes, for a slider position under memory budgets.

planner.py (the frontier of placements, quality against speed, and the slider's scale),
batch_scaling.py (how a tier's cost grows with the tokens one expert takes at once),
kv_reservation.py (the context's keys and values against the budgets), hardware.py (this machine's
measured tier costs, cached), profile.py (a model's measured sensitivity and popularity: the
calibration), inputs.py (a model, a config or a GGUF header to the planner's inputs), fit.py (whether
and how a model fits this machine, for the browser and `mixdesk plan`).

May import: model, experts, files, families, machine, placement, native, protocol.
"""
