"""The MoE block: route -> group tokens by expert -> run each expert in its tier -> combine.

Shapes: T tokens, E experts, K top-k, D hidden.
Routing is the block's Router (engine/layers/router.py: Mixtral's softmax over E in fp32 and top-K,
GPT-OSS's top-K of biased logits then a softmax, GLM's sigmoid groups, Gemma's). Weights multiply in fp32 and the
product is cast to the activation dtype before it is summed, as transformers does, so 16-bit
placements reproduce its numbers.

Where experts live on different devices, only activations cross: the tokens' hidden states go to
the CPU for CPU-resident experts and their outputs come back. Accelerator experts are launched
first (asynchronously on CUDA) so the CPU experts compute while the GPU works.

With the native kernels (engine/native), a layer whose experts all run on the CPU is one call:
route, gate+up, SiLU, down and the weighted sum, with the threads inside it and no host sync in
Python. Otherwise the CPU-resident experts of a step still run in one native call; the native
path sums in fp32 and rounds once, so 16-bit results differ from transformers' in the last bit.
"""
from __future__ import annotations

import ctypes

import torch

from .. import native
from ..native import choice
from ..experts.offload import OffloadCosts
from ..native.dense_linear import linear
from ..experts.expert import Expert16, QuantExpert, run_jobs
from ..layers.router import Router

CPU = torch.device("cpu")


class MoEBlock:
    def __init__(self, router: Router, experts: list[Expert16 | QuantExpert], accel: torch.device,
                 offload: OffloadCosts | None = None, shared: tuple[Expert16, torch.Tensor | None] | None = None):
        self.router = router  # which experts each token goes to, and their weights (engine/layers/router.py)
        self.gate, self.top_k = router.gate, router.top_k  # [E, D] on accel
        self.shared = shared  # (shared expert, its sigmoid gate [1, D] or None: ungated, GLM) on accel
        self.accel = accel
        self.offload = offload  # when a CPU expert's weights are copied over for a prefill (offload.py)
        self.copied = 0  # prefill segments whose weights were copied to the accelerator (for stats)
        # calibration: (inputs, routes, route weights, residual stream) appended per call when set;
        # the model sets `residual` (the stream this block's output joins) just before the call
        self.record: list | None = None
        self.residual: torch.Tensor | None = None
        # the native kernel's table of this layer's experts (a null entry: not a native CPU expert), and
        # its router matrix where moe.c routes as this block does (router.plain)
        self.table = (ctypes.c_void_p * len(experts))()
        self.router_matrix = native.matrix(router.gate) if router.plain and choice.router(router.gate) else None
        self.experts = experts

    # ---- the expert table ----
    @property
    def experts(self) -> list:
        return self._experts

    @experts.setter
    def experts(self, experts: list) -> None:
        """A whole new list of experts (calibration swaps layers this way); the table follows."""
        self._experts = experts
        for e, ex in enumerate(experts):
            self.table[e] = self._address(ex)
        self.all_native = all(self.table)

    def set_expert(self, e: int, ex: Expert16 | QuantExpert) -> None:
        """Swap expert e for a new form (a safe point: between forward passes)."""
        self.experts[e] = ex
        self.table[e] = self._address(ex)
        self.all_native = all(self.table)

    @staticmethod
    def _address(ex) -> int | None:
        desc = getattr(ex, "desc", None)
        return ctypes.addressof(desc) if desc is not None else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.router(x)

    def __call__(self, x: torch.Tensor, route_x: torch.Tensor | None = None) -> torch.Tensor:  # x [T, D] on accel
        """route_x: what the router reads where it is not the experts' input (Gemma 4: the stream)."""
        out = self._routed(x, route_x)
        if self.shared is not None:
            ex, g = self.shared
            if g is None:  # ungated (GLM): added as it is
                return out + ex(x).to(x.dtype)
            out = out + (torch.sigmoid(linear(x, g).float()) * ex(x).float()).to(x.dtype)  # [T, D]
        return out

    def _routed(self, x: torch.Tensor, route_x: torch.Tensor | None = None) -> torch.Tensor:
        T = x.shape[0]
        if route_x is None and choice.moe_layer(self, x):
            return self._native_layer(x)  # (its router renormalises the top-k weights)
        w, idx = self.route(x if route_x is None else route_x)
        if self.record is not None:
            self.record.append((x, idx, w, self.residual))
        if T == 1:
            return self._decode(x, w, idx)
        return self._prefill(x, w, idx)

    def _native_layer(self, x: torch.Tensor) -> torch.Tensor:
        """Route and run every selected expert in one native call (all experts native, x on the CPU)."""
        x = x.contiguous()
        T, K = x.shape[0], self.top_k
        out = torch.empty_like(x)
        idx = torch.empty(T, K, dtype=torch.int32)
        wts = torch.empty(T, K, dtype=torch.float32)
        fmt = native.FMT[x.dtype]
        rc = native.lib().mdk_moe(self.table, len(self.experts), ctypes.byref(self.router_matrix), K, fmt,
                                  x.data_ptr(), fmt, T, out.data_ptr(), fmt, idx.data_ptr(), wts.data_ptr(),
                                  native.threads())
        if rc:
            raise RuntimeError(f"native MoE layer failed: {native.ERRORS.get(rc, rc)}")
        return out

    def _decode(self, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ids = idx[0].tolist()  # K expert ids (one host sync, needed to dispatch)
        experts = [self.experts[e] for e in ids]
        on_cpu = [not ex.tier.on_accelerator for ex in experts]
        cuda = self.accel.type == "cuda"
        if cuda and any(on_cpu):  # copy before launching GPU work, so the copy doesn't wait on it
            x_cpu, w_cpu = x.to(CPU), w.to(CPU)
        else:
            x_cpu, w_cpu = x, w
        out = None
        native_jobs = [(experts[j], j, 1) for j in range(len(ids))
                       if on_cpu[j] and getattr(experts[j], "desc", None) is not None]
        done = {j for _, j, _ in native_jobs}
        for j in sorted(range(len(ids)), key=lambda j: on_cpu[j]):  # accelerator experts first
            if j in done:
                continue
            if on_cpu[j]:
                y = (experts[j](x_cpu) * w_cpu[0, j]).to(x.dtype).to(self.accel, non_blocking=cuda)
            else:
                y = (experts[j](x) * w[0, j]).to(x.dtype)
            out = y if out is None else out + y
        if native_jobs:
            y = run_jobs(native_jobs, x_cpu, torch.zeros(len(ids), dtype=torch.int32), w_cpu[0])
            y = y.to(self.accel, non_blocking=cuda)
            out = y if out is None else out + y
        return out

    def _prefill(self, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        k = self.top_k
        flat = idx.reshape(-1)  # [T*K] expert of each (token, slot)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        token = order // k  # [T*K] token of each grouped slot
        weight = w.reshape(-1)[order]  # [T*K] fp32
        out = torch.zeros_like(x)  # [T, D]

        accel_jobs, cpu_jobs, off = [], [], 0
        for e, c in enumerate(counts):
            if c:
                ex = self.experts[e]
                if ex.tier.on_accelerator:
                    accel_jobs.append((ex, off, c))
                elif ex.copyable and self.offload is not None and self.offload.copy_wins(c, ex.nbytes):
                    accel_jobs.append((ex.to(self.accel, x.dtype), off, c))  # temporary copy for this batch
                    self.copied += 1
                else:
                    cpu_jobs.append((ex, off, c))
                off += c
        cuda = self.accel.type == "cuda"
        if cpu_jobs and cuda:
            x_cpu, token_cpu, weight_cpu = x.to(CPU), token.to(CPU), weight.to(CPU)
        else:
            x_cpu, token_cpu, weight_cpu = x, token, weight
        for ex, a, c in accel_jobs:
            t = token[a:a + c]
            y = ex(x[t]) * weight[a:a + c, None]  # [c, D] fp32
            out.index_add_(0, t, y.to(x.dtype))
        native_jobs = [j for j in cpu_jobs if getattr(j[0], "desc", None) is not None]
        for ex, a, c in cpu_jobs:
            if getattr(ex, "desc", None) is not None:
                continue
            t = token_cpu[a:a + c]
            y = (ex(x_cpu[t]) * weight_cpu[a:a + c, None]).to(x.dtype)  # [c, D]
            out.index_add_(0, token[a:a + c], y.to(self.accel, non_blocking=cuda))
        if native_jobs:
            out += run_jobs(native_jobs, x_cpu, token_cpu, weight_cpu).to(self.accel, non_blocking=cuda)
        return out
