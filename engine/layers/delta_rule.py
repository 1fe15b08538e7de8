"""The gated delta rule over n tokens of one sequence, updating its recurrent state in place.

q, k [n, Hv, Dk] (normalised, q scaled), v [n, Hv, Dv], g [n, Hv] (log decay), beta [n, Hv], all fp32;
S [Hv, Dk, Dv]. For each token t: S = exp(g_t) S; S += k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t.

A decode step's one token runs the rule as written (`recurrent`). A prompt runs it a chunk of C tokens
at a time (`chunked`, the WY/UT form of DeltaNet, Yang et al. 2024, as FLA and transformers compute
it): inside a chunk the C updates fold into one lower-triangular solve and a few [C, C] and [C, D]
matmuls, so the state is read and written once per chunk instead of once per token.
"""
from __future__ import annotations

import torch

CHUNK = 64         # tokens per chunk (FLA's and transformers' choice)
CHUNKED_FROM = 8   # shorter runs go token by token (a chunk's fixed cost is a few small matmuls)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        S: torch.Tensor) -> torch.Tensor:
    """-> o [n, Hv, Dv]; S updated in place."""
    if q.shape[0] >= CHUNKED_FROM:
        return chunked(q, k, v, g, beta, S)
    return recurrent(q, k, v, g, beta, S)


def recurrent(q, k, v, g, beta, S):
    """Token by token (the reference)."""
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


def chunked(q, k, v, g, beta, S, chunk: int = CHUNK):
    """C tokens at a time. Within a chunk (positions i, j; c the cumulative log decay from its start):
    the updates' corrected values u solve (I + L) u = beta v with L_ij = beta_i k_i.k_j e^(c_i - c_j) for
    j < i, and the keys that read the chunk's incoming state, w, solve (I + L) w = beta k e^c; then
    o = (q e^c) S + ((q k^T) o e^(c_i - c_j), j <= i) (u - w S), and S = e^(c_last) S + (k e^(c_last - c))^T (u - w S)."""
    n, H = q.shape[0], q.shape[1]
    pad = (-n) % chunk
    q, k, v = (torch.nn.functional.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))  # [H, n', D]
    g, beta = (torch.nn.functional.pad(x.t(), (0, pad)) for x in (g, beta))  # [H, n'] (padding: no decay, no update)
    N = q.shape[1] // chunk
    q, k, v = (x.reshape(H, N, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(H, N, chunk), beta.reshape(H, N, chunk)
    c = g.cumsum(-1)  # [H, N, C]
    seen = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~seen, float("-inf")).exp()  # [H, N, C, C]
    kb = k * beta[..., None]
    L = (kb @ k.transpose(-1, -2)) * decay  # its strict lower triangle; the solves take the diagonal as 1
    u = torch.linalg.solve_triangular(L, v * beta[..., None], upper=False, unitriangular=True)  # [H, N, C, Dv]
    w = torch.linalg.solve_triangular(L, kb * c.exp()[..., None], upper=False, unitriangular=True)  # [H, N, C, Dk]
    inner = (q @ k.transpose(-1, -2)) * decay  # [H, N, C, C]
    qd = q * c.exp()[..., None]
    kd = k * (c[..., -1:] - c).exp()[..., None]
    last = c[..., -1].exp()  # [H, N]
    out = torch.empty_like(v)
    for i in range(N):
        fresh = u[:, i] - w[:, i] @ S  # [H, C, Dv]
        out[:, i] = qd[:, i] @ S + inner[:, i] @ fresh
        S.mul_(last[:, i, None, None]).add_(kd[:, i].transpose(-1, -2) @ fresh)
    return out.reshape(H, N * chunk, -1)[:, :n].transpose(0, 1)
