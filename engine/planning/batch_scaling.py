"""How an expert's time grows with the tokens run through it at once: the measured batch scaling
of the hardware profile (engine/measures/hardware.py), read as the planner's cost model needs it
(engine/planning/planner.py: a batched decode step, a prefill)."""
from __future__ import annotations

import math

import numpy as np


def _ratio(rows, n: float) -> float:
    b = [row[0] for row in rows]
    r = [row[1] for row in rows]
    if n >= b[-1]:
        return r[-1] * n / b[-1]  # past the table: linear
    return float(np.interp(n, b, r))


def batch_ratio(table, n: float, nbytes: float = 0.0) -> float:
    """Time for n tokens at once / time for one, for an expert of nbytes. table: a list of
    [batch, ratio], or {"small": ..., "large": ..., "bytes": [small, large]} (interpolated in
    log bytes between the two measured sizes). Below one expected token the expert runs with
    probability ~n."""
    if n <= 1.0 or not table:
        return max(n, 0.0)
    if isinstance(table, list):
        return _ratio(table, n)
    lo, hi = (float(x) for x in table["bytes"])
    w = float(np.clip((np.log(max(nbytes, 1.0)) - np.log(lo)) / (np.log(hi) - np.log(lo)), 0.0, 1.0))
    return (1 - w) * _ratio(table["small"], n) + w * _ratio(table["large"], n)


def _ratios(rows, n: np.ndarray) -> np.ndarray:
    b = np.array([row[0] for row in rows], dtype=np.float64)
    r = np.array([row[1] for row in rows], dtype=np.float64)
    return np.where(n >= b[-1], r[-1] * n / b[-1], np.interp(n, b, r))


def batch_ratios(table, n, nbytes: float = 0.0) -> np.ndarray:
    """batch_ratio for an array of token counts n (one expert size): the same values, in one pass."""
    n = np.asarray(n, dtype=np.float64)
    small = np.maximum(n, 0.0)
    if not table:
        return small
    if isinstance(table, list):
        big = _ratios(table, n)
    else:
        lo, hi = (float(x) for x in table["bytes"])
        w = float(np.clip((np.log(max(nbytes, 1.0)) - np.log(lo)) / (np.log(hi) - np.log(lo)), 0.0, 1.0))
        big = (1 - w) * _ratios(table["small"], n) + w * _ratios(table["large"], n)
    return np.where(n <= 1.0, small, big)


def expected_runs(p, streams: int, table, nbytes: float) -> np.ndarray:
    """An expert's expected cost in one decode step, in batch-1 runs, when each of `streams`
    tokens picks it with probability p: E[batch_ratio(n)] for n ~ Binomial(streams, p). At one
    stream that is p."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    if streams <= 1:
        return p
    out = np.zeros_like(p)
    for n in range(1, streams + 1):
        out += math.comb(streams, n) * p ** n * (1 - p) ** (streams - n) * batch_ratio(table, n, nbytes)
    return out
