"""The planner: which tier every expert takes, for a slider position under memory budgets. Pure
arithmetic on numpy arrays over measured inputs (engine/measures/ measures them): planner.py (the frontier
of placements, quality against speed, and the slider's scale), batch_scaling.py (how a tier's cost grows
with the tokens one expert takes at once), kv_reservation.py (the context's keys and values against the
budgets).

May import: placement and protocol only; no torch (pyproject's import contracts).
"""
