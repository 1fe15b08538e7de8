"""A MoE block's router: from the tokens' hidden states [T, D] to the experts each token goes to and
their weights, ((w [T, K] fp32, idx [T, K])). One small class per kind the families use:

- SoftmaxTopK (Mixtral, Qwen2/3-MoE, OLMoE, Qwen3.5/Next): softmax over all E in fp32, the top k,
  renormalised where the family does (norm_topk); an optional bias on the logits.
- TopKSoftmax (GPT-OSS): the top k of the (biased) logits, then a softmax over those k.
- SigmoidGroups (GLM-4.5, GLM-4.7-Flash): sigmoid scores from an fp32 router; the top k by score plus a
  correction [E], chosen only within the best groups[1] of groups[0] expert groups (a group's strength:
  its two best); the weights are the scores, renormalised where the family does, times scale.
- GemmaRouter (Gemma 4): reads its own input (the stream), RMS-normalised without a weight, times
  route_in [D]; softmax, top k renormalised, each weight times its expert's scale [E].

`plain` says whether the native layer kernel (engine/native/moe.c) routes the same way (SoftmaxTopK,
renormalised, no bias); `tensors` are its weights that count as dense weights."""
from __future__ import annotations

import torch

from ..native.dense_linear import linear
from .norms import rms


class Router:
    plain = False  # moe.c's router: softmax over E, top-k renormalised, no bias

    def __init__(self, gate: torch.Tensor, top_k: int):
        self.gate = gate  # [E, D] on the accelerator
        self.top_k = top_k

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def tensors(self) -> list[torch.Tensor]:
        return [self.gate]


class SoftmaxTopK(Router):
    def __init__(self, gate: torch.Tensor, top_k: int, norm_topk: bool = True, bias: torch.Tensor | None = None):
        super().__init__(gate, top_k)
        self.norm_topk, self.bias = norm_topk, bias
        self.plain = norm_topk and bias is None

    def __call__(self, x):
        logits = linear(x, self.gate)  # [T, E]
        if self.bias is not None:
            logits = logits + self.bias
        probs = torch.softmax(logits.float(), dim=-1)  # [T, E] fp32
        w, idx = torch.topk(probs, self.top_k, dim=-1)  # [T, K]
        return (w / w.sum(dim=-1, keepdim=True) if self.norm_topk else w), idx


class TopKSoftmax(Router):
    def __init__(self, gate: torch.Tensor, top_k: int, bias: torch.Tensor | None = None):
        super().__init__(gate, top_k)
        self.bias = bias

    def __call__(self, x):
        logits = linear(x, self.gate)
        if self.bias is not None:
            logits = logits + self.bias
        top, idx = torch.topk(logits, self.top_k, dim=-1)  # [T, K]
        return torch.softmax(top.float(), dim=-1), idx


class SigmoidGroups(Router):
    def __init__(self, gate: torch.Tensor, top_k: int, correction: torch.Tensor, groups: tuple[int, int] = (1, 1),
                 scale: float = 1.0, norm_topk: bool = True):
        super().__init__(gate.float(), top_k)  # the router is fp32, as transformers has it
        self.correction, self.groups, self.scale, self.norm_topk = correction, groups, scale, norm_topk

    def __call__(self, x):
        scores = torch.sigmoid(linear(x.float(), self.gate))  # [T, E] fp32
        choose = scores + self.correction
        n, keep = self.groups
        if n > 1:  # only the best `keep` groups compete
            T, E = choose.shape
            best = choose.view(T, n, E // n).topk(2, dim=-1)[0].sum(-1)  # [T, n]
            mask = torch.zeros_like(best).scatter_(1, best.topk(keep, dim=-1)[1], 1.0).bool()
            choose = choose.masked_fill(~mask.repeat_interleave(E // n, dim=1), float("-inf"))
        idx = torch.topk(choose, self.top_k, dim=-1)[1]  # [T, K]
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * self.scale, idx

    def tensors(self):
        return [self.gate, self.correction]


class GemmaRouter(Router):
    def __init__(self, gate: torch.Tensor, top_k: int, route_in: torch.Tensor, expert_scale: torch.Tensor,
                 eps: float = 1e-6):
        super().__init__(gate, top_k)
        self.route_in, self.expert_scale, self.eps = route_in, expert_scale, eps

    def __call__(self, x):
        h = rms(x, self.eps) * self.route_in
        probs = torch.softmax(linear(h, self.gate).float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        return w / w.sum(dim=-1, keepdim=True) * self.expert_scale[idx], idx
