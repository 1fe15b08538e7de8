"""Stacked matrices of one input (engine/experts/dense_forms.py Stacked: [q; k; v] or DeltaNet's [qkv; z; b; a]
in different formats) multiply in one native call (moe.c mdk_matmul_parts) exactly as part by part."""
import pytest
import torch
from gguf import GGMLQuantizationType as GT

from engine import native
from engine.files.gguf.blockquant import BlockQuant
from engine.experts.dense_forms import Stacked
from engine.native.dense_linear import linear

pytestmark = pytest.mark.skipif(not native.available(), reason="the native library is not built")


def blocks(qtype, n, k, seed):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * k ** -0.5
    return BlockQuant.quantize(w, qtype)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kinds", [("Q4_K", "Q6_K", "Q8_0", "Q4_K"), ("bf16", "bf16"), ("Q4_K", "Q4_K", "Q6_K")])
def test_one_call_gives_each_parts_product(rows, kinds):
    k = 512
    parts = []
    for i, kind in enumerate(kinds):
        n = (96, 40, 256, 32)[i]  # row counts off the kernels' blocks of rows too
        if kind == "bf16":
            parts.append((torch.randn(n, k, generator=torch.Generator().manual_seed(i)) * k ** -0.5).to(torch.bfloat16))
        else:
            parts.append(blocks(getattr(GT, kind), n, k, seed=i))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    s = Stacked(parts)
    from engine.native import choice

    assert choice.stacked(parts, x)
    want = torch.cat([linear(x, p) for p in parts], dim=-1)
    got = s.matmul(x)
    assert got.shape == want.shape and torch.equal(got, want)
