"""The gated delta rule over n tokens of one sequence, updating its recurrent state in place.

q, k [n, Hv, Dk] (normalised, q scaled), v [n, Hv, Dv], g [n, Hv] (log decay), beta [n, Hv], all fp32;
S [Hv, Dk, Dv]. For each token t: S = exp(g_t) S; S += k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t.
"""
from __future__ import annotations

import torch


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        S: torch.Tensor) -> torch.Tensor:
    """-> o [n, Hv, Dv]; S updated in place."""
    return recurrent(q, k, v, g, beta, S)


def recurrent(q, k, v, g, beta, S):
    """Token by token (the reference; a decode step's one token)."""
    n = q.shape[0]
    out = torch.empty_like(v)
    decay = g.exp()
    for t in range(n):
        S.mul_(decay[t][:, None, None])
        kv = torch.einsum("hkv,hk->hv", S, k[t])  # what the state recalls for k_t [Hv, Dv]
        delta = (v[t] - kv) * beta[t][:, None]
        S.add_(k[t][:, :, None] * delta[:, None, :])
        out[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return out
